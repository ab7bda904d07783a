/* mix.c — butterfly mixing (see reduce.h): pairwise exchanges of one
 * fragment between two learners, point-to-point on canonical chunk plans. */
#include "reduce.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "status.h"

/* A pair verdict: one byte "accepted", then the earliest round in which a
 * learner asked to stop (int64, INT64_MAX: none). */
#define PAIR_VERDICT_BYTES (1 + sizeof(int64_t))

static PairPlan *plan_at(const Reducer *r, int f, int d, int exact)
{
    return &r->pairs[((size_t)f * r->pair_bits + d) * 2 + (exact != 0)];
}

static int build_pair(Reducer *r, int f, int d, int exact)
{
    const Topology *t = r->topo;
    PairPlan *pp = plan_at(r, f, d, exact);
    const int partner = t->learner ^ (1 << d);
    int first, G;
    topology_learner_ranks(t, partner, &first, &G);
    pp->partner = partner;
    pp->fragment = f;
    pp->crosses = topology_site_of_learner(t, partner) != t->site;
    pp->codec = exact ? CODEC_NONE : r->codec;
    CHECK(peers_add(&pp->peers, &r->table, &r->frag[f].own, G, first, topology_site_of_learner(t, partner), f,
                    pp->codec, r->cp, LINK_PAIR_VALUES, PAIR_VERDICT_BYTES, !pp->crosses));
    return peers_index(&pp->peers);
}

int reduce_enable_mixing(Reducer *r)
{
    const Topology *t = r->topo;
    int k = 0;
    while ((1 << k) < t->n_learners) k++;
    r->pair_bits = k;
    r->pairs = isth_calloc((size_t)r->fragments * (k ? k : 1) * 2, sizeof(PairPlan));
    r->mix_residual = isth_calloc((size_t)r->fragments, sizeof(float *));
    CHECK_ALLOC(r->pairs);
    CHECK_ALLOC(r->mix_residual);
    for (int f = 0; f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        /* butterfly exchanges no site sums: those plans and residuals go */
        peers_free(&fp->site);
        isth_free(fp->residual);
        fp->residual = NULL;
        for (int d = 0; d < k; d++) {
            CHECK(build_pair(r, f, d, 0));
            CHECK(build_pair(r, f, d, 1));
        }
        if (r->error_feedback) {
            const AllocCategory was = alloc_category(ALLOC_RESIDUAL);
            r->mix_residual[f] = isth_calloc(fp->own.size + 1, sizeof(float));
            alloc_category(was);
            CHECK_ALLOC(r->mix_residual[f]);
        }
    }
    return ISTH_OK;
}

static PairPlan *pair_plan(const Reducer *r, int f, int partner, int exact)
{
    if (!r->pairs) return NULL;
    for (int d = 0; d < r->pair_bits; d++)
        if ((r->topo->learner ^ (1 << d)) == partner) return plan_at(r, f, d, exact);
    return NULL;
}

static PairPlan *pair_in_flight(const Reducer *r, int f)
{
    if (!r->pairs) return NULL;
    for (int i = 0; i < 2 * r->pair_bits; i++)
        if (r->pairs[(size_t)f * r->pair_bits * 2 + i].in_flight) return &r->pairs[(size_t)f * r->pair_bits * 2 + i];
    return NULL;
}


int mix_start(Reducer *r, int f, int partner, const float *values, double w_me, double w_partner, int exact)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
    PairPlan *pp = pair_plan(r, f, partner, exact);
    if (!pp) return isth_fail(ISTH_ERUNTIME, "butterfly: cannot plan fragment %d with learner %d", f, partner);
    if (pair_in_flight(r, f) || fp->slot) return isth_fail(ISTH_ERUNTIME, "butterfly: fragment %d mixed twice at once", f);
    fp->slot = reduce_take_slot(r, f);
    if (!fp->slot) return ISTH_ERUNTIME;
    pp->in_flight = 1;
    pp->polls = 0;
    pp->arrived_poll = -1;
    pp->w_me = w_me;
    pp->w_them = w_partner;
    pp->err2 = pp->norm2 = 0.0;
    pp->exchange = ++r->exchanges;
    float *mine = fp->slot->values;
    Encoded enc = {pp->codec, fp->slot->enc, fp->own.enc_off};
    if (pp->codec != r->codec) { /* exact: the values as they are, no error feedback */
        memcpy(mine, values, sizeof(float) * fp->own.size);
        for (size_t e = 0; e < fp->own.size; e++) pp->norm2 += (double)mine[e] * mine[e];
        enc = (Encoded){CODEC_NONE, (const unsigned char *)mine, fp->raw_off};
    } else {
        /* the codec with error feedback (codec none keeps no residual, so an
         * exact round here sends the values as they are) */
        float *res = !exact && r->mix_residual ? r->mix_residual[f] : NULL;
        for (int k = 0; k < fp->own.n; k++) {
            const size_t n = r->table.chunks[fp->own.chunk[k]].size;
            double e2, n2;
            CHECK(reduce_encode_chunk(r, values + fp->own.off[k], res ? res + fp->own.off[k] : NULL, n,
                                      fp->slot->enc + fp->own.enc_off[k], mine + fp->own.off[k], &e2, &n2));
            pp->err2 += e2;
            pp->norm2 += n2;
        }
    }
    /* both partners number their exchanges alike: learner rounds are in step */
    peers_bind(&pp->peers, fp->slot);
    const int corrupt = r->link.corrupt_exchange && (uint64_t)r->link.corrupt_exchange == pp->exchange;
    return peers_post(&r->link, &r->table, &fp->own, enc, &pp->peers, r->cp, LINK_PAIR_VALUES, f,
                      (uint32_t)t->learner, pp->exchange, 1, corrupt);
}

int mix_poll(Reducer *r)
{
    for (int f = 0; f < r->fragments; f++) {
        PairPlan *pp = pair_in_flight(r, f);
        if (!pp) continue;
        pp->polls++;
        int arrived = 0;
        if (pp->arrived_poll < 0) {
            arrived = 1;
            if (pp->peers.n) CHECK(link_test(&r->link, pp->peers.links, pp->peers.n, &arrived));
        }
        if (arrived) pp->arrived_poll = pp->polls;
    }
    return ISTH_OK;
}

int mix_finish_staged(Reducer *r, int f, ReduceReport *rep, double *pair_distance, float **mixed, int *accepted)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
    PairPlan *pp = pair_in_flight(r, f);
    if (!pp) return isth_fail(ISTH_ERUNTIME, "butterfly: fragment %d finished but not started", f);
    memset(rep, 0, sizeof *rep);
    rep->fragment = f;
    rep->exchange = pp->exchange;
    rep->arrived_poll = pp->arrived_poll;
    rep->partner = pp->partner;
    rep->crosses = pp->crosses;
    rep->codec = pp->codec;
    rep->n_sites = 2;
    /* the federated launch: a partner on a lost site, or one that misses
     * the deadline, is skipped (this learner keeps its own values) */
    const int psite = topology_site_of_learner(t, pp->partner);
    unsigned char alive[2] = {1, !r->link.lost[psite]}; /* {ok, partner alive} */
    double waited = 0.0;
    int rc = ISTH_OK;
    reduce_abandon_lost(r, f, &pp->peers); /* the partner's site was lost after mix_start */
    if (pp->peers.n && alive[1]) {
        unsigned char *late = isth_calloc((size_t)pp->peers.n, 1);
        rc = late ? link_wait_live(&r->link, pp->peers.links, pp->peers.n, "butterfly exchange", late, &waited)
                  : isth_fail(ISTH_ERUNTIME, "butterfly: out of memory");
        for (int i = 0; late && i < pp->peers.n; i++)
            if (late[i]) alive[1] = 0;
        isth_free(late);
    }
    pp->in_flight = 0;
    fp->has_result = 1;
    if (r->max_peer_learners < 1) r->max_peer_learners = 1; /* the partner, nobody else */
    CHECK(rc);
    float *mine = fp->slot->values, *theirs = mine + r->pool.size;
    *mixed = mine;
    unsigned char ok = alive[1];
    const char *why = alive[1] ? NULL : "partner's site lost";
    for (int i = 0; i < pp->peers.n && alive[1]; i++) {
        const char *bad = peer_take(&r->link, &r->table, &fp->own, pp->codec, r->cp, &pp->peers.peers[i], LINK_PAIR_VALUES, f,
                                    pp->exchange, theirs);
        if (bad) {
            ok = 0;
            why = bad;
        }
    }
    /* agree inside my learner, then with the partner learner, then again;
     * the earliest stop round either side knows of rides along */
    alive[0] = ok;
    CHECK(coll_allreduce_comm(t->learner_comm, alive, 2, MPI_UNSIGNED_CHAR, 1, MPI_MIN));
    ok = alive[0];
    int64_t stop = r->stop_round < 0 ? INT64_MAX : (int64_t)r->stop_round;
    for (int i = 0; i < pp->peers.n && alive[1]; i++) {
        Peer *p = &pp->peers.peers[i];
        p->verdict.send[sizeof(LinkHeader)] = ok;
        memcpy(p->verdict.send + sizeof(LinkHeader) + 1, &stop, sizeof stop);
        link_frame(&r->link, p->world_rank, p->verdict.send, 0, LINK_PAIR_VERDICT, (uint32_t)f, (uint32_t)t->learner, pp->exchange,
                   PAIR_VERDICT_BYTES, PAIR_VERDICT_BYTES);
        p->verdict.send_posted = 0;
        CHECK(link_post_recv(&r->link, &p->verdict));
        CHECK(link_post_send(&r->link, &p->verdict));
    }
    if (pp->peers.n && alive[1]) {
        unsigned char *late = isth_calloc((size_t)pp->peers.n, 1);
        double vwait = 0.0;
        rc = late ? link_wait_live(&r->link, pp->peers.links + pp->peers.n, pp->peers.n, "butterfly verdict", late,
                                   &vwait)
                  : isth_fail(ISTH_ERUNTIME, "butterfly: out of memory");
        for (int i = 0; late && i < pp->peers.n; i++)
            if (late[i]) alive[1] = 0;
        if (vwait > waited) waited = vwait;
        isth_free(late);
        CHECK(rc);
        if (!alive[1]) {
            ok = 0;
            why = "partner's site lost";
        }
    }
    for (int i = 0; i < pp->peers.n && alive[1]; i++) {
        const LinkMsg *v = &pp->peers.peers[i].verdict;
        const char *bad = link_check(&r->link, pp->peers.peers[i].world_rank, v->recv, v->recv_bytes, LINK_PAIR_VERDICT, (uint32_t)f, pp->exchange,
                                     PAIR_VERDICT_BYTES, PAIR_VERDICT_BYTES);
        if (bad) /* the partners would disagree on the result: the run cannot go on */
            return isth_fail(ISTH_ERUNTIME, "link: butterfly verdict from world rank %d unreadable: %s",
                             pp->peers.peers[i].world_rank, bad);
        if (!v->recv[sizeof(LinkHeader)]) ok = 0;
        int64_t other;
        memcpy(&other, v->recv + sizeof(LinkHeader) + 1, sizeof other);
        if (other < stop) stop = other;
    }
    alive[0] = ok;
    CHECK(coll_allreduce_comm(t->learner_comm, alive, 2, MPI_UNSIGNED_CHAR, 1, MPI_MIN));
    ok = alive[0] && alive[1];
    if (!alive[1]) { /* what the waits gave up on: stuck messages renew the slot */
        for (int i = 0; i < pp->peers.n; i++) {
            Peer *p = &pp->peers.peers[i];
            if (p->msg.stuck || p->verdict.stuck) fp->slot_stuck = 1;
            p->msg.stuck = p->verdict.stuck = 0;
        }
    }
    CHECK(coll_allreduce_comm(t->learner_comm, &stop, 1, MPI_INT64_T, sizeof stop, MPI_MIN));
    if (r->link.survive && t->n_sites > 1) { /* the whole site agrees on who is lost */
        unsigned char present[CONFIG_MAX_SITES];
        for (int s = 0; s < t->n_sites; s++) present[s] = !r->link.lost[s];
        if (!alive[1]) present[psite] = 0;
        double w = waited;
        CHECK(coll_allreduce_comm(t->site_comm, present, (size_t)t->n_sites, MPI_UNSIGNED_CHAR, 1, MPI_MIN));
        int any_gone = 0; /* the same on every rank of the site */
        for (int s = 0; s < t->n_sites; s++) any_gone |= !present[s] && !r->link.lost[s];
        if (any_gone) CHECK(coll_allreduce_comm(t->site_comm, &w, 1, MPI_DOUBLE, sizeof w, MPI_MAX));
        for (int s = 0; s < t->n_sites; s++)
            if (!present[s] && s != t->site) {
                char what[64];
                snprintf(what, sizeof what, "butterfly exchange %llu (fragment %d)", (unsigned long long)pp->exchange, f);
                link_mark_lost(&r->link, s, what, w);
            }
    }
    r->stop_round = stop == INT64_MAX ? -1 : (long)stop;
    rep->accepted_sites = ok ? 2 : 1;
    if (!ok) snprintf(rep->rejected, sizeof rep->rejected, "learner %d: %s",
                      why && alive[1] ? t->learner : pp->partner, why ? why : "rejected by the partner");
    /* distance between the partners before mixing (my owned part) */
    const size_t n = fp->own.size;
    double d2 = 0.0, n2 = 0.0;
    for (size_t i = 0; i < n && alive[1]; i++) { /* no partner values: no distance */
        double d = (double)mine[i] - theirs[i];
        d2 += d * d;
        n2 += (double)mine[i] * mine[i];
    }
    struct {
        PayloadSums payload;
        double dist2, norm2; /* the pair's distance and my values' energy */
    } sums = {{0.0, pp->err2, pp->norm2}, d2, n2};
    for (int i = 0; i < pp->peers.n; i++) sums.payload.bytes += (double)pp->peers.peers[i].msg.send_bytes;
    const size_t n_sums = sizeof sums / sizeof(double);
    CHECK(coll_allreduce_comm(t->learner_comm, &sums, n_sums, MPI_DOUBLE, sizeof(double), MPI_SUM));
    rep->payload_bytes = sums.payload.bytes;
    rep->codec_rel_error = sums.payload.norm2 > 0 ? sqrt(sums.payload.err2 / sums.payload.norm2) : 0.0;
    if (pair_distance) *pair_distance = sums.norm2 > 0 ? sqrt(sums.dist2 / sums.norm2) : 0.0;
    *accepted = ok;
    if (!ok) return ISTH_OK; /* both learners keep their own values */
    const int me_first = t->learner < pp->partner;
    const double w_lo = me_first ? pp->w_me : pp->w_them, w_hi = me_first ? pp->w_them : pp->w_me;
    const float a = (float)(w_lo / (w_lo + w_hi)), b = (float)(w_hi / (w_lo + w_hi));
    const float *lo = me_first ? mine : theirs, *hi = me_first ? theirs : mine;
    for (size_t e = 0; e < n; e++) mine[e] = a * lo[e] + b * hi[e]; /* in place, element by element */
    return ISTH_OK;
}

int mix_finish(Reducer *r, int f, float *values, ReduceReport *rep, double *pair_distance)
{
    float *mixed;
    int accepted;
    CHECK(mix_finish_staged(r, f, rep, pair_distance, &mixed, &accepted));
    if (accepted) memcpy(values, mixed, sizeof(float) * r->frag[f].own.size);
    reduce_release(r, f);
    return ISTH_OK;
}
