# Chapter 00's technique, which later chapters link: the tensor-parallel building blocks (f, g,
# the column- and row-parallel linears). mlp.c (the two-layer MLP it trains) and main.c are its own.
TECHNIQUE_00 := 00_naive_tp_mlp/tensor_parallel.c
