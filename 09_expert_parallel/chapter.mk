# The technique, which a later chapter may include and link: the MoE block and expert parallelism;
# the chapter's other files are its own (tests/t_layers.sh).
TECHNIQUE_09 := 09_expert_parallel/moe.c 09_expert_parallel/expert_parallel.c
# Chapter 09 links nothing of the earlier chapters: its plan is the single device's with the experts
# and the batch split (expert_parallel.c); the MoE block is moe.c.
LINKS_09 :=
# The unit tests of this chapter's files, linked with them (all but main.c).
TESTS_09 :=
