# Chapter 03 links chapter 00's building blocks (f, g, column/row-parallel linears), chapter 01's
# parameters (tp_params: slices, gradients, AdamW, gathers) and chapter 02's vocabulary-parallel
# embedding and loss (vocab_parallel.c) with its layouts (vp_layouts, in vp_llama.c). Its own
# activations and layers are in sequence_parallel.c.
LINKS_03 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c 02_loss_parallel/vocab_parallel.c 02_loss_parallel/vp_llama.c
