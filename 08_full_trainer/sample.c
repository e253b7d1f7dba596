/* sample.c: see sample.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "data.h"
#include "device.h"
#include "llama_kernels.h"
#include "log.h"
#include "params.h"
#include "sample.h"

/* A byte drawn from the softmax of logits[256] / temperature with the uniform number u. */
static int draw_byte(const float *logits, int V, double temperature, double u) {
    int best = 0;
    for (int v = 1; v < V; v++) if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    double *p = malloc((size_t)V * sizeof(double)), sum = 0;
    for (int v = 0; v < V; v++) sum += p[v] = exp((logits[v] - logits[best]) / temperature);
    int pick = V - 1;
    for (int v = 0; v < V; v++) {
        u -= p[v] / sum;
        if (u < 0) { pick = v; break; }
    }
    free(p);
    return pick;
}

void sample_text(llama_model *m, const char *prompt, int n_bytes, double temperature, uint64_t seed) {
    const llama_config *c = &m->c;
    bool root = comm_world()->rank == 0;
    /* one device, one sequence: the weights gathered into the baseline's layout */
    llama_model *one = root ? llama_create_baseline(c, 1, seed) : NULL;
    float *full = NULL;
    for (int i = 0; i < llama_num_params(c); i++) {
        param_spec s = llama_param_spec(c, i);
        if (root) full = realloc(full, (size_t)s.rows * s.cols * sizeof(float));
        param_gather(m->params, i, false, full);
        if (root) device_copy_to_device(param_in(one->params, one->params->params, i), full,
                                        (size_t)s.rows * s.cols * sizeof(float));
    }
    free(full);
    if (!root) return;

    int T = c->seq_len, V = c->vocab_size, n_prompt = (int)strlen(prompt);
    unsigned char *text = malloc((size_t)n_prompt + n_bytes + 1);
    memcpy(text, prompt, (size_t)n_prompt);
    int len = n_prompt;
    int *tokens = malloc((size_t)T * sizeof(int)), *targets = malloc((size_t)T * sizeof(int));
    int *tokens_dev = device_alloc_ints(T, MEM_BUFFERS), *targets_dev = device_alloc_ints(T, MEM_BUFFERS);
    float *logits = malloc((size_t)V * sizeof(float));
    for (int t = 0; t < T; t++) targets[t] = IGNORE_INDEX;   /* no loss: only the logits are read */
    log0("sample (%d bytes after the prompt, temperature %g):\n", n_bytes, temperature);   /* (before the wait) */
    device_copy_to_device(targets_dev, targets, (size_t)T * sizeof(int));
    for (int k = 0; k < n_bytes; k++) {
        /* the last T bytes (or all of them) at positions 0 ..; the rest of the window is padding
         * the causal mask keeps out of the positions before it */
        int start = len > T ? len - T : 0, n = len - start;
        for (int t = 0; t < T; t++) tokens[t] = t < n ? text[start + t] : 0;
        device_copy_to_device(tokens_dev, tokens, (size_t)T * sizeof(int));
        llama_forward(one, tokens_dev, targets_dev, 0.0f);
        device_copy_to_host(logits, one->saved->logits + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        /* the tokens are bytes: a vocabulary above 256 has entries no text holds, never drawn */
        text[len++] = (unsigned char)draw_byte(logits, V < 256 ? V : 256, temperature, data_uniform(seed, -1, k));
    }
    text[len] = 0;
    log0("----\n%s\n----\n", (const char *)text);
    free(text); free(tokens); free(targets); free(logits);
    device_free(tokens_dev); device_free(targets_dev);
    llama_free(one);
}
