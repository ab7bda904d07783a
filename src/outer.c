/* outer.c — see outer.h. */
#include "outer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

int outer_fragment_due(long step, int p, int H, int P)
{
    return step >= 1 && step % H == (long)p * H / P;
}

int outer_create(Outer *o, const OuterConfig *cfg, const Model *m, double learner_weight)
{
    memset(o, 0, sizeof *o);
    o->streaming = !strcmp(cfg->mode, "streaming");
    o->H = cfg->inner_steps;
    o->P = cfg->fragments;
    o->tau = o->streaming ? cfg->overlap : 0;
    o->lr = cfg->lr;
    o->momentum = cfg->momentum;
    o->alpha = o->streaming ? cfg->merge_alpha : 0.0;
    o->learner_weight = learner_weight;
    o->anchor = malloc(sizeof(float) * m->n_params);
    o->mom = calloc(m->n_params, sizeof(float));
    o->delta = calloc(m->n_params, sizeof(float));
    o->started = malloc(sizeof(long) * (size_t)o->P);
    o->last_sync = calloc((size_t)o->P, sizeof(long));
    if (!o->anchor || !o->mom || !o->delta || !o->started || !o->last_sync) {
        outer_destroy(o);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the outer state");
    }
    memcpy(o->anchor, m->params, sizeof(float) * m->n_params);
    for (int p = 0; p < o->P; p++) o->started[p] = -1;
    return ISTH_OK;
}

void outer_destroy(Outer *o)
{
    free(o->anchor);
    free(o->mom);
    free(o->delta);
    free(o->started);
    free(o->last_sync);
    memset(o, 0, sizeof *o);
}

static int start_fragment(Outer *o, Reducer *r, const Model *m, int p, long step)
{
    const size_t *off, *len;
    int n;
    reduce_fragment_runs(r, p, &off, &len, &n);
    const float w = (float)o->learner_weight;
    for (int i = 0; i < n; i++) {
        const float *a = o->anchor + off[i], *th = m->params + off[i];
        float *d = o->delta + off[i];
        for (size_t j = 0; j < len[i]; j++) d[j] = (a[j] - th[j]) * w;
    }
    o->started[p] = step;
    o->last_sync[p] = step;
    return reduce_start(r, p, o->delta, REDUCE_REPLICATED);
}

/* Finish fragment p, Nesterov step on the anchor, merge into theta. */
static int finish_fragment(Outer *o, Reducer *r, Model *m, int p, long step, double alpha, Metrics *mt, int log)
{
    ReduceReport rep;
    CHECK(reduce_finish(r, p, o->delta, &rep));
    const size_t *off, *len;
    int n;
    reduce_fragment_runs(r, p, &off, &len, &n);
    const float lr = (float)o->lr, mu = (float)o->momentum, a = (float)alpha;
    for (int i = 0; i < n; i++) {
        float *an = o->anchor + off[i], *mo = o->mom + off[i], *th = m->params + off[i];
        const float *d = o->delta + off[i];
        for (size_t j = 0; j < len[i]; j++) {
            mo[j] = mu * mo[j] + d[j];
            an[j] -= lr * (d[j] + mu * mo[j]);
            th[j] = a == 0.0f ? an[j] : a * th[j] + (1.0f - a) * an[j];
        }
    }
    o->outer_steps++;
    if (log) metrics_outer(mt, o->outer_steps, p, o->started[p], step, &rep);
    o->started[p] = -1;
    return ISTH_OK;
}

int outer_after_step(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log)
{
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0 && step - o->started[p] >= o->tau)
            CHECK(finish_fragment(o, r, m, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 && outer_fragment_due(step, p, o->H, o->P)) {
            CHECK(start_fragment(o, r, m, p, step));
            if (o->tau == 0) CHECK(finish_fragment(o, r, m, p, step, o->alpha, mt, log));
        }
    }
    reduce_poll(r);
    return ISTH_OK;
}

int outer_finish(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log)
{
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0) CHECK(finish_fragment(o, r, m, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++)
        if (o->last_sync[p] < step) {
            CHECK(start_fragment(o, r, m, p, step));
            CHECK(finish_fragment(o, r, m, p, step, 0.0, mt, log));
        }
    memcpy(m->params, o->anchor, sizeof(float) * m->n_params);
    return ISTH_OK;
}
