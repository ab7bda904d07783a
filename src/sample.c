/* sample.c — see sample.h. */
#include "sample.h"

#include <math.h>
#include <string.h>

#include "alloc.h"
#include "rng.h"
#include "status.h"

#define SAMPLE_STREAM 0x73616d706c65ull /* "sample" */

/* The k-th largest of v (n values; k in 1..n), by quickselect on a copy. */
static double kth_largest(double *v, int n, int k)
{
    int lo = 0, hi = n - 1;
    const int want = k - 1; /* index in descending order */
    while (lo < hi) {
        const double pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                const double t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

int sample_draw(const float *logits, int V, const SampleRule *r, uint64_t draw, double *scratch)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (r->temperature <= 0.0) return best;
    /* the cut: values above `cut` are kept, and `at_cut` of those equal to it, lowest index first */
    double cut = -INFINITY;
    int at_cut = V;
    if (r->top_k > 0 && r->top_k < V) {
        for (int i = 0; i < V; i++) scratch[i] = logits[i];
        cut = kth_largest(scratch, V, r->top_k);
        int above = 0;
        for (int i = 0; i < V; i++) above += logits[i] > cut;
        at_cut = r->top_k - above;
    }
    const double mx = logits[best], inv_t = 1.0 / r->temperature;
    double total = 0.0;
    int seen = 0;
    for (int i = 0; i < V; i++) {
        double w = 0.0;
        if (logits[i] > cut || (logits[i] == cut && seen++ < at_cut)) w = exp((logits[i] - mx) * inv_t);
        scratch[i] = w;
        total += w;
    }
    const double u = rng_uniform(r->seed, SAMPLE_STREAM, draw) * total;
    double cum = 0.0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (scratch[i] <= 0.0) continue;
        cum += scratch[i];
        last = i;
        if (cum > u) return i;
    }
    return last; /* rounding left u at the very end */
}

int sample_generate(Decoder *d, const int *prompt, size_t n, int count, const SampleRule *r, int *out,
                    void (*emit)(void *ctx, int token), void *ctx)
{
    if (n == 0) return isth_fail(ISTH_EINPUT, "generate: the prompt has no tokens");
    /* a restart keeps the last half of the context (none at context 1) */
    const size_t T = (size_t)d->T, keep = T / 2;
    /* the tokens of the window in the cache, to start again from its last half */
    int *window = isth_malloc(T * sizeof(int));
    float *logits = isth_malloc((size_t)d->dims.V * sizeof(float));
    double *scratch = isth_malloc((size_t)d->dims.V * sizeof(double));
    int rc = window && logits && scratch ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "out of memory for sampling");
    decoder_reset(d);
    size_t in_window = 0;
    /* a prompt longer than the context: its last `keep` tokens (as if generated past it), at least one */
    const size_t first = n > T ? n - (keep > 0 ? keep : 1) : 0;
    for (size_t i = first; i < n && rc == ISTH_OK; i++) {
        window[in_window++] = prompt[i];
        rc = decoder_step(d, prompt[i], logits);
    }
    for (int g = 0; g < count && rc == ISTH_OK; g++) {
        const int tok = sample_draw(logits, d->dims.V, r, (uint64_t)g, scratch);
        if (out) out[g] = tok;
        if (emit) emit(ctx, tok);
        if (g + 1 == count) break;
        if (in_window == T) { /* full: the last half again, then the new token */
            memmove(window, window + T - keep, keep * sizeof(int));
            in_window = keep;
            decoder_reset(d);
            for (size_t i = 0; i < keep && rc == ISTH_OK; i++) rc = decoder_step(d, window[i], logits);
        }
        window[in_window++] = tok;
        if (rc == ISTH_OK) rc = decoder_step(d, tok, logits);
    }
    isth_free(window);
    isth_free(logits);
    isth_free(scratch);
    return rc;
}
