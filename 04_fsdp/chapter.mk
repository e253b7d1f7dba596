# Chapter 04 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan),
# used inside each data rank for FSDP x TP; its own files are data_parallel.c (the technique),
# dp_report.c and main.c.
LINKS_04 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
