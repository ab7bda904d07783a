/* mix.c — see mix.h: pairwise exchanges of one fragment between two
 * learners, point-to-point on canonical chunk plans. */
#include "mix.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "status.h"

/* A pair verdict: one byte "accepted", then the earliest round in which a
 * learner asked to stop (int64, INT64_MAX: none), the sites that asked in
 * that round and which of them asked to end (uint64 each, bit s: site s),
 * then the learner's progress table (progress.h: every site's newest
 * summary it knows, its own site's included). Pairs pass the table on, so
 * every site's summary reaches every learner within a cycle of rounds,
 * also a learner whose partners are all on its own site. */
#define PAIR_HEAD_BYTES (1 + 3 * sizeof(int64_t))
#define PAIR_VERDICT_BYTES(S) (PAIR_HEAD_BYTES + PROGRESS_BYTES * (size_t)(S))

/* Two views of the stop vote combined: the earlier round wins with its
 * sites; in the same round the sites add up (every site that asked in the
 * earliest round reaches every learner with it). */
static void vote_merge(int64_t *round, uint64_t *sites, uint64_t *ends, int64_t o_round, uint64_t o_sites,
                       uint64_t o_ends)
{
    if (o_round < *round) *round = o_round, *sites = o_sites, *ends = o_ends;
    else if (o_round == *round) *sites |= o_sites, *ends |= o_ends;
}

static PairPlan *plan_at(const Mixer *m, int f, int d, int exact)
{
    return &m->pairs[((size_t)f * m->pair_bits + d) * 2 + (exact != 0)];
}

static int build_pair(Mixer *m, int f, int d, int exact)
{
    const Topology *t = m->topo;
    const PayloadCodec *pc = shard_codec(m->shard);
    PairPlan *pp = plan_at(m, f, d, exact);
    const int partner = t->learner ^ (1 << d);
    int first, G;
    topology_learner_ranks(t, partner, &first, &G);
    pp->partner = partner;
    pp->crosses = topology_site_of_learner(t, partner) != t->site;
    pp->codec = exact ? CODEC_NONE : pc->codec;
    CHECK(peers_add(&pp->peers, &m->shard->table, shard_owned(m->shard, f), G, first,
                    topology_site_of_learner(t, partner), f, pp->codec, pc->cp, LINK_PAIR_VALUES, PAIR_VERDICT_BYTES(t->n_sites),
                    !pp->crosses));
    CHECK(peers_index(&pp->peers));
    return shard_stage_need(m->shard, pp->peers.send_bytes, pp->peers.recv_bytes);
}

int mixer_create(Mixer *m, Shard *s, Link *l, StopBallot *ballot)
{
    const Topology *t = s->topo;
    memset(m, 0, sizeof *m);
    m->topo = t;
    m->shard = s;
    m->link = l;
    m->ballot = ballot;
    m->fragments = s->fragments;
    int k = 0;
    while ((1 << k) < t->n_learners) k++;
    m->pair_bits = k;
    m->pairs = isth_calloc((size_t)m->fragments * (k ? k : 1) * 2, sizeof(PairPlan));
    m->raw_off = isth_calloc((size_t)m->fragments, sizeof(size_t *));
    CHECK_ALLOC(m->pairs);
    CHECK_ALLOC(m->raw_off);
    for (int f = 0; f < m->fragments; f++) { /* the exact rounds' payloads: float32 as they are */
        const Owned *own = shard_owned(s, f);
        m->raw_off[f] = isth_malloc(sizeof(size_t) * (size_t)(own->n + 1));
        CHECK_ALLOC(m->raw_off[f]);
        for (int c = 0; c < own->n; c++) m->raw_off[f][c] = own->off[c] * sizeof(float);
    }
    /* a slot's rows: mine, then the partner's */
    CHECK(shard_stage_rows(s, 2, 0, 0));
    for (int f = 0; f < m->fragments; f++)
        for (int d = 0; d < k; d++) {
            CHECK(build_pair(m, f, d, 0));
            CHECK(build_pair(m, f, d, 1));
        }
    return shard_alloc_residuals(s); /* every learner encodes its own payloads */
}

int mixer_destroy(Mixer *m)
{
    int retired = 1;
    for (size_t i = 0; m->pairs && i < (size_t)m->fragments * m->pair_bits * 2; i++)
        retired &= peers_free(&m->pairs[i].peers);
    for (int f = 0; m->raw_off && f < m->fragments; f++) isth_free(m->raw_off[f]);
    isth_free(m->raw_off);
    isth_free(m->pairs);
    memset(m, 0, sizeof *m);
    return retired;
}

void mix_watch(Mixer *m, Progress *progress) { m->progress = progress; }

static PairPlan *pair_plan(const Mixer *m, int f, int partner, int exact)
{
    if (!m->pairs) return NULL;
    for (int d = 0; d < m->pair_bits; d++)
        if ((m->topo->learner ^ (1 << d)) == partner) return plan_at(m, f, d, exact);
    return NULL;
}

static PairPlan *pair_in_flight(const Mixer *m, int f)
{
    if (!m->pairs) return NULL;
    for (int i = 0; i < 2 * m->pair_bits; i++)
        if (m->pairs[(size_t)f * m->pair_bits * 2 + i].in_flight) return &m->pairs[(size_t)f * m->pair_bits * 2 + i];
    return NULL;
}


int mix_start(Mixer *m, int f, int partner, const float *values, double w_me, double w_partner, int exact)
{
    const Topology *t = m->topo;
    const PayloadCodec *pc = shard_codec(m->shard);
    const Owned *own = shard_owned(m->shard, f);
    PairPlan *pp = pair_plan(m, f, partner, exact);
    if (!pp) return isth_fail(ISTH_ERUNTIME, "butterfly: cannot plan fragment %d with learner %d", f, partner);
    if (pair_in_flight(m, f) || shard_slot(m->shard, f))
        return isth_fail(ISTH_ERUNTIME, "butterfly: fragment %d mixed twice at once", f);
    Slot *slot = shard_stage(m->shard, f);
    if (!slot) return ISTH_ERUNTIME;
    pp->in_flight = 1;
    pp->polls = 0;
    pp->arrived_poll = -1;
    pp->w_me = w_me;
    pp->w_them = w_partner;
    pp->err2 = pp->norm2 = 0.0;
    pp->exchange = shard_next_exchange(m->shard);
    float *mine = slot->values;
    Encoded enc = {pp->codec, slot->enc, own->enc_off};
    if (pp->codec != pc->codec) { /* exact: the values as they are, no error feedback */
        memcpy(mine, values, sizeof(float) * own->size);
        for (size_t e = 0; e < own->size; e++) pp->norm2 += (double)mine[e] * mine[e];
        enc = (Encoded){CODEC_NONE, (const unsigned char *)mine, m->raw_off[f]};
    } else {
        /* the codec with error feedback (codec none keeps no residual, so an
         * exact round here sends the values as they are) */
        float *res = exact ? NULL : shard_residual(m->shard, f);
        CHECK(payload_encode(pc, &m->shard->table, own, values, res, slot->enc, mine, &pp->err2, &pp->norm2));
    }
    /* both partners number their exchanges alike: learner rounds are in step */
    peers_bind(&pp->peers, slot->send, slot->recv);
    return payload_post(m->link, &m->shard->table, own, enc, &pp->peers, pc->cp, LINK_PAIR_VALUES, f,
                        (uint32_t)t->learner, pp->exchange, 1, link_corrupts(m->link, pp->exchange));
}

int mix_poll(Mixer *m)
{
    for (int f = 0; f < m->fragments; f++) {
        PairPlan *pp = pair_in_flight(m, f);
        if (!pp) continue;
        pp->polls++;
        int arrived = 0;
        if (pp->arrived_poll < 0) {
            arrived = 1;
            if (pp->peers.n) CHECK(link_test(m->link, pp->peers.links, pp->peers.n, &arrived));
        }
        if (arrived) pp->arrived_poll = pp->polls;
    }
    return ISTH_OK;
}

static int finish_pair(Mixer *m, int f, ExchangeReport *rep, double *pair_distance, float **mixed, int *accepted)
{
    const Topology *t = m->topo;
    PairPlan *pp = pair_in_flight(m, f);
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
    unsigned char alive[2] = {1, !link_is_lost(m->link, psite)}; /* {ok, partner alive} */
    double waited = 0.0;
    int rc = ISTH_OK;
    /* the partner's site was lost after mix_start */
    if (peers_abandon_lost(m->link, &pp->peers)) shard_mark_stuck(m->shard, f);
    if (pp->peers.n && alive[1]) {
        unsigned char *late = isth_calloc((size_t)pp->peers.n, 1);
        rc = late ? link_wait_live(m->link, pp->peers.links, pp->peers.n, "butterfly exchange", late, &waited)
                  : isth_fail(ISTH_ERUNTIME, "butterfly: out of memory");
        for (int i = 0; late && i < pp->peers.n; i++)
            if (late[i]) alive[1] = 0;
        isth_free(late);
    }
    pp->in_flight = 0;
    shard_set_result(m->shard, f);
    shard_waited_on(m->shard, 1); /* the partner, nobody else */
    CHECK(rc);
    const Owned *own = shard_owned(m->shard, f);
    float *mine = shard_slot(m->shard, f)->values, *theirs = mine + shard_row_size(m->shard);
    *mixed = mine;
    unsigned char ok = alive[1];
    const char *why = alive[1] ? NULL : "partner's site lost";
    for (int i = 0; i < pp->peers.n && alive[1]; i++) {
        const char *bad = payload_take(m->link, &m->shard->table, own, pp->codec, shard_codec(m->shard)->cp,
                                       &pp->peers.peers[i], LINK_PAIR_VALUES, f, pp->exchange, theirs);
        if (bad) {
            ok = 0;
            why = bad;
        }
    }
    /* agree inside my learner, then with the partner learner, then again;
     * the earliest stop round either side knows of rides along, with the
     * sites that asked in it, and the progress table */
    alive[0] = ok;
    CHECK(coll_allreduce_comm(t->learner_comm, alive, 2, MPI_UNSIGNED_CHAR, 1, MPI_MIN));
    ok = alive[0];
    int64_t stop = m->ballot->round < 0 ? INT64_MAX : (int64_t)m->ballot->round;
    uint64_t asked[2] = {m->ballot->round_sites, m->ballot->round_ends}; /* the sites, those that end */
    const size_t vbytes = PAIR_VERDICT_BYTES(t->n_sites);
    for (int i = 0; i < pp->peers.n && alive[1]; i++) {
        unsigned char verdict[PAIR_VERDICT_BYTES(CONFIG_MAX_SITES)];
        verdict[0] = ok;
        memcpy(verdict + 1, &stop, sizeof stop);
        memcpy(verdict + 1 + sizeof stop, asked, sizeof asked);
        progress_encode(m->progress, t->n_sites, 0, verdict + PAIR_HEAD_BYTES);
        CHECK(payload_post_verdict(m->link, &pp->peers.peers[i], LINK_PAIR_VERDICT, f, (uint32_t)t->learner,
                                   pp->exchange, verdict, vbytes));
    }
    if (pp->peers.n && alive[1]) {
        unsigned char *late = isth_calloc((size_t)pp->peers.n, 1);
        double vwait = 0.0;
        rc = late ? link_wait_live(m->link, pp->peers.links + pp->peers.n, pp->peers.n, "butterfly verdict", late,
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
    /* {ok, partner alive, the partner's progress table}: a rank that read
     * no verdict holds 0xFF there, the others the same bytes (the partner
     * learner's table is one on all its ranks), so the MIN is that table */
    unsigned char agreed[2 + PROGRESS_BYTES * CONFIG_MAX_SITES];
    const size_t n_agreed = 2 + PROGRESS_BYTES * (size_t)t->n_sites;
    memset(agreed + 2, 0xFF, n_agreed - 2);
    for (int i = 0; i < pp->peers.n && alive[1]; i++) {
        const unsigned char *v;
        const char *bad = payload_open_verdict(m->link, &pp->peers.peers[i], LINK_PAIR_VERDICT, f, pp->exchange,
                                               vbytes, &v);
        if (bad) /* the partners would disagree on the result: the run cannot go on */
            return isth_fail(ISTH_ERUNTIME, "link: butterfly verdict from world rank %d unreadable: %s",
                             pp->peers.peers[i].world_rank, bad);
        if (!v[0]) ok = 0;
        int64_t other;
        uint64_t o_asked[2];
        memcpy(&other, v + 1, sizeof other);
        memcpy(o_asked, v + 1 + sizeof other, sizeof o_asked);
        vote_merge(&stop, &asked[0], &asked[1], other, o_asked[0], o_asked[1]);
        if (i == 0) memcpy(agreed + 2, v + PAIR_HEAD_BYTES, n_agreed - 2);
    }
    agreed[0] = ok;
    agreed[1] = alive[1];
    CHECK(coll_allreduce_comm(t->learner_comm, agreed, n_agreed, MPI_UNSIGNED_CHAR, 1, MPI_MIN));
    alive[0] = agreed[0];
    alive[1] = agreed[1];
    ok = alive[0] && alive[1];
    progress_learn(m->progress, agreed + 2); /* observation only; the same on every rank of the learner */
    if (!alive[1]) { /* what the waits gave up on: stuck messages renew the slot */
        if (peers_take_stuck(&pp->peers)) shard_mark_stuck(m->shard, f);
    }
    int64_t mine_stop = stop; /* the learner's earliest round, and only its sites */
    CHECK(coll_allreduce_comm(t->learner_comm, &stop, 1, MPI_INT64_T, sizeof stop, MPI_MIN));
    if (mine_stop != stop || stop == INT64_MAX) asked[0] = asked[1] = 0;
    CHECK(coll_allreduce_comm(t->learner_comm, asked, 2, MPI_UINT64_T, sizeof asked[0], MPI_BOR));
    if (link_survives(m->link) && t->n_sites > 1) { /* the whole site agrees on who is lost */
        unsigned char present[CONFIG_MAX_SITES];
        for (int s = 0; s < t->n_sites; s++) present[s] = !link_is_lost(m->link, s);
        if (!alive[1]) present[psite] = 0;
        double w = waited;
        CHECK(coll_allreduce_comm(t->site_comm, present, (size_t)t->n_sites, MPI_UNSIGNED_CHAR, 1, MPI_MIN));
        int any_gone = 0; /* the same on every rank of the site */
        for (int s = 0; s < t->n_sites; s++) any_gone |= !present[s] && !link_is_lost(m->link, s);
        if (any_gone) CHECK(coll_allreduce_comm(t->site_comm, &w, 1, MPI_DOUBLE, sizeof w, MPI_MAX));
        for (int s = 0; s < t->n_sites; s++)
            if (!present[s] && s != t->site) {
                char what[64];
                snprintf(what, sizeof what, "butterfly exchange %llu (fragment %d)", (unsigned long long)pp->exchange, f);
                link_mark_lost(m->link, s, what, w);
            }
    }
    m->ballot->round = stop == INT64_MAX ? -1 : (long)stop;
    m->ballot->round_sites = asked[0];
    m->ballot->round_ends = asked[1];
    rep->accepted_sites = ok ? 2 : 1;
    if (!ok) snprintf(rep->rejected, sizeof rep->rejected, "learner %d: %s",
                      why && alive[1] ? t->learner : pp->partner, why ? why : "rejected by the partner");
    /* distance between the partners before mixing (my owned part) */
    const size_t n = own->size;
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

/* The stop ballot's butterfly half around the exchange: a request of
 * this learner goes out with this round's verdict, with its site (and
 * whether it asks to end); a stop raised in round m has reached every
 * learner after round m + k - 1 (one round per bit), with every site that
 * asked in round m: all decide then, at the same step, on the same sites.
 * (A site that asks later keeps its request: it goes out again once the
 * sites of round m have left.) */
int mix_finish_staged(Mixer *m, int f, long round, ExchangeReport *rep, double *pair_distance, float **mixed,
                      int *accepted)
{
    StopBallot *b = m->ballot;
    const int site = m->topo->site;
    if (b->request && b->round < 0) { /* raised in this round */
        b->round = round;
        b->round_sites = (uint64_t)1 << site;
        b->round_ends = b->request == STOP_END ? (uint64_t)1 << site : 0;
    }
    CHECK(finish_pair(m, f, rep, pair_distance, mixed, accepted));
    if (b->round >= 0 && round >= b->round + m->pair_bits - 1) {
        b->agreed = 1;
        for (int s = 0; s < m->topo->n_sites; s++) {
            b->sites[s] = (unsigned char)(b->round_sites >> s & 1);
            b->ends[s] = (unsigned char)(b->round_ends >> s & 1);
        }
    }
    return ISTH_OK;
}

int mix_finish(Mixer *m, int f, long round, float *values, ExchangeReport *rep, double *pair_distance)
{
    float *mixed;
    int accepted;
    CHECK(mix_finish_staged(m, f, round, rep, pair_distance, &mixed, &accepted));
    if (accepted) memcpy(values, mixed, sizeof(float) * shard_owned(m->shard, f)->size);
    shard_release(m->shard, f);
    return ISTH_OK;
}
