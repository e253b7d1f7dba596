# Chapter 02 links chapter 00's building blocks (f, g, column/row-parallel linears) and chapter
# 01's tensor-parallel layers; its own .c files (vocab_parallel.c, vp_llama.c, loss_check.c,
# main.c) are compiled in by the Makefile. A later chapter that wants the vocabulary-parallel
# embedding and loss links 02_loss_parallel/vocab_parallel.c alone.
LINKS_02 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
