/* plan.h — the model's canonical chunks and who owns each inside a learner:
 * the geometry every exchange, checkpoint and memory plan is built on.
 *
 * Owns: the decomposition of the model into chunks (one per dense tensor
 * and layer, one per expert tensor, layer and expert; canonical order
 * tensor, layer, expert), the fragment of each chunk, the owner of each
 * chunk inside a learner of G ranks, and the packed layout of the chunks
 * a rank owns in a fragment (the layout of outer state, residuals and
 * staging). Pure tables, computed from the model and a rank's place alone
 * (no MPI), so the memory planner builds them for ranks it is not.
 * Must not: hold values, move them, or know about the link (payload.h
 * frames what these tables describe; shard.h holds this rank's values).
 */
#ifndef ISTHMUS_PLAN_H
#define ISTHMUS_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "model.h"

typedef struct {
    int tensor, layer, expert; /* expert -1: a dense chunk */
    size_t size;
    int fragment;
} Chunk;

typedef struct {
    int G;
    int *owner; /* (n_chunks) rank in a learner of G owning each dense chunk, -1 for experts */
} OwnerMap;

typedef struct {
    const Model *model; /* this rank's table: where held chunks live */
    Chunk *chunks;
    int n_chunks, fragments;
    int first[N_TENSORS]; /* index of each tensor's first chunk */
    OwnerMap *owners;     /* one per learner size seen (a few: one per site) */
    int n_owners;
} ChunkTable;

int chunk_table_create(ChunkTable *ct, const Model *m, int fragments);
void chunk_table_destroy(ChunkTable *ct);

/* Fragment of layer `layer` of a tensor with these PARAM_ flags: layer mod
 * fragments; unlayered tensors layer 0's (embed), or with PARAM_AT_END the
 * last layer's (final_norm). */
int fragment_of(unsigned flags, int layer, int layers, int fragments);
/* Index of chunk (tensor, layer, expert); layer 0 for unlayered tensors. */
int chunk_index(const ChunkTable *ct, int tensor, int layer, int expert);
/* Owner of chunk c inside a learner of G ranks: experts their shard; dense
 * chunks balanced greedily by size in canonical order (ties to the lower
 * rank). -1 when out of memory for the table. */
int chunk_owner(ChunkTable *ct, int c, int G);
/* Does this rank hold chunk c (every dense chunk, its own experts)? */
int chunk_held(const ChunkTable *ct, int c);
/* Offset of a held chunk in a buffer laid out like the params. */
size_t chunk_offset(const ChunkTable *ct, int c);

/* The chunks of one fragment that rank j of a learner of G owns, packed in
 * canonical order. */
typedef struct {
    int *chunk;      /* chunk ids */
    size_t *off;     /* packed offset of each */
    size_t *enc_off; /* encoded byte offset of each (the plan's codec) */
    int n;
    size_t size, enc_size, max_chunk;
} Owned;

int owned_build(Owned *o, ChunkTable *ct, int f, int G, int j, Codec codec, CodecParams cp);
void owned_free(Owned *o);

#endif
