# The technique, which a later chapter may include and link (ring and all-gather attention);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_06 := 06_context_parallel/context_parallel.c
# Chapter 06 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan),
# used inside each cp rank for CP x TP; its own files are context_parallel.c (the technique) and
# main.c.
LINKS_06 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
# The unit tests of this chapter's files, linked with them (all but main.c) and LINKS_06.
TESTS_06 := test_ring_attention
