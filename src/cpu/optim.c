/* optim.c — see optim.h. */
#include "optim.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

int adamw_create(AdamW *opt, size_t n)
{
    opt->n = n;
    opt->t = 0;
    opt->m = isth_calloc(n, sizeof(float));
    opt->v = isth_calloc(n, sizeof(float));
    if (!opt->m || !opt->v) {
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
}

void adamw_step(AdamW *opt, Model *model, double lr, double weight_decay)
{
    opt->t++;
    const float b1 = (float)ADAM_BETA1, b2 = (float)ADAM_BETA2, eps = (float)ADAM_EPS;
    const float c1 = (float)(1.0 / (1.0 - pow(ADAM_BETA1, (double)opt->t)));
    const float c2 = (float)(1.0 / (1.0 - pow(ADAM_BETA2, (double)opt->t)));
    const float flr = (float)lr;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const float decay = (t->flags & PARAM_DECAY) ? (float)(1.0 - lr * weight_decay) : 1.0f;
        float *p = model->params + t->offset, *g = model->grads + t->offset;
        float *m = opt->m + t->offset, *v = opt->v + t->offset;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < t->numel; j++) {
            float gj = g[j];
            m[j] = b1 * m[j] + (1.0f - b1) * gj;
            v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
            float mh = m[j] * c1, vh = v[j] * c2;
            p[j] = p[j] * decay - flr * mh / (sqrtf(vh) + eps);
        }
    }
}

void sgd_step(Model *model, double lr, double weight_decay)
{
    const float flr = (float)lr;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const float decay = (t->flags & PARAM_DECAY) ? (float)(1.0 - lr * weight_decay) : 1.0f;
        float *p = model->params + t->offset;
        const float *g = model->grads + t->offset;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < t->numel; j++) p[j] = p[j] * decay - flr * g[j];
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
