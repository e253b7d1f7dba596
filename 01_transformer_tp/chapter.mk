# The technique, which a later chapter may include and link (Megatron's plan (megatron_plan, megatron_region));
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_01 := 01_transformer_tp/tp.c
# Chapter 01 links chapter 00's tensor-parallel building blocks (f, g, column/row-parallel linears).
LINKS_01 := 00_naive_tp_mlp/tensor_parallel.c
TESTS_01 := test_layer_blocks
