/* eval.c — see eval.h. */
#include "eval.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "status.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int eval_corpus(const Model *m, Activations *a, const Corpus *c, size_t max_bytes, EvalResult *out)
{
    const double t0 = now_s();
    const int B = a->B, T = a->T;
    const size_t size = max_bytes && max_bytes < c->size ? max_bytes : c->size;
    const size_t predicted = size - 1;
    const size_t windows = (predicted + (size_t)T - 1) / (size_t)T;
    int *tokens = malloc((size_t)B * T * sizeof(int));
    int *targets = malloc((size_t)B * T * sizeof(int));
    if (!tokens || !targets) {
        free(tokens);
        free(targets);
        return isth_fail(ISTH_ERUNTIME, "out of memory for evaluation batch");
    }
    double ce = 0.0;
    size_t counted = 0;
    int rc = ISTH_OK;
    for (size_t w0 = 0; w0 < windows && rc == ISTH_OK; w0 += (size_t)B) {
        for (int b = 0; b < B; b++) {
            size_t start = (w0 + (size_t)b) * (size_t)T; /* first input byte */
            for (int t = 0; t < T; t++) {
                size_t i = start + (size_t)t;
                int valid = (w0 + (size_t)b) < windows && i + 1 < size;
                /* padding: token 0, not scored; causal attention and
                 * capacity-free routing keep it from affecting real bytes */
                tokens[(size_t)b * T + t] = valid ? c->bytes[i] : 0;
                targets[(size_t)b * T + t] = valid ? c->bytes[i + 1] : -1;
            }
        }
        ForwardStats st;
        rc = transformer_forward(m, a, tokens, targets, B, T, 0, &st);
        ce += st.ce_sum;
        counted += st.n_targets;
    }
    free(tokens);
    free(targets);
    CHECK(rc);
    if (counted != predicted)
        return isth_fail(ISTH_ERUNTIME, "eval %s: scored %zu bytes, expected %zu", c->path, counted,
                         predicted);
    out->ce_sum = ce;
    out->predicted = predicted;
    out->bpb = ce / ((double)predicted * M_LN2);
    out->seconds = now_s() - t0;
    return ISTH_OK;
}
