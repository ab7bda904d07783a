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

int outer_in_flight_at(const OuterConfig *cfg, long step)
{
    const int butterfly = cfg->mode_id == MODE_BUTTERFLY;
    const int tau = cfg->mode_id == MODE_STREAMING || butterfly ? cfg->overlap : 0; /* diloco finishes at once */
    for (long s = step - tau + 1; tau > 0 && s <= step; s++) { /* one started at s finishes at s + tau */
        if (s < 1) continue;
        if (butterfly && s % cfg->inner_steps == 0) return 1;
        for (int p = 0; !butterfly && p < cfg->fragments; p++)
            if (outer_fragment_due(s, p, cfg->inner_steps, cfg->fragments)) return 1;
    }
    return 0;
}

int outer_create(Outer *o, const OuterConfig *cfg, Shard *s, Reducer *r, Backend *be, double learner_weight)
{
    memset(o, 0, sizeof *o);
    o->shard = s;
    o->red = r;
    o->mode = cfg->mode_id;
    o->nesterov_mix = cfg->lr != 1.0 || cfg->momentum != 0.0;
    o->H = cfg->inner_steps;
    o->P = cfg->fragments;
    o->tau = o->mode == MODE_STREAMING || o->mode == MODE_BUTTERFLY ? cfg->overlap : 0;
    o->lr = cfg->lr;
    o->momentum = cfg->momentum;
    o->alpha = o->mode == MODE_STREAMING ? cfg->merge_alpha : 0.0;
    o->learner_weight = learner_weight;
    const ChunkTable *ct = &s->table;
    o->off = isth_malloc(sizeof(size_t) * (size_t)o->P);
    o->pos = isth_malloc(sizeof(size_t) * (size_t)ct->n_chunks);
    CHECK_ALLOC(o->off);
    CHECK_ALLOC(o->pos);
    for (int c = 0; c < ct->n_chunks; c++) o->pos[c] = SIZE_MAX;
    size_t largest = 0;
    for (int f = 0; f < o->P; f++) {
        const Owned *own = shard_owned(s, f);
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
    o->pending = isth_calloc((size_t)o->P, sizeof(ExchangeReport));
    o->pending_dist = isth_calloc((size_t)o->P, sizeof(double));
    if (!o->anchor || !o->mom || (o->mode == MODE_BUTTERFLY && !o->sent) || !o->theta || !o->started ||
        !o->last_sync || !o->reduced || !o->pending || !o->pending_dist) {
        outer_destroy(o);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the outer state");
    }
    for (int f = 0; f < o->P; f++) CHECK(shard_get(s, be, f, STATE_PARAMS, o->anchor + o->off[f]));
    for (int p = 0; p < o->P; p++) o->started[p] = -1;
    shard_set_slots(s, outer_max_in_flight(cfg));
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

float *outer_view(const Outer *o, OuterState which, int tensor, int layer, int expert)
{
    const ChunkTable *ct = &o->shard->table;
    const int c = chunk_index(ct, tensor, layer, expert < 0 ? 0 : expert);
    const size_t at = o->pos[c];
    if (at == SIZE_MAX) return NULL;
    const int f = ct->chunks[c].fragment;
    switch (which) {
    case OUTER_ANCHOR: return o->anchor + at;
    case OUTER_MOMENTUM: return o->mom + at;
    case OUTER_SENT: return o->sent ? o->sent + at : o->anchor + at;
    case OUTER_PENDING: {
        float *res = shard_result(o->shard, f);
        return res ? res + (at - o->off[f]) : o->anchor + at;
    }
    }
    return NULL;
}

int outer_view_anchor(Outer *o, Backend *be)
{
    CHECK(be->ops->copy_state(be, STATE_GRADS, STATE_PARAMS));
    for (int f = 0; f < o->P; f++) CHECK(shard_put(o->shard, be, f, STATE_PARAMS, o->anchor + o->off[f]));
    for (int f = 0; f < o->P; f++) CHECK(shard_share_dense(o->shard, be, f, STATE_PARAMS));
    return ISTH_OK;
}

int outer_view_end(Backend *be) { return be->ops->copy_state(be, STATE_PARAMS, STATE_GRADS); }

static int start_fragment(Outer *o, Backend *be, int p, long step)
{
    const Owned *own = shard_owned(o->shard, p);
    float *d = reduce_stage(o->red, p);
    if (!d) return ISTH_ERUNTIME;
    CHECK(shard_get(o->shard, be, p, STATE_PARAMS, d)); /* theta, then the pseudo-gradient in place */
    const float w = (float)o->learner_weight, *a = o->anchor + o->off[p];
    for (size_t j = 0; j < own->size; j++) d[j] = (a[j] - d[j]) * w;
    o->started[p] = step;
    o->last_sync[p] = step;
    return reduce_start_staged(o->red, p);
}

/* Finish fragment p, Nesterov step on the anchor, merge into theta: each
 * rank updates the chunks it owns, then the dense ones are shared inside
 * the learner. */
static int finish_fragment(Outer *o, Backend *be, int p, long step, double alpha, Metrics *mt, int log)
{
    ExchangeReport rep;
    float *d;
    if (o->reduced[p]) { /* completed early by outer_drain */
        rep = o->pending[p];
        d = shard_result(o->shard, p);
    } else {
        CHECK(reduce_finish_staged(o->red, p, &rep, &d));
    }
    o->reduced[p] = 0;
    const size_t n = shard_owned(o->shard, p)->size;
    const float lr = (float)o->lr, mu = (float)o->momentum, a = (float)alpha;
    float *an = o->anchor + o->off[p], *mo = o->mom + o->off[p];
    for (size_t j = 0; j < n; j++) {
        mo[j] = mu * mo[j] + d[j];
        an[j] -= lr * (d[j] + mu * mo[j]);
    }
    shard_release(o->shard, p);
    if (a == 0.0f) { /* theta = anchor */
        CHECK(shard_put(o->shard, be, p, STATE_PARAMS, an));
    } else {
        float *th = o->theta;
        CHECK(shard_get(o->shard, be, p, STATE_PARAMS, th));
        for (size_t j = 0; j < n; j++) th[j] = a * th[j] + (1.0f - a) * an[j];
        CHECK(shard_put(o->shard, be, p, STATE_PARAMS, th));
    }
    CHECK(shard_share_dense(o->shard, be, p, STATE_PARAMS));
    o->outer_steps++;
    if (log) CHECK(metrics_outer(mt, o->outer_steps, p, o->started[p], step, &rep));
    o->started[p] = -1;
    return ISTH_OK;
}

int outer_set_butterfly(Outer *o, Mixer *m, Link *l, int learner, int n_learners, const double *weights)
{
    o->learner = learner;
    o->n_learners = n_learners;
    o->k = 0;
    while ((1 << o->k) < n_learners) o->k++;
    o->weights = isth_malloc(sizeof(double) * (size_t)n_learners);
    CHECK_ALLOC(o->weights);
    memcpy(o->weights, weights, sizeof(double) * (size_t)n_learners);
    o->mix = m;
    CHECK(spread_create(&o->spread, o->shard->topo, o->shard->model, l, weights));
    o->spread.timeout_s = link_timeout(l);
    return ISTH_OK;
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
static int mix_begin(Outer *o, Backend *be, int f, long round, long step, int exact)
{
    const int d = (int)(round % o->k), partner = o->learner ^ (1 << d);
    float *sent = o->sent + o->off[f];
    CHECK(shard_get(o->shard, be, f, STATE_PARAMS, sent));
    o->started[f] = step;
    o->last_sync[f] = step;
    return mix_start(o->mix, f, partner, sent, group_weight(o, o->learner, d), group_weight(o, partner, d), exact);
}

/* Complete round `round`'s exchange of fragment f (the network part); the
 * stop vote rides on its verdicts. A rejected exchange leaves every
 * learner its own values: the result is what was sent. */
static int mix_complete(Outer *o, int f, long round, ExchangeReport *rep, double *dist)
{
    float *mixed;
    int accepted;
    CHECK(mix_finish_staged(o->mix, f, round, rep, dist, &mixed, &accepted));
    if (!accepted) memcpy(mixed, o->sent + o->off[f], sizeof(float) * shard_owned(o->shard, f)->size);
    return ISTH_OK;
}

/* keep_local: add the progress made since the fragment was sent */
static int mix_end(Outer *o, Backend *be, int f, long round, long step, int keep_local, Metrics *mt,
                   int log)
{
    ExchangeReport rep;
    double dist = 0.0;
    if (o->reduced[f]) { /* completed early by outer_drain */
        rep = o->pending[f];
        dist = o->pending_dist[f];
    } else {
        CHECK(mix_complete(o, f, round, &rep, &dist));
    }
    o->reduced[f] = 0;
    const float *mx = shard_result(o->shard, f), *sent = o->sent + o->off[f];
    const size_t n = shard_owned(o->shard, f)->size;
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
    shard_release(o->shard, f);
    /* the target is the anchor just set; keep_local adds the progress since the send */
    if (keep_local) {
        float *th = o->theta;
        CHECK(shard_get(o->shard, be, f, STATE_PARAMS, th));
        for (size_t j = 0; j < n; j++) th[j] = an[j] + (th[j] - sent[j]);
        CHECK(shard_put(o->shard, be, f, STATE_PARAMS, th));
    } else {
        CHECK(shard_put(o->shard, be, f, STATE_PARAMS, an));
    }
    CHECK(shard_share_dense(o->shard, be, f, STATE_PARAMS));
    o->outer_steps++;
    if (log) CHECK(metrics_mix(mt, round, f, rep.partner, rep.crosses, o->started[f], step, &rep, dist));
    o->started[f] = -1;
    return ISTH_OK;
}

static int butterfly_after_step(Outer *o, Backend *be, long step, Metrics *mt, int log)
{
    for (int f = 0; f < o->P; f++)
        if (o->started[f] >= 0 && step - o->started[f] >= o->tau)
            CHECK(mix_end(o, be, f, o->round - 1, step, 1, mt, log));
    if (step % o->H == 0) {
        const long round = step / o->H - 1;
        const int f = butterfly_fragment(round, o->k, o->P);
        CHECK(spread_round(&o->spread, round, step, be, mt));
        CHECK(mix_begin(o, be, f, round, step, 0));
        o->round = round + 1;
        if (o->tau == 0) CHECK(mix_end(o, be, f, round, step, 1, mt, log));
    }
    CHECK(mix_poll(o->mix));
    return spread_poll(&o->spread, mt);
}

int outer_after_step(Outer *o, Backend *be, long step, Metrics *mt, int log)
{
    if (o->mode == MODE_BUTTERFLY) return butterfly_after_step(o, be, step, mt, log);
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0 && step - o->started[p] >= o->tau)
            CHECK(finish_fragment(o, be, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 && outer_fragment_due(step, p, o->H, o->P)) {
            CHECK(start_fragment(o, be, p, step));
            if (o->tau == 0) CHECK(finish_fragment(o, be, p, step, o->alpha, mt, log));
        }
    }
    return reduce_poll(o->red);
}

int outer_drain(Outer *o)
{
    for (int p = 0; p < o->P; p++) {
        if (o->started[p] < 0 || o->reduced[p]) continue;
        if (o->mode == MODE_BUTTERFLY) {
            CHECK(mix_complete(o, p, o->round - 1, &o->pending[p], &o->pending_dist[p]));
        } else {
            float *d;
            CHECK(reduce_finish_staged(o->red, p, &o->pending[p], &d));
        }
        o->reduced[p] = 1;
    }
    return ISTH_OK;
}

int outer_finish(Outer *o, Backend *be, long step, Metrics *mt, int log)
{
    if (o->mode == MODE_BUTTERFLY) {
        for (int f = 0; f < o->P; f++)
            if (o->started[f] >= 0) CHECK(mix_end(o, be, f, o->round - 1, step, 1, mt, log));
        /* k rounds of every fragment without local updates, uncompressed:
         * the exact mean; logged as rounds numbered on from the last
         * regular one */
        long label = o->round;
        for (int f = 0; f < o->P; f++)
            for (int d = 0; d < o->k; d++) {
                CHECK(mix_begin(o, be, f, d, step, 1));
                CHECK(mix_end(o, be, f, label++, step, 0, mt, log));
            }
        for (int f = 0; f < o->P; f++) CHECK(shard_get(o->shard, be, f, STATE_PARAMS, o->anchor + o->off[f]));
        /* every learner got through the final rounds (each under the link's
         * deadline), so every sample was sent: this wait ends */
        return spread_finish(&o->spread, mt);
    }
    for (int p = 0; p < o->P; p++)
        if (o->started[p] >= 0) CHECK(finish_fragment(o, be, p, step, o->alpha, mt, log));
    for (int p = 0; p < o->P; p++)
        if (o->last_sync[p] < step) {
            CHECK(start_fragment(o, be, p, step));
            CHECK(finish_fragment(o, be, p, step, 0.0, mt, log));
        }
    /* theta = anchor: already so for every fragment just finished with alpha 0 */
    for (int f = 0; f < o->P; f++) CHECK(shard_put(o->shard, be, f, STATE_PARAMS, o->anchor + o->off[f]));
    for (int f = 0; f < o->P; f++) CHECK(shard_share_dense(o->shard, be, f, STATE_PARAMS));
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
