/* assemble.c — see assemble.h. */
#include "assemble.h"

#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "oneway.h"
#include "stateview.h"
#include "status.h"

#define WHAT "the whole model's assembly"

static int tensor_end(const ChunkTable *ct, int t) { return t + 1 < N_TENSORS ? ct->first[t + 1] : ct->n_chunks; }

/* Does chunk c go from world rank `from` to writer rank `to`? From its
 * source site (a->src: the owner, or a holder of its copy) unless that is
 * the writer's own. */
static int goes(const Assembly *a, const Topology *t, const ChunkTable *ct, int lead, int c, int from, int to)
{
    const int e = ct->chunks[c].expert, E = ct->model->cfg.experts;
    return e >= 0 && a->src[e] >= 0 && a->src[e] != lead && copies_sender(t, a->src[e], E, e) == from &&
           copies_place(t, lead, E, e) == to;
}

/* The values of tensor T's chunks from `from` to writer rank `to`. */
static size_t values_of(const Assembly *a, const Topology *t, const ChunkTable *ct, int lead, int T, int from, int to)
{
    size_t n = 0;
    for (int c = ct->first[T]; c < tensor_end(ct, T); c++)
        if (goes(a, t, ct, lead, c, from, to)) n += ct->chunks[c].size;
    return n;
}

/* A StateSelect: the expert chunks this rank holds. */
static int held_expert(const void *ct, int c)
{
    return ((const ChunkTable *)ct)->chunks[c].expert >= 0 && chunk_held(ct, c);
}

/* The sender's part of tensor T: to each writer rank the chunks it gets,
 * from the weights it trains or from the copies it holds. */
static int send_tensor(const Assembly *a, Link *l, const Topology *t, const ChunkTable *ct, StateView *v, int lead,
                       int T, unsigned char *late, double *waited)
{
    const SiteInfo *w = &t->sites[lead];
    OneWay *fr = isth_calloc((size_t)w->learner_ranks, sizeof(OneWay));
    CHECK_ALLOC(fr);
    int n = 0, rc = ISTH_OK;
    for (int to = 0; to < w->learner_ranks && rc == ISTH_OK; to++) {
        const size_t values = values_of(a, t, ct, lead, T, t->world_rank, to), bytes = values * sizeof(float);
        if (!values) continue;
        OneWay *f = &fr[n];
        if ((rc = oneway_alloc(f, values, bytes, lead, WHAT)) != ISTH_OK) break;
        n++;
        const int peer = w->first_rank + to;
        float *out = (float *)(f->buf + ONEWAY_ROOM);
        for (int c = ct->first[T]; c < tensor_end(ct, T) && rc == ISTH_OK; c++) {
            if (!goes(a, t, ct, lead, c, t->world_rank, to)) continue;
            const Chunk *ch = &ct->chunks[c];
            const float *src = chunk_held(ct, c) ? state_view_at(v, T, ch->layer, ch->expert) : copies_chunk(a->copies, c);
            if (!src) rc = v->rc != ISTH_OK ? v->rc : isth_fail(ISTH_ERUNTIME, "%s: chunk %d is not held here", WHAT, c);
            else memcpy(out, src, ch->size * sizeof(float));
            out += ch->size;
        }
        if (rc == ISTH_OK) {
            link_frame(l, peer, f->buf, 0, LINK_CONTROL, 0, (uint32_t)t->site, (uint64_t)T + 1, values, bytes);
            oneway_send(f, peer, LINK_TAG_ASSEMBLY);
        }
    }
    if (rc == ISTH_OK) rc = oneway_await(l, fr, n, WHAT, late, waited);
    oneway_release(fr, n);
    isth_free(fr);
    return rc;
}

/* The writer rank's part of tensor T: from each sender the chunks it gets,
 * kept in a->bufs, each chunk's place in a->at. */
static int receive_tensor(Assembly *a, Link *l, const Topology *t, const ChunkTable *ct, int lead, int T,
                          unsigned char *late, double *waited)
{
    const int me = t->learner_rank;
    OneWay *fr = isth_calloc((size_t)t->world_size, sizeof(OneWay));
    CHECK_ALLOC(fr);
    int n = 0, rc = ISTH_OK;
    for (int s = 0; s < t->n_sites && rc == ISTH_OK; s++) {
        if (s == lead) continue;
        for (int k = 0; k < t->sites[s].learner_ranks && rc == ISTH_OK; k++) {
            const int from = t->sites[s].first_rank + k;
            const size_t values = values_of(a, t, ct, lead, T, from, me), bytes = values * sizeof(float);
            if (!values) continue;
            OneWay *f = &fr[n];
            if ((rc = oneway_alloc(f, values, bytes, s, WHAT)) != ISTH_OK) break;
            n++;
            rc = oneway_recv(l, f, from, LINK_TAG_ASSEMBLY);
        }
    }
    if (rc == ISTH_OK) rc = oneway_await(l, fr, n, WHAT, late, waited);
    for (int i = 0; i < n && rc == ISTH_OK; i++) {
        OneWay *f = &fr[i];
        if (late[f->site]) continue;
        const char *bad = link_check(l, f->m.peer, f->buf, f->m.recv_bytes, LINK_CONTROL, 0, (uint64_t)T + 1,
                                     f->values, f->bytes);
        if (bad) {
            rc = isth_fail(ISTH_ERUNTIME, "link: %s: the frame of tensor %s from world rank %d (site %s) rejected: %s",
                           WHAT, ct->model->tensors[T].name, f->m.peer, t->sites[f->site].name, bad);
            break;
        }
        float *in = (float *)(f->buf + ONEWAY_ROOM);
        for (int c = ct->first[T]; c < tensor_end(ct, T); c++)
            if (goes(a, t, ct, lead, c, f->m.peer, me)) {
                a->at[c] = in;
                in += ct->chunks[c].size;
            }
        a->bufs[a->n_bufs++] = f->buf; /* kept until assembly_free */
        f->kept = 1;
    }
    oneway_release(fr, n);
    isth_free(fr);
    return rc;
}

/* Where each expert comes from (a->src): its owner site when live, else
 * the first live site after it holding a copy (once a refresh has run);
 * -1: none, the model is not whole. */
static int choose_sources(Assembly *a, Link *l, const Topology *t, const ExpertCopies *copies, int E)
{
    a->src = isth_malloc(sizeof(int) * (size_t)E);
    CHECK_ALLOC(a->src);
    for (int e = 0; e < E; e++) {
        const int s = topology_expert_site(t, e);
        a->src[e] = link_is_lost(l, s) ? -1 : s;
        a->copy_step[s] = -1;
        for (int k = 1; a->src[e] < 0 && copies && copies->on && copies->live_refreshes[s] > 0 && k < copies->replicas;
             k++) {
            const int h = (s + k) % t->n_sites;
            if (link_is_lost(l, h)) continue;
            /* the holder itself knows best whether its copy was ever taken
             * whole (a refresh it saw s late in is not counted there); the
             * others send it nothing either way (a writer's own copy moves
             * nothing). With three sites, a holder elsewhere that never got
             * a copy the others count leaves the model not whole after the
             * assembly's deadline. */
            if (h == t->site && copies->from_step[s] < 0) break;
            a->src[e] = h;
            a->from_copy[s] = 1;
            if (h == t->site) a->copy_step[s] = copies->from_step[s];
        }
        if (a->src[e] < 0 && a->lost_site < 0) a->lost_site = s;
    }
    return ISTH_OK;
}

int assembly_gather(Assembly *a, Link *l, const Topology *t, const ChunkTable *ct, Backend *be,
                    const ExpertCopies *copies, int lead)
{
    memset(a, 0, sizeof *a);
    a->done = 1;
    a->lost_site = -1;
    a->copies = copies;
    a->ct = ct;
    a->topo = t;
    a->lead = lead;
    CHECK(choose_sources(a, l, t, copies, ct->model->cfg.experts));
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
                if (ct->model->tensors[T].flags & PARAM_EXPERT) rc = send_tensor(a, l, t, ct, &v, lead, T, late, &waited);
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

float *assembly_chunk(const Assembly *a, int c)
{
    if (a->at && a->at[c]) return a->at[c];
    const int e = a->ct ? a->ct->chunks[c].expert : -1; /* the writer's own copy of a lost site's expert */
    return e >= 0 && a->src && a->copies && a->src[e] == a->lead && topology_expert_site(a->topo, e) != a->lead
               ? copies_chunk(a->copies, c)
               : NULL;
}

void assembly_free(Assembly *a)
{
    for (int i = 0; i < a->n_bufs; i++) isth_free(a->bufs[i]);
    isth_free(a->bufs);
    isth_free(a->at);
    isth_free(a->src);
    a->bufs = NULL;
    a->at = NULL;
    a->src = NULL;
    a->n_bufs = 0;
}
