/* plan.c — see plan.h. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

int fragment_of(unsigned flags, int layer, int layers, int fragments)
{
    if (!(flags & PARAM_LAYERED)) return (flags & PARAM_AT_END) ? (layers - 1) % fragments : 0;
    return layer % fragments;
}

static int layers_of(const Model *m, const Tensor *x) { return (x->flags & PARAM_LAYERED) ? m->cfg.layers : 1; }

/* Elements of one layer of a tensor on this rank (all its local experts). */
static size_t layer_numel(const Tensor *x) { return (x->flags & PARAM_LAYERED) ? x->numel / x->local[0] : x->numel; }

int chunk_table_create(ChunkTable *ct, const Model *m, int fragments)
{
    memset(ct, 0, sizeof *ct);
    ct->model = m;
    ct->fragments = fragments;
    const int E = m->cfg.experts;
    ct->expert_lo = 0;
    ct->expert_n = E;
    int n = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        const Tensor *x = &m->tensors[t];
        ct->first[t] = n;
        n += (x->flags & PARAM_EXPERT) ? layers_of(m, x) * E : layers_of(m, x);
    }
    ct->chunks = isth_malloc(sizeof(Chunk) * (size_t)n);
    CHECK_ALLOC(ct->chunks);
    ct->n_chunks = n;
    n = 0;
    for (int t = 0; t < N_TENSORS; t++) { /* canonical order: tensor, layer, expert */
        const Tensor *x = &m->tensors[t];
        for (int l = 0; l < layers_of(m, x); l++) {
            const int f = fragment_of(x->flags, l, m->cfg.layers, fragments);
            if (x->flags & PARAM_EXPERT)
                for (int e = 0; e < E; e++) ct->chunks[n++] = (Chunk){t, l, e, x->chunk_numel, f};
            else
                ct->chunks[n++] = (Chunk){t, l, -1, x->chunk_numel, f};
        }
    }
    return ISTH_OK;
}

void chunk_table_destroy(ChunkTable *ct)
{
    for (int i = 0; i < ct->n_owners; i++) isth_free(ct->owners[i].owner);
    isth_free(ct->owners);
    isth_free(ct->chunks);
    memset(ct, 0, sizeof *ct);
}

void chunk_table_set_experts(ChunkTable *ct, int begin, int count)
{
    ct->expert_lo = begin;
    ct->expert_n = count;
}

int chunk_crosses(const ChunkTable *ct, int c)
{
    return ct->chunks[c].expert < 0 || (ct->expert_lo == 0 && ct->expert_n == ct->model->cfg.experts);
}

int chunk_index(const ChunkTable *ct, int tensor, int layer, int expert)
{
    const Tensor *x = &ct->model->tensors[tensor];
    return ct->first[tensor] + ((x->flags & PARAM_EXPERT) ? layer * ct->model->cfg.experts + expert : layer);
}

static const int *dense_owners(ChunkTable *ct, int G)
{
    for (int i = 0; i < ct->n_owners; i++)
        if (ct->owners[i].G == G) return ct->owners[i].owner;
    OwnerMap *grown = isth_realloc(ct->owners, sizeof(OwnerMap) * (size_t)(ct->n_owners + 1));
    if (!grown) return NULL;
    ct->owners = grown;
    int *owner = isth_malloc(sizeof(int) * (size_t)ct->n_chunks);
    double *load = isth_calloc((size_t)G, sizeof(double));
    if (!owner || !load) {
        isth_free(owner);
        isth_free(load);
        return NULL;
    }
    for (int k = 0; k < ct->n_chunks; k++) {
        if (ct->chunks[k].expert >= 0) {
            owner[k] = -1;
            continue;
        }
        int best = 0;
        for (int j = 1; j < G; j++)
            if (load[j] < load[best]) best = j;
        owner[k] = best;
        load[best] += (double)ct->chunks[k].size;
    }
    isth_free(load);
    ct->owners[ct->n_owners++] = (OwnerMap){G, owner};
    return owner;
}

int chunk_owner(ChunkTable *ct, int c, int G)
{
    const Chunk *ch = &ct->chunks[c];
    if (ch->expert >= 0) { /* replicated: lo = 0, n = E, e / (E / G) */
        const int e = ch->expert - ct->expert_lo;
        return e >= 0 && e < ct->expert_n ? e / (ct->expert_n / G) : -1;
    }
    const int *owner = dense_owners(ct, G);
    return owner ? owner[c] : -1;
}

int chunk_held(const ChunkTable *ct, int c)
{
    const Chunk *ch = &ct->chunks[c];
    const Model *m = ct->model;
    return ch->expert < 0 || (ch->expert >= m->expert_begin && ch->expert < m->expert_begin + m->experts_local);
}

size_t chunk_offset(const ChunkTable *ct, int c)
{
    const Chunk *ch = &ct->chunks[c];
    const Model *m = ct->model;
    const Tensor *x = &m->tensors[ch->tensor];
    size_t off = x->offset + ((x->flags & PARAM_LAYERED) ? (size_t)ch->layer * layer_numel(x) : 0);
    if (ch->expert >= 0) off += (size_t)(ch->expert - m->expert_begin) * ch->size;
    return off;
}

int owned_build(Owned *o, ChunkTable *ct, int f, int G, int j, Codec codec, CodecParams cp)
{
    memset(o, 0, sizeof *o);
    int n = 0;
    for (int c = 0; c < ct->n_chunks; c++) n += ct->chunks[c].fragment == f;
    o->chunk = isth_malloc(sizeof(int) * (size_t)(n + 1));
    o->off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    o->enc_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    CHECK_ALLOC(o->chunk);
    CHECK_ALLOC(o->off);
    CHECK_ALLOC(o->enc_off);
    for (int c = 0; c < ct->n_chunks; c++) {
        const Chunk *ch = &ct->chunks[c];
        if (ch->fragment != f) continue;
        const int owner = chunk_owner(ct, c, G);
        if (owner < 0 && ch->expert < 0) return isth_fail(ISTH_ERUNTIME, "plan: out of memory for ownership tables");
        if (owner != j) continue; /* an expert of another site: nobody's here */
        o->off[o->n] = o->size;
        o->enc_off[o->n] = o->enc_size;
        o->chunk[o->n++] = c;
        o->size += ch->size;
        if (chunk_crosses(ct, c)) o->enc_size += codec_encoded_size(codec, ch->size, cp);
        if (ch->size > o->max_chunk) o->max_chunk = ch->size;
    }
    return ISTH_OK;
}

void owned_free(Owned *o)
{
    isth_free(o->chunk);
    isth_free(o->off);
    isth_free(o->enc_off);
    memset(o, 0, sizeof *o);
}
