/* reduce.c — see reduce.h: the site reduction of a fragment over every
 * learner of every site (site sums, payloads through payload.c, the
 * verdicts). */
#include "reduce.h"
#include "clock.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "codec_topk.h"
#include "coll.h"
#include "status.h"

/* A verdict: per site, its payload was accepted; then per site, its stop
 * vote: bit 0 clear = it asks to stop, bit 1 clear = it asks to end (not to
 * pause); then per site, the host does not ask to take it back (0 = it
 * asks); then per site, the sender sees it in the run (0 = out: the AND
 * is the set of sites every site sees in, the one a take-back acts on). A site writes only its own vote (VOTE_NONE for the others), so
 * the AND over sites (and the MIN inside one: VOTE_END < VOTE_PAUSE <
 * VOTE_NONE, each one's bits within the next's) keeps every request and
 * its intent. Last, per site, PROGRESS_BYTES of its progress summary: a
 * site writes only its own slot (the same on each of its ranks), the
 * others are 0xFF, so the same AND and MIN leave every site's summary in
 * its slot (observation only: nothing decided reads it). */
static size_t site_verdict_bytes(const Topology *t) { return REDUCE_VERDICT_BYTES(t->n_sites); }
enum { VOTE_END = 0, VOTE_PAUSE = 2, VOTE_NONE = 3 };

static unsigned char site_vote(int request)
{
    return request == STOP_END ? VOTE_END : request ? VOTE_PAUSE : VOTE_NONE;
}

/* The first learner of a site: the peers of fragment f in the other
 * sites' first learners, and its error feedback. */
static int build_site(Reducer *r, int f)
{
    const Topology *t = r->topo;
    Shard *sh = r->shard;
    SiteExchange *fp = &r->frag[f];
    const PayloadCodec *pc = shard_codec(sh);
    for (int s = 0; s < t->n_sites; s++) {
        if (s == t->site) continue;
        const SiteInfo *o = &t->sites[s];
        CHECK(peers_add(&fp->site, &sh->table, shard_owned(sh, f), o->learner_ranks, o->first_rank, s, f, pc->codec,
                        pc->cp, LINK_SITE_VALUES, site_verdict_bytes(t), 0));
    }
    CHECK(peers_index(&fp->site));
    return shard_stage_need(sh, fp->site.send_bytes, fp->site.recv_bytes);
}

int reducer_create(Reducer *r, Shard *s, Link *l, StopBallot *ballot, MPI_Comm world)
{
    const Topology *t = s->topo;
    memset(r, 0, sizeof *r);
    r->topo = t;
    r->shard = s;
    r->link = l;
    r->ballot = ballot;
    r->fragments = s->fragments;
    r->site_peers = MPI_COMM_NULL;
    r->leader = t->learner == t->sites[t->site].first_learner;
    /* the same learner rank in every learner of the site: one colour per (site, learner rank) */
    CHECK_MPI(MPI_Comm_split(world, t->site * t->world_size + t->learner_rank, t->learner, &r->site_peers));
    r->site_weight = isth_malloc(sizeof(double) * (size_t)t->n_sites);
    CHECK_ALLOC(r->site_weight);
    for (int st = 0; st < t->n_sites; st++)
        r->site_weight[st] = t->sites[st].tokens_per_step * t->sites[st].learners / t->total_tokens_per_step;
    r->frag = isth_calloc((size_t)r->fragments, sizeof(SiteExchange));
    CHECK_ALLOC(r->frag);
    /* a slot's rows: every site's sum (mine ends as the total), and the
     * site's learners' values while they are summed */
    const SiteInfo *site = &t->sites[t->site];
    CHECK(shard_stage_rows(s, (size_t)t->n_sites, (size_t)t->site, site->learners > 1 ? (size_t)site->learners : 0));
    if (!r->leader || t->n_sites == 1) return ISTH_OK;
    CHECK(shard_alloc_residuals(s));
    for (int f = 0; f < r->fragments; f++) CHECK(build_site(r, f));
    return ISTH_OK;
}

int reducer_destroy(Reducer *r)
{
    int retired = 1; /* messages still posted (a failed exchange) are cancelled before their buffers go */
    for (int f = 0; r->frag && f < r->fragments; f++) retired &= peers_free(&r->frag[f].site);
    isth_free(r->frag);
    isth_free(r->site_weight);
    if (r->site_peers != MPI_COMM_NULL) MPI_Comm_free(&r->site_peers);
    memset(r, 0, sizeof *r);
    r->site_peers = MPI_COMM_NULL;
    return retired;
}

void reduce_set_window(Reducer *r, int window_polls, int pace)
{
    r->window_polls = window_polls;
    r->pace = pace;
}

void reduce_log_to(Reducer *r, int log, Metrics *metrics)
{
    r->log = log;
    r->metrics = metrics;
}

void reduce_watch(Reducer *r, Progress *progress) { r->progress = progress; }

float *reduce_stage(Reducer *r, int f)
{
    if (shard_slot(r->shard, f)) {
        isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
        return NULL;
    }
    Slot *slot = shard_stage(r->shard, f);
    return slot ? slot->values + (size_t)r->topo->site * shard_row_size(r->shard) : NULL;
}


int reduce_start(Reducer *r, Backend *be, int f, StateKind which, int kind)
{
    SiteExchange *fp = &r->frag[f];
    if (kind == REDUCE_GRADS) CHECK(shard_sum_dense(r->shard, be, f, which));
    if (r->topo->n_learners == 1) { /* nothing to combine: buf is the result, no staging */
        if (fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
        fp->in_flight = 1;
        fp->arrived_poll = -1;
        fp->exchange = shard_next_exchange(r->shard);
        return ISTH_OK;
    }
    float *mine = reduce_stage(r, f);
    if (!mine) return ISTH_ERUNTIME;
    CHECK(shard_get(r->shard, be, f, which, mine));
    return reduce_start_staged(r, f);
}

/* A paced exchange posts its sends across its window (pace on, and the
 * link kept up with this rank's last exchange: pace_ok, set as an exchange
 * finishes; a link that does not gets every piece at once). Its polls: the
 * first right at its start, then one after each inner step; its result is
 * due one step after poll `window`. After poll p (and at the start) the
 * first max(p, 1) / (window - 1) of each payload is posted: all of it at
 * poll window - 1, so the last pieces have two steps to drain. A link
 * slower than that pace simply holds them queued; a faster one is left
 * free for the other fragments' exchanges and the control messages
 * between them. */
static int pace_sends(Reducer *r, SiteExchange *fp)
{
    const double share = fmin(1.0, (double)(fp->polls > 1 ? fp->polls : 1) / (double)(r->window_polls - 1));
    for (int i = 0; i < fp->site.n; i++) {
        LinkMsg *m = &fp->site.peers[i].msg;
        if (m->send_posted == 2) continue;
        CHECK(link_post_send_upto(r->link, m, (size_t)ceil(share * (double)m->send_bytes)));
    }
    return ISTH_OK;
}

/* After a poll that found the exchange incomplete: will the rest arrive
 * before its result is due? Poll p comes p - 1 inner steps after the
 * start and the result is due `window` steps after it, so window - p + 1
 * steps (of the length the last p - 1 took) are left; the pieces received
 * so far give the payload's rate. Once it is clear that it will not
 * arrive in time, this is logged once, before the step that waits for it. */
static int warn_if_late(Reducer *r, int f, SiteExchange *fp)
{
    if (fp->late_warned || r->window_polls < 1 || fp->polls > r->window_polls || fp->polls < 2) return ISTH_OK;
    double got = 0;
    for (int i = 0; i < fp->site.n; i++) got += link_recv_fraction(&fp->site.peers[i].msg);
    got /= fp->site.n;
    const double elapsed = now_s() - fp->started_s, per_step = elapsed / (fp->polls - 1);
    const double left = (r->window_polls - fp->polls + 1) * per_step;
    /* nothing yet is no rate: only past half the window is it a sign */
    if (got <= 0 && 2 * (fp->polls - 1) < r->window_polls) return ISTH_OK;
    const double eta = got > 0 ? elapsed * (1.0 - got) / got : HUGE_VAL;
    if (eta <= left) return ISTH_OK;
    fp->late_warned = 1;
    if (!r->log) return ISTH_OK;
    if (got > 0)
        printf("link: exchange %llu (fragment %d) will not arrive within its window of %d step(s): %.0f%% after %.1f s "
               "(%d step(s)), about %.1f s more at this rate, %.1f s past the step that applies it\n",
               (unsigned long long)fp->exchange, f, r->window_polls, 100.0 * got, elapsed, fp->polls - 1, eta, eta - left);
    else
        printf("link: exchange %llu (fragment %d) will not arrive within its window of %d step(s): nothing after %.1f s "
               "(%d step(s))\n", (unsigned long long)fp->exchange, f, r->window_polls, elapsed, fp->polls - 1);
    fflush(stdout);
    return metrics_link_late(r->metrics, (unsigned long long)fp->exchange, f, fp->polls - 1, r->window_polls, got,
                             elapsed, eta, left);
}

int reduce_start_staged(Reducer *r, int f)
{
    const Topology *t = r->topo;
    SiteExchange *fp = &r->frag[f];
    const SiteInfo *site = &t->sites[t->site];
    const Owned *own = shard_owned(r->shard, f);
    Slot *slot = shard_slot(r->shard, f);
    if (!slot) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started without staging", f);
    if (fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
    fp->in_flight = 1;
    fp->polls = 0;
    fp->window_polls_seen = 0;
    fp->verdict_posted = 0;
    fp->arrived_poll = -1;
    fp->err2 = fp->norm2 = 0.0;
    fp->exchange = shard_next_exchange(r->shard);
    if (t->n_learners == 1) return ISTH_OK; /* nothing to combine */

    /* (2) my owned chunks, summed over the site's learners in learner order */
    const size_t size = shard_row_size(r->shard);
    float *mine = slot->values + (size_t)t->site * size;
    if (site->learners > 1) {
        float *gather = slot->gather;
        CHECK(coll_allgather_floats(r->site_peers, mine, own->size, gather));
        for (size_t i = 0; i < own->size; i++) {
            float s = 0.0f;
            for (int l = 0; l < site->learners; l++) s += gather[(size_t)l * own->size + i];
            mine[i] = s;
        }
    }
    if (t->n_sites == 1 || !r->leader) return ISTH_OK;

    /* (3) encode chunk by chunk; my contribution becomes what others decode */
    const PayloadCodec *pc = shard_codec(r->shard);
    unsigned char *enc = slot->enc;
    CHECK(payload_encode(pc, &r->shard->table, own, mine, shard_residual(r->shard, f), enc, mine, &fp->err2,
                         &fp->norm2));
    peers_bind(&fp->site, slot->send, slot->recv);
    const int corrupt = link_corrupts(r->link, fp->exchange);
    const int paced = r->pace && r->pace_ok && r->window_polls > 1 && !link_delay_polls(r->link);
    fp->paced = paced;
    CHECK(payload_post(r->link, &r->shard->table, own, (Encoded){pc->codec, enc, own->enc_off}, &fp->site, pc->cp,
                       LINK_SITE_VALUES, f, (uint32_t)t->site, fp->exchange, !link_delay_polls(r->link) && !paced,
                       corrupt));
    fp->sends_deferred = link_delay_polls(r->link) > 0;
    fp->sent_poll = 0;
    fp->started_s = now_s();
    fp->late_warned = 0;
    if (paced) CHECK(pace_sends(r, fp));
    return ISTH_OK;
}

static int verdict_early(Reducer *r, SiteExchange *fp, int f);

void reduce_progress(void *reducer)
{
    Reducer *r = reducer;
    for (int f = 0; f < r->fragments; f++) {
        SiteExchange *fp = &r->frag[f];
        int all;
        /* an error here is found again by the next poll, which reports it */
        if (fp->in_flight && fp->site.n) (void)link_test(r->link, fp->site.links, fp->site.n, &all);
    }
}

int reduce_poll(Reducer *r)
{
    const Topology *t = r->topo;
    for (int f = 0; f < r->fragments; f++) {
        SiteExchange *fp = &r->frag[f];
        if (!fp->in_flight) continue;
        fp->window_polls_seen++; /* every rank of the site alike (the early verdict is collective) */
        if (fp->site.n) {
            fp->polls++;
            if (fp->sends_deferred && fp->polls >= link_delay_polls(r->link)) {
                for (int i = 0; i < fp->site.n; i++) CHECK(link_post_send(r->link, &fp->site.peers[i].msg));
                fp->sends_deferred = 0;
                fp->sent_poll = fp->polls;
            }
            if (!fp->sends_deferred && fp->paced) CHECK(pace_sends(r, fp));
            int arrived = 0;
            if (fp->arrived_poll < 0) CHECK(link_test(r->link, fp->site.links, fp->site.n, &arrived));
            if (arrived) fp->arrived_poll = fp->polls;
            else CHECK(warn_if_late(r, f, fp));
        }
        if (r->window_polls >= 2 && fp->window_polls_seen == r->window_polls && !link_delay_polls(r->link) &&
            !fp->verdict_posted && t->n_sites > 1 && t->n_learners > 1)
            CHECK(verdict_early(r, fp, f));
    }
    return ISTH_OK;
}

static void append_reason(char *buf, size_t cap, const char *site, const char *why)
{
    size_t n = strlen(buf);
    if (strstr(buf, site)) return;
    snprintf(buf + n, cap - n, "%s%s: %s", n ? "; " : "", site, why);
}

/* (4) verdicts: which sites' payloads every site accepted; the stop vote
 * rides along (ok[n_sites + s] = 0 when site s asks to stop), and so does
 * the host's ask to take a lost site back (ok[2 n_sites + s] = 0: site s). alive[s] = 0 for
 * a site this rank found late (federated launch: lost from now on); a
 * verdict that misses the deadline makes its site late too. Both are
 * agreed inside the site, then lost sites are marked in the link.
 * (4a) the site's verdict, agreed and posted to the other sites: at the
 * finish, or at the last poll before it (a step earlier) when every
 * payload had arrived by then (reduce_poll), so that the verdicts' round
 * trip hides behind a step. */
static int agree_post(Reducer *r, SiteExchange *fp, int f, const unsigned char *ok, const unsigned char *alive)
{
    const Topology *t = r->topo;
    const int S = t->n_sites;
    const size_t nv = site_verdict_bytes(t);
    unsigned char *buf = fp->verdict;
    memcpy(buf, ok, (size_t)S);
    for (int s = 0; s < S; s++) buf[S + s] = s == t->site ? site_vote(r->ballot->request) : VOTE_NONE;
    for (int s = 0; s < S; s++) buf[2 * S + s] = r->ballot->take != s + 1;
    for (int s = 0; s < S; s++) buf[3 * S + s] = !link_is_lost(r->link, s);
    progress_encode(r->progress, S, 1, buf + 4 * S);
    memcpy(buf + nv, alive, (size_t)S);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, (int)nv + S, MPI_UNSIGNED_CHAR, MPI_MIN, t->site_comm));
    fp->verdict_posted = 1;
    if (!r->leader || !fp->site.n) return ISTH_OK;
    for (int i = 0; i < fp->site.n; i++) {
        Peer *p = &fp->site.peers[i];
        p->verdict_waited = 0;
        if (!buf[nv + p->site] || link_is_lost(r->link, p->site)) continue; /* no verdict to or from a lost site */
        CHECK(payload_post_verdict(r->link, p, LINK_SITE_VERDICT, f, (uint32_t)t->site, fp->exchange, buf, nv));
        p->verdict_waited = 1;
    }
    return ISTH_OK;
}

/* (4b) the other sites' verdicts, awaited, and the site's final word. */
static int agree_complete(Reducer *r, SiteExchange *fp, int f, unsigned char *ok, unsigned char *alive, double waited)
{
    const Topology *t = r->topo;
    const int S = t->n_sites;
    const size_t nv = site_verdict_bytes(t);
    unsigned char *buf = fp->verdict;
    fp->verdict_posted = 0;
    if (r->leader && fp->site.n) {
        LinkMsg **wait = isth_malloc(sizeof(LinkMsg *) * (size_t)fp->site.n);
        int *peer_of = isth_malloc(sizeof(int) * (size_t)fp->site.n), n = 0;
        unsigned char *late = isth_malloc((size_t)fp->site.n);
        if (!wait || !peer_of || !late) {
            isth_free(wait);
            isth_free(peer_of);
            isth_free(late);
            return isth_fail(ISTH_ERUNTIME, "reduce: out of memory for the verdicts of fragment %d", f);
        }
        int rc = ISTH_OK;
        for (int i = 0; i < fp->site.n; i++) {
            Peer *p = &fp->site.peers[i];
            if (!p->verdict_waited) continue;
            if (link_is_lost(r->link, p->site)) { /* lost since the verdict was posted */
                link_abandon(&p->verdict);
                buf[nv + p->site] = 0;
                buf[p->site] = 0;
                continue;
            }
            wait[n] = &p->verdict;
            peer_of[n++] = i;
        }
        double vwait = 0.0;
        /* with three sites or more a peer posts its verdict only once its
         * own wait for a third site has ended, up to one deadline after
         * ours began: its verdict gets two (a live site is not lost for a
         * dead one's silence) */
        const double deadline = link_timeout(r->link);
        if (S > 2) link_set_timeout(r->link, 2 * deadline);
        if (rc == ISTH_OK) rc = link_wait_live(r->link, wait, n, "verdict exchange", late, &vwait);
        if (S > 2) link_set_timeout(r->link, deadline);
        if (vwait > waited) waited = vwait;
        for (int k = 0; rc == ISTH_OK && k < n; k++) {
            const Peer *p = &fp->site.peers[peer_of[k]];
            if (late[k]) {
                buf[nv + p->site] = 0;
                buf[p->site] = 0;
                continue;
            }
            const unsigned char *v;
            const char *bad = payload_open_verdict(r->link, p, LINK_SITE_VERDICT, f, fp->exchange, nv, &v);
            /* a verdict we cannot read would leave the sites with different
             * sets of contributions (and stop votes): the run cannot go on */
            if (bad)
                rc = isth_fail(ISTH_ERUNTIME, "link: verdict from world rank %d for fragment %d unreadable: %s",
                               p->world_rank, f, bad);
            else
                for (size_t s = 0; s < nv; s++) buf[s] &= v[s];
        }
        isth_free(wait);
        isth_free(peer_of);
        isth_free(late);
        CHECK(rc);
    }
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, (int)nv + S, MPI_UNSIGNED_CHAR, MPI_MIN, t->site_comm));
    /* only when a site was found late (buf is the same on every rank of the
     * site): how long the longest wait was, for the log */
    int any_late = 0;
    for (int s = 0; s < S; s++) any_late |= !buf[nv + s] && s != t->site;
    double w = waited;
    if (any_late) CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, t->site_comm));
    for (int s = 0; s < S; s++) {
        alive[s] = buf[nv + s];
        ok[s] = buf[s] && alive[s];
        if (!alive[s] && s != t->site) {
            char what[64];
            snprintf(what, sizeof what, "exchange %llu (fragment %d)", (unsigned long long)fp->exchange, f);
            link_mark_lost(r->link, s, what, w);
        }
    }
    for (int s = 0; s < S; s++) {
        if (!(buf[S + s] & 1)) r->ballot->agreed = 1, r->ballot->sites[s] = 1;
        if (!(buf[S + s] & 2)) r->ballot->ends[s] = 1;
    }
    for (int s = 0; s < S; s++)
        if (!buf[2 * S + s]) {
            r->ballot->take_agreed = s + 1;
            for (int k = 0; k < S; k++) r->ballot->take_out[k] = !buf[3 * S + k];
        }
    progress_learn(r->progress, buf + 4 * S); /* the same on every rank of the site */
    return ISTH_OK;
}

/* Decode and check every arrived payload into the staging (a site found
 * late or lost is not taken); ok[s] = 0 for a payload rejected, with why. */
static void take_payloads(Reducer *r, SiteExchange *fp, int f, unsigned char *ok, const unsigned char *alive,
                          char *rejected, size_t cap)
{
    const size_t size = shard_row_size(r->shard);
    const Owned *own = shard_owned(r->shard, f);
    const PayloadCodec *pc = shard_codec(r->shard);
    float *staging = shard_slot(r->shard, f)->values;
    for (int i = 0; i < fp->site.n; i++) {
        const Peer *p = &fp->site.peers[i];
        if (!alive[p->site]) {
            ok[p->site] = 0;
            continue;
        }
        const char *bad = payload_take(r->link, &r->shard->table, own, pc->codec, pc->cp, p, LINK_SITE_VALUES, f,
                                       fp->exchange, staging + (size_t)p->site * size);
        if (bad) {
            ok[p->site] = 0;
            append_reason(rejected, cap, r->topo->sites[p->site].name, bad);
        }
    }
}

/* At the last poll before the finish (a step before it), collectively over
 * the site: if every payload has arrived at every rank of the site, take
 * them and post the site's verdict now; the finish then only awaits the
 * other sites'. */
static int verdict_early(Reducer *r, SiteExchange *fp, int f)
{
    const Topology *t = r->topo;
    int here = 1, all; /* the payloads here; this site's own sends may still drain */
    if (r->leader && fp->site.n) CHECK(link_test(r->link, fp->site.links, fp->site.n, &all));
    for (int i = 0; here && r->leader && i < fp->site.n; i++) here = fp->site.peers[i].msg.recv_done;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &here, 1, MPI_INT, MPI_MIN, t->site_comm));
    if (!here) return ISTH_OK; /* the finish does it all, as without a window */
    memset(fp->early_ok, 1, sizeof fp->early_ok);
    for (int s = 0; s < t->n_sites; s++) fp->early_alive[s] = !link_is_lost(r->link, s);
    fp->early_rejected[0] = '\0';
    if (peers_abandon_lost(r->link, &fp->site)) shard_mark_stuck(r->shard, f);
    if (r->leader && fp->site.n)
        take_payloads(r, fp, f, fp->early_ok, fp->early_alive, fp->early_rejected, sizeof fp->early_rejected);
    return agree_post(r, fp, f, fp->early_ok, fp->early_alive);
}

/* The report of fragment f's exchange as it finishes (before the link part). */
static void report_begin(const Reducer *r, int f, ExchangeReport *rep)
{
    const SiteExchange *fp = &r->frag[f];
    memset(rep, 0, sizeof *rep);
    rep->fragment = f;
    rep->exchange = fp->exchange;
    rep->n_sites = rep->accepted_sites = r->topo->n_sites;
    rep->arrived_poll = fp->arrived_poll;
}

/* (5) the accepted sites summed in site order over [lo, hi) of the packed
 * owned chunks; the total overwrites my site's row element by element. */
static void sum_accepted(const Reducer *r, const unsigned char *ok, float rescale, float *staging, size_t lo, size_t hi)
{
    const Topology *t = r->topo;
    const size_t size = shard_row_size(r->shard);
    float *total = staging + (size_t)t->site * size;
    if (shard_codec(r->shard)->codec == CODEC_TOPK && shard_codec(r->shard)->sender_mean) {
        /* each value over the sites that sent it: a sparse payload's zero is
         * "not sent", not "zero" (the values arrive pre-scaled by their
         * site's token share, so the divisor is the senders' share) */
        for (size_t i = lo; i < hi; i++) {
            float s = 0.0f, w = 0.0f;
            for (int st = 0; st < t->n_sites; st++)
                if (ok[st] && codec_topk_sent(staging[(size_t)st * size + i])) {
                    s += staging[(size_t)st * size + i];
                    w += (float)r->site_weight[st];
                }
            total[i] = w > 0.0f ? s / w : 0.0f;
        }
        return;
    }
    for (size_t i = lo; i < hi; i++) {
        float s = 0.0f;
        for (int st = 0; st < t->n_sites; st++)
            if (ok[st]) s += staging[(size_t)st * size + i];
        total[i] = rescale == 1.0f ? s : s * rescale;
    }
}

/* (5) for a router chunk at [lo, lo + D * E) under Topology.router_by_owner:
 * column e (the router is D rows of E) is its owner site's own value over
 * that site's share, the owner site's token-weighted average, as its
 * experts are; an owner not accepted leaves it unmoved (0). Every other
 * site's copy of the column was never read, so it carries no gradient:
 * averaged in, it would halve the column's step and add the weight decay
 * of sites that never use it. My site's row is read before it is written,
 * element by element, so the total may overwrite it. */
static void take_owned_columns(const Reducer *r, const unsigned char *ok, float *staging, size_t lo, size_t n)
{
    const Topology *t = r->topo;
    const size_t size = shard_row_size(r->shard);
    const int E = r->shard->table.model->cfg.experts;
    float *total = staging + (size_t)t->site * size;
    for (size_t i = 0; i < n; i++) {
        const int s = topology_expert_site(t, (int)(i % (size_t)E));
        total[lo + i] = s >= 0 && ok[s] ? staging[(size_t)s * size + lo + i] / (float)r->site_weight[s] : 0.0f;
    }
}

int reduce_finish_staged(Reducer *r, int f, ExchangeReport *rep, float **result)
{
    const Topology *t = r->topo;
    SiteExchange *fp = &r->frag[f];
    const SiteInfo *site = &t->sites[t->site];
    report_begin(r, f, rep);
    if (fp->sends_deferred) { /* still held back by the test hook: link_wait posts them now */
        fp->sent_poll = fp->polls;
        fp->sends_deferred = 0;
    }
    rep->sent_poll = fp->sent_poll;
    if (!fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d finished but not started", f);
    /* the next exchange is paced when the link kept up with this one: an
     * unpaced payload arrived within half its window, a paced one (its last
     * share goes at poll W - 1) at a poll at all */
    if (fp->site.n)
        r->pace_ok = fp->arrived_poll > 0 && (fp->paced || 2 * (fp->arrived_poll - 1) <= r->window_polls);
    fp->in_flight = 0;
    shard_set_result(r->shard, f);
    const size_t size = shard_row_size(r->shard), n = shard_owned(r->shard, f)->size;
    float *staging = shard_slot(r->shard, f)->values, *total = staging + (size_t)t->site * size; /* my site's sum, then the total */
    *result = total;
    if (t->n_learners == 1) return ISTH_OK; /* one learner: the staged values are the result */
    /* the site sum waits on the site's learners, the link on every other
     * site's payload, which waited on all of that site's learners */
    shard_waited_on(r->shard, t->n_learners - 1);
    if (t->n_sites == 1) return ISTH_OK;
    unsigned char ok[CONFIG_MAX_SITES + 1], alive[CONFIG_MAX_SITES];
    memset(ok, 1, sizeof ok);
    for (int s = 0; s < t->n_sites; s++) alive[s] = !link_is_lost(r->link, s);
    double waited = 0.0;
    if (peers_abandon_lost(r->link, &fp->site)) shard_mark_stuck(r->shard, f); /* posted before a loss found elsewhere: not waited for again */
    if (fp->verdict_posted) { /* taken and judged at the poll before: only our sends may still be going */
        memcpy(ok, fp->early_ok, sizeof fp->early_ok);
        memcpy(alive, fp->early_alive, sizeof fp->early_alive);
        memcpy(rep->rejected, fp->early_rejected, sizeof rep->rejected);
        if (r->leader && fp->site.n) {
            unsigned char *late = isth_calloc((size_t)fp->site.n, 1);
            CHECK_ALLOC(late);
            const int wrc = link_wait_live(r->link, fp->site.links, fp->site.n, "payload exchange", late, &waited);
            isth_free(late); /* a send that never completes: its verdict, awaited next, says so */
            CHECK(wrc);
        }
    } else {
        if (r->leader && fp->site.n) {
            unsigned char *late = isth_calloc((size_t)fp->site.n, 1);
            CHECK_ALLOC(late);
            const int wrc = link_wait_live(r->link, fp->site.links, fp->site.n, "payload exchange", late, &waited);
            for (int i = 0; wrc == ISTH_OK && i < fp->site.n; i++)
                if (late[i]) alive[fp->site.peers[i].site] = 0;
            isth_free(late);
            CHECK(wrc);
            take_payloads(r, fp, f, ok, alive, rep->rejected, sizeof rep->rejected);
        }
        CHECK(agree_post(r, fp, f, ok, alive));
    }
    CHECK(agree_complete(r, fp, f, ok, alive, waited));
    if (peers_abandon_lost(r->link, &fp->site)) shard_mark_stuck(r->shard, f); /* what the waits gave up on: stuck ones renew the slot */
    double wsum = 0.0;
    rep->accepted_sites = 0;
    for (int s = 0; s < t->n_sites; s++)
        if (ok[s]) {
            wsum += r->site_weight[s];
            rep->accepted_sites++;
        } else {
            append_reason(rep->rejected, sizeof rep->rejected, t->sites[s].name,
                          alive[s] ? "rejected by a site" : "lost (missed the deadline)");
        }
    /* (5) sum the accepted sites in site order: the chunks that crossed,
     * run by run; a split expert is my site's own sum, re-weighted by the
     * site's share alone (its learners' token-weighted average); a router
     * under router_by_owner takes each column from its expert's site */
    if (r->leader) {
        const Owned *own = shard_owned(r->shard, f);
        const ChunkTable *ct = &r->shard->table;
        const float rescale = rep->accepted_sites == t->n_sites ? 1.0f : (float)(1.0 / wsum);
        const float site_w = (float)r->site_weight[t->site];
        size_t lo = 0; /* the run of summed chunks so far: [lo, own->off[k]) */
        for (int k = 0; k <= own->n; k++) {
            const Chunk *ch = k < own->n ? &ct->chunks[own->chunk[k]] : NULL;
            const int by_owner = ch && t->router_by_owner && ch->tensor == T_ROUTER;
            if (ch && chunk_crosses(ct, own->chunk[k]) && !by_owner) continue;
            const size_t end = ch ? own->off[k] : n;
            if (end > lo) sum_accepted(r, ok, rescale, staging, lo, end);
            if (!ch) break;
            lo = end + ch->size;
            if (by_owner)
                take_owned_columns(r, ok, staging, end, ch->size);
            else
                for (size_t i = end; i < lo; i++) total[i] /= site_w;
        }
    }
    /* site-wide payload statistics for the log */
    PayloadSums sums = {0.0, fp->err2, fp->norm2};
    if (r->leader)
        for (int i = 0; i < fp->site.n; i++) sums.bytes += (double)fp->site.peers[i].msg.send_bytes;
    CHECK(coll_allreduce_comm(t->site_comm, &sums, PAYLOAD_SUMS, MPI_DOUBLE, sizeof(double), MPI_SUM));
    rep->payload_bytes = sums.bytes;
    rep->codec_rel_error = sums.norm2 > 0 ? sqrt(sums.err2 / sums.norm2) : 0.0;
    /* the first learner's total to the site's other learners */
    if (site->learners > 1) CHECK(coll_bcast_bytes(r->site_peers, total, n * sizeof(float), 0));
    return ISTH_OK;
}

int reduce_finish(Reducer *r, Backend *be, int f, StateKind which, ExchangeReport *rep)
{
    SiteExchange *fp = &r->frag[f];
    if (r->topo->n_learners == 1) { /* see reduce_start */
        report_begin(r, f, rep);
        if (!fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d finished but not started", f);
        fp->in_flight = 0;
        return ISTH_OK;
    }
    float *total;
    CHECK(reduce_finish_staged(r, f, rep, &total));
    CHECK(shard_put(r->shard, be, f, which, total));
    shard_release(r->shard, f);
    /* dense chunks shared inside the learner (one learner: the state is the result already) */
    return shard_share_dense(r->shard, be, f, which);
}

