# The technique, which a later chapter may include and link (the vocabulary-parallel ends and loss);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_02 := 02_loss_parallel/vocab_parallel.c
# Chapter 02 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan,
# megatron_region), which it extends with the vocabulary-parallel ends; its own .c files
# (vocab_parallel.c, loss_check.c, loss_report.c, main.c) are compiled in by the Makefile. A later
# chapter that wants the vocabulary-parallel embedding and loss links 02_loss_parallel/vocab_parallel.c.
LINKS_02 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
