# The technique, which a later chapter may include and link: the MoE block and expert parallelism;
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_09 := 09_expert_parallel/moe.c 09_expert_parallel/expert_parallel.c
# Chapter 09 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan), for
# the dense parts split over tp (--tp); the experts and the batch split are expert_parallel.c, the
# MoE block moe.c.
LINKS_09 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
# --pp: chapter 05's pipeline, its schedules and its reports, the experts' ranks inside each stage.
LINKS_09 += 05_pipeline/pipeline.c 05_pipeline/schedule.c 05_pipeline/pp_report.c
# --fsdp: chapter 04's FSDP of the dense tensors over the ep group (data_parallel.c dispatches to
# every mode, so all of them link).
LINKS_09 += 04_fsdp/data_parallel.c 04_fsdp/dp_units.c 04_fsdp/ddp.c 04_fsdp/zero.c 04_fsdp/fsdp.c
# --cp: chapter 06's context parallelism, each sequence's rows over the cp ranks.
LINKS_09 += 06_context_parallel/context_parallel.c
# --save and --resume: chapter 08's sharded checkpoints, which load into any mesh (another ep too).
LINKS_09 += 08_full_trainer/checkpoint.c
# --plan: chapter 08's calculator, given this chapter's layer, and what it links (08's plan of the
# mesh and its rules, 02's vocabulary split, 03's checkpointing modes, and what 08's plan applies).
LINKS_09 += 08_full_trainer/plan_calculator.c 08_full_trainer/parallelize.c 02_loss_parallel/vocab_parallel.c \
            03_sequence_parallel/sequence_parallel.c 03_sequence_parallel/async_tp.c 07_float8/float8_linear.c \
            07_float8/float8_all_gather.c
# The unit tests of this chapter's files, linked with them (all but main.c): 08's --plan with this
# chapter's layer.
TESTS_09 := test_moe_plan
