/* flags.h: chapter 08's flags: the mesh and the techniques on it, the training run, checkpoints
 * and outputs, and the --plan calculator's; the chapter's defaults for the model and the run. */
#pragma once
#include <stdbool.h>
#include "parallelize.h"
#include "plan_calculator.h"
#include "run.h"

/* The trainer's own settings (the model and the step are run.h's run_options). */
typedef struct {
    parallel_options par;
    const char *data, *ckpt_dir, *export_path, *prompt;
    int warmup, accum, eval_every, eval_batches, ckpt_every, sample;
    int vocab_multiple;       /* --vocab-multiple (02's padding of the vocabulary over tp), 0: default */
    double lr_min, temperature, peak_tflops;
    bool resume, plan, microbatches_given;
    /* flags that only some settings use, given on the command line (refused where ignored) */
    bool schedule_given, cp_method_given, no_sp_given, prompt_given, temperature_given;
    plan_calc_options calc;
} trainer_options;

/* The chapter's defaults (a 0.46 M-parameter model sized to learn Shakespeare on a laptop: dim 96,
 * 4 layers, 16 x 64 bytes a step, 500 steps, lr 3e-3 with clipping at 1), then every flag parsed
 * (the shared ones of run.h, this chapter's, the calculator's); bad values exit 2 with one line. */
void trainer_parse_flags(run_options *o, trainer_options *t, int argc, char **argv);
/* The run's settings checked together before anything is read or built (exit 2, one line): the
 * mesh against the model and the batch (parallelize_validate, mesh_check's rules), then the
 * combinations this trainer cannot run (a vocabulary other than the bytes', checkpoints without a
 * directory, float8 with what cannot reproduce its casts, a fault without FSDP, a warmup longer
 * than the run). Fills what was left to the defaults: --microbatches (pp), --warmup. */
void trainer_validate(run_options *o, trainer_options *t);
