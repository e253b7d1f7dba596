# The technique, which a later chapter may include and link (the sequence split and checkpointing);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_03 := 03_sequence_parallel/sequence_parallel.c 03_sequence_parallel/async_tp.c
# Chapter 03 links chapter 00's building blocks (f and g), chapter 01's plan (megatron_plan) and
# chapter 02's vocabulary-parallel ends (vocab_parallel.c), which it extends with the sequence
# split and activation checkpointing (sequence_parallel.c).
LINKS_03 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c 02_loss_parallel/vocab_parallel.c
