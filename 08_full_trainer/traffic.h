/* traffic.h: the composed mesh's communication, measured per step on world rank 0 beside the
 * formulas of the chapters each collective comes from (03's sequence regions, 02's loss, 06's
 * ring, 05's messages, 04's FSDP/HSDP), composed: every per-pass count times the forward-backward
 * passes of a step (microbatches x accumulation), over the layers rank 0's stage holds. */
#pragma once
#include "mesh.h"
#include "model.h"
#include "parallelize.h"

/* Prints the table (rank 0) and returns the mismatches; a run the formulas do not cover (--no-sp,
 * --ac full, a cp method other than ring, float8 under tp) prints one line saying so and returns
 * 0. `steps` the steps counted, `accum` the micro-batches of a step. Not collective: the other
 * ranks return 0 at once (a stage other than the first sends and receives otherwise). */
int report_traffic(const parallel_options *o, device_mesh *mesh, const llama_model *m, int steps, int accum);
