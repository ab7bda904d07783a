/* reduce.c — see reduce.h. */
#include "reduce.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "optim.h"
#include "status.h"

/* A site verdict: one byte per site (its payload accepted), then one byte
 * "go on" (0: this site asks every site to stop). */
static size_t site_verdict_bytes(const Topology *t) { return (size_t)t->n_sites + 1; }

int fragment_of(int tensor, int layer, int layers, int fragments)
{
    if (tensor == T_EMBED) return 0;
    if (tensor == T_FINAL_NORM) return (layers - 1) % fragments;
    return layer % fragments;
}

static size_t per_layer(const Tensor *t) { return (t->flags & PARAM_LAYERED) ? t->numel / t->local[0] : t->numel; }

static int build_chunks(Reducer *r)
{
    const Model *m = r->model;
    const int L = m->cfg.layers, E = m->cfg.experts;
    const size_t per_expert = (size_t)m->cfg.dim * m->cfg.ffn;
    int n = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        const Tensor *x = &m->tensors[t];
        int layers = (x->flags & PARAM_LAYERED) ? L : 1;
        n += (x->flags & PARAM_EXPERT) ? layers * E : layers;
    }
    r->chunks = isth_malloc(sizeof(Chunk) * (size_t)n);
    CHECK_ALLOC(r->chunks);
    r->n_chunks = n;
    n = 0;
    for (int t = 0; t < N_TENSORS; t++) { /* canonical order: tensor, layer, expert */
        const Tensor *x = &m->tensors[t];
        int layers = (x->flags & PARAM_LAYERED) ? L : 1;
        for (int l = 0; l < layers; l++) {
            int f = fragment_of(t, l, L, r->fragments);
            if (x->flags & PARAM_EXPERT)
                for (int e = 0; e < E; e++) r->chunks[n++] = (Chunk){t, l, e, per_expert, f};
            else
                r->chunks[n++] = (Chunk){t, l, -1, per_layer(x), f};
        }
    }
    return ISTH_OK;
}

/* Owner of chunk c inside a learner of G ranks. Experts: their shard;
 * dense chunks: greedy balance by size in canonical order (ties to the
 * lower rank), the same computation on every rank. */
static int chunk_owner(Reducer *r, int c, int G)
{
    const Chunk *ch = &r->chunks[c];
    if (ch->expert >= 0) return ch->expert / (r->model->cfg.experts / G);
    for (int i = 0; i < r->n_dense_cache; i++)
        if (r->dense_G[i] == G) return r->dense_owner[i][c];
    if (r->n_dense_cache == REDUCE_MAX_LEARNER_SIZES) return -1; /* cannot happen: one size per site */
    int *owner = isth_malloc(sizeof(int) * (size_t)r->n_chunks);
    double *load = isth_calloc((size_t)G, sizeof(double));
    if (!owner || !load) {
        free(owner);
        free(load);
        return -1;
    }
    for (int k = 0; k < r->n_chunks; k++) {
        if (r->chunks[k].expert >= 0) {
            owner[k] = -1;
            continue;
        }
        int best = 0;
        for (int j = 1; j < G; j++)
            if (load[j] < load[best]) best = j;
        owner[k] = best;
        load[best] += (double)r->chunks[k].size;
    }
    free(load);
    r->dense_G[r->n_dense_cache] = G;
    r->dense_owner[r->n_dense_cache++] = owner;
    return owner[c];
}

/* Local offset of chunk c on this rank (which must hold it). */
static size_t chunk_offset(const Reducer *r, int c)
{
    const Chunk *ch = &r->chunks[c];
    const Model *m = r->model;
    const Tensor *x = &m->tensors[ch->tensor];
    size_t off = x->offset + ((x->flags & PARAM_LAYERED) ? (size_t)ch->layer * per_layer(x) : 0);
    if (ch->expert >= 0) off += (size_t)(ch->expert - m->expert_begin) * ch->size;
    return off;
}

static int holds(const Reducer *r, int c)
{
    const Chunk *ch = &r->chunks[c];
    return ch->expert < 0 ||
           (ch->expert >= r->model->expert_begin && ch->expert < r->model->expert_begin + r->model->experts_local);
}

/* The plan with one rank of another learner (rank j of a learner of G
 * ranks, world rank `world`): the chunks of my fragment both of us own, and
 * the message buffers. Returns 1 (a peer), 0 (nothing in common) or -1 (out
 * of memory); on 0 the peer is left empty. */
static int build_peer(Reducer *r, const FragPlan *fp, Peer *p, int G, int j, int world, int site, int f,
                      Codec codec, uint8_t values_kind, size_t verdict_bytes, int local)
{
    p->chunks = isth_malloc(sizeof(int) * (size_t)(fp->n_owned + 1));
    if (!p->chunks) return -1;
    for (int k = 0; k < fp->n_owned; k++) {
        const int owner = chunk_owner(r, fp->owned[k], G);
        if (owner < 0) return -1;
        if (owner != j) continue;
        p->chunks[p->n++] = k;
        p->values += r->chunks[fp->owned[k]].size;
        p->enc_bytes += codec_encoded_size(codec, r->chunks[fp->owned[k]].size, r->block);
    }
    if (!p->n) {
        free(p->chunks);
        memset(p, 0, sizeof *p);
        return 0;
    }
    p->world_rank = world;
    p->site = site;
    const size_t bytes = sizeof(LinkHeader) + p->enc_bytes, vbytes = sizeof(LinkHeader) + verdict_bytes;
    if (link_msg_alloc(&p->msg, world, LINK_TAG(values_kind, f), bytes, bytes, local) != ISTH_OK) return -1;
    if (link_msg_alloc(&p->verdict, world, LINK_TAG(values_kind + 1, f), vbytes, vbytes, local) != ISTH_OK) return -1;
    return 1;
}

/* The peers' messages as the link calls take them: payloads, then verdicts
 * (built once per plan; the polls of every step only read it). */
static LinkMsg **index_links(Peer *peers, int n)
{
    LinkMsg **links = isth_malloc(sizeof(LinkMsg *) * (size_t)(2 * n + 1));
    for (int i = 0; links && i < n; i++) {
        links[i] = &peers[i].msg;
        links[n + i] = &peers[i].verdict;
    }
    return links;
}

static int build_fragment(Reducer *r, int f)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
    const int G = t->learner_size;
    fp->owned = isth_malloc(sizeof(int) * (size_t)r->n_chunks);
    fp->packed_off = isth_malloc(sizeof(size_t) * (size_t)r->n_chunks);
    fp->enc_off = isth_malloc(sizeof(size_t) * (size_t)r->n_chunks);
    fp->held_off = isth_malloc(sizeof(size_t) * (size_t)r->n_chunks);
    fp->held_len = isth_malloc(sizeof(size_t) * (size_t)r->n_chunks);
    fp->dense_chunks = isth_malloc(sizeof(int) * (size_t)r->n_chunks);
    CHECK_ALLOC(fp->owned);
    CHECK_ALLOC(fp->packed_off);
    CHECK_ALLOC(fp->enc_off);
    CHECK_ALLOC(fp->held_off);
    CHECK_ALLOC(fp->held_len);
    CHECK_ALLOC(fp->dense_chunks);
    size_t max_chunk = 1;
    for (int c = 0; c < r->n_chunks; c++) {
        const Chunk *ch = &r->chunks[c];
        if (ch->fragment != f) continue;
        if (holds(r, c)) {
            fp->held_off[fp->n_held] = chunk_offset(r, c);
            fp->held_len[fp->n_held++] = ch->size;
        }
        if (ch->expert < 0) {
            fp->dense_chunks[fp->n_dense++] = c;
            fp->dense_size += ch->size;
        }
        int owner = chunk_owner(r, c, G);
        if (owner < 0) return isth_fail(ISTH_ERUNTIME, "reduce: out of memory for ownership tables");
        if (owner != t->learner_rank) continue;
        fp->packed_off[fp->n_owned] = fp->size;
        fp->enc_off[fp->n_owned] = fp->enc_size;
        fp->owned[fp->n_owned++] = c;
        fp->size += ch->size;
        fp->enc_size += codec_encoded_size(r->codec, ch->size, r->block);
        if (ch->size > max_chunk) max_chunk = ch->size;
    }
    const SiteInfo *site = &t->sites[t->site];
    const size_t sz = fp->size ? fp->size : 1;
    fp->staging = isth_malloc(sizeof(float) * sz * (size_t)t->n_sites);
    fp->gather = site->learners > 1 ? isth_malloc(sizeof(float) * sz * (size_t)site->learners) : NULL;
    fp->scratch = isth_malloc(sizeof(float) * max_chunk);
    fp->enc = isth_malloc(fp->enc_size + 1);
    fp->dense_buf = isth_malloc(sizeof(float) * (fp->dense_size + 1));
    CHECK_ALLOC(fp->staging);
    CHECK_ALLOC(fp->scratch);
    CHECK_ALLOC(fp->enc);
    CHECK_ALLOC(fp->dense_buf);
    if (site->learners > 1) CHECK_ALLOC(fp->gather);
    if (!r->leader || t->n_sites == 1) return ISTH_OK;

    if (r->error_feedback) {
        fp->residual = isth_calloc(sz, sizeof(float));
        CHECK_ALLOC(fp->residual);
    }
    int max_peers = 0;
    for (int s = 0; s < t->n_sites; s++)
        if (s != t->site) max_peers += t->sites[s].learner_ranks;
    fp->peers = isth_calloc((size_t)max_peers + 1, sizeof(Peer));
    CHECK_ALLOC(fp->peers);
    for (int s = 0; s < t->n_sites; s++) {
        if (s == t->site) continue;
        const SiteInfo *o = &t->sites[s];
        for (int j = 0; j < o->learner_ranks; j++) {
            const int got = build_peer(r, fp, &fp->peers[fp->n_peers], o->learner_ranks, j, o->first_rank + j, s, f,
                                       r->codec, LINK_SITE_VALUES, site_verdict_bytes(t), 0);
            if (got < 0) return isth_fail(ISTH_ERUNTIME, "reduce: out of memory for exchange plans");
            fp->n_peers += got;
        }
    }
    fp->links = index_links(fp->peers, fp->n_peers);
    CHECK_ALLOC(fp->links);
    return ISTH_OK;
}

int reducer_create(Reducer *r, const Topology *t, const Model *m, int fragments, Codec codec,
                   int block, int error_feedback, double timeout_s, MPI_Comm world)
{
    memset(r, 0, sizeof *r);
    r->topo = t;
    r->model = m;
    r->fragments = fragments;
    r->codec = codec;
    r->block = block;
    r->error_feedback = error_feedback && codec != CODEC_NONE;
    r->world = world;
    r->site_peers = MPI_COMM_NULL;
    r->stop_round = -1;
    r->leader = t->learner == t->sites[t->site].first_learner;
    link_init(&r->link, world, timeout_s, t->sites[t->site].name);
    CHECK_MPI(MPI_Comm_split(world, t->site * t->world_size + t->learner_rank, t->learner, &r->site_peers));
    r->site_weight = isth_malloc(sizeof(double) * (size_t)t->n_sites);
    CHECK_ALLOC(r->site_weight);
    for (int s = 0; s < t->n_sites; s++)
        r->site_weight[s] = t->sites[s].tokens_per_step * t->sites[s].learners / t->total_tokens_per_step;
    CHECK(build_chunks(r));
    r->frag = isth_calloc((size_t)fragments, sizeof(FragPlan));
    CHECK_ALLOC(r->frag);
    for (int f = 0; f < fragments; f++) CHECK(build_fragment(r, f));
    return ISTH_OK;
}

/* Messages still posted (a failed exchange) are cancelled before their
 * buffers go (link_msg_free). */
static void free_peer(Peer *p)
{
    free(p->chunks);
    link_msg_free(&p->msg);
    link_msg_free(&p->verdict);
}

void reducer_destroy(Reducer *r)
{
    for (int f = 0; r->frag && f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        for (int i = 0; i < fp->n_peers; i++) free_peer(&fp->peers[i]);
        void *bufs[] = {fp->owned, fp->packed_off, fp->enc_off, fp->held_off, fp->held_len, fp->dense_chunks,
                        fp->peers, fp->links, fp->staging, fp->gather, fp->residual, fp->scratch, fp->enc, fp->dense_buf};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    }
    for (size_t i = 0; r->pairs && i < (size_t)r->fragments * 64; i++) {
        PairPlan *pp = &r->pairs[i];
        for (int j = 0; j < pp->n_peers; j++) free_peer(&pp->peers[j]);
        free(pp->peers);
        free(pp->links);
        free(pp->raw_off);
        free(pp->mine);
        free(pp->theirs);
    }
    for (int f = 0; r->mix_residual && f < r->fragments; f++) free(r->mix_residual[f]);
    free(r->mix_residual);
    free(r->pairs);
    free(r->frag);
    free(r->chunks);
    free(r->site_weight);
    for (int i = 0; i < r->n_dense_cache; i++) free(r->dense_owner[i]);
    if (r->site_peers != MPI_COMM_NULL) MPI_Comm_free(&r->site_peers);
    memset(r, 0, sizeof *r);
    r->site_peers = MPI_COMM_NULL;
}

void reduce_fragment_runs(const Reducer *r, int f, const size_t **off, const size_t **len, int *n)
{
    *off = r->frag[f].held_off;
    *len = r->frag[f].held_len;
    *n = r->frag[f].n_held;
}

size_t reduce_canonical_params(const Reducer *r)
{
    size_t n = 0;
    for (int c = 0; c < r->n_chunks; c++) n += r->chunks[c].size;
    return n;
}

/* Sum the fragment's dense chunks over the learner's ranks, in place. */
static int learner_sum_dense(Reducer *r, FragPlan *fp, float *local)
{
    if (r->topo->learner_size == 1 || !fp->n_dense) return ISTH_OK;
    size_t k = 0;
    for (int i = 0; i < fp->n_dense; i++) {
        const int c = fp->dense_chunks[i];
        memcpy(fp->dense_buf + k, local + chunk_offset(r, c), r->chunks[c].size * sizeof(float));
        k += r->chunks[c].size;
    }
    CHECK(coll_allreduce_comm(r->topo->learner_comm, fp->dense_buf, fp->dense_size, MPI_FLOAT, sizeof(float),
                              MPI_SUM));
    k = 0;
    for (int i = 0; i < fp->n_dense; i++) {
        const int c = fp->dense_chunks[i];
        memcpy(local + chunk_offset(r, c), fp->dense_buf + k, r->chunks[c].size * sizeof(float));
        k += r->chunks[c].size;
    }
    return ISTH_OK;
}

/* A fragment's owned chunks, encoded: chunk k at bytes + off[k]. */
typedef struct {
    Codec codec;
    const unsigned char *bytes;
    const size_t *off;
} Encoded;

/* Frame the encoded chunks each peer owns and post the exchange. */
static int post_payloads(Reducer *r, FragPlan *fp, Encoded enc, Peer *peers, int n, uint8_t kind, int f,
                         uint32_t from, uint64_t exchange, int send_now)
{
    const int corrupt = r->link.corrupt_exchange && (uint64_t)r->link.corrupt_exchange == exchange;
    for (int i = 0; i < n; i++) {
        Peer *p = &peers[i];
        unsigned char *payload = p->msg.send + sizeof(LinkHeader);
        for (int j = 0; j < p->n; j++) {
            const int k = p->chunks[j];
            const size_t bytes = codec_encoded_size(enc.codec, r->chunks[fp->owned[k]].size, r->block);
            memcpy(payload, enc.bytes + enc.off[k], bytes);
            payload += bytes;
        }
        link_frame(p->msg.send, (uint8_t)enc.codec, kind, (uint32_t)f, from, exchange, p->values, p->enc_bytes);
        if (corrupt) link_corrupt(p->msg.send, p->msg.send_bytes);
        p->msg.send_posted = 0;
        CHECK(link_post_recv(&r->link, &p->msg));
        if (send_now) CHECK(link_post_send(&r->link, &p->msg));
    }
    return ISTH_OK;
}

/* Check a peer's frame and decode its chunks into dst (packed owned layout).
 * Returns NULL or the reason for rejecting it. */
static const char *take_payload(Reducer *r, FragPlan *fp, Codec codec, Peer *p, uint8_t kind, int f, uint64_t exchange,
                                float *dst)
{
    const char *bad = link_check(p->msg.recv, p->msg.recv_bytes, kind, (uint32_t)f, exchange, p->values, p->enc_bytes);
    const unsigned char *src = p->msg.recv + sizeof(LinkHeader);
    for (int j = 0; j < p->n && !bad; j++) {
        const int k = p->chunks[j];
        const size_t n = r->chunks[fp->owned[k]].size;
        float *d = dst + fp->packed_off[k];
        codec_decode(codec, src, n, r->block, d);
        src += codec_encoded_size(codec, n, r->block);
        for (size_t e = 0; e < n; e++)
            if (!isfinite(d[e])) return "NaN or Inf in payload";
    }
    return bad;
}

int reduce_learner_sum(Reducer *r, float *grads)
{
    for (int f = 0; f < r->fragments; f++) CHECK(learner_sum_dense(r, &r->frag[f], grads));
    return ISTH_OK;
}

int reduce_start(Reducer *r, int f, float *buf, int kind)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
    const SiteInfo *site = &t->sites[t->site];
    if (fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d started twice", f);
    fp->in_flight = 1;
    fp->kind = kind;
    fp->polls = 0;
    fp->arrived_poll = -1;
    fp->err2 = fp->norm2 = 0.0;
    fp->exchange = ++r->exchanges;
    if (kind == REDUCE_GRADS) CHECK(learner_sum_dense(r, fp, buf));
    if (t->n_learners == 1) return ISTH_OK; /* nothing to combine */

    /* (2) my owned chunks, summed over the site's learners in learner order */
    float *mine = fp->staging + (size_t)t->site * fp->size;
    for (int k = 0; k < fp->n_owned; k++)
        memcpy(mine + fp->packed_off[k], buf + chunk_offset(r, fp->owned[k]),
               r->chunks[fp->owned[k]].size * sizeof(float));
    if (site->learners > 1) {
        CHECK(coll_allgather_floats(r->site_peers, mine, fp->size, fp->gather));
        for (size_t i = 0; i < fp->size; i++) {
            float s = 0.0f;
            for (int l = 0; l < site->learners; l++) s += fp->gather[(size_t)l * fp->size + i];
            mine[i] = s;
        }
    }
    if (t->n_sites == 1 || !r->leader) return ISTH_OK;

    /* (3) encode chunk by chunk; my contribution becomes what others decode */
    for (int k = 0; k < fp->n_owned; k++) {
        const size_t n = r->chunks[fp->owned[k]].size;
        float *v = mine + fp->packed_off[k];
        double e2, n2;
        codec_encode_ef(r->codec, v, fp->residual ? fp->residual + fp->packed_off[k] : NULL, n, r->block,
                        fp->enc + fp->enc_off[k], fp->scratch, &e2, &n2);
        memcpy(v, fp->scratch, n * sizeof(float));
        fp->err2 += e2;
        fp->norm2 += n2;
    }
    CHECK(post_payloads(r, fp, (Encoded){r->codec, fp->enc, fp->enc_off}, fp->peers, fp->n_peers, LINK_SITE_VALUES,
                        f, (uint32_t)t->site, fp->exchange, !r->link.delay_polls));
    fp->sends_deferred = r->link.delay_polls > 0;
    fp->sent_poll = 0;
    return ISTH_OK;
}

static int mix_poll(Reducer *r);
static int peers_arrived(Reducer *r, LinkMsg **links, int n, int *arrived);

int reduce_poll(Reducer *r)
{
    CHECK(mix_poll(r));
    for (int f = 0; f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        if (!fp->in_flight || !fp->n_peers) continue;
        fp->polls++;
        if (fp->sends_deferred && fp->polls >= r->link.delay_polls) {
            for (int i = 0; i < fp->n_peers; i++) CHECK(link_post_send(&r->link, &fp->peers[i].msg));
            fp->sends_deferred = 0;
            fp->sent_poll = fp->polls;
        }
        int arrived = 0;
        if (fp->arrived_poll < 0) CHECK(peers_arrived(r, fp->links, fp->n_peers, &arrived));
        if (arrived) fp->arrived_poll = fp->polls;
    }
    return ISTH_OK;
}

/* Complete n peers' payloads (or verdicts) against the deadline. */
static int wait_peers(Reducer *r, LinkMsg **links, int n, int verdict, const char *what)
{
    return n ? link_wait(&r->link, links + (verdict ? n : 0), n, what) : ISTH_OK;
}

static int peers_arrived(Reducer *r, LinkMsg **links, int n, int *arrived)
{
    *arrived = 1;
    return n ? link_test(&r->link, links, n, arrived) : ISTH_OK;
}

static void append_reason(char *buf, size_t cap, const char *site, const char *why)
{
    size_t n = strlen(buf);
    if (strstr(buf, site)) return;
    snprintf(buf + n, cap - n, "%s%s: %s", n ? "; " : "", site, why);
}

/* (4) verdicts: which sites' payloads every site accepted; the stop vote
 * rides along (ok[n_sites] = 0 when a site asks to stop). */
static int agree(Reducer *r, FragPlan *fp, int f, unsigned char *ok)
{
    const Topology *t = r->topo;
    const size_t nv = site_verdict_bytes(t);
    ok[t->n_sites] = !r->stop_request;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, ok, (int)nv, MPI_UNSIGNED_CHAR, MPI_MIN, t->site_comm));
    if (r->leader && fp->n_peers) {
        for (int i = 0; i < fp->n_peers; i++) {
            Peer *p = &fp->peers[i];
            memcpy(p->verdict.send + sizeof(LinkHeader), ok, nv);
            link_frame(p->verdict.send, 0, LINK_SITE_VERDICT, (uint32_t)f, (uint32_t)t->site, fp->exchange, nv, nv);
            p->verdict.send_posted = 0;
            CHECK(link_post_recv(&r->link, &p->verdict));
            CHECK(link_post_send(&r->link, &p->verdict));
        }
        CHECK(wait_peers(r, fp->links, fp->n_peers, 1, "verdict exchange"));
        for (int i = 0; i < fp->n_peers; i++) {
            const unsigned char *v = fp->peers[i].verdict.recv;
            const char *bad = link_check(v, fp->peers[i].verdict.recv_bytes, LINK_SITE_VERDICT, (uint32_t)f, fp->exchange,
                                         nv, nv);
            /* a verdict we cannot read would leave the sites with different
             * sets of contributions (and stop votes): the run cannot go on */
            if (bad)
                return isth_fail(ISTH_ERUNTIME, "link: verdict from world rank %d for fragment %d unreadable: %s",
                                 fp->peers[i].world_rank, f, bad);
            for (size_t s = 0; s < nv; s++) ok[s] &= v[sizeof(LinkHeader) + s];
        }
    }
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, ok, (int)nv, MPI_UNSIGNED_CHAR, MPI_MIN, t->site_comm));
    if (!ok[t->n_sites]) r->stop_agreed = 1;
    return ISTH_OK;
}

static int share_dense(Reducer *r, FragPlan *fp, float *buf);

int reduce_finish(Reducer *r, int f, float *buf, ReduceReport *rep)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
    const SiteInfo *site = &t->sites[t->site];
    memset(rep, 0, sizeof *rep);
    rep->fragment = f;
    rep->exchange = fp->exchange;
    rep->n_sites = rep->accepted_sites = t->n_sites;
    rep->arrived_poll = fp->arrived_poll;
    if (fp->sends_deferred) { /* still held back by the test hook: link_wait posts them now */
        fp->sent_poll = fp->polls;
        fp->sends_deferred = 0;
    }
    rep->sent_poll = fp->sent_poll;
    if (!fp->in_flight) return isth_fail(ISTH_ERUNTIME, "reduce: fragment %d finished but not started", f);
    fp->in_flight = 0;

    if (t->n_learners == 1) return ISTH_OK; /* one learner: buf already holds the result */
    /* the site sum waits on the site's learners, the link on every other
     * site's payload, which waited on all of that site's learners */
    if (t->n_learners - 1 > r->max_peer_learners) r->max_peer_learners = t->n_learners - 1;
    float *total = fp->staging + (size_t)t->site * fp->size; /* my site's sum, then the total */
    if (t->n_sites > 1) {
        unsigned char ok[CONFIG_MAX_SITES + 1];
        memset(ok, 1, sizeof ok);
        if (r->leader && fp->n_peers) {
            CHECK(wait_peers(r, fp->links, fp->n_peers, 0, "payload exchange"));
            for (int i = 0; i < fp->n_peers; i++) {
                Peer *p = &fp->peers[i];
                const char *bad = take_payload(r, fp, r->codec, p, LINK_SITE_VALUES, f, fp->exchange,
                                               fp->staging + (size_t)p->site * fp->size);
                if (bad) {
                    ok[p->site] = 0;
                    append_reason(rep->rejected, sizeof rep->rejected, t->sites[p->site].name, bad);
                }
            }
        }
        CHECK(agree(r, fp, f, ok));
        double wsum = 0.0;
        rep->accepted_sites = 0;
        for (int s = 0; s < t->n_sites; s++)
            if (ok[s]) {
                wsum += r->site_weight[s];
                rep->accepted_sites++;
            } else {
                append_reason(rep->rejected, sizeof rep->rejected, t->sites[s].name, "rejected by a site");
            }
        /* (5) sum the accepted sites in site order */
        if (r->leader) { /* total overwrites my site's slot element by element */
            const float rescale = rep->accepted_sites == t->n_sites ? 1.0f : (float)(1.0 / wsum);
            for (size_t i = 0; i < fp->size; i++) {
                float s = 0.0f;
                for (int st = 0; st < t->n_sites; st++)
                    if (ok[st]) s += fp->staging[(size_t)st * fp->size + i];
                total[i] = rescale == 1.0f ? s : s * rescale;
            }
        }
        /* site-wide payload statistics for the log */
        double stats[3] = {0.0, fp->err2, fp->norm2};
        if (r->leader)
            for (int i = 0; i < fp->n_peers; i++) stats[0] += (double)fp->peers[i].msg.send_bytes;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, stats, 3, MPI_DOUBLE, MPI_SUM, t->site_comm));
        rep->payload_bytes = stats[0];
        rep->codec_rel_error = stats[2] > 0 ? sqrt(stats[1] / stats[2]) : 0.0;
        /* the first learner's total to the site's other learners */
        if (site->learners > 1) CHECK(coll_bcast_bytes(r->site_peers, total, fp->size * sizeof(float), 0));
    }
    /* write back: my owned chunks, then dense chunks shared inside the learner */
    for (int k = 0; k < fp->n_owned; k++)
        memcpy(buf + chunk_offset(r, fp->owned[k]), total + fp->packed_off[k],
               r->chunks[fp->owned[k]].size * sizeof(float));
    return share_dense(r, fp, buf);
}

/* Dense chunks of the fragment, final on their owners, copied to every rank
 * of the learner (one non-zero term per element: the sum is exact). */
static int share_dense(Reducer *r, FragPlan *fp, float *buf)
{
    const Topology *t = r->topo;
    if (t->learner_size > 1 && fp->n_dense) {
        size_t k = 0;
        const int G = t->learner_size;
        for (int i = 0; i < fp->n_dense; i++) {
            const int c = fp->dense_chunks[i];
            if (chunk_owner(r, c, G) == t->learner_rank)
                memcpy(fp->dense_buf + k, buf + chunk_offset(r, c), r->chunks[c].size * sizeof(float));
            else
                memset(fp->dense_buf + k, 0, r->chunks[c].size * sizeof(float));
            k += r->chunks[c].size;
        }
        /* one non-zero term per element: the sum is exact */
        CHECK(coll_allreduce_comm(t->learner_comm, fp->dense_buf, fp->dense_size, MPI_FLOAT, sizeof(float),
                                  MPI_SUM));
        k = 0;
        for (int i = 0; i < fp->n_dense; i++) {
            const int c = fp->dense_chunks[i];
            memcpy(buf + chunk_offset(r, c), fp->dense_buf + k, r->chunks[c].size * sizeof(float));
            k += r->chunks[c].size;
        }
    }
    return ISTH_OK;
}

int grad_norm_sq_learner(const Model *m, MPI_Comm learner_comm, double *out)
{
    /* dense: every rank holds the whole dense gradient */
    double dense = grad_sumsq(m, PARAM_EXPERT, 0);
    const int L = m->cfg.layers, E = m->cfg.experts;
    const size_t per = (size_t)m->cfg.dim * m->cfg.ffn, nblocks = (size_t)3 * L * E;
    double *blocks = isth_calloc(nblocks, sizeof(double));
    CHECK_ALLOC(blocks);
    for (int t = T_W_GATE; t <= T_W_DOWN; t++)
        for (int l = 0; l < L; l++)
            for (int e = 0; e < m->experts_local; e++) {
                const float *g = model_grad(m, (TensorId)t, l) + (size_t)e * per;
                double s = 0.0;
                for (size_t i = 0; i < per; i++) s += (double)g[i] * g[i];
                blocks[((size_t)(t - T_W_GATE) * L + l) * E + m->expert_begin + e] = s;
            }
    /* one non-zero per block: the sum is exact whatever the reduction order */
    int rc = MPI_Allreduce(MPI_IN_PLACE, blocks, (int)nblocks, MPI_DOUBLE, MPI_SUM, learner_comm);
    double total = dense;
    for (size_t i = 0; i < nblocks; i++) total += blocks[i];
    free(blocks);
    if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "grad norm: MPI_Allreduce failed");
    *out = total;
    return ISTH_OK;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int model_fingerprint(const Model *m, const float *buf, MPI_Comm learner_comm, uint64_t *out)
{
    const int L = m->cfg.layers, E = m->cfg.experts;
    const size_t per = (size_t)m->cfg.dim * m->cfg.ffn, nblocks = (size_t)3 * L * E;
    uint64_t *blocks = isth_calloc(nblocks, sizeof(uint64_t));
    CHECK_ALLOC(blocks);
    for (int t = T_W_GATE; t <= T_W_DOWN; t++)
        for (int l = 0; l < L; l++)
            for (int e = 0; e < m->experts_local; e++) {
                const float *p = buf + (model_param(m, (TensorId)t, l) - m->params) + (size_t)e * per;
                blocks[((size_t)(t - T_W_GATE) * L + l) * E + m->expert_begin + e] =
                    fnv1a(14695981039346656037ull, p, per * sizeof(float));
            }
    /* each block hashed by exactly one rank: XOR with zeros is exact */
    int rc = MPI_Allreduce(MPI_IN_PLACE, blocks, (int)nblocks, MPI_UINT64_T, MPI_BXOR, learner_comm);
    uint64_t h = 14695981039346656037ull;
    for (int t = 0; t < T_W_GATE; t++)
        h = fnv1a(h, buf + m->tensors[t].offset, m->tensors[t].numel * sizeof(float));
    h = fnv1a(h, blocks, nblocks * sizeof(uint64_t));
    free(blocks);
    if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "fingerprint: MPI_Allreduce failed");
    *out = h;
    return ISTH_OK;
}

int reduce_owns(const void *reducer, int tensor, int layer, int expert)
{
    Reducer *r = (Reducer *)reducer;
    for (int c = 0; c < r->n_chunks; c++) {
        const Chunk *ch = &r->chunks[c];
        if (ch->tensor == tensor && ch->layer == layer && ch->expert == expert)
            return chunk_owner(r, c, r->topo->learner_size) == r->topo->learner_rank;
    }
    return 0;
}

/* The error-feedback state in use: the butterfly's (every learner) or the
 * outer modes' (first learner of a site). */
static float *residual_of(const Reducer *r, int f)
{
    return r->mix_residual ? r->mix_residual[f] : r->frag[f].residual;
}

int reduce_has_residual(const Reducer *r) { return r->frag && residual_of(r, 0) != NULL; }

int reduce_any_residual(const Reducer *r)
{
    return r->error_feedback && r->topo->n_sites > 1;
}

void reduce_residual_export(const Reducer *r, float *buf)
{
    memset(buf, 0, sizeof(float) * r->model->n_params);
    for (int f = 0; f < r->fragments; f++) {
        const FragPlan *fp = &r->frag[f];
        const float *res = residual_of(r, f);
        if (!res) continue;
        for (int k = 0; k < fp->n_owned; k++)
            memcpy(buf + chunk_offset(r, fp->owned[k]), res + fp->packed_off[k],
                   r->chunks[fp->owned[k]].size * sizeof(float));
    }
}

void reduce_residual_import(Reducer *r, const float *buf)
{
    for (int f = 0; f < r->fragments; f++) {
        FragPlan *fp = &r->frag[f];
        float *res = residual_of(r, f);
        if (!res) continue;
        for (int k = 0; k < fp->n_owned; k++)
            memcpy(res + fp->packed_off[k], buf + chunk_offset(r, fp->owned[k]),
                   r->chunks[fp->owned[k]].size * sizeof(float));
    }
}

/* ---- butterfly mixing ------------------------------------------------------- */

int reduce_enable_mixing(Reducer *r)
{
    r->pairs = isth_calloc((size_t)r->fragments * 64, sizeof(PairPlan));
    r->mix_residual = isth_calloc((size_t)r->fragments, sizeof(float *));
    CHECK_ALLOC(r->pairs);
    CHECK_ALLOC(r->mix_residual);
    for (int f = 0; r->error_feedback && f < r->fragments; f++) {
        r->mix_residual[f] = isth_calloc(r->frag[f].size ? r->frag[f].size : 1, sizeof(float));
        CHECK_ALLOC(r->mix_residual[f]);
    }
    return ISTH_OK;
}

/* A pair verdict: one byte "accepted", then the earliest round in which a
 * learner asked to stop (int64, INT64_MAX: none). */
#define PAIR_VERDICT_BYTES (1 + sizeof(int64_t))

/* Plans are kept per (fragment, partner bit, exact): 64 per fragment. */
static PairPlan *pair_plan(Reducer *r, int f, int partner, int exact)
{
    const Topology *t = r->topo;
    if (!r->pairs) return NULL;
    int d = 0;
    while (d < 31 && (t->learner ^ (1 << d)) != partner) d++;
    if (d == 31) return NULL;
    PairPlan *pp = &r->pairs[((size_t)f * 32 + d) * 2 + (exact != 0)];
    if (pp->peers) return pp;
    FragPlan *fp = &r->frag[f];
    int first, G;
    topology_learner_ranks(t, partner, &first, &G);
    pp->partner = partner;
    pp->fragment = f;
    pp->crosses = topology_site_of_learner(t, partner) != t->site;
    pp->codec = exact ? CODEC_NONE : r->codec;
    pp->peers = isth_calloc((size_t)G, sizeof(Peer));
    const size_t sz = fp->size ? fp->size : 1;
    pp->mine = isth_malloc(sizeof(float) * sz);
    pp->theirs = isth_malloc(sizeof(float) * sz);
    if (!pp->peers || !pp->mine || !pp->theirs) return NULL;
    if (pp->codec != r->codec) { /* uncompressed: the payload is `mine` itself */
        pp->raw_off = isth_malloc(sizeof(size_t) * (size_t)(fp->n_owned + 1));
        if (!pp->raw_off) return NULL;
        for (int k = 0; k < fp->n_owned; k++) pp->raw_off[k] = fp->packed_off[k] * sizeof(float);
    }
    for (int j = 0; j < G; j++) {
        const int got = build_peer(r, fp, &pp->peers[pp->n_peers], G, j, first + j,
                                   topology_site_of_learner(t, partner), f, pp->codec, LINK_PAIR_VALUES,
                                   PAIR_VERDICT_BYTES, !pp->crosses);
        if (got < 0) return NULL;
        pp->n_peers += got;
    }
    pp->links = index_links(pp->peers, pp->n_peers);
    return pp->links ? pp : NULL;
}

static PairPlan *pair_in_flight(const Reducer *r, int f)
{
    if (!r->pairs) return NULL;
    for (int i = 0; i < 64; i++)
        if (r->pairs[(size_t)f * 64 + i].in_flight) return &r->pairs[(size_t)f * 64 + i];
    return NULL;
}

int mix_in_flight(const Reducer *r, int f) { return pair_in_flight(r, f) != NULL; }

int mix_start(Reducer *r, int f, int partner, float *buf, double w_me, double w_partner, int exact)
{
    const Topology *t = r->topo;
    FragPlan *fp = &r->frag[f];
    PairPlan *pp = pair_plan(r, f, partner, exact);
    if (!pp) return isth_fail(ISTH_ERUNTIME, "butterfly: cannot plan fragment %d with learner %d", f, partner);
    if (pair_in_flight(r, f)) return isth_fail(ISTH_ERUNTIME, "butterfly: fragment %d mixed twice at once", f);
    pp->in_flight = 1;
    pp->polls = 0;
    pp->arrived_poll = -1;
    pp->w_me = w_me;
    pp->w_them = w_partner;
    pp->err2 = pp->norm2 = 0.0;
    pp->exchange = ++r->exchanges;
    Encoded enc = {pp->codec, fp->enc, fp->enc_off};
    if (pp->raw_off) { /* exact: the values as they are, no error feedback */
        for (int k = 0; k < fp->n_owned; k++) {
            const size_t n = r->chunks[fp->owned[k]].size;
            float *v = pp->mine + fp->packed_off[k];
            memcpy(v, buf + chunk_offset(r, fp->owned[k]), n * sizeof(float));
            for (size_t e = 0; e < n; e++) pp->norm2 += (double)v[e] * v[e];
        }
        enc = (Encoded){CODEC_NONE, (const unsigned char *)pp->mine, pp->raw_off};
    } else {
        /* the codec with error feedback (codec none keeps no residual, so an
         * exact round here sends the values as they are) */
        float *res = !exact && r->mix_residual ? r->mix_residual[f] : NULL;
        for (int k = 0; k < fp->n_owned; k++) {
            const size_t n = r->chunks[fp->owned[k]].size;
            double e2, n2;
            codec_encode_ef(r->codec, buf + chunk_offset(r, fp->owned[k]), res ? res + fp->packed_off[k] : NULL, n,
                            r->block, fp->enc + fp->enc_off[k], pp->mine + fp->packed_off[k], &e2, &n2);
            pp->err2 += e2;
            pp->norm2 += n2;
        }
    }
    /* both partners number their exchanges alike: learner rounds are in step */
    return post_payloads(r, fp, enc, pp->peers, pp->n_peers, LINK_PAIR_VALUES, f, (uint32_t)t->learner, pp->exchange,
                         1);
}

static int mix_poll(Reducer *r)
{
    for (int f = 0; f < r->fragments; f++) {
        PairPlan *pp = pair_in_flight(r, f);
        if (!pp) continue;
        pp->polls++;
        int arrived = 0;
        if (pp->arrived_poll < 0) CHECK(peers_arrived(r, pp->links, pp->n_peers, &arrived));
        if (arrived) pp->arrived_poll = pp->polls;
    }
    return ISTH_OK;
}

int mix_finish(Reducer *r, int f, float *buf, ReduceReport *rep, double *pair_distance)
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
    int rc = wait_peers(r, pp->links, pp->n_peers, 0, "butterfly exchange");
    pp->in_flight = 0;
    if (r->max_peer_learners < 1) r->max_peer_learners = 1; /* the partner, nobody else */
    CHECK(rc);
    unsigned char ok = 1;
    const char *why = NULL;
    for (int i = 0; i < pp->n_peers; i++) {
        const char *bad = take_payload(r, fp, pp->codec, &pp->peers[i], LINK_PAIR_VALUES, f, pp->exchange, pp->theirs);
        if (bad) {
            ok = 0;
            why = bad;
        }
    }
    /* agree inside my learner, then with the partner learner, then again;
     * the earliest stop round either side knows of rides along */
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_UNSIGNED_CHAR, MPI_MIN, t->learner_comm));
    int64_t stop = r->stop_round < 0 ? INT64_MAX : (int64_t)r->stop_round;
    for (int i = 0; i < pp->n_peers; i++) {
        Peer *p = &pp->peers[i];
        p->verdict.send[sizeof(LinkHeader)] = ok;
        memcpy(p->verdict.send + sizeof(LinkHeader) + 1, &stop, sizeof stop);
        link_frame(p->verdict.send, 0, LINK_PAIR_VERDICT, (uint32_t)f, (uint32_t)t->learner, pp->exchange,
                   PAIR_VERDICT_BYTES, PAIR_VERDICT_BYTES);
        p->verdict.send_posted = 0;
        CHECK(link_post_recv(&r->link, &p->verdict));
        CHECK(link_post_send(&r->link, &p->verdict));
    }
    CHECK(wait_peers(r, pp->links, pp->n_peers, 1, "butterfly verdict"));
    for (int i = 0; i < pp->n_peers; i++) {
        const LinkMsg *v = &pp->peers[i].verdict;
        const char *bad = link_check(v->recv, v->recv_bytes, LINK_PAIR_VERDICT, (uint32_t)f, pp->exchange,
                                     PAIR_VERDICT_BYTES, PAIR_VERDICT_BYTES);
        if (bad) /* the partners would disagree on the result: the run cannot go on */
            return isth_fail(ISTH_ERUNTIME, "link: butterfly verdict from world rank %d unreadable: %s",
                             pp->peers[i].world_rank, bad);
        if (!v->recv[sizeof(LinkHeader)]) ok = 0;
        int64_t theirs;
        memcpy(&theirs, v->recv + sizeof(LinkHeader) + 1, sizeof theirs);
        if (theirs < stop) stop = theirs;
    }
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_UNSIGNED_CHAR, MPI_MIN, t->learner_comm));
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT64_T, MPI_MIN, t->learner_comm));
    r->stop_round = stop == INT64_MAX ? -1 : (long)stop;
    rep->accepted_sites = ok ? 2 : 1;
    if (!ok) snprintf(rep->rejected, sizeof rep->rejected, "learner %d: %s", why ? t->learner : pp->partner,
                      why ? why : "rejected by the partner");
    /* distance between the partners before mixing (my owned part) */
    double d2 = 0.0, n2 = 0.0;
    for (size_t i = 0; i < fp->size; i++) {
        double d = (double)pp->mine[i] - pp->theirs[i];
        d2 += d * d;
        n2 += (double)pp->mine[i] * pp->mine[i];
    }
    double stats[5] = {0.0, pp->err2, pp->norm2, d2, n2};
    for (int i = 0; i < pp->n_peers; i++) stats[0] += (double)pp->peers[i].msg.send_bytes;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, stats, 5, MPI_DOUBLE, MPI_SUM, t->learner_comm));
    rep->payload_bytes = stats[0];
    rep->codec_rel_error = stats[2] > 0 ? sqrt(stats[1] / stats[2]) : 0.0;
    if (pair_distance) *pair_distance = stats[4] > 0 ? sqrt(stats[3] / stats[4]) : 0.0;
    if (!ok) return ISTH_OK; /* both learners keep their own values */
    const int me_first = t->learner < pp->partner;
    const double w_lo = me_first ? pp->w_me : pp->w_them, w_hi = me_first ? pp->w_them : pp->w_me;
    const float a = (float)(w_lo / (w_lo + w_hi)), b = (float)(w_hi / (w_lo + w_hi));
    const float *lo = me_first ? pp->mine : pp->theirs, *hi = me_first ? pp->theirs : pp->mine;
    for (int k = 0; k < fp->n_owned; k++) {
        float *dst = buf + chunk_offset(r, fp->owned[k]);
        const size_t o = fp->packed_off[k], n = r->chunks[fp->owned[k]].size;
        for (size_t e = 0; e < n; e++) dst[e] = a * lo[o + e] + b * hi[o + e];
    }
    return share_dense(r, fp, buf);
}
