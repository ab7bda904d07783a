/* eval.c — see eval.h. */
#include "eval.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <mpi.h>
#include <time.h>

#include "clock.h"
#include <string.h>
#include "status.h"

int eval_corpus(Backend *be, Coll *ep, int B, int T, Corpus *c, size_t max_bytes, int vocab, EvalResult *out)
{
    const double t0 = now_s();
    const int G = ep->size, me = ep->rank;
    const size_t size = c->width == 1 && max_bytes && max_bytes < c->n_tokens ? max_bytes : c->n_tokens; /* tokens */
    const size_t predicted = size - 1;
    const size_t windows = (predicted + (size_t)T - 1) / (size_t)T;
    const size_t per_call = (size_t)B * G; /* windows per forward over the learner */
    const size_t calls = (windows + per_call - 1) / per_call;
    int *tokens = isth_malloc((size_t)B * T * sizeof(int));
    int *targets = isth_malloc((size_t)B * T * sizeof(int));
    int *bytes = isth_malloc(sizeof(int) * ((size_t)T + 1)); /* one window and the byte after it */
    float *losses = isth_malloc((size_t)B * T * sizeof(float));
    /* per-window sums: each window is scored by exactly one rank, so the
     * learner-wide sum of this array is exact and the total, added in window
     * order, does not depend on the number of ranks */
    double *window_ce = isth_calloc(windows + 1, sizeof(double));
    size_t *window_n = isth_calloc(windows + 1, sizeof(size_t));
    if (!tokens || !targets || !window_ce || !window_n || !bytes || !losses) {
        isth_free(losses);
        isth_free(bytes);
        isth_free(tokens);
        isth_free(targets);
        isth_free(window_ce);
        isth_free(window_n);
        return isth_fail(ISTH_ERUNTIME, "out of memory for evaluation");
    }
    int rc = ISTH_OK;
    for (size_t call = 0; call < calls && rc == ISTH_OK; call++) {
        const size_t w0 = call * per_call + (size_t)me * B; /* this rank's first window */
        for (int b = 0; b < B && rc == ISTH_OK; b++) {
            const size_t w = w0 + (size_t)b, start = w * (size_t)T;
            const size_t have = w < windows ? (size - start < (size_t)T + 1 ? size - start : (size_t)T + 1) : 0;
            if (have) rc = corpus_tokens(c, start, have, bytes, vocab);
            for (int t = 0; t < T; t++) {
                /* padding: token 0, not scored; causal attention and
                 * capacity-free routing keep it from affecting real bytes */
                const int valid = (size_t)t + 1 < have;
                tokens[(size_t)b * T + t] = valid ? bytes[t] : 0;
                targets[(size_t)b * T + t] = valid ? bytes[t + 1] : -1;
            }
        }
        if (rc != ISTH_OK) break;
        rc = be->ops->score(be, tokens, targets, B, T, losses);
        for (int b = 0; b < B && rc == ISTH_OK; b++) {
            const size_t w = w0 + (size_t)b;
            if (w >= windows) break;
            for (int t = 0; t < T; t++)
                if (targets[(size_t)b * T + t] >= 0) {
                    window_ce[w] += losses[(size_t)b * T + t];
                    window_n[w]++;
                }
        }
    }
    if (rc == ISTH_OK) rc = coll_allreduce_sum_double(ep, window_ce, windows);
    double ce = 0.0;
    size_t counted = 0;
    for (size_t w = 0; w < windows; w++) {
        ce += window_ce[w];
        counted += window_n[w];
    }
    isth_free(losses);
    isth_free(bytes);
    isth_free(tokens);
    isth_free(targets);
    isth_free(window_ce);
    if (rc != ISTH_OK) isth_free(window_n);
    CHECK(rc);
    unsigned long long n_all = counted;
    isth_free(window_n);
    if (G > 1) CHECK(coll_allreduce_comm(ep->comm, &n_all, 1, MPI_UNSIGNED_LONG_LONG, sizeof n_all, MPI_SUM));
    if (n_all != predicted)
        return isth_fail(ISTH_ERUNTIME, "eval %s: scored %llu tokens, expected %zu", c->path, n_all,
                         predicted);
    out->ce_sum = ce;
    out->predicted = predicted;
    out->loss = ce / (double)predicted;
    out->bytes = (double)predicted; /* a byte file; eval_set scales a shard's */
    out->bpb = ce / ((double)predicted * M_LN2);
    out->seconds = now_s() - t0;
    return ISTH_OK;
}

int eval_set(Backend *be, Coll *ep, int B, int T, EvalSet *s, size_t max_bytes, int vocab, EvalResult *out)
{
    CHECK(eval_corpus(be, ep, B, T, &s->file, s->file.width == 1 ? max_bytes : 0, vocab, out));
    if (s->file.width != 1) {
        out->bytes = (double)s->cfg.bytes * (double)out->predicted / (double)s->file.n_tokens;
        out->bpb = out->ce_sum / (out->bytes * M_LN2);
    }
    return ISTH_OK;
}

/* the sets' tokens were checked in this process (they are the config's: the same each time) */
static int tokens_checked;

int eval_sets_open(EvalSet sets[CONFIG_MAX_EVALS], int *n, const Config *cfg, int train_width)
{
    EvalConfig ec[CONFIG_MAX_EVALS];
    const int count = config_eval_sets(cfg, ec);
    *n = 0;
    if (!cfg->n_evals && train_width > 1) return ISTH_OK; /* the bundled byte sets do not measure a token model */
    for (int i = 0; i < count; i++) {
        EvalSet *s = &sets[i];
        memset(s, 0, sizeof *s);
        s->cfg = ec[i];
        s->file.fd = -1;
        char path[CONFIG_FILE_PATH_MAX];
        char key[CONFIG_NAME_MAX + 16];
        snprintf(key, sizeof key, "eval.%.*s.path", CONFIG_NAME_MAX - 1, ec[i].name);
        int rc = data_expand(key, ec[i].path, path, sizeof path);
        if (rc == ISTH_OK) rc = corpus_open(&s->file, cfg->data.dir, path);
        if (rc != ISTH_OK) {
            eval_sets_close(sets, *n);
            return rc;
        }
        (*n)++;
        const Corpus *c = &s->file;
        if (train_width && c->width != train_width)
            rc = isth_fail(ISTH_EINPUT, "[eval.%s] %s holds %s, the training data %s", ec[i].name, c->path,
                           corpus_kind(c->width), corpus_kind(train_width));
        else if (c->width != 1 && ec[i].bytes <= 0)
            rc = isth_fail(ISTH_EINPUT, "[eval.%s] %s holds tokens: give bytes = the bytes of text they stand for "
                           "(bits per byte divides by it)", ec[i].name, c->path);
        else if (c->width == 1 && ec[i].bytes && (size_t)ec[i].bytes != c->size)
            rc = isth_fail(ISTH_EINPUT, "[eval.%s] bytes = %ld, but %s is a byte file of %zu bytes", ec[i].name,
                           ec[i].bytes, c->path, c->size);
        /* every token now, not at the first evaluation (after the training:
         * the training data's are checked as windows read them); a set of
         * the wrong kind for the model is the training data's message. Once
         * per process: a live rejoin opens the same sets again */
        else if (!tokens_checked && data_kind_fits(c->width, cfg->model.vocab))
            rc = corpus_check_tokens(&s->file, cfg->model.vocab);
        if (rc != ISTH_OK) {
            eval_sets_close(sets, *n);
            return rc;
        }
    }
    tokens_checked = 1;
    return ISTH_OK;
}

void eval_sets_close(EvalSet *sets, int n)
{
    for (int i = 0; i < n; i++) corpus_close(&sets[i].file);
}
