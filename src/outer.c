/* outer.c — see outer.h. */
#include "outer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

int butterfly_partner(int learner, long round, int k) { return learner ^ (1 << (int)(round % k)); }
int butterfly_fragment(long round, int k, int P) { return (int)((round / k) % P); }

int outer_fragment_due(long step, int p, int H, int P)
{
    return step >= 1 && step % H == (long)p * H / P;
}

int outer_max_in_flight(const OuterConfig *cfg)
{
    const int H = cfg->inner_steps, P = cfg->fragments;
    /* diloco finishes at once; a butterfly round finishes before the next starts */
    if (cfg->mode_id != MODE_STREAMING) return 1;
    const int tau = cfg->overlap;
    /* the schedule repeats every H steps: count the starts of the last tau+1 steps at its worst */
    int most = 1;
    for (long t = H; t < 2L * H; t++) {
        int n = 0;
        for (long s = t - tau + (tau > 0 ? 1 : 0); s <= t; s++)
            for (int p = 0; p < P; p++) n += outer_fragment_due(s, p, H, P);
        if (n > most) most = n;
    }
    return most < P ? most : P;
}

int outer_create(Outer *o, const OuterConfig *cfg, Reducer *r, Backend *be, double learner_weight)
{
    memset(o, 0, sizeof *o);
    o->mode = cfg->mode_id;
    o->nesterov_mix = cfg->lr != 1.0 || cfg->momentum != 0.0;
    o->H = cfg->inner_steps;
    o->P = cfg->fragments;
    o->tau = o->mode == MODE_STREAMING || o->mode == MODE_BUTTERFLY ? cfg->overlap : 0;
    o->lr = cfg->lr;
    o->momentum = cfg->momentum;
    o->alpha = o->mode == MODE_STREAMING ? cfg->merge_alpha : 0.0;
    o->learner_weight = learner_weight;
    const ChunkTable *ct = &r->table;
    o->off = isth_malloc(sizeof(size_t) * (size_t)o->P);
    o->pos = isth_malloc(sizeof(size_t) * (size_t)ct->n_chunks);
    CHECK_ALLOC(o->off);
    CHECK_ALLOC(o->pos);
    for (int c = 0; c < ct->n_chunks; c++) o->pos[c] = SIZE_MAX;
    size_t largest = 0;
    for (int f = 0; f < o->P; f++) {
        const Owned *own = reduce_owned(r, f);
        o->off[f] = o->owned;
        for (int k = 0; k < own->n; k++) o->pos[own->chunk[k]] = o->owned + own->off[k];
        o->owned += own->size;
        if (own->size > largest) largest = own->size;
    }
    AllocCategory was = alloc_category(ALLOC_OUTER);
    o->anchor = isth_malloc(sizeof(float) * (o->owned + 1));
    o->mom = isth_calloc(o->owned + 1, sizeof(float));
    o->sent = o->mode == MODE_BUTTERFLY ? isth_calloc(o->owned + 1, sizeof(float)) : NULL;
    alloc_category(ALLOC_STAGING);
    o->theta = isth_malloc(sizeof(float) * (largest + 1)); /* one fragment's owned weights, for merges */
    alloc_category(was);
    o->started = isth_malloc(sizeof(long) * (size_t)o->P);
    o->last_sync = isth_calloc((size_t)o->P, sizeof(long));
    o->reduced = isth_calloc((size_t)o->P, sizeof(int));
    o->pending = isth_calloc((size_t)o->P, sizeof(ReduceReport));
    o->pending_dist = isth_calloc((size_t)o->P, sizeof(double));
    if (!o->anchor || !o->mom || (o->mode == MODE_BUTTERFLY && !o->sent) || !o->theta || !o->started ||
        !o->last_sync || !o->reduced || !o->pending || !o->pending_dist) {
        outer_destroy(o);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the outer state");
    }
    for (int f = 0; f < o->P; f++) CHECK(reduce_get_owned(r, be, f, STATE_PARAMS, o->anchor + o->off[f]));
    for (int p = 0; p < o->P; p++) o->started[p] = -1;
    reduce_set_slots(r, outer_max_in_flight(cfg));
    return ISTH_OK;
}

void outer_destroy(Outer *o)
{
    void *bufs[] = {o->anchor, o->mom, o->sent, o->theta, o->off, o->pos, o->started, o->last_sync,
                    o->reduced, o->pending, o->pending_dist, o->weights};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) isth_free(bufs[i]);
    spread_destroy(&o->spread);
    memset(o, 0, sizeof *o);
}

float *outer_view(const Outer *o, const Reducer *r, OuterState which, int tensor, int layer, int expert)
{
    const ChunkTable *ct = &r->table;
    const int c = chunk_index(ct, tensor, layer, expert < 0 ? 0 : expert);
    const size_t at = o->pos[c];
    if (at == SIZE_MAX) return NULL;
    const int f = ct->chunks[c].fragment;
    switch (which) {
    case OUTER_ANCHOR: return o->anchor + at;
    case OUTER_MOMENTUM: return o->mom + at;
    case OUTER_SENT: return o->sent ? o->sent + at : o->anchor + at;
    case OUTER_PENDING: {
        float *res = reduce_result(r, f);
        return res ? res + (at - o->off[f]) : o->anchor + at;
    }
    }
    return NULL;
}

int outer_view_anchor(Outer *o, Reducer *r, Backend *be)
{
    CHECK(be->ops->copy_state(be, STATE_GRADS, STATE_PARAMS));
    for (int f = 0; f < o->P; f++) CHECK(reduce_put_owned(r, be, f, STATE_PARAMS, o->anchor + o->off[f]));
    for (int f = 0; f < o->P; f++) CHECK(reduce_share_dense(r, be, f, STATE_PARAMS));
    return ISTH_OK;
}

int outer_view_end(Backend *be) { return be->ops->copy_state(be, STATE_PARAMS, STATE_GRADS); }

static int start_fragment(Outer *o, Reducer *r, Backend *be, int p, long step)
{
    const Owned *own = reduce_owned(r, p);
    float *d = reduce_stage(r, p);
    if (!d) return ISTH_ERUNTIME;
    CHECK(reduce_get_owned(r, be, p, STATE_PARAMS, d)); /* theta, then the pseudo-gradient in place */
    const float w = (float)o->learner_weight, *a = o->anchor + o->off[p];
    for (size_t j = 0; j < own->size; j++) d[j] = (a[j] - d[j]) * w;
    o->started[p] = step;
    o->last_sync[p] = step;
    return reduce_start_staged(r, p);
}

/* Finish fragment p, Nesterov step on the anchor, merge into theta: each
 * rank updates the chunks it owns, then the dense ones are shared inside
 * the learner. */
static int finish_fragment(Outer *o, Reducer *r, Backend *be, int p, long step, double alpha, Metrics *mt, int log)
{
    ReduceReport rep;
    float *d;
    if (o->reduced[p]) { /* completed early by outer_drain */
        rep = o->pending[p];
        d = reduce_result(r, p);
    } else {
        CHECK(reduce_finish_staged(r, p, &rep, &d));
    }
    o->reduced[p] = 0;
    const size_t n = reduce_owned(r, p)->size;
    const float lr = (float)o->lr, mu = (float)o->momentum, a = (float)alpha;
    float *an = o->anchor + o->off[p], *mo = o->mom + o->off[p];
    for (size_t j = 0; j < n; j++) {
        mo[j] = mu * mo[j] + d[j];
        an[j] -= lr * (d[j] + mu * mo[j]);
    }
    reduce_release(r, p);
    if (a == 0.0f) { /* theta = anchor */
        CHECK(reduce_put_owned(r, be, p, STATE_PARAMS, an));
    } else {
        float *th = o->theta;
        CHECK(reduce_get_owned(r, be, p, STATE_PARAMS, th));
        for (size_t j = 0; j < n; j++) th[j] = a * th[j] + (1.0f - a) * an[j];
        CHECK(reduce_put_owned(r, be, p, STATE_PARAMS, th));
    }
    CHECK(reduce_share_dense(r, be, p, STATE_PARAMS));
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
    CHECK(spread_create(&o->spread, r->topo, r->model, &r->link, weights));
    o->spread.timeout_s = r->link.timeout_s;
    return reduce_enable_mixing(r);
}

int outer_drain_probes(Outer *o, Metrics *mt)
{
    return o->mode == MODE_BUTTERFLY ? spread_finish(&o->spread, mt) : ISTH_OK;
}

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
static int mix_begin(Outer *o, Reducer *r, Backend *be, int f, long round, long step, int exact)
{
    const int d = (int)(round % o->k), partner = o->learner ^ (1 << d);
    float *sent = o->sent + o->off[f];
    CHECK(reduce_get_owned(r, be, f, STATE_PARAMS, sent));
    o->started[f] = step;
    o->last_sync[f] = step;
    return mix_start(r, f, partner, sent, group_weight(o, o->learner, d), group_weight(o, partner, d), exact);
}

/* Complete round `round`'s exchange of fragment f (the network part); the
 * stop vote rides on its verdicts. A rejected exchange leaves every
 * learner its own values: the result is what was sent. */
static int mix_complete(Outer *o, Reducer *r, int f, long round, ReduceReport *rep, double *dist)
{
    if (r->stop_request && r->stop_round < 0) r->stop_round = round; /* raised in this round */
    float *mixed;
    int accepted;
    CHECK(mix_finish_staged(r, f, rep, dist, &mixed, &accepted));
    if (!accepted) memcpy(mixed, o->sent + o->off[f], sizeof(float) * reduce_owned(r, f)->size);
    /* a stop raised in round m has reached every learner after round
     * m + k - 1 (one round per bit): all decide then, at the same step */
    if (r->stop_round >= 0 && round >= r->stop_round + o->k - 1) r->stop_agreed = 1;
    return ISTH_OK;
}

/* keep_local: add the progress made since the fragment was sent */
static int mix_end(Outer *o, Reducer *r, Backend *be, int f, long round, long step, int keep_local, Metrics *mt,
                   int log)
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
    const float *mx = reduce_result(r, f), *sent = o->sent + o->off[f];
    const size_t n = reduce_owned(r, f)->size;
    const float lr = (float)o->lr, mu = (float)o->momentum;
    float *an = o->anchor + o->off[f], *mo = o->mom + o->off[f];
    for (size_t j = 0; j < n; j++) {
        if (o->nesterov_mix && keep_local) { /* Nesterov on the change since the previous mix */
            const float d = an[j] - mx[j];
            mo[j] = mu * mo[j] + d;
            an[j] -= lr * (d + mu * mo[j]);
        } else {
            an[j] = mx[j];
        }
    }
    reduce_release(r, f);
    /* the target is the anchor just set; keep_local adds the progress since the send */
    if (keep_local) {
        float *th = o->theta;
        CHECK(reduce_get_owned(r, be, f, STATE_PARAMS, th));
        for (size_t j = 0; j < n; j++) th[j] = an[j] + (th[j] - sent[j]);
        CHECK(reduce_put_owned(r, be, f, STATE_PARAMS, th));
    } else {
        CHECK(reduce_put_owned(r, be, f, STATE_PARAMS, an));
    }
    CHECK(reduce_share_dense(r, be, f, STATE_PARAMS));
    o->outer_steps++;
    if (log) CHECK(metrics_mix(mt, round, f, rep.partner, rep.crosses, o->started[f], step, &rep, dist));
    o->started[f] = -1;
    return ISTH_OK;
}

static int butterfly_after_step(Outer *o, Reducer *r, Backend *be, long step, Metrics *mt, int log)
{
    for (int f = 0; f < o->P; f++)
        if (o->started[f] >= 0 && step - o->started[f] >= o->tau)
            CHECK(mix_end(o, r, be, f, o->round - 1, step, 1, mt, log));
    if (step % o->H == 0) {
        const long round = step / o->H - 1;
        const int f = butterfly_fragment(round, o->k, o->P);
        CHECK(spread_round(&o->spread, round, step, be, mt));
        CHECK(mix_begin(o, r, be, f, round, step, 0));
        o->round = round + 1;
        if (o->tau == 0) CHECK(mix_end(o, r, be, f, round, step, 1, mt, log));
    }
    CHECK(reduce_poll(r));
    return spread_poll(&o->spread, mt);
}

int outer_after_step(Outer *o, Reducer *r, Backend *be, long step, Metrics *mt, int log)
{
    if (o->mode == MODE_BUTTERFLY) return butterfly_after_step(o, r, be, step, mt, log);
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0 && step - o->started[p] >= o->tau)
            CHECK(finish_fragment(o, r, be, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 && outer_fragment_due(step, p, o->H, o->P)) {
            CHECK(start_fragment(o, r, be, p, step));
            if (o->tau == 0) CHECK(finish_fragment(o, r, be, p, step, o->alpha, mt, log));
        }
    }
    return reduce_poll(r);
}

int outer_drain(Outer *o, Reducer *r)
{
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 || o->reduced[p]) continue;
        if (o->mode == MODE_BUTTERFLY) {
            CHECK(mix_complete(o, r, p, o->round - 1, &o->pending[p], &o->pending_dist[p]));
        } else {
            float *d;
            CHECK(reduce_finish_staged(r, p, &o->pending[p], &d));
        }
        o->reduced[p] = 1;
    }
    return ISTH_OK;
}

int outer_finish(Outer *o, Reducer *r, Backend *be, long step, Metrics *mt, int log)
{
    if (o->mode == MODE_BUTTERFLY) {
        for (int f = 0; f < o->P; f++)
            if (o->started[f] >= 0) CHECK(mix_end(o, r, be, f, o->round - 1, step, 1, mt, log));
        /* k rounds of every fragment without local updates, uncompressed:
         * the exact mean; logged as rounds numbered on from the last
         * regular one */
        long label = o->round;
        for (int f = 0; f < o->P; f++)
            for (int d = 0; d < o->k; d++) {
                CHECK(mix_begin(o, r, be, f, d, step, 1));
                CHECK(mix_end(o, r, be, f, label++, step, 0, mt, log));
            }
        for (int f = 0; f < o->P; f++) CHECK(reduce_get_owned(r, be, f, STATE_PARAMS, o->anchor + o->off[f]));
        /* every learner got through the final rounds (each under the link's
         * deadline), so every sample was sent: this wait ends */
        return spread_finish(&o->spread, mt);
    }
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0) CHECK(finish_fragment(o, r, be, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++)
        if (o->last_sync[p] < step) {
            CHECK(start_fragment(o, r, be, p, step));
            CHECK(finish_fragment(o, r, be, p, step, 0.0, mt, log));
        }
    /* theta = anchor: already so for every fragment just finished with alpha 0 */
    for (int f = 0; f < o->P; f++) CHECK(reduce_put_owned(r, be, f, STATE_PARAMS, o->anchor + o->off[f]));
    for (int f = 0; f < o->P; f++) CHECK(reduce_share_dense(r, be, f, STATE_PARAMS));
    return ISTH_OK;
}

void outer_restore(Outer *o, const double *last_sync, const double *started, int n_sites, long step, long outer_steps)
{
    o->outer_steps = outer_steps;
    for (int p = 0; p < o->P; p++) {
        o->last_sync[p] = (long)last_sync[p];
        o->started[p] = (long)started[p];
        o->reduced[p] = o->started[p] >= 0; /* drained before the checkpoint */
        memset(&o->pending[p], 0, sizeof o->pending[p]);
        o->pending[p].fragment = p;
        o->pending[p].n_sites = o->pending[p].accepted_sites = n_sites;
        o->pending[p].arrived_poll = -1;
    }
    if (o->mode == MODE_BUTTERFLY) o->round = step / o->H; /* rounds started by this step */
}
