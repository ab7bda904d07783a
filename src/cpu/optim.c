/* optim.c — see optim.h. */
#include "optim.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

int param_runs_create(ParamRuns *r, const size_t *off, const size_t *len, int n)
{
    memset(r, 0, sizeof *r);
    r->off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    r->len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    r->packed = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    if (!r->off || !r->len || !r->packed) {
        param_runs_destroy(r);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the optimizer's runs (%d)", n);
    }
    for (int i = 0; i < n; i++) {
        if (i && off[i] < off[i - 1] + len[i - 1]) {
            param_runs_destroy(r);
            return isth_fail(ISTH_ERUNTIME, "optimizer: run %d (offset %zu) overlaps or precedes run %d", i, off[i],
                             i - 1);
        }
        r->off[i] = off[i];
        r->len[i] = len[i];
        r->packed[i] = r->total;
        r->total += len[i];
    }
    r->n = n;
    return ISTH_OK;
}

void param_runs_destroy(ParamRuns *r)
{
    isth_free(r->off);
    isth_free(r->len);
    isth_free(r->packed);
    memset(r, 0, sizeof *r);
}

int adamw_create(AdamW *opt, const size_t *off, const size_t *len, int n_runs)
{
    memset(opt, 0, sizeof *opt);
    CHECK(param_runs_create(&opt->runs, off, len, n_runs));
    opt->m = isth_calloc(opt->runs.total + 1, sizeof(float));
    opt->v = isth_calloc(opt->runs.total + 1, sizeof(float));
    if (!opt->m || !opt->v) {
        const size_t n = opt->runs.total;
        adamw_destroy(opt);
        return isth_fail(ISTH_ERUNTIME, "out of memory for optimizer state (%zu params)", n);
    }
    return ISTH_OK;
}

void adamw_destroy(AdamW *opt)
{
    isth_free(opt->m);
    isth_free(opt->v);
    opt->m = opt->v = NULL;
    param_runs_destroy(&opt->runs);
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

int run_segment(const ParamRuns *runs, int r, const Tensor *t, size_t *param, size_t *packed, size_t *n)
{
    const size_t a = runs->off[r] > t->offset ? runs->off[r] : t->offset;
    const size_t end = runs->off[r] + runs->len[r], tend = t->offset + t->numel;
    const size_t b = end < tend ? end : tend;
    if (a >= b) return 0;
    *param = a;
    *packed = runs->packed[r] + (a - runs->off[r]);
    *n = b - a;
    return 1;
}

void adamw_step(AdamW *opt, Model *model, double lr, double weight_decay)
{
    opt->t++;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const AdamWStep k = adamw_constants(opt->t, lr, weight_decay, t->flags & PARAM_DECAY);
        for (int r = 0; r < opt->runs.n; r++) {
            size_t at, packed, n;
            if (!run_segment(&opt->runs, r, t, &at, &packed, &n)) continue;
            float *p = model->params + at, *g = model->grads + at, *m = opt->m + packed, *v = opt->v + packed;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++) adamw_update(&p[j], &m[j], &v[j], g[j], &k);
        }
    }
}

void sgd_step(const ParamRuns *runs, Model *model, double lr, double weight_decay)
{
    const float flr = (float)lr;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const float decay = (t->flags & PARAM_DECAY) ? (float)(1.0 - lr * weight_decay) : 1.0f;
        for (int r = 0; r < runs->n; r++) {
            size_t at, packed, n;
            if (!run_segment(runs, r, t, &at, &packed, &n)) continue;
            float *p = model->params + at;
            const float *g = model->grads + at;
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
