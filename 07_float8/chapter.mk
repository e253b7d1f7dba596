# The technique, which a later chapter may include and link (the float8 linears and all-gather);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_07 := 07_float8/float8_linear.c 07_float8/float8_all_gather.c
# Chapter 07 links chapter 00's building blocks (f and g), chapter 01's plan (megatron_plan), on
# which the float8 linears run under tensor parallelism, and chapter 04's data parallelism, whose
# fully sharded all-gathers move float8 bytes with --fp8-all-gather; its own files are
# float8_linear.c and float8_all_gather.c (the technique) and main.c.
LINKS_07 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c 04_fsdp/data_parallel.c \
            04_fsdp/dp_units.c 04_fsdp/ddp.c 04_fsdp/zero.c 04_fsdp/fsdp.c
# The unit tests of this chapter's files, linked with them (all but main.c) and LINKS_07.
TESTS_07 := test_float8_linear
