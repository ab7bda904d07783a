/* norms.c — the learner's gradient norm and the fingerprint of a learner's
 * state (see reduce.h): numbers every rank of every learner agrees on,
 * whatever the sharding. */
#include "reduce.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "optim.h"
#include "status.h"

int grad_norm_sq_learner(const Model *m, MPI_Comm learner_comm, double *out)
{
    /* dense: every rank holds the whole dense gradient */
    double dense = grad_sumsq(m, PARAM_EXPERT, 0);
    const int L = m->cfg.layers, E = m->cfg.experts;
    int n_expert_tensors = 0;
    for (int t = 0; t < N_TENSORS; t++) n_expert_tensors += (m->tensors[t].flags & PARAM_EXPERT) != 0;
    const size_t per = (size_t)m->cfg.dim * m->cfg.ffn, nblocks = (size_t)n_expert_tensors * L * E;
    double *blocks = isth_calloc(nblocks, sizeof(double));
    CHECK_ALLOC(blocks);
    /* one block per (expert tensor, layer, expert), in table order */
    size_t base = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        if (!(m->tensors[t].flags & PARAM_EXPERT)) continue;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < m->experts_local; e++) {
                const float *g = model_grad(m, (TensorId)t, l) + (size_t)e * per;
                double s = 0.0;
                for (size_t i = 0; i < per; i++) s += (double)g[i] * g[i];
                blocks[(base + (size_t)l) * E + m->expert_begin + e] = s;
            }
        base += (size_t)L;
    }
    /* one non-zero per block: the sum is exact whatever the reduction order */
    int rc = coll_allreduce_comm(learner_comm, blocks, nblocks, MPI_DOUBLE, sizeof(double), MPI_SUM);
    double total = dense;
    for (size_t i = 0; i < nblocks; i++) total += blocks[i];
    isth_free(blocks);
    CHECK(rc);
    *out = total;
    return ISTH_OK;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

#define FNV_OFFSET 14695981039346656037ull

int model_fingerprint(Reducer *r, ChunkView view, const void *ctx, MPI_Comm learner_comm, uint64_t *out)
{
    const ChunkTable *ct = &r->table;
    uint64_t *blocks = isth_calloc((size_t)ct->n_chunks, sizeof(uint64_t));
    CHECK_ALLOC(blocks);
    for (int c = 0; c < ct->n_chunks; c++) {
        const Chunk *ch = &ct->chunks[c];
        const float *p = view(ctx, ch->tensor, ch->layer, ch->expert);
        if (p) blocks[c] = fnv1a(FNV_OFFSET, p, ch->size * sizeof(float));
    }
    /* each chunk hashed by exactly one rank: XOR with zeros is exact */
    int rc = coll_allreduce_comm(learner_comm, blocks, (size_t)ct->n_chunks, MPI_UINT64_T, sizeof(uint64_t), MPI_BXOR);
    *out = fnv1a(FNV_OFFSET, blocks, (size_t)ct->n_chunks * sizeof(uint64_t));
    isth_free(blocks);
    return rc;
}
