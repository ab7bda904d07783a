/* assemble.c — see assemble.h. */
#include "assemble.h"

#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "stateview.h"
#include "status.h"

#define ROOM sizeof(LinkHeader) /* the link's header in front of each payload, sealed in place */
#define WHAT "the whole model's assembly"

static int tensor_end(const ChunkTable *ct, int t) { return t + 1 < N_TENSORS ? ct->first[t + 1] : ct->n_chunks; }

/* The site that trains expert e. */
static int owner_site(const Topology *t, int e)
{
    for (int s = 0; s < t->n_sites; s++)
        if (e >= t->sites[s].expert_begin && e < t->sites[s].expert_begin + t->sites[s].experts) return s;
    return -1;
}

/* World rank of the sender of expert e: the rank of its site's first
 * learner holding it (the expert parallelism's shard, as chunk_owner). */
static int sender_of(const Topology *t, int e)
{
    const SiteInfo *s = &t->sites[owner_site(t, e)];
    return s->first_rank + (e - s->expert_begin) / (s->experts / s->learner_ranks);
}

/* The writer rank (of the lead learner's G) that receives expert e: the
 * i-th of the n experts outside the lead site's range goes to i * G / n. */
static int receiver_of(const Topology *t, int lead, int E, int e)
{
    const SiteInfo *w = &t->sites[lead];
    const int n = E - w->experts, i = e < w->expert_begin ? e : e - w->experts;
    return (int)((long long)i * w->learner_ranks / n);
}

/* Does chunk c go from world rank `from` to writer rank `to`? */
static int goes(const Topology *t, const ChunkTable *ct, int lead, int c, int from, int to)
{
    const int e = ct->chunks[c].expert;
    return e >= 0 && owner_site(t, e) != lead && sender_of(t, e) == from &&
           receiver_of(t, lead, ct->model->cfg.experts, e) == to;
}

/* The values of tensor T's chunks from `from` to writer rank `to`. */
static size_t values_of(const Topology *t, const ChunkTable *ct, int lead, int T, int from, int to)
{
    size_t n = 0;
    for (int c = ct->first[T]; c < tensor_end(ct, T); c++)
        if (goes(t, ct, lead, c, from, to)) n += ct->chunks[c].size;
    return n;
}

/* A StateSelect: the expert chunks this rank holds. */
static int held_expert(const void *ct, int c)
{
    return ((const ChunkTable *)ct)->chunks[c].expert >= 0 && chunk_held(ct, c);
}

typedef struct {
    LinkMsg m;
    unsigned char *buf;
    size_t values;
    int site;
    int kept; /* a received frame's buffer went to a->bufs */
} Frame;

/* Wait for n frames within the deadline; a late one's site in late[]. */
static int await(Link *l, Frame *fr, int n, unsigned char *late, double *waited)
{
    LinkMsg **msgs = isth_malloc(sizeof(LinkMsg *) * (size_t)(n + 1));
    unsigned char *missed = isth_calloc((size_t)n + 1, 1);
    if (!msgs || !missed) {
        isth_free(msgs);
        isth_free(missed);
        return isth_fail(ISTH_ERUNTIME, "%s: out of memory", WHAT);
    }
    for (int i = 0; i < n; i++) msgs[i] = &fr[i].m;
    double w = 0.0;
    const int rc = link_wait_live(l, msgs, n, WHAT, missed, &w);
    for (int i = 0; rc == ISTH_OK && i < n; i++)
        if (missed[i]) late[fr[i].site] = 1;
    if (w > *waited) *waited = w;
    isth_free(msgs);
    isth_free(missed);
    return rc;
}

/* Free the buffers MPI no longer holds and nobody kept (after a failure
 * or a late frame MPI may still use one: leaked, failure rule 6). */
static void release(Frame *fr, int n)
{
    for (int i = 0; i < n; i++)
        if (link_msg_free(&fr[i].m) && !fr[i].kept) isth_free(fr[i].buf);
}

/* A frame's buffer: the link's room and `values` floats, from or for `site`. */
static int frame_alloc(Frame *f, size_t values, int site)
{
    f->buf = isth_malloc(ROOM + values * sizeof(float));
    if (!f->buf) return isth_fail(ISTH_ERUNTIME, "%s: out of memory for %zu bytes", WHAT, values * sizeof(float));
    f->values = values;
    f->site = site;
    return ISTH_OK;
}

/* The sender's part of tensor T: to each writer rank the chunks it gets. */
static int send_tensor(Link *l, const Topology *t, const ChunkTable *ct, StateView *v, int lead, int T,
                       unsigned char *late, double *waited)
{
    const SiteInfo *w = &t->sites[lead];
    Frame *fr = isth_calloc((size_t)w->learner_ranks, sizeof(Frame));
    CHECK_ALLOC(fr);
    int n = 0, rc = ISTH_OK;
    for (int to = 0; to < w->learner_ranks && rc == ISTH_OK; to++) {
        const size_t values = values_of(t, ct, lead, T, t->world_rank, to), bytes = values * sizeof(float);
        if (!values) continue;
        Frame *f = &fr[n];
        if ((rc = frame_alloc(f, values, lead)) != ISTH_OK) break;
        n++;
        const int peer = w->first_rank + to;
        link_msg_init_borrowed(&f->m, peer, LINK_TAG_ASSEMBLY, ROOM + bytes, 0, 0);
        f->m.send = f->buf;
        f->m.recv_done = 1; /* one way */
        float *out = (float *)(f->buf + ROOM);
        for (int c = ct->first[T]; c < tensor_end(ct, T) && rc == ISTH_OK; c++) {
            if (!goes(t, ct, lead, c, t->world_rank, to)) continue;
            const Chunk *ch = &ct->chunks[c];
            const float *src = state_view_at(v, T, ch->layer, ch->expert);
            if (!src) rc = v->rc != ISTH_OK ? v->rc : isth_fail(ISTH_ERUNTIME, "%s: chunk %d is not held here", WHAT, c);
            else memcpy(out, src, ch->size * sizeof(float));
            out += ch->size;
        }
        if (rc == ISTH_OK)
            link_frame(l, peer, f->buf, 0, LINK_CONTROL, 0, (uint32_t)t->site, (uint64_t)T + 1, values, bytes);
    }
    if (rc == ISTH_OK) rc = await(l, fr, n, late, waited);
    release(fr, n);
    isth_free(fr);
    return rc;
}

/* The writer rank's part of tensor T: from each sender the chunks it gets,
 * kept in a->bufs, each chunk's place in a->at. */
static int receive_tensor(Assembly *a, Link *l, const Topology *t, const ChunkTable *ct, int lead, int T,
                          unsigned char *late, double *waited)
{
    const int me = t->learner_rank;
    Frame *fr = isth_calloc((size_t)t->world_size, sizeof(Frame));
    CHECK_ALLOC(fr);
    int n = 0, rc = ISTH_OK;
    for (int s = 0; s < t->n_sites && rc == ISTH_OK; s++) {
        if (s == lead) continue;
        for (int k = 0; k < t->sites[s].learner_ranks && rc == ISTH_OK; k++) {
            const int from = t->sites[s].first_rank + k;
            const size_t values = values_of(t, ct, lead, T, from, me), bytes = values * sizeof(float);
            if (!values) continue;
            Frame *f = &fr[n];
            if ((rc = frame_alloc(f, values, s)) != ISTH_OK) break;
            n++;
            link_msg_init_borrowed(&f->m, from, LINK_TAG_ASSEMBLY, 0, ROOM + bytes, 0);
            f->m.recv = f->buf;
            f->m.send_posted = 2; /* one way */
            rc = link_post_recv(l, &f->m);
        }
    }
    if (rc == ISTH_OK) rc = await(l, fr, n, late, waited);
    for (int i = 0; i < n && rc == ISTH_OK; i++) {
        Frame *f = &fr[i];
        if (late[f->site]) continue;
        const size_t bytes = f->values * sizeof(float);
        const char *bad = link_check(l, f->m.peer, f->buf, f->m.recv_bytes, LINK_CONTROL, 0, (uint64_t)T + 1,
                                     f->values, bytes);
        if (bad) {
            rc = isth_fail(ISTH_ERUNTIME, "link: %s: the frame of tensor %s from world rank %d (site %s) rejected: %s",
                           WHAT, ct->model->tensors[T].name, f->m.peer, t->sites[f->site].name, bad);
            break;
        }
        float *in = (float *)(f->buf + ROOM);
        for (int c = ct->first[T]; c < tensor_end(ct, T); c++)
            if (goes(t, ct, lead, c, f->m.peer, me)) {
                a->at[c] = in;
                in += ct->chunks[c].size;
            }
        a->bufs[a->n_bufs++] = f->buf; /* kept until assembly_free */
        f->kept = 1;
    }
    release(fr, n);
    isth_free(fr);
    return rc;
}

int assembly_gather(Assembly *a, Link *l, const Topology *t, const ChunkTable *ct, Backend *be, int lead)
{
    memset(a, 0, sizeof *a);
    a->done = 1;
    a->lost_site = -1;
    for (int s = 0; s < t->n_sites && a->lost_site < 0; s++)
        if (link_is_lost(l, s)) a->lost_site = s;
    if (a->lost_site >= 0) return ISTH_OK; /* the same on every rank of the site: nothing is sent */
    const LinkCounters before = link_counters(l);
    const int writer = t->site == lead && t->learner == t->sites[lead].first_learner;
    const int sender = t->site != lead && t->learner == t->sites[t->site].first_learner;
    unsigned char late[CONFIG_MAX_SITES] = {0};
    double waited = 0.0;
    int rc = ISTH_OK;
    if (writer) {
        a->at = isth_calloc((size_t)ct->n_chunks, sizeof(float *));
        a->bufs = isth_calloc((size_t)N_TENSORS * (size_t)t->world_size + 1, sizeof(unsigned char *));
        if (!a->at || !a->bufs) rc = isth_fail(ISTH_ERUNTIME, "%s: out of memory", WHAT);
        for (int T = 0; T < N_TENSORS && rc == ISTH_OK; T++)
            if (ct->model->tensors[T].flags & PARAM_EXPERT) rc = receive_tensor(a, l, t, ct, lead, T, late, &waited);
    } else if (sender) { /* one tensor at a time through host staging */
        StateView v;
        const size_t need = state_view_need(ct, held_expert, ct);
        rc = state_view_create(&v, ct, need);
        if (rc == ISTH_OK) {
            state_view_begin(&v, be, STATE_PARAMS, NULL, held_expert, ct, 0);
            for (int T = 0; T < N_TENSORS && rc == ISTH_OK; T++)
                if (ct->model->tensors[T].flags & PARAM_EXPERT) rc = send_tensor(l, t, ct, &v, lead, T, late, &waited);
            const int vrc = state_view_end(&v, 0);
            if (rc == ISTH_OK) rc = vrc;
            state_view_destroy(&v);
        }
    }
    const LinkCounters after = link_counters(l);
    a->bytes = after.bytes_sent + after.bytes_recv - before.bytes_sent - before.bytes_recv;
    CHECK(rc);
    /* a site missed the deadline (the federated launch): lost on every
     * rank of this site alike, and the model is not whole */
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, late, t->n_sites, MPI_UNSIGNED_CHAR, MPI_MAX, t->site_comm));
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &waited, 1, MPI_DOUBLE, MPI_MAX, t->site_comm));
    for (int s = 0; s < t->n_sites; s++)
        if (late[s] && s != t->site) {
            link_mark_lost(l, s, WHAT, waited);
            if (a->lost_site < 0) a->lost_site = s, a->lost_during = 1;
        }
    a->whole = a->lost_site < 0;
    return ISTH_OK;
}

float *assembly_chunk(const Assembly *a, int c) { return a->at ? a->at[c] : NULL; }

void assembly_free(Assembly *a)
{
    for (int i = 0; i < a->n_bufs; i++) isth_free(a->bufs[i]);
    isth_free(a->bufs);
    isth_free(a->at);
    a->bufs = NULL;
    a->at = NULL;
    a->n_bufs = 0;
}
