/* reduce.c — see reduce.h: the reducer's plans, and the reduction of a
 * fragment over every learner of every site (site sums, the link, the
 * verdicts). Butterfly mixing is in mix.c, norms and fingerprints in
 * norms.c, chunks and staging in plan.c. */
#include "reduce.h"
#include "clock.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "status.h"

/* A verdict: per site, its payload was accepted; then per site, it does
 * not ask to stop (0 = it asks: the AND over sites keeps every request). */
static size_t site_verdict_bytes(const Topology *t) { return 2 * (size_t)t->n_sites; }

static int build_fragment(Reducer *r, int f)
{
    const Topology *t = r->topo;
    ChunkTable *ct = &r->table;
    FragPlan *fp = &r->frag[f];
    CHECK(owned_build(&fp->own, ct, f, t->learner_size, t->learner_rank, r->codec, r->cp));
    int n = 0;
    for (int c = 0; c < ct->n_chunks; c++) n += ct->chunks[c].fragment == f;
    fp->held_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fp->held_len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fp->dense_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fp->dense_len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fp->dense_owner = isth_malloc(sizeof(int) * (size_t)(n + 1));
    fp->raw_off = isth_malloc(sizeof(size_t) * (size_t)(fp->own.n + 1));
    fp->own_off = isth_malloc(sizeof(size_t) * (size_t)(fp->own.n + 1));
    fp->own_len = isth_malloc(sizeof(size_t) * (size_t)(fp->own.n + 1));
    CHECK_ALLOC(fp->held_off);
    CHECK_ALLOC(fp->held_len);
    CHECK_ALLOC(fp->dense_off);
    CHECK_ALLOC(fp->dense_len);
    CHECK_ALLOC(fp->dense_owner);
    CHECK_ALLOC(fp->raw_off);
    CHECK_ALLOC(fp->own_off);
    CHECK_ALLOC(fp->own_len);
    for (int c = 0; c < ct->n_chunks; c++) {
        const Chunk *ch = &ct->chunks[c];
        if (ch->fragment != f) continue;
        if (chunk_held(ct, c)) {
            fp->held_off[fp->n_held] = chunk_offset(ct, c);
            fp->held_len[fp->n_held++] = ch->size;
        }
        if (ch->expert < 0) {
            const int owner = chunk_owner(ct, c, t->learner_size);
            if (owner < 0) return isth_fail(ISTH_ERUNTIME, "reduce: out of memory for ownership tables");
            fp->dense_off[fp->n_dense] = chunk_offset(ct, c);
            fp->dense_len[fp->n_dense] = ch->size;
            fp->dense_owner[fp->n_dense++] = owner;
        }
    }
    for (int k = 0; k < fp->own.n; k++) {
        fp->raw_off[k] = fp->own.off[k] * sizeof(float);
        fp->own_off[k] = chunk_offset(ct, fp->own.chunk[k]);
        fp->own_len[k] = ct->chunks[fp->own.chunk[k]].size;
    }
    if (!r->leader || t->n_sites == 1) return ISTH_OK;

    if (r->error_feedback) {
        const AllocCategory was = alloc_category(ALLOC_RESIDUAL);
        fp->residual = isth_calloc(fp->own.size + 1, sizeof(float));
        alloc_category(was);
        CHECK_ALLOC(fp->residual);
    }
    for (int s = 0; s < t->n_sites; s++) {
        if (s == t->site) continue;
        const SiteInfo *o = &t->sites[s];
        CHECK(peers_add(&fp->site, ct, &fp->own, o->learner_ranks, o->first_rank, s, f, r->codec, r->cp,
                        LINK_SITE_VALUES, site_verdict_bytes(t), 0));
    }
    return peers_index(&fp->site);
}

typedef struct {
    size_t off;
    int chunk;
} PlacedChunk;

static int by_offset(const void *a, const void *b)
{
    const size_t x = ((const PlacedChunk *)a)->off, y = ((const PlacedChunk *)b)->off;
    return x < y ? -1 : x > y;
}

/* The owned chunks in memory order, merged into runs; each chunk's place
 * in the packed runs. */
static int build_runs(Reducer *r)
{
    const int n = r->table.n_chunks;
    PlacedChunk *mine = isth_malloc(sizeof(PlacedChunk) * (size_t)(n + 1));
    r->run_pos = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    r->run_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    r->run_len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    if (!mine || !r->run_pos || !r->run_off || !r->run_len) {
        isth_free(mine);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the optimizer's runs (%d chunks)", n);
    }
    int k = 0;
    for (int c = 0; c < n; c++) {
        r->run_pos[c] = SIZE_MAX;
        if (r->owned_pos[c] != SIZE_MAX) mine[k++] = (PlacedChunk){chunk_offset(&r->table, c), c};
    }
    qsort(mine, (size_t)k, sizeof *mine, by_offset);
    size_t packed = 0;
    r->n_runs = 0;
    for (int i = 0; i < k; i++) {
        const int c = mine[i].chunk;
        const size_t off = mine[i].off, size = r->table.chunks[c].size;
        r->run_pos[c] = packed;
        packed += size;
        if (r->n_runs && r->run_off[r->n_runs - 1] + r->run_len[r->n_runs - 1] == off) {
            r->run_len[r->n_runs - 1] += size;
        } else {
            r->run_off[r->n_runs] = off;
            r->run_len[r->n_runs++] = size;
        }
    }
    isth_free(mine);
    return ISTH_OK;
}

int reducer_create(Reducer *r, const Topology *t, const Model *m, int fragments, Codec codec,
                   CodecParams cp, int error_feedback, double timeout_s, MPI_Comm world)
{
    memset(r, 0, sizeof *r);
    r->topo = t;
    r->model = m;
    r->fragments = fragments;
    r->codec = codec;
    r->cp = cp;
    r->error_feedback = error_feedback && codec != CODEC_NONE;
    r->world = world;
    r->site_peers = MPI_COMM_NULL;
    r->stop_round = -1;
    r->slots = 1;
    r->leader = t->learner == t->sites[t->site].first_learner;
    link_init(&r->link, world, timeout_s, t->sites[t->site].name);
    /* the same learner rank in every learner of the site: one colour per (site, learner rank) */
    CHECK_MPI(MPI_Comm_split(world, t->site * t->world_size + t->learner_rank, t->learner, &r->site_peers));
    r->site_weight = isth_malloc(sizeof(double) * (size_t)t->n_sites);
    CHECK_ALLOC(r->site_weight);
    for (int s = 0; s < t->n_sites; s++)
        r->site_weight[s] = t->sites[s].tokens_per_step * t->sites[s].learners / t->total_tokens_per_step;
    CHECK(chunk_table_create(&r->table, m, fragments));
    r->frag = isth_calloc((size_t)fragments, sizeof(FragPlan));
    CHECK_ALLOC(r->frag);
    size_t max_chunk = 1;
    for (int f = 0; f < fragments; f++) {
        CHECK(build_fragment(r, f));
        if (r->frag[f].own.max_chunk > max_chunk) max_chunk = r->frag[f].own.max_chunk;
    }
    r->owned_pos = isth_malloc(sizeof(size_t) * (size_t)r->table.n_chunks);
    CHECK_ALLOC(r->owned_pos);
    for (int c = 0; c < r->table.n_chunks; c++) r->owned_pos[c] = SIZE_MAX;
    for (int f = 0; f < fragments; f++)
        for (int k = 0; k < r->frag[f].own.n; k++) r->owned_pos[r->frag[f].own.chunk[k]] = r->frag[f].own.off[k];
    CHECK(build_runs(r));
    const AllocCategory was = alloc_category(ALLOC_STAGING);
    r->scratch = t->n_sites > 1 || t->n_learners > 1 ? isth_malloc(sizeof(float) * max_chunk) : NULL;
    alloc_category(was);
    if (t->n_sites > 1 || t->n_learners > 1) CHECK_ALLOC(r->scratch);
    return ISTH_OK;
}

void reduce_set_slots(Reducer *r, int slots) { r->slots = slots > 0 ? slots : 1; }

void reduce_restore(Reducer *r, uint64_t exchanges) { r->exchanges = exchanges; }

void reducer_destroy(Reducer *r)
{
    link_forget_keys(&r->link);
    int retired = 1; /* messages still posted (a failed exchange) are cancelled before their buffers go */
    for (int f = 0; r->frag && f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        retired &= peers_free(&fp->site);
        owned_free(&fp->own);
        void *bufs[] = {fp->held_off, fp->held_len, fp->dense_off, fp->dense_len, fp->dense_owner,
                        fp->raw_off, fp->own_off, fp->own_len, fp->residual};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) isth_free(bufs[i]);
    }
    for (size_t i = 0; r->pairs && i < (size_t)r->fragments * r->pair_bits * 2; i++)
        retired &= peers_free(&r->pairs[i].peers);
    pool_free(&r->pool, !retired);
    for (int f = 0; r->mix_residual && f < r->fragments; f++) isth_free(r->mix_residual[f]);
    isth_free(r->mix_residual);
    isth_free(r->pairs);
    isth_free(r->frag);
    isth_free(r->site_weight);
    isth_free(r->scratch);
    isth_free(r->owned_pos);
    isth_free(r->run_pos);
    isth_free(r->run_off);
    isth_free(r->run_len);
    chunk_table_destroy(&r->table);
    link_close_wire(&r->link); /* after every message: nothing of the wire is held any more */
    if (r->site_peers != MPI_COMM_NULL) MPI_Comm_free(&r->site_peers);
    memset(r, 0, sizeof *r);
    r->site_peers = MPI_COMM_NULL;
}

const Owned *reduce_owned(const Reducer *r, int f) { return &r->frag[f].own; }

void reduce_fragment_runs(const Reducer *r, int f, const size_t **off, const size_t **len, int *n)
{
    *off = r->frag[f].held_off;
    *len = r->frag[f].held_len;
    *n = r->frag[f].n_held;
}

size_t reduce_canonical_params(const Reducer *r)
{
    size_t n = 0;
    for (int c = 0; c < r->table.n_chunks; c++) n += r->table.chunks[c].size;
    return n;
}

/* The staging pool, sized for every plan, allocated at the first exchange
 * (after reduce_enable_mixing has added the butterfly's plans). */
static int ensure_pool(Reducer *r)
{
    if (r->pool.slots) return ISTH_OK;
    const Topology *t = r->topo;
    StagePool *p = &r->pool;
    for (int f = 0; f < r->fragments; f++) {
        const FragPlan *fp = &r->frag[f];
        pool_need(p, fp->own.size, fp->own.enc_size, fp->site.send_bytes, fp->site.recv_bytes);
    }
    for (size_t i = 0; r->pairs && i < (size_t)r->fragments * r->pair_bits * 2; i++)
        pool_need(p, 0, 0, r->pairs[i].peers.send_bytes, r->pairs[i].peers.recv_bytes);
    const SiteInfo *site = &t->sites[t->site];
    /* rows: the sites' sums (site mode), or mine and the partner's (butterfly) */
    const size_t rows = r->pairs ? 2 : (size_t)t->n_sites;
    return pool_alloc(p, r->slots, rows, !r->pairs && site->learners > 1 ? (size_t)site->learners : 0);
}

Slot *reduce_take_slot(Reducer *r, int f)
{
    if (ensure_pool(r) != ISTH_OK) return NULL;
    Slot *s = pool_take(&r->pool, f);
    if (!s) isth_fail(ISTH_ERUNTIME, "reduce: more than %d exchange(s) in flight (fragment %d)", r->slots, f);
    return s;
}

float *reduce_result(const Reducer *r, int f)
{
    const FragPlan *fp = &r->frag[f];
    if (!fp->has_result) return NULL;
    if (r->pairs) return fp->slot->values; /* butterfly: the mixed values */
    return fp->slot->values + (size_t)r->topo->site * r->pool.size;
}

float *reduce_hold(Reducer *r, int f)
{
    FragPlan *fp = &r->frag[f];
    if (!fp->slot) fp->slot = reduce_take_slot(r, f);
    if (!fp->slot) return NULL;
    fp->has_result = 1;
    return reduce_result(r, f);
}

void reduce_abandon_lost(Reducer *r, int f, PeerSet *ps)
{
    for (int i = 0; i < ps->n; i++) {
        Peer *p = &ps->peers[i];
        if (p->site < 0 || p->site >= LINK_MAX_SITES || !r->link.lost[p->site]) continue;
        link_abandon(&p->msg);
        link_abandon(&p->verdict);
        if (p->msg.stuck || p->verdict.stuck) r->frag[f].slot_stuck = 1;
        p->msg.stuck = p->verdict.stuck = 0;
    }
}

void reduce_release(Reducer *r, int f)
{
    FragPlan *fp = &r->frag[f];
    if (fp->slot && fp->slot_stuck && pool_renew(&r->pool, fp->slot) != ISTH_OK) {
        fp->slot->user = -2; /* kept out of the pool for good: MPI may still write it */
        fp->slot = NULL;
    }
    fp->slot_stuck = 0;
    pool_give(fp->slot);
    fp->slot = NULL;
    fp->has_result = 0;
}

int reduce_share_dense(const Reducer *r, Backend *be, int f, StateKind which)
{
    const FragPlan *fp = &r->frag[f];
    if (r->topo->learner_size == 1) return ISTH_OK;
    return be->ops->share_runs(be, which, fp->dense_off, fp->dense_len, fp->dense_owner, fp->n_dense);
}

int reduce_share_params(const Reducer *r, Backend *be)
{
    for (int f = 0; r->topo->learner_size > 1 && f < r->fragments; f++)
        CHECK(reduce_share_dense(r, be, f, STATE_PARAMS));
    return ISTH_OK;
}

int reduce_get_owned(const Reducer *r, Backend *be, int f, StateKind which, float *packed)
{
    const FragPlan *fp = &r->frag[f];
    return be->ops->get(be, which, fp->own_off, fp->own_len, fp->own.n, packed);
}

int reduce_put_owned(const Reducer *r, Backend *be, int f, StateKind which, const float *packed)
{
    const FragPlan *fp = &r->frag[f];
    return be->ops->put(be, which, fp->own_off, fp->own_len, fp->own.n, packed);
}

void reduce_owned_runs(const Reducer *r, const size_t **off, const size_t **len, int *n)
{
    *off = r->run_off;
    *len = r->run_len;
    *n = r->n_runs;
}

static int sum_dense(const Reducer *r, Backend *be, int f, StateKind which)
{
    const FragPlan *fp = &r->frag[f];
    if (r->topo->learner_size == 1) return ISTH_OK;
    return be->ops->sum_runs(be, which, fp->dense_off, fp->dense_len, fp->n_dense);
}

int reduce_learner_sum(const Reducer *r, Backend *be)
{
    for (int f = 0; f < r->fragments; f++) CHECK(sum_dense(r, be, f, STATE_GRADS));
    return ISTH_OK;
}

float *reduce_stage(Reducer *r, int f)
{
    FragPlan *fp = &r->frag[f];
    if (fp->slot) {
        isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
        return NULL;
    }
    fp->slot = reduce_take_slot(r, f);
    return fp->slot ? fp->slot->values + (size_t)r->topo->site * r->pool.size : NULL;
}

void reduce_encode_on(Reducer *r, Backend *be) { r->encoder = be && be->ops->encode_ef ? be : NULL; }

int reduce_encode_chunk(const Reducer *r, const float *x, float *residual, size_t n, unsigned char *out,
                        float *decoded, double *err2, double *norm2)
{
    /* the backends encode the element-wise codecs with plain feedback; the
     * sparse codec and a decaying residual are the host's */
    if (r->encoder && r->codec != CODEC_TOPK && r->cp.decay == 1.0f)
        return r->encoder->ops->encode_ef(r->encoder, r->codec, x, residual, n, r->cp.block, out, decoded, err2,
                                          norm2);
    if (codec_encode_ef(r->codec, x, residual, n, r->cp, out, decoded, err2, norm2))
        return isth_fail(ISTH_ERUNTIME, "codec %s: out of memory encoding a %zu-value chunk", codec_name(r->codec), n);
    return ISTH_OK;
}

int reduce_start(Reducer *r, Backend *be, int f, StateKind which, int kind)
{
    FragPlan *fp = &r->frag[f];
    if (kind == REDUCE_GRADS) CHECK(sum_dense(r, be, f, which));
    if (r->topo->n_learners == 1) { /* nothing to combine: buf is the result, no staging */
        if (fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
        fp->in_flight = 1;
        fp->arrived_poll = -1;
        fp->exchange = ++r->exchanges;
        return ISTH_OK;
    }
    float *mine = reduce_stage(r, f);
    if (!mine) return ISTH_ERUNTIME;
    CHECK(reduce_get_owned(r, be, f, which, mine));
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
static int pace_sends(Reducer *r, FragPlan *fp)
{
    const double share = fmin(1.0, (double)(fp->polls > 1 ? fp->polls : 1) / (double)(r->window_polls - 1));
    for (int i = 0; i < fp->site.n; i++) {
        LinkMsg *m = &fp->site.peers[i].msg;
        if (m->send_posted == 2) continue;
        CHECK(link_post_send_upto(&r->link, m, (size_t)ceil(share * (double)m->send_bytes)));
    }
    return ISTH_OK;
}

/* After a poll that found the exchange incomplete: will the rest arrive
 * before its result is due? Poll p comes p - 1 inner steps after the
 * start and the result is due `window` steps after it, so window - p + 1
 * steps (of the length the last p - 1 took) are left; the pieces received
 * so far give the payload's rate. Once it is clear that it will not
 * arrive in time, this is logged once, before the step that waits for it. */
static int warn_if_late(Reducer *r, int f, FragPlan *fp)
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
    r->late_exchanges++;
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
    FragPlan *fp = &r->frag[f];
    const SiteInfo *site = &t->sites[t->site];
    if (!fp->slot) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started without staging", f);
    if (fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
    fp->in_flight = 1;
    fp->has_result = 0;
    fp->polls = 0;
    fp->window_polls_seen = 0;
    fp->verdict_posted = 0;
    fp->arrived_poll = -1;
    fp->err2 = fp->norm2 = 0.0;
    fp->exchange = ++r->exchanges;
    if (t->n_learners == 1) return ISTH_OK; /* nothing to combine */

    /* (2) my owned chunks, summed over the site's learners in learner order */
    const size_t size = r->pool.size;
    float *mine = fp->slot->values + (size_t)t->site * size;
    if (site->learners > 1) {
        float *gather = fp->slot->gather;
        CHECK(coll_allgather_floats(r->site_peers, mine, fp->own.size, gather));
        for (size_t i = 0; i < fp->own.size; i++) {
            float s = 0.0f;
            for (int l = 0; l < site->learners; l++) s += gather[(size_t)l * fp->own.size + i];
            mine[i] = s;
        }
    }
    if (t->n_sites == 1 || !r->leader) return ISTH_OK;

    /* (3) encode chunk by chunk; my contribution becomes what others decode */
    unsigned char *enc = fp->slot->enc;
    for (int k = 0; k < fp->own.n; k++) {
        const size_t n = r->table.chunks[fp->own.chunk[k]].size;
        float *v = mine + fp->own.off[k];
        double e2, n2;
        CHECK(reduce_encode_chunk(r, v, fp->residual ? fp->residual + fp->own.off[k] : NULL, n,
                                  enc + fp->own.enc_off[k], r->scratch, &e2, &n2));
        memcpy(v, r->scratch, n * sizeof(float));
        fp->err2 += e2;
        fp->norm2 += n2;
    }
    peers_bind(&fp->site, fp->slot);
    const int corrupt = r->link.corrupt_exchange && (uint64_t)r->link.corrupt_exchange == fp->exchange;
    const int paced = r->pace && r->pace_ok && r->window_polls > 1 && !r->link.delay_polls;
    fp->paced = paced;
    CHECK(peers_post(&r->link, &r->table, &fp->own, (Encoded){r->codec, enc, fp->own.enc_off}, &fp->site, r->cp,
                     LINK_SITE_VALUES, f, (uint32_t)t->site, fp->exchange, !r->link.delay_polls && !paced, corrupt));
    fp->sends_deferred = r->link.delay_polls > 0;
    fp->sent_poll = 0;
    fp->started_s = now_s();
    fp->late_warned = 0;
    if (paced) CHECK(pace_sends(r, fp));
    return ISTH_OK;
}

static int verdict_early(Reducer *r, FragPlan *fp, int f);

void reduce_progress(void *reducer)
{
    Reducer *r = reducer;
    for (int f = 0; f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        int all;
        /* an error here is found again by the next poll, which reports it */
        if (fp->in_flight && fp->site.n) (void)link_test(&r->link, fp->site.links, fp->site.n, &all);
    }
}

int reduce_poll(Reducer *r)
{
    const Topology *t = r->topo;
    CHECK(mix_poll(r));
    for (int f = 0; f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        if (!fp->in_flight) continue;
        fp->window_polls_seen++; /* every rank of the site alike (the early verdict is collective) */
        if (fp->site.n) {
            fp->polls++;
            if (fp->sends_deferred && fp->polls >= r->link.delay_polls) {
                for (int i = 0; i < fp->site.n; i++) CHECK(link_post_send(&r->link, &fp->site.peers[i].msg));
                fp->sends_deferred = 0;
                fp->sent_poll = fp->polls;
            }
            if (!fp->sends_deferred && fp->paced) CHECK(pace_sends(r, fp));
            int arrived = 0;
            if (fp->arrived_poll < 0) CHECK(link_test(&r->link, fp->site.links, fp->site.n, &arrived));
            if (arrived) fp->arrived_poll = fp->polls;
            else CHECK(warn_if_late(r, f, fp));
        }
        if (r->window_polls >= 2 && fp->window_polls_seen == r->window_polls && !r->link.delay_polls &&
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
 * rides along (ok[n_sites + s] = 0 when site s asks to stop). alive[s] = 0 for
 * a site this rank found late (federated launch: lost from now on); a
 * verdict that misses the deadline makes its site late too. Both are
 * agreed inside the site, then lost sites are marked in the link.
 * (4a) the site's verdict, agreed and posted to the other sites: at the
 * finish, or at the last poll before it (a step earlier) when every
 * payload had arrived by then (reduce_poll), so that the verdicts' round
 * trip hides behind a step. */
static int agree_post(Reducer *r, FragPlan *fp, int f, const unsigned char *ok, const unsigned char *alive)
{
    const Topology *t = r->topo;
    const int S = t->n_sites;
    const size_t nv = site_verdict_bytes(t);
    unsigned char *buf = fp->verdict;
    memcpy(buf, ok, (size_t)S);
    for (int s = 0; s < S; s++) buf[S + s] = s != t->site || !r->stop_request;
    memcpy(buf + nv, alive, (size_t)S);
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, (int)nv + S, MPI_UNSIGNED_CHAR, MPI_MIN, t->site_comm));
    fp->verdict_posted = 1;
    if (!r->leader || !fp->site.n) return ISTH_OK;
    for (int i = 0; i < fp->site.n; i++) {
        Peer *p = &fp->site.peers[i];
        p->verdict_waited = 0;
        if (!buf[nv + p->site] || r->link.lost[p->site]) continue; /* no verdict to or from a lost site */
        memcpy(p->verdict.send + sizeof(LinkHeader), buf, nv);
        link_frame(&r->link, p->world_rank, p->verdict.send, 0, LINK_SITE_VERDICT, (uint32_t)f, (uint32_t)t->site, fp->exchange, nv, nv);
        p->verdict.send_posted = 0;
        CHECK(link_post_recv(&r->link, &p->verdict));
        CHECK(link_post_send(&r->link, &p->verdict));
        p->verdict_waited = 1;
    }
    return ISTH_OK;
}

/* (4b) the other sites' verdicts, awaited, and the site's final word. */
static int agree_complete(Reducer *r, FragPlan *fp, int f, unsigned char *ok, unsigned char *alive, double waited)
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
            if (r->link.lost[p->site]) { /* lost since the verdict was posted */
                link_abandon(&p->verdict);
                buf[nv + p->site] = 0;
                buf[p->site] = 0;
                continue;
            }
            wait[n] = &p->verdict;
            peer_of[n++] = i;
        }
        double vwait = 0.0;
        if (rc == ISTH_OK) rc = link_wait_live(&r->link, wait, n, "verdict exchange", late, &vwait);
        if (vwait > waited) waited = vwait;
        for (int k = 0; rc == ISTH_OK && k < n; k++) {
            const Peer *p = &fp->site.peers[peer_of[k]];
            if (late[k]) {
                buf[nv + p->site] = 0;
                buf[p->site] = 0;
                continue;
            }
            const unsigned char *v = p->verdict.recv;
            const char *bad = link_check(&r->link, p->world_rank, p->verdict.recv, p->verdict.recv_bytes,
                                         LINK_SITE_VERDICT, (uint32_t)f, fp->exchange, nv, nv);
            /* a verdict we cannot read would leave the sites with different
             * sets of contributions (and stop votes): the run cannot go on */
            if (bad)
                rc = isth_fail(ISTH_ERUNTIME, "link: verdict from world rank %d for fragment %d unreadable: %s",
                               p->world_rank, f, bad);
            else
                for (size_t s = 0; s < nv; s++) buf[s] &= v[sizeof(LinkHeader) + s];
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
            link_mark_lost(&r->link, s, what, w);
        }
    }
    for (int s = 0; s < S; s++)
        if (!buf[S + s]) r->stop_agreed = 1, r->stop_sites[s] = 1;
    return ISTH_OK;
}

/* Decode and check every arrived payload into the staging (a site found
 * late or lost is not taken); ok[s] = 0 for a payload rejected, with why. */
static void take_payloads(Reducer *r, FragPlan *fp, int f, unsigned char *ok, const unsigned char *alive,
                          char *rejected, size_t cap)
{
    const size_t size = r->pool.size;
    float *staging = fp->slot->values;
    for (int i = 0; i < fp->site.n; i++) {
        const Peer *p = &fp->site.peers[i];
        if (!alive[p->site]) {
            ok[p->site] = 0;
            continue;
        }
        const char *bad = peer_take(&r->link, &r->table, &fp->own, r->codec, r->cp, p, LINK_SITE_VALUES, f, fp->exchange,
                                    staging + (size_t)p->site * size);
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
static int verdict_early(Reducer *r, FragPlan *fp, int f)
{
    const Topology *t = r->topo;
    int here = 1, all; /* the payloads here; this site's own sends may still drain */
    if (r->leader && fp->site.n) CHECK(link_test(&r->link, fp->site.links, fp->site.n, &all));
    for (int i = 0; here && r->leader && i < fp->site.n; i++) here = fp->site.peers[i].msg.recv_done;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &here, 1, MPI_INT, MPI_MIN, t->site_comm));
    if (!here) return ISTH_OK; /* the finish does it all, as without a window */
    memset(fp->early_ok, 1, sizeof fp->early_ok);
    for (int s = 0; s < t->n_sites; s++) fp->early_alive[s] = !r->link.lost[s];
    fp->early_rejected[0] = '\0';
    reduce_abandon_lost(r, f, &fp->site);
    if (r->leader && fp->site.n)
        take_payloads(r, fp, f, fp->early_ok, fp->early_alive, fp->early_rejected, sizeof fp->early_rejected);
    return agree_post(r, fp, f, fp->early_ok, fp->early_alive);
}

/* The report of fragment f's exchange as it finishes (before the link part). */
static void report_begin(const Reducer *r, int f, ReduceReport *rep)
{
    const FragPlan *fp = &r->frag[f];
    memset(rep, 0, sizeof *rep);
    rep->fragment = f;
    rep->exchange = fp->exchange;
    rep->n_sites = rep->accepted_sites = r->topo->n_sites;
    rep->arrived_poll = fp->arrived_poll;
}

int reduce_finish_staged(Reducer *r, int f, ReduceReport *rep, float **result)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
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
    fp->has_result = 1;
    const size_t size = r->pool.size, n = fp->own.size;
    float *staging = fp->slot->values, *total = staging + (size_t)t->site * size; /* my site's sum, then the total */
    *result = total;
    if (t->n_learners == 1) return ISTH_OK; /* one learner: the staged values are the result */
    /* the site sum waits on the site's learners, the link on every other
     * site's payload, which waited on all of that site's learners */
    if (t->n_learners - 1 > r->max_peer_learners) r->max_peer_learners = t->n_learners - 1;
    if (t->n_sites == 1) return ISTH_OK;
    unsigned char ok[CONFIG_MAX_SITES + 1], alive[CONFIG_MAX_SITES];
    memset(ok, 1, sizeof ok);
    for (int s = 0; s < t->n_sites; s++) alive[s] = !r->link.lost[s];
    double waited = 0.0;
    reduce_abandon_lost(r, f, &fp->site); /* posted before a loss found elsewhere: not waited for again */
    if (fp->verdict_posted) { /* taken and judged at the poll before: only our sends may still be going */
        memcpy(ok, fp->early_ok, sizeof fp->early_ok);
        memcpy(alive, fp->early_alive, sizeof fp->early_alive);
        memcpy(rep->rejected, fp->early_rejected, sizeof rep->rejected);
        if (r->leader && fp->site.n) {
            unsigned char *late = isth_calloc((size_t)fp->site.n, 1);
            CHECK_ALLOC(late);
            const int wrc = link_wait_live(&r->link, fp->site.links, fp->site.n, "payload exchange", late, &waited);
            isth_free(late); /* a send that never completes: its verdict, awaited next, says so */
            CHECK(wrc);
        }
    } else {
        if (r->leader && fp->site.n) {
            unsigned char *late = isth_calloc((size_t)fp->site.n, 1);
            CHECK_ALLOC(late);
            const int wrc = link_wait_live(&r->link, fp->site.links, fp->site.n, "payload exchange", late, &waited);
            for (int i = 0; wrc == ISTH_OK && i < fp->site.n; i++)
                if (late[i]) alive[fp->site.peers[i].site] = 0;
            isth_free(late);
            CHECK(wrc);
            take_payloads(r, fp, f, ok, alive, rep->rejected, sizeof rep->rejected);
        }
        CHECK(agree_post(r, fp, f, ok, alive));
    }
    CHECK(agree_complete(r, fp, f, ok, alive, waited));
    reduce_abandon_lost(r, f, &fp->site); /* what the waits gave up on: stuck ones renew the slot */
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
    /* (5) sum the accepted sites in site order */
    if (r->leader && r->codec == CODEC_TOPK && r->sender_mean) {
        /* each value over the sites that sent it: a sparse payload's zero is
         * "not sent", not "zero" (the values arrive pre-scaled by their
         * site's token share, so the divisor is the senders' share) */
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f, w = 0.0f;
            for (int st = 0; st < t->n_sites; st++)
                if (ok[st] && codec_topk_sent(staging[(size_t)st * size + i])) {
                    s += staging[(size_t)st * size + i];
                    w += (float)r->site_weight[st];
                }
            total[i] = w > 0.0f ? s / w : 0.0f;
        }
    } else if (r->leader) { /* total overwrites my site's slot element by element */
        const float rescale = rep->accepted_sites == t->n_sites ? 1.0f : (float)(1.0 / wsum);
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (int st = 0; st < t->n_sites; st++)
                if (ok[st]) s += staging[(size_t)st * size + i];
            total[i] = rescale == 1.0f ? s : s * rescale;
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

int reduce_finish(Reducer *r, Backend *be, int f, StateKind which, ReduceReport *rep)
{
    FragPlan *fp = &r->frag[f];
    if (r->topo->n_learners == 1) { /* see reduce_start */
        report_begin(r, f, rep);
        if (!fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d finished but not started", f);
        fp->in_flight = 0;
        return ISTH_OK;
    }
    float *total;
    CHECK(reduce_finish_staged(r, f, rep, &total));
    CHECK(reduce_put_owned(r, be, f, which, total));
    reduce_release(r, f);
    /* dense chunks shared inside the learner (one learner: the state is the result already) */
    return reduce_share_dense(r, be, f, which);
}

int reduce_owns(const Reducer *r, int c) { return r->owned_pos[c] != SIZE_MAX; }

float *reduce_residual(const Reducer *r, int f)
{
    return r->mix_residual ? r->mix_residual[f] : r->frag[f].residual;
}

float *reduce_residual_at(const Reducer *r, int tensor, int layer, int expert)
{
    const int c = chunk_index(&r->table, tensor, layer, expert < 0 ? 0 : expert);
    float *res = reduce_residual(r, r->table.chunks[c].fragment);
    return res && r->owned_pos[c] != SIZE_MAX ? res + r->owned_pos[c] : NULL;
}

void reduce_zero_residuals(Reducer *r)
{
    for (int f = 0; f < r->fragments; f++) {
        float *res = reduce_residual(r, f);
        if (res) memset(res, 0, sizeof(float) * (r->frag[f].own.size + 1));
    }
}

int reduce_has_residual(const Reducer *r) { return r->frag && reduce_residual(r, 0) != NULL; }

int reduce_any_residual(const Reducer *r) { return r->error_feedback && r->topo->n_sites > 1; }
