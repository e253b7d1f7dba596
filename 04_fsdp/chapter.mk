# The technique, which a later chapter may include and link (DDP, ZeRO-1/2 and FSDP/HSDP);
# the chapter's other files are its own (tests/t_layers.sh).
# data_parallel.c is the entry point (data_parallel_apply), dp_units.c what the modes share, ddp.c,
# zero.c (zero1, zero2) and fsdp.c the modes.
TECHNIQUE_04 := 04_fsdp/data_parallel.c 04_fsdp/dp_units.c 04_fsdp/ddp.c 04_fsdp/zero.c 04_fsdp/fsdp.c
# Chapter 04 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan),
# used inside each data rank for FSDP x TP; its own files are data_parallel.c, dp_units.c, ddp.c,
# zero.c and fsdp.c (the technique), dp_report.c and main.c.
LINKS_04 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
