# The technique, which a later chapter may include and link (the schedules, the pipeline's plan and executor,
# and its reports: chapter 09 prints a pipeline's memory and messages beside its formulas);
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_05 := 05_pipeline/schedule.c 05_pipeline/pipeline.c 05_pipeline/pp_report.c
# Chapter 05 links chapter 00's building blocks (f and g) and chapter 01's plan (megatron_plan),
# used inside each pipeline stage for PP x TP; its own files are schedule.c (the action lists and
# their simulator), pipeline.c (the plan and the executor), pp_report.c (the reports) and main.c.
LINKS_05 := 00_naive_tp_mlp/tensor_parallel.c 01_transformer_tp/tp.c
# The unit tests of this chapter's files, linked with them (all but main.c) and LINKS_05.
TESTS_05 := test_schedule
