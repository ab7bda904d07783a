/* norms.c — see norms.h: the learner's gradient norm and the fingerprint
 * of a learner's state. */
#include "norms.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "status.h"

int grad_norm_sq_learner(Backend *be, MPI_Comm learner_comm, double *out)
{
    const Model *m = &be->table;
    /* dense: every rank holds the whole dense gradient */
    double dense;
    CHECK(be->ops->sumsq(be, STATE_GRADS, PARAM_EXPERT, 0, &dense));
    const int L = m->cfg.layers, E = m->cfg.experts, El = m->experts_local;
    int n_expert_tensors = 0;
    for (int t = 0; t < N_TENSORS; t++) n_expert_tensors += (m->tensors[t].flags & PARAM_EXPERT) != 0;
    const size_t nblocks = (size_t)n_expert_tensors * L * E;
    const size_t mine = (size_t)n_expert_tensors * L * El;
    double *blocks = isth_calloc(nblocks, sizeof(double)), *sums = isth_malloc(sizeof(double) * (mine + 1));
    size_t *off = isth_malloc(sizeof(size_t) * (mine + 1)), *len = isth_malloc(sizeof(size_t) * (mine + 1));
    int rc = blocks && sums && off && len ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "out of memory for the gradient norm");
    if (rc == ISTH_OK) {
        /* one block per (expert tensor, layer, expert), in table order */
        size_t k = 0;
        for (int t = 0; t < N_TENSORS; t++) {
            const Tensor *x = &m->tensors[t];
            if (!(x->flags & PARAM_EXPERT)) continue;
            for (int l = 0; l < L; l++)
                for (int e = 0; e < El; e++, k++) {
                    off[k] = x->offset + ((size_t)l * El + (size_t)e) * x->chunk_numel;
                    len[k] = x->chunk_numel;
                }
        }
        rc = be->ops->run_sumsq(be, STATE_GRADS, off, len, (int)mine, sums);
    }
    if (rc == ISTH_OK) {
        size_t k = 0;
        for (int t = 0, base = 0; t < N_TENSORS; t++) {
            if (!(m->tensors[t].flags & PARAM_EXPERT)) continue;
            for (int l = 0; l < L; l++)
                for (int e = 0; e < El; e++) blocks[((size_t)base + (size_t)l) * E + m->expert_begin + e] = sums[k++];
            base += L;
        }
        /* one non-zero per block: the sum is exact whatever the reduction order */
        rc = coll_allreduce_comm(learner_comm, blocks, nblocks, MPI_DOUBLE, sizeof(double), MPI_SUM);
    }
    double total = dense;
    for (size_t i = 0; rc == ISTH_OK && i < nblocks; i++) total += blocks[i];
    isth_free(blocks);
    isth_free(sums);
    isth_free(off);
    isth_free(len);
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

int model_fingerprint(const ChunkTable *ct, ChunkView view, void *ctx, MPI_Comm learner_comm, uint64_t *out,
                      uint64_t *crossing)
{
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
    for (int c = 0; c < ct->n_chunks; c++) /* the chunks that stay at their site count as zeros */
        if (!chunk_crosses(ct, c)) blocks[c] = 0;
    *crossing = fnv1a(FNV_OFFSET, blocks, (size_t)ct->n_chunks * sizeof(uint64_t));
    isth_free(blocks);
    return rc;
}
