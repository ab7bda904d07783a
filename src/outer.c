/* outer.c — see outer.h. */
#include "outer.h"
#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

int butterfly_partner(int learner, long round, int k) { return learner ^ (1 << (int)(round % k)); }
int butterfly_fragment(long round, int k, int P) { return (int)((round / k) % P); }

int outer_fragment_due(long step, int p, int H, int P)
{
    return step >= 1 && step % H == (long)p * H / P;
}

int outer_create(Outer *o, const OuterConfig *cfg, const Model *m, double learner_weight)
{
    memset(o, 0, sizeof *o);
    o->streaming = !strcmp(cfg->mode, "streaming");
    o->butterfly = !strcmp(cfg->mode, "butterfly");
    o->outer_step = cfg->lr != 1.0 || cfg->momentum != 0.0;
    o->H = cfg->inner_steps;
    o->P = cfg->fragments;
    o->tau = o->streaming || o->butterfly ? cfg->overlap : 0;
    o->lr = cfg->lr;
    o->momentum = cfg->momentum;
    o->alpha = o->streaming ? cfg->merge_alpha : 0.0;
    o->learner_weight = learner_weight;
    o->anchor = isth_malloc(sizeof(float) * m->n_params);
    o->mom = isth_calloc(m->n_params, sizeof(float));
    o->delta = isth_calloc(m->n_params, sizeof(float));
    o->started = isth_malloc(sizeof(long) * (size_t)o->P);
    o->sent = isth_calloc(m->n_params, sizeof(float));
    o->last_sync = isth_calloc((size_t)o->P, sizeof(long));
    o->reduced = isth_calloc((size_t)o->P, sizeof(int));
    o->pending = isth_calloc((size_t)o->P, sizeof(ReduceReport));
    o->pending_dist = isth_calloc((size_t)o->P, sizeof(double));
    if (!o->anchor || !o->mom || !o->delta || !o->started || !o->last_sync || !o->sent || !o->reduced || !o->pending ||
        !o->pending_dist) {
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
    free(o->reduced);
    free(o->pending);
    free(o->pending_dist);
    free(o->sent);
    free(o->weights);
    spread_destroy(&o->spread);
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
    if (o->reduced[p]) rep = o->pending[p]; /* completed early by outer_drain */
    else CHECK(reduce_finish(r, p, o->delta, &rep));
    o->reduced[p] = 0;
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
    if (log) CHECK(metrics_outer(mt, o->outer_steps, p, o->started[p], step, &rep));
    o->started[p] = -1;
    return ISTH_OK;
}

int outer_set_butterfly(Outer *o, Reducer *r, int learner, int n_learners, const double *weights)
{
    o->learner = learner;
    o->n_learners = n_learners;
    o->k = 0;
    while ((1 << o->k) < n_learners) o->k++;
    o->weights = isth_malloc(sizeof(double) * (size_t)n_learners);
    CHECK_ALLOC(o->weights);
    memcpy(o->weights, weights, sizeof(double) * (size_t)n_learners);
    CHECK(spread_create(&o->spread, r->topo, r->model, r->world, weights));
    o->spread.timeout_s = r->link.timeout_s;
    return reduce_enable_mixing(r);
}

int outer_drain_probes(Outer *o, Metrics *mt) { return o->butterfly ? spread_finish(&o->spread, mt) : ISTH_OK; }

/* Tokens behind learner i's value before the round on dimension d of a
 * cycle: its subcube of learners agreeing on bits >= d. */
static double group_weight(const Outer *o, int i, int d)
{
    double w = 0.0;
    for (int j = 0; j < o->n_learners; j++)
        if ((j >> d) == (i >> d)) w += o->weights[j];
    return w;
}

/* exact: the final averaging, uncompressed (see mix_start) */
static int mix_begin(Outer *o, Reducer *r, const Model *m, int f, long round, long step, int exact)
{
    const int d = (int)(round % o->k), partner = o->learner ^ (1 << d);
    const size_t *off, *len;
    int n;
    reduce_fragment_runs(r, f, &off, &len, &n);
    for (int i = 0; i < n; i++) {
        memcpy(o->sent + off[i], m->params + off[i], len[i] * sizeof(float));
        memcpy(o->delta + off[i], m->params + off[i], len[i] * sizeof(float));
    }
    o->started[f] = step;
    o->last_sync[f] = step;
    return mix_start(r, f, partner, o->delta, group_weight(o, o->learner, d), group_weight(o, partner, d), exact);
}

/* keep_local: add the progress made since the fragment was sent */
/* Complete round `round`'s exchange of fragment f (the network part); the
 * stop vote rides on its verdicts. */
static int mix_complete(Outer *o, Reducer *r, int f, long round, ReduceReport *rep, double *dist)
{
    if (r->stop_request && r->stop_round < 0) r->stop_round = round; /* raised in this round */
    CHECK(mix_finish(r, f, o->delta, rep, dist));
    /* a stop raised in round m has reached every learner after round
     * m + k - 1 (one round per bit): all decide then, at the same step */
    if (r->stop_round >= 0 && round >= r->stop_round + o->k - 1) r->stop_agreed = 1;
    return ISTH_OK;
}

static int mix_end(Outer *o, Reducer *r, Model *m, int f, long round, long step, int keep_local, Metrics *mt, int log)
{
    ReduceReport rep;
    double dist = 0.0;
    if (o->reduced[f]) { /* completed early by outer_drain */
        rep = o->pending[f];
        dist = o->pending_dist[f];
    } else {
        CHECK(mix_complete(o, r, f, round, &rep, &dist));
    }
    o->reduced[f] = 0;
    const size_t *off, *len;
    int n;
    reduce_fragment_runs(r, f, &off, &len, &n);
    const float lr = (float)o->lr, mu = (float)o->momentum;
    for (int i = 0; i < n; i++) {
        float *an = o->anchor + off[i], *mo = o->mom + off[i], *th = m->params + off[i];
        const float *mixed = o->delta + off[i], *sent = o->sent + off[i];
        for (size_t j = 0; j < len[i]; j++) {
            float target = mixed[j];
            if (o->outer_step && keep_local) { /* Nesterov on the change since the previous mix */
                const float d = an[j] - mixed[j];
                mo[j] = mu * mo[j] + d;
                an[j] -= lr * (d + mu * mo[j]);
                target = an[j];
            } else {
                an[j] = mixed[j];
            }
            th[j] = keep_local ? target + (th[j] - sent[j]) : target;
        }
    }
    o->outer_steps++;
    if (log) CHECK(metrics_mix(mt, round, f, rep.partner, rep.crosses, o->started[f], step, &rep, dist));
    o->started[f] = -1;
    return ISTH_OK;
}

static int butterfly_after_step(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log)
{
    for (int f = 0; f < o->P; f++)
        if (o->started[f] >= 0 && step - o->started[f] >= o->tau)
            CHECK(mix_end(o, r, m, f, o->round - 1, step, 1, mt, log));
    if (step % o->H == 0) {
        const long round = step / o->H - 1;
        const int f = butterfly_fragment(round, o->k, o->P);
        CHECK(spread_round(&o->spread, round, step, m->params, mt));
        CHECK(mix_begin(o, r, m, f, round, step, 0));
        o->round = round + 1;
        if (o->tau == 0) CHECK(mix_end(o, r, m, f, round, step, 1, mt, log));
    }
    CHECK(reduce_poll(r));
    return spread_poll(&o->spread, mt);
}

int outer_after_step(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log)
{
    if (o->butterfly) return butterfly_after_step(o, r, m, step, mt, log);
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0 && step - o->started[p] >= o->tau)
            CHECK(finish_fragment(o, r, m, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 && outer_fragment_due(step, p, o->H, o->P)) {
            CHECK(start_fragment(o, r, m, p, step));
            if (o->tau == 0) CHECK(finish_fragment(o, r, m, p, step, o->alpha, mt, log));
        }
    }
    return reduce_poll(r);
}

int outer_drain(Outer *o, Reducer *r, Model *m)
{
    (void)m;
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 || o->reduced[p]) continue;
        if (o->butterfly) CHECK(mix_complete(o, r, p, o->round - 1, &o->pending[p], &o->pending_dist[p]));
        else CHECK(reduce_finish(r, p, o->delta, &o->pending[p]));
        o->reduced[p] = 1;
    }
    return ISTH_OK;
}

int outer_finish(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log)
{
    if (o->butterfly) {
        for (int f = 0; f < o->P; f++)
            if (o->started[f] >= 0) CHECK(mix_end(o, r, m, f, o->round - 1, step, 1, mt, log));
        /* k rounds of every fragment without local updates, uncompressed:
         * the exact mean; logged as rounds numbered on from the last
         * regular one */
        long label = o->round;
        for (int f = 0; f < o->P; f++)
            for (int d = 0; d < o->k; d++) {
                CHECK(mix_begin(o, r, m, f, d, step, 1));
                CHECK(mix_end(o, r, m, f, label++, step, 0, mt, log));
            }
        memcpy(o->anchor, m->params, sizeof(float) * m->n_params);
        /* every learner got through the final rounds (each under the link's
         * deadline), so every sample was sent: this wait ends */
        return spread_finish(&o->spread, mt);
    }
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
