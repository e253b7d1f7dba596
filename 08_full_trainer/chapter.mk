# The technique, which a later chapter may include and link (the plan of the whole mesh; the sharded
# checkpoints, which chapter 09 resumes from on another ep degree; the --plan calculator, which
# chapter 09 runs with its mixture-of-experts layer);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_08 := 08_full_trainer/parallelize.c 08_full_trainer/checkpoint.c 08_full_trainer/plan_calculator.c
# Chapter 08 links the technique of every earlier chapter and copies none: chapter 00's building
# blocks (f and g), 01's Megatron plan, 02's vocabulary-parallel ends, 03's sequence parallelism
# and checkpointing, 04's FSDP/HSDP, 05's pipeline and its schedules, 06's context parallelism,
# 07's float8 linears and all-gather. Its own files: parallelize.c (the plan of the mesh),
# trainer.c (schedule, evaluation, metrics), checkpoint.c, sample.c, plan_calculator.c and main.c.
LINKS_08 += 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c 02_loss_parallel/vocab_parallel.c \
            03_sequence_parallel/sequence_parallel.c 04_fsdp/data_parallel.c 04_fsdp/dp_units.c \
            04_fsdp/ddp.c 04_fsdp/zero.c 04_fsdp/fsdp.c 05_pipeline/pipeline.c 05_pipeline/schedule.c \
            06_context_parallel/context_parallel.c 07_float8/float8_linear.c 07_float8/float8_all_gather.c
# --async-tp: chapter 03's decomposition of the sequence collectives.
LINKS_08 += 03_sequence_parallel/async_tp.c
# make run-08: the trainer on 8 ranks (oversubscribed on a small machine), pp 2 x dp_shard 2 x tp 2,
# 500 steps on Shakespeare with a sample at the end, without the baseline (make check-08 has it).
RUN_NP_08    := 8
RUN_FLAGS_08 := --sample 400
RUN_ARGS_08  := --pp 2 --dp-shard 2 --tp 2
# The unit tests of this chapter's files, linked with them (all but main.c) and LINKS_08.
TESTS_08 := test_plan_calculator test_trainer test_checkpoint test_mesh
