/* optim.c — see optim.h. */
#include "optim.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

int adamw_create(AdamW *opt, const size_t *off, const size_t *len, int n_runs)
{
    memset(opt, 0, sizeof *opt);
    opt->off = isth_malloc(sizeof(size_t) * (size_t)(n_runs + 1));
    opt->len = isth_malloc(sizeof(size_t) * (size_t)(n_runs + 1));
    opt->packed = isth_malloc(sizeof(size_t) * (size_t)(n_runs + 1));
    if (!opt->off || !opt->len || !opt->packed) {
        adamw_destroy(opt);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the optimizer's runs (%d)", n_runs);
    }
    for (int r = 0; r < n_runs; r++) {
        if (r && off[r] < off[r - 1] + len[r - 1]) {
            adamw_destroy(opt);
            return isth_fail(ISTH_ERUNTIME, "optimizer: run %d (offset %zu) overlaps or precedes run %d", r, off[r],
                             r - 1);
        }
        opt->off[r] = off[r];
        opt->len[r] = len[r];
        opt->packed[r] = opt->n;
        opt->n += len[r];
    }
    opt->n_runs = n_runs;
    opt->m = isth_calloc(opt->n + 1, sizeof(float));
    opt->v = isth_calloc(opt->n + 1, sizeof(float));
    if (!opt->m || !opt->v) {
        const size_t n = opt->n;
        adamw_destroy(opt);
        return isth_fail(ISTH_ERUNTIME, "out of memory for optimizer state (%zu params)", n);
    }
    return ISTH_OK;
}

void adamw_destroy(AdamW *opt)
{
    void *bufs[] = {opt->m, opt->v, opt->off, opt->len, opt->packed};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) isth_free(bufs[i]);
    opt->m = opt->v = NULL;
    opt->off = opt->len = opt->packed = NULL;
    opt->n_runs = 0;
    opt->n = 0;
}

AdamWStep adamw_constants(long t, double lr, double weight_decay, int decays)
{
    AdamWStep k;
    k.b1 = (float)ADAM_BETA1;
    k.b2 = (float)ADAM_BETA2;
    k.eps = (float)ADAM_EPS;
    k.c1 = (float)(1.0 / (1.0 - pow(ADAM_BETA1, (double)t)));
    k.c2 = (float)(1.0 / (1.0 - pow(ADAM_BETA2, (double)t)));
    k.lr = (float)lr;
    k.decay = decays ? (float)(1.0 - lr * weight_decay) : 1.0f;
    return k;
}

int run_in_tensor(const AdamW *opt, int r, const Tensor *t, size_t *j0, size_t *j1)
{
    return run_part_in_tensor(opt->off[r], opt->len[r], t, j0, j1);
}

/* The part of run r inside tensor t: [*j0, *j1) relative to the tensor.
 * Returns 0 when they do not meet. */
int run_part_in_tensor(size_t off, size_t len, const Tensor *t, size_t *j0, size_t *j1)
{
    const size_t a = off > t->offset ? off : t->offset;
    const size_t end = off + len, tend = t->offset + t->numel;
    const size_t b = end < tend ? end : tend;
    if (a >= b) return 0;
    *j0 = a - t->offset;
    *j1 = b - t->offset;
    return 1;
}

void adamw_step(AdamW *opt, Model *model, double lr, double weight_decay)
{
    opt->t++;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const AdamWStep k = adamw_constants(opt->t, lr, weight_decay, t->flags & PARAM_DECAY);
        for (int r = 0; r < opt->n_runs; r++) {
            size_t j0, j1;
            if (!run_in_tensor(opt, r, t, &j0, &j1)) continue;
            float *p = model->params + t->offset + j0, *g = model->grads + t->offset + j0;
            const size_t at = opt->packed[r] + (t->offset + j0 - opt->off[r]);
            float *m = opt->m + at, *v = opt->v + at;
            const size_t n = j1 - j0;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++) adamw_update(&p[j], &m[j], &v[j], g[j], &k);
        }
    }
}

void sgd_step(const AdamW *runs, Model *model, double lr, double weight_decay)
{
    const float flr = (float)lr;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const float decay = (t->flags & PARAM_DECAY) ? (float)(1.0 - lr * weight_decay) : 1.0f;
        for (int r = 0; r < runs->n_runs; r++) {
            size_t j0, j1;
            if (!run_in_tensor(runs, r, t, &j0, &j1)) continue;
            float *p = model->params + t->offset + j0;
            const float *g = model->grads + t->offset + j0;
            const size_t n = j1 - j0;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++) p[j] = p[j] * decay - flr * g[j];
        }
    }
}

double grad_sumsq(const Model *m, unsigned mask, unsigned want) { return state_sumsq(m, m->grads, mask, want); }

double state_sumsq(const Model *m, const float *buf, unsigned mask, unsigned want)
{
    double total = 0.0;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        if ((t->flags & mask) != want) continue;
        const float *g = buf + t->offset;
        enum { CHUNKS = 64 };
        double part[CHUNKS];
#pragma omp parallel for schedule(static)
        for (int c = 0; c < CHUNKS; c++) {
            size_t j0 = t->numel * (size_t)c / CHUNKS, j1 = t->numel * (size_t)(c + 1) / CHUNKS;
            double s = 0.0;
            for (size_t j = j0; j < j1; j++) s += (double)g[j] * g[j];
            part[c] = s;
        }
        for (int c = 0; c < CHUNKS; c++) total += part[c];
    }
    return total;
}

void grad_scale(Model *m, float factor)
{
    float *g = m->grads;
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < m->n_params; j++) g[j] *= factor;
}
