/* sync.c — see sync.h. */
#include "sync.h"

#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "status.h"

/* My packed index of local offset o (o inside my owned set). */
static size_t packed_index(const SyncPlan *p, const Model *m, size_t o)
{
    return o < m->dense_end ? o - p->dense_lo : (p->dense_hi - p->dense_lo) + (o - m->dense_end);
}

/* Owned expert range of learner rank j in a learner of G ranks. */
static void expert_range(int E, int G, int j, int *e0, int *e1)
{
    *e0 = j * (E / G);
    *e1 = *e0 + E / G;
}

static void dense_slice(size_t dense, int G, int j, size_t *lo, size_t *hi)
{
    *lo = dense * (size_t)j / (size_t)G;
    *hi = dense * (size_t)(j + 1) / (size_t)G;
}

/* Offset of (tensor t, layer l, expert e) in the buffer of a rank holding
 * experts [eb, eb+El), given the model table of THIS rank (dense offsets are
 * the same everywhere; expert tensors are laid out back to back after
 * dense_end, each [L, El, per_expert], padded to 16 elements). */
static size_t expert_offset(const Model *m, int El, int eb, int t, int l, int e)
{
    size_t off = m->dense_end;
    const size_t L = (size_t)m->cfg.layers, per = (size_t)m->cfg.dim * m->cfg.ffn;
    for (int i = T_W_GATE; i < t; i++) off += (L * (size_t)El * per + 15) & ~(size_t)15;
    return off + ((size_t)l * El + (size_t)(e - eb)) * per;
}

static int build_peer(SyncPlan *p, const Model *m, int peer_rank, int peer_site, int peer_G, int peer_j)
{
    const Topology *t = p->topo;
    Segment *segs = malloc(sizeof(Segment) * (1 + 3 * (size_t)m->cfg.layers));
    CHECK_ALLOC(segs);
    int n = 0;
    size_t elems = 0;
    size_t lo, hi;
    dense_slice(m->dense_end, peer_G, peer_j, &lo, &hi);
    size_t a = lo > p->dense_lo ? lo : p->dense_lo, b = hi < p->dense_hi ? hi : p->dense_hi;
    if (a < b) {
        segs[n++] = (Segment){a, a, b - a};
        elems += b - a;
    }
    int me0, me1, pe0, pe1;
    expert_range(m->cfg.experts, t->learner_size, t->learner_rank, &me0, &me1);
    expert_range(m->cfg.experts, peer_G, peer_j, &pe0, &pe1);
    int e0 = me0 > pe0 ? me0 : pe0, e1 = me1 < pe1 ? me1 : pe1;
    if (e0 < e1) {
        const size_t per = (size_t)m->cfg.dim * m->cfg.ffn;
        for (int tt = T_W_GATE; tt <= T_W_DOWN; tt++)
            for (int l = 0; l < m->cfg.layers; l++) {
                size_t mine = expert_offset(m, me1 - me0, me0, tt, l, e0);
                size_t theirs = expert_offset(m, pe1 - pe0, pe0, tt, l, e0);
                segs[n++] = (Segment){mine, theirs, (size_t)(e1 - e0) * per};
                elems += (size_t)(e1 - e0) * per;
            }
    }
    if (n == 0) {
        free(segs);
        return ISTH_OK;
    }
    PeerPlan *pp = &p->peers[p->n_peers++];
    pp->world_rank = peer_rank;
    pp->site = peer_site;
    pp->segs = segs;
    pp->n_segs = n;
    pp->elems = elems;
    p->peer_elems_total += elems;
    return ISTH_OK;
}

int sync_plan_create(SyncPlan *p, const Topology *t, const Model *m, MPI_Comm world)
{
    memset(p, 0, sizeof *p);
    p->topo = t;
    p->world = world;
    p->site_peers = MPI_COMM_NULL;
    const int G = t->learner_size;
    p->dense_counts = malloc(sizeof(int) * 2 * (size_t)G);
    CHECK_ALLOC(p->dense_counts);
    p->dense_displs = p->dense_counts + G;
    for (int j = 0; j < G; j++) {
        size_t lo, hi;
        dense_slice(m->dense_end, G, j, &lo, &hi);
        p->dense_counts[j] = (int)(hi - lo);
        p->dense_displs[j] = (int)lo;
    }
    dense_slice(m->dense_end, G, t->learner_rank, &p->dense_lo, &p->dense_hi);
    p->owned = (p->dense_hi - p->dense_lo) + (m->n_params - m->dense_end);
    const SiteInfo *site = &t->sites[t->site];
    p->leader = t->learner == site->first_learner;
    CHECK_MPI(MPI_Comm_split(world, t->site * 65536 + t->learner_rank, t->learner, &p->site_peers));

    if (p->leader) {
        /* every rank of every other site's first learner: keep those that overlap */
        int max_peers = 0;
        for (int s = 0; s < t->n_sites; s++)
            if (s != t->site) max_peers += t->sites[s].learner_ranks;
        p->peers = calloc((size_t)max_peers + 1, sizeof(PeerPlan));
        CHECK_ALLOC(p->peers);
        for (int s = 0; s < t->n_sites; s++) {
            if (s == t->site) continue;
            const SiteInfo *o = &t->sites[s];
            for (int j = 0; j < o->learner_ranks; j++)
                CHECK(build_peer(p, m, o->first_rank + j, s, o->learner_ranks, j));
        }
    }
    p->staging = malloc(sizeof(float) * (size_t)t->n_sites * (p->owned ? p->owned : 1));
    p->packed = malloc(sizeof(float) * (size_t)site->learners * (p->owned ? p->owned : 1));
    p->sendbuf = malloc(sizeof(float) * (p->peer_elems_total + 1));
    p->recvbuf = malloc(sizeof(float) * (p->peer_elems_total + 1));
    if (!p->staging || !p->packed || !p->sendbuf || !p->recvbuf)
        return isth_fail(ISTH_ERUNTIME, "out of memory for the sync plan");
    return ISTH_OK;
}

void sync_plan_destroy(SyncPlan *p)
{
    for (int i = 0; i < p->n_peers; i++) free(p->peers[i].segs);
    free(p->peers);
    free(p->dense_counts);
    free(p->staging);
    free(p->packed);
    free(p->sendbuf);
    free(p->recvbuf);
    if (p->site_peers != MPI_COMM_NULL) MPI_Comm_free(&p->site_peers);
    memset(p, 0, sizeof *p);
}

/* Copy my owned part of g into dst (packed order), or back. */
static void pack_owned(const SyncPlan *p, const Model *m, const float *g, float *dst)
{
    const size_t nd = p->dense_hi - p->dense_lo;
    memcpy(dst, g + p->dense_lo, nd * sizeof(float));
    memcpy(dst + nd, g + m->dense_end, (m->n_params - m->dense_end) * sizeof(float));
}

static void unpack_owned(const SyncPlan *p, const Model *m, const float *src, float *g)
{
    const size_t nd = p->dense_hi - p->dense_lo;
    memcpy(g + p->dense_lo, src, nd * sizeof(float));
    memcpy(g + m->dense_end, src + nd, (m->n_params - m->dense_end) * sizeof(float));
}

int sync_reduce_grads(SyncPlan *p, Model *m)
{
    const Topology *t = p->topo;
    const SiteInfo *site = &t->sites[t->site];
    const size_t owned = p->owned;
    float *g = m->grads;

    /* 1. dense gradient: reduce-scatter inside the learner */
    if (t->learner_size > 1) {
        CHECK_MPI(MPI_Reduce_scatter(MPI_IN_PLACE, g, p->dense_counts, MPI_FLOAT, MPI_SUM, t->learner_comm));
        /* MPI_IN_PLACE leaves my slice at the start of the buffer */
        memmove(g + p->dense_lo, g, (p->dense_hi - p->dense_lo) * sizeof(float));
    }
    if (t->n_learners == 1) goto allgather;

    /* 2. inside the site: gather every learner's owned part, sum in learner order */
    float *mine = p->staging + (size_t)t->site * owned;
    if (site->learners > 1) {
        pack_owned(p, m, g, mine);
        CHECK_MPI(MPI_Allgather(mine, (int)owned, MPI_FLOAT, p->packed, (int)owned, MPI_FLOAT, p->site_peers));
        p->intra_site_bytes += 2.0 * (site->learners - 1) * owned * sizeof(float);
        for (size_t i = 0; i < owned; i++) {
            float s = 0.0f;
            for (int l = 0; l < site->learners; l++) s += p->packed[(size_t)l * owned + i];
            mine[i] = s;
        }
    } else {
        pack_owned(p, m, g, mine);
    }

    /* 3. across sites: leaders exchange overlapping segments of their site sums */
    if (t->n_sites > 1 && p->leader) {
        MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * (size_t)(p->n_peers + 1));
        CHECK_ALLOC(req);
        size_t off = 0;
        for (int i = 0; i < p->n_peers; i++) {
            const PeerPlan *pp = &p->peers[i];
            float *sb = p->sendbuf + off, *rb = p->recvbuf + off;
            size_t k = 0;
            for (int s = 0; s < pp->n_segs; s++) {
                memcpy(sb + k, mine + packed_index(p, m, pp->segs[s].local), pp->segs[s].len * sizeof(float));
                k += pp->segs[s].len;
            }
            MPI_Irecv(rb, (int)pp->elems, MPI_FLOAT, pp->world_rank, 7001, p->world, &req[2 * i]);
            MPI_Isend(sb, (int)pp->elems, MPI_FLOAT, pp->world_rank, 7001, p->world, &req[2 * i + 1]);
            off += pp->elems;
            p->inter_site_bytes += 2.0 * pp->elems * sizeof(float);
        }
        int rc = MPI_Waitall(2 * p->n_peers, req, MPI_STATUSES_IGNORE);
        free(req);
        if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "sync: inter-site exchange failed (%d)", rc);
        off = 0;
        for (int i = 0; i < p->n_peers; i++) {
            const PeerPlan *pp = &p->peers[i];
            float *dst = p->staging + (size_t)pp->site * owned;
            size_t k = 0;
            for (int s = 0; s < pp->n_segs; s++) {
                memcpy(dst + packed_index(p, m, pp->segs[s].local), p->recvbuf + off + k,
                       pp->segs[s].len * sizeof(float));
                k += pp->segs[s].len;
            }
            off += pp->elems;
        }
        /* total in site order: the same additions on every leader */
        for (size_t i = 0; i < owned; i++) {
            float s = 0.0f;
            for (int st = 0; st < t->n_sites; st++) s += p->staging[(size_t)st * owned + i];
            p->packed[i] = s;
        }
    } else if (p->leader) {
        memcpy(p->packed, mine, owned * sizeof(float));
    }

    /* 4. the leader learner's total to the site's other learners */
    if (site->learners > 1) {
        CHECK_MPI(MPI_Bcast(p->packed, (int)owned, MPI_FLOAT, 0, p->site_peers));
        p->intra_site_bytes += (double)owned * sizeof(float);
    }
    unpack_owned(p, m, p->packed, g);

allgather:
    if (t->learner_size > 1)
        CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g, p->dense_counts,
                                 p->dense_displs, MPI_FLOAT, t->learner_comm));
    return ISTH_OK;
}

int grad_norm_sq_learner(const Model *m, MPI_Comm learner_comm, double *out)
{
    /* dense: every rank holds the whole dense gradient */
    double dense = grad_sumsq(m, PARAM_EXPERT, 0);
    const int L = m->cfg.layers, E = m->cfg.experts;
    const size_t per = (size_t)m->cfg.dim * m->cfg.ffn, nblocks = (size_t)3 * L * E;
    double *blocks = calloc(nblocks, sizeof(double));
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

int model_fingerprint(const Model *m, MPI_Comm learner_comm, uint64_t *out)
{
    const int L = m->cfg.layers, E = m->cfg.experts;
    const size_t per = (size_t)m->cfg.dim * m->cfg.ffn, nblocks = (size_t)3 * L * E;
    uint64_t *blocks = calloc(nblocks, sizeof(uint64_t));
    CHECK_ALLOC(blocks);
    for (int t = T_W_GATE; t <= T_W_DOWN; t++)
        for (int l = 0; l < L; l++)
            for (int e = 0; e < m->experts_local; e++)
                blocks[((size_t)(t - T_W_GATE) * L + l) * E + m->expert_begin + e] =
                    fnv1a(14695981039346656037ull, model_param(m, (TensorId)t, l) + (size_t)e * per,
                          per * sizeof(float));
    /* each block hashed by exactly one rank: XOR with zeros is exact */
    int rc = MPI_Allreduce(MPI_IN_PLACE, blocks, (int)nblocks, MPI_UINT64_T, MPI_BXOR, learner_comm);
    uint64_t h = 14695981039346656037ull;
    for (int t = 0; t < T_W_GATE; t++)
        h = fnv1a(h, m->params + m->tensors[t].offset, m->tensors[t].numel * sizeof(float));
    h = fnv1a(h, blocks, nblocks * sizeof(uint64_t));
    free(blocks);
    if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "fingerprint: MPI_Allreduce failed");
    *out = h;
    return ISTH_OK;
}
