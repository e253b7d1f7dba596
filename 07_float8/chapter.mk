# Chapter 07 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan),
# on which the float8 linears run under tensor parallelism; its own files are float8_linear.c
# (the technique) and main.c.
LINKS_07 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
