/* sample.h: text from the trained model, so a reader sees what it learned. */
#pragma once
#include <stdint.h>
#include "model.h"

/* Every parameter gathered to world rank 0 (collective), which then writes `prompt` followed by
 * n_bytes bytes sampled one at a time: the logits of the last position of a single-device
 * forward over the last seq_len bytes, softmax at `temperature`, one draw of a seeded uniform
 * number (temperature 0: the most likely byte). Rank 0 prints the text. */
void sample_text(llama_model *m, const char *prompt, int n_bytes, double temperature, uint64_t seed);
