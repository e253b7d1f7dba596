# The technique, which a later chapter may include and link (DDP, ZeRO-1/2 and FSDP/HSDP);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_04 := 04_fsdp/data_parallel.c
# Chapter 04 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan),
# used inside each data rank for FSDP x TP; its own files are data_parallel.c (the technique),
# dp_report.c and main.c.
LINKS_04 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
