/* expert_copies.c — see expert_copies.h. */
#include "expert_copies.h"

#include <mpi.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "expert_split.h"
#include "oneway.h"
#include "clock.h"
#include "stateview.h"
#include "status.h"

#define WHAT "the refresh of the experts' copies"

static int tensor_end(const ChunkTable *ct, int t) { return t + 1 < N_TENSORS ? ct->first[t + 1] : ct->n_chunks; }

int copies_place(const Topology *t, int h, int E, int e)
{
    const SiteInfo *w = &t->sites[h];
    const int n = E - w->experts, i = e < w->expert_begin ? e : e - w->experts;
    return (int)((long long)i * w->learner_ranks / n);
}

int copies_holds(const Topology *t, int replicas, int h, int s)
{
    for (int k = 1; k < replicas; k++)
        if ((s + k) % t->n_sites == h) return 1;
    return 0;
}

int copies_sender(const Topology *t, int h, int E, int e)
{
    const SiteInfo *s = &t->sites[h];
    if (topology_expert_site(t, e) != h) return s->first_rank + copies_place(t, h, E, e);
    return s->first_rank + (e - s->expert_begin) / (s->experts / s->learner_ranks);
}

/* Chunk c's expert and its owner site; -1 for a dense chunk. */
static int owner_of(const Topology *t, const ChunkTable *ct, int c)
{
    const int e = ct->chunks[c].expert;
    return e < 0 ? -1 : topology_expert_site(t, e);
}

/* Is chunk c a copy on this rank (a first learner's)? */
static int copy_here(const ExpertCopies *x, const Topology *t, const ChunkTable *ct, int c)
{
    const int s = owner_of(t, ct, c);
    return s >= 0 && s != t->site && copies_holds(t, x->replicas, t->site, s) &&
           copies_place(t, t->site, ct->model->cfg.experts, ct->chunks[c].expert) == t->learner_rank;
}

/* Is chunk c trained on this rank (a first learner's) and copied elsewhere? */
static int mirror_here(const ChunkTable *ct, int c) { return ct->chunks[c].expert >= 0 && chunk_held(ct, c); }

/* n_chunks pointers into one buffer, for the chunks `want` picks, each at
 * its initial weights. */
static int make_table(const ExpertCopies *x, const Topology *t, const ChunkTable *ct, int mirror, float ***table,
                      float **buf)
{
    size_t n = 0;
    for (int c = 0; c < ct->n_chunks; c++)
        if (mirror ? mirror_here(ct, c) : copy_here(x, t, ct, c)) n += ct->chunks[c].size;
    *table = isth_calloc((size_t)ct->n_chunks, sizeof(float *));
    const AllocCategory was = alloc_category(ALLOC_OUTER); /* config --memory counts them there (copies_plan) */
    *buf = isth_malloc(sizeof(float) * (n + 1));
    alloc_category(was);
    if (!*table || !*buf) return isth_fail(ISTH_ERUNTIME, "%s: out of memory for %zu values", WHAT, n);
    n = 0;
    for (int c = 0; c < ct->n_chunks; c++) {
        if (!(mirror ? mirror_here(ct, c) : copy_here(x, t, ct, c))) continue;
        const Chunk *ch = &ct->chunks[c];
        (*table)[c] = *buf + n;
        model_init_expert_chunk(ct->model, (TensorId)ch->tensor, ch->layer, ch->expert, *buf + n);
        n += ch->size;
    }
    return ISTH_OK;
}

int copies_plan(const Config *cfg, const Topology *t, const Model *m, size_t *copy, size_t *mirror)
{
    *copy = *mirror = 0;
    if (!t->experts_split || t->learner != t->sites[t->site].first_learner) return ISTH_OK;
    ExpertSplit xs;
    ExpertSplitFault bad;
    char why[512];
    if (expert_split_assign(cfg, &xs, why, sizeof why, &bad)) return isth_fail(ISTH_EINPUT, "%s", why);
    if (xs.replicas < 2) return ISTH_OK;
    size_t per_expert = 0; /* every expert tensor's chunks of one expert, all layers */
    for (int T = 0; T < N_TENSORS; T++)
        if (m->tensors[T].flags & PARAM_EXPERT) per_expert += m->tensors[T].chunk_numel * (size_t)m->cfg.layers;
    const int E = m->cfg.experts;
    for (int e = 0; e < E; e++) {
        const int s = topology_expert_site(t, e);
        if (s != t->site && copies_holds(t, xs.replicas, t->site, s) && copies_place(t, t->site, E, e) == t->learner_rank)
            *copy += per_expert;
    }
    *mirror = per_expert * (size_t)t->experts_local;
    return ISTH_OK;
}

int copies_create(ExpertCopies *x, const Config *cfg, const Topology *t, const ChunkTable *ct)
{
    memset(x, 0, sizeof *x);
    x->step = x->mirror_step = -1;
    for (int s = 0; s < CONFIG_MAX_SITES; s++) x->from_step[s] = -1;
    if (!t->experts_split) return ISTH_OK;
    ExpertSplit xs;
    ExpertSplitFault bad;
    char why[512];
    if (expert_split_assign(cfg, &xs, why, sizeof why, &bad)) return isth_fail(ISTH_EINPUT, "%s", why);
    x->replicas = xs.replicas;
    if (x->replicas < 2) return ISTH_OK;
    x->on = 1;
    x->every = (long)cfg->outer.expert_refresh * cfg->outer.inner_steps;
    x->codec = (Codec)codec_from_name(cfg->outer.codec);
    x->cp = config_codec_params(&cfg->outer);
    if (t->learner != t->sites[t->site].first_learner) return ISTH_OK; /* the first learner keeps and sends them */
    CHECK(make_table(x, t, ct, 0, &x->copy, &x->copy_buf));
    return make_table(x, t, ct, 1, &x->mirror, &x->mirror_buf);
}

void copies_destroy(ExpertCopies *x)
{
    isth_free(x->copy);
    isth_free(x->mirror);
    isth_free(x->copy_buf);
    isth_free(x->mirror_buf);
    memset(x, 0, sizeof *x);
}

int copies_after_step(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, Backend *be, long step,
                      long steps, int log)
{
    if (!x->on || step >= steps || step % x->every) return ISTH_OK;
    const double was_bytes = x->bytes, was_s = x->seconds;
    CHECK(copies_refresh(x, l, t, ct, be, step));
    if (log && x->bytes > was_bytes) /* nothing moves once every partner is lost */
        printf("copies    | refresh %d after step %ld | %.0f B through the link (this rank, sent + received) | %.2f s\n",
               x->refreshes, step, x->bytes - was_bytes, x->seconds - was_s);
    return ISTH_OK;
}

float *copies_chunk(const ExpertCopies *x, int c) { return x->copy ? x->copy[c] : NULL; }

float *copies_at(void *view, int tensor, int layer, int expert)
{
    const CopiesView *v = view;
    if (expert < 0) return NULL;
    float **table = v->mirror ? v->x->mirror : v->x->copy;
    return table ? table[chunk_index(v->ct, tensor, layer, expert)] : NULL;
}

void copies_state_save(const ExpertCopies *x, int n_sites, double *out)
{
    out[0] = x->refreshes;
    out[1] = (double)x->step;
    out[2] = (double)x->mirror_step;
    out[3] = x->replicas;
    for (int s = 0; s < n_sites; s++) {
        out[4 + s] = x->live_refreshes[s];
        out[4 + n_sites + s] = (double)x->from_step[s];
    }
}

void copies_state_load(ExpertCopies *x, int n_sites, const double *in)
{
    x->refreshes = x->refreshes_loaded = (int)in[0];
    x->step = (long)in[1];
    x->mirror_step = (long)in[2];
    for (int s = 0; s < n_sites; s++) {
        x->live_refreshes[s] = (int)in[4 + s];
        x->from_step[s] = (long)in[4 + n_sites + s];
    }
}

/* Does chunk c of a frame go from world rank `from` to rank `to` of site
 * h's first learner? */
static int goes(const ExpertCopies *x, const Topology *t, const ChunkTable *ct, int c, int h, int from, int to)
{
    const int s = owner_of(t, ct, c), E = ct->model->cfg.experts, e = ct->chunks[c].expert;
    return s >= 0 && s != h && copies_holds(t, x->replicas, h, s) && copies_sender(t, s, E, e) == from &&
           copies_place(t, h, E, e) == to;
}

/* Values and encoded bytes of tensor T's chunks from `from` to rank `to` of h. */
static size_t frame_size(const ExpertCopies *x, const Topology *t, const ChunkTable *ct, int T, int h, int from,
                         int to, size_t *values)
{
    size_t bytes = 0;
    *values = 0;
    for (int c = ct->first[T]; c < tensor_end(ct, T); c++)
        if (goes(x, t, ct, c, h, from, to)) {
            *values += ct->chunks[c].size;
            bytes += codec_encoded_size(x->codec, ct->chunks[c].size, x->cp);
        }
    return bytes;
}

/* A StateSelect: the expert chunks this rank trains. */
static int held_expert(const void *ct, int c) { return mirror_here(ct, c); }

/* Does a live holder (not late in this refresh) hold copies of my site's experts? */
static int live_holders(const ExpertCopies *x, Link *l, const Topology *t, const unsigned char *late)
{
    int n = 0;
    for (int h = 0; h < t->n_sites; h++)
        n += h != t->site && !link_is_lost(l, h) && !late[h] && copies_holds(t, x->replicas, h, t->site);
    return n;
}

/* The sender's part of tensor T: each chunk's difference from its mirror
 * encoded once (into enc, at enc_at), then framed for every rank of every
 * live holder site that gets it. Frames go into fr[*n...]. */
static int send_tensor(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, StateView *v, int T,
                       uint64_t exchange, const unsigned char *late, OneWay *fr, int *n, float *tmp,
                       unsigned char *enc, size_t *enc_at)
{
    size_t off = 0;
    for (int c = ct->first[T]; c < tensor_end(ct, T); c++) {
        if (!x->mirror[c]) continue;
        const Chunk *ch = &ct->chunks[c];
        const float *w = state_view_at(v, T, ch->layer, ch->expert);
        if (!w) return v->rc != ISTH_OK ? v->rc : isth_fail(ISTH_ERUNTIME, "%s: chunk %d is not held here", WHAT, c);
        const float *mirror = x->mirror[c];
        for (size_t i = 0; i < ch->size; i++) tmp[i] = w[i] - mirror[i];
        if (codec_encode(x->codec, tmp, ch->size, x->cp, enc + off))
            return isth_fail(ISTH_ERUNTIME, "%s: out of memory encoding chunk %d", WHAT, c);
        enc_at[c - ct->first[T]] = off;
        off += codec_encoded_size(x->codec, ch->size, x->cp);
    }
    for (int h = 0; h < t->n_sites; h++) {
        if (h == t->site || link_is_lost(l, h) || late[h] || !copies_holds(t, x->replicas, h, t->site)) continue;
        for (int to = 0; to < t->sites[h].learner_ranks; to++) {
            size_t values;
            const size_t bytes = frame_size(x, t, ct, T, h, t->world_rank, to, &values);
            if (!bytes) continue;
            OneWay *f = &fr[*n];
            CHECK(oneway_alloc(f, values, bytes, h, WHAT));
            ++*n;
            unsigned char *out = f->buf + ONEWAY_ROOM;
            for (int c = ct->first[T]; c < tensor_end(ct, T); c++)
                if (goes(x, t, ct, c, h, t->world_rank, to)) {
                    const size_t b = codec_encoded_size(x->codec, ct->chunks[c].size, x->cp);
                    memcpy(out, enc + enc_at[c - ct->first[T]], b);
                    out += b;
                }
            const int peer = t->sites[h].first_rank + to;
            link_frame(l, peer, f->buf, (uint8_t)x->codec, LINK_CONTROL, 1, (uint32_t)t->site, exchange, values, bytes);
            oneway_send(f, peer, LINK_TAG_REFRESH);
        }
    }
    return ISTH_OK;
}

/* The mirrors of tensor T take what was sent (enc), once every holder has
 * it: a holder late in this refresh is lost, and never holds a copy the
 * mirror does not describe for the holders left. */
static int advance_mirrors(ExpertCopies *x, const ChunkTable *ct, int T, float *tmp, const unsigned char *enc,
                           const size_t *enc_at)
{
    for (int c = ct->first[T]; c < tensor_end(ct, T); c++) {
        if (!x->mirror[c]) continue;
        const size_t size = ct->chunks[c].size;
        if (codec_decode(x->codec, enc + enc_at[c - ct->first[T]], size, x->cp, tmp))
            return isth_fail(ISTH_ERUNTIME, "%s: chunk %d does not decode", WHAT, c);
        float *mirror = x->mirror[c];
        for (size_t i = 0; i < size; i++) mirror[i] += tmp[i];
    }
    return ISTH_OK;
}

/* The holder's receives of tensor T, posted into fr[*n...]. */
static int post_receives(const ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, int T,
                         const unsigned char *late, OneWay *fr, int *n)
{
    for (int s = 0; s < t->n_sites; s++) {
        if (s == t->site || link_is_lost(l, s) || late[s] || !copies_holds(t, x->replicas, t->site, s)) continue;
        for (int k = 0; k < t->sites[s].learner_ranks; k++) {
            const int from = t->sites[s].first_rank + k;
            size_t values;
            const size_t bytes = frame_size(x, t, ct, T, t->site, from, t->learner_rank, &values);
            if (!bytes) continue;
            OneWay *f = &fr[*n];
            CHECK(oneway_alloc(f, values, bytes, s, WHAT));
            ++*n;
            CHECK(oneway_recv(l, f, from, LINK_TAG_REFRESH));
        }
    }
    return ISTH_OK;
}

/* A received frame checked, decoded chunk by chunk and added to the copies. */
static int take_frame(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, int T, uint64_t exchange,
                      const OneWay *f, float *tmp)
{
    const char *bad = link_check(l, f->m.peer, f->buf, f->m.recv_bytes, LINK_CONTROL, 1, exchange, f->values, f->bytes);
    if (bad)
        return isth_fail(ISTH_ERUNTIME, "link: %s: the frame of tensor %s from world rank %d (site %s) rejected: %s",
                         WHAT, ct->model->tensors[T].name, f->m.peer, t->sites[f->site].name, bad);
    const unsigned char *in = f->buf + ONEWAY_ROOM;
    for (int c = ct->first[T]; c < tensor_end(ct, T); c++) {
        if (!goes(x, t, ct, c, t->site, f->m.peer, t->learner_rank)) continue;
        const size_t size = ct->chunks[c].size;
        if (codec_decode(x->codec, in, size, x->cp, tmp))
            return isth_fail(ISTH_ERUNTIME, "link: %s: tensor %s from world rank %d (site %s): chunk %d does not decode",
                             WHAT, ct->model->tensors[T].name, f->m.peer, t->sites[f->site].name, c);
        float *copy = x->copy[c];
        for (size_t i = 0; i < size; i++) copy[i] += tmp[i];
        in += codec_encoded_size(x->codec, size, x->cp);
    }
    return ISTH_OK;
}

/* One expert tensor's refresh on a first learner's rank: receives posted,
 * the sends framed and posted, all awaited, then the arrivals decoded and,
 * when no live holder is late, the mirrors advanced. *sent: how many of
 * this rank's tensors advanced. */
static int refresh_tensor(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, StateView *v, int T,
                          long step, unsigned char *late, double *waited, float *tmp, unsigned char *enc,
                          size_t *enc_at, int *sent)
{
    const uint64_t exchange = ((uint64_t)(step / x->every) << 8) | (uint64_t)(T + 1);
    OneWay *fr = isth_calloc((size_t)2 * (size_t)t->world_size + 1, sizeof(OneWay));
    CHECK_ALLOC(fr);
    int n = 0, rc = post_receives(x, l, t, ct, T, late, fr, &n);
    const int received = n, sending = live_holders(x, l, t, late) > 0;
    if (rc == ISTH_OK && sending) rc = send_tensor(x, l, t, ct, v, T, exchange, late, fr, &n, tmp, enc, enc_at);
    if (rc == ISTH_OK) rc = oneway_await(l, fr, n, WHAT, late, waited);
    for (int i = 0; i < received && rc == ISTH_OK; i++)
        if (!late[fr[i].site]) rc = take_frame(x, l, t, ct, T, exchange, &fr[i], tmp);
    /* no live holder (none from the start, or every one late now): the
     * mirror stays what the holders have */
    if (rc == ISTH_OK && sending && live_holders(x, l, t, late) > 0) {
        rc = advance_mirrors(x, ct, T, tmp, enc, enc_at);
        ++*sent;
    }
    oneway_release(fr, n);
    isth_free(fr);
    return rc;
}

int copies_refresh(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, Backend *be, long step)
{
    if (!x->on) return ISTH_OK;
    const double t0 = now_s();
    const LinkCounters before = link_counters(l);
    unsigned char late[CONFIG_MAX_SITES] = {0}, live[CONFIG_MAX_SITES];
    for (int s = 0; s < t->n_sites; s++) live[s] = !link_is_lost(l, s);
    double waited = 0.0;
    int rc = ISTH_OK, sent = 0;
    if (t->learner == t->sites[t->site].first_learner) { /* one tensor at a time through host staging */
        size_t biggest = 1, enc_bytes = 1;
        int most = 1;
        for (int T = 0; T < N_TENSORS; T++) {
            if (!(ct->model->tensors[T].flags & PARAM_EXPERT)) continue;
            size_t b = 0;
            for (int c = ct->first[T]; c < tensor_end(ct, T); c++) {
                if (ct->chunks[c].size > biggest) biggest = ct->chunks[c].size;
                if (x->mirror[c]) b += codec_encoded_size(x->codec, ct->chunks[c].size, x->cp);
            }
            if (b > enc_bytes) enc_bytes = b;
            if (tensor_end(ct, T) - ct->first[T] > most) most = tensor_end(ct, T) - ct->first[T];
        }
        float *tmp = isth_malloc(sizeof(float) * biggest);
        unsigned char *enc = isth_malloc(enc_bytes);
        size_t *enc_at = isth_malloc(sizeof(size_t) * (size_t)most);
        StateView v;
        rc = tmp && enc && enc_at ? state_view_create(&v, ct, state_view_need(ct, held_expert, ct))
                                  : isth_fail(ISTH_ERUNTIME, "%s: out of memory", WHAT);
        if (rc == ISTH_OK) {
            state_view_begin(&v, be, STATE_PARAMS, NULL, held_expert, ct, 0);
            for (int T = 0; T < N_TENSORS && rc == ISTH_OK; T++)
                if (ct->model->tensors[T].flags & PARAM_EXPERT)
                    rc = refresh_tensor(x, l, t, ct, &v, T, step, late, &waited, tmp, enc, enc_at, &sent);
            const int vrc = state_view_end(&v, 0);
            if (rc == ISTH_OK) rc = vrc;
            state_view_destroy(&v);
        }
        isth_free(tmp);
        isth_free(enc);
        isth_free(enc_at);
    }
    const LinkCounters after = link_counters(l);
    x->bytes += after.bytes_sent + after.bytes_recv - before.bytes_sent - before.bytes_recv;
    CHECK(rc);
    /* a site that missed the deadline (the federated launch): lost on every
     * rank of this site alike */
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, late, t->n_sites, MPI_UNSIGNED_CHAR, MPI_MAX, t->site_comm));
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &waited, 1, MPI_DOUBLE, MPI_MAX, t->site_comm));
    /* the mirrors are of this refresh when every tensor advanced on every
     * first-learner rank (a holder lost part-way leaves them mixed: the
     * label stays the last whole one) */
    int expert_tensors = 0;
    for (int T = 0; T < N_TENSORS; T++) expert_tensors += (ct->model->tensors[T].flags & PARAM_EXPERT) != 0;
    const int first = t->learner == t->sites[t->site].first_learner;
    int whole[2] = {first ? sent == expert_tensors : 1, first ? -(sent > 0) : 0}; /* MIN: all, and any (negated) */
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, whole, 2, MPI_INT, MPI_MIN, t->site_comm));
    sent = whole[0] && whole[1] < 0;
    for (int s = 0; s < t->n_sites; s++) {
        if (late[s] && s != t->site) link_mark_lost(l, s, WHAT, waited);
        /* a refresh counts for s when s was live through it (a site lost in
         * it may have sent part: what the holder took stays, not counted) */
        if (live[s] && !late[s]) x->live_refreshes[s]++;
        if (live[s] && !late[s] && s != t->site && copies_holds(t, x->replicas, t->site, s)) x->from_step[s] = step;
    }
    if (sent) x->mirror_step = step;
    x->refreshes++;
    x->step = step;
    x->seconds += now_s() - t0;
    return ISTH_OK;
}
