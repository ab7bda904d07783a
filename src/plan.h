/* plan.h — the model's canonical chunks and who owns each inside a learner:
 * the geometry every exchange, checkpoint and memory plan is built on.
 *
 * Owns: the decomposition of the model into chunks (one per dense tensor
 * and layer, one per expert tensor, layer and expert; canonical order
 * tensor, layer, expert), the fragment of each chunk, the owner of each
 * chunk inside a learner of G ranks, and the packed layout of the chunks
 * a rank owns in a fragment (the layout of outer state, residuals and
 * staging); which chunks cross to other learners. Pure tables, computed
 * from the model and a rank's place alone (no MPI), so the memory planner
 * builds them for ranks it is not.
 * Experts split across sites ([outer] experts = split): a table also
 * knows the experts a learner of its site holds, [expert_lo, expert_lo +
 * expert_n); an expert outside that range is owned by nobody there, and no
 * expert chunk crosses to another learner (the other sites hold other
 * experts). chunk_table_create: every learner holds all E.
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
    int expert_lo, expert_n; /* a learner holds experts [lo, lo + n): 0, E unless split */
} ChunkTable;

int chunk_table_create(ChunkTable *ct, const Model *m, int fragments);
void chunk_table_destroy(ChunkTable *ct);
/* Experts split: a learner (of any G) of the table's site holds experts
 * [begin, begin + count) only (count a multiple of every G asked about).
 * May be called again (the planner walks the sites); dense owners stay. */
void chunk_table_set_experts(ChunkTable *ct, int begin, int count);
/* Does chunk c cross to other learners: a dense chunk, or an expert when
 * every learner holds every expert (not split)? What does not cross is
 * summed inside the site only, never encoded, framed or counted. */
int chunk_crosses(const ChunkTable *ct, int c);

/* Fragment of layer `layer` of a tensor with these PARAM_ flags: layer mod
 * fragments; unlayered tensors layer 0's (embed), or with PARAM_AT_END the
 * last layer's (final_norm). */
int fragment_of(unsigned flags, int layer, int layers, int fragments);
/* Index of chunk (tensor, layer, expert); layer 0 for unlayered tensors. */
int chunk_index(const ChunkTable *ct, int tensor, int layer, int expert);
/* Owner of chunk c inside a learner of G ranks holding the table's
 * experts: an expert its shard ((e - lo) / (n / G)), -1 for an expert
 * outside [lo, lo + n) (owned by nobody there); dense chunks balanced
 * greedily by size in canonical order (ties to the lower rank), -1 only
 * when out of memory for the table. */
int chunk_owner(ChunkTable *ct, int c, int G);
/* Does this rank hold chunk c (every dense chunk, its own experts)? */
int chunk_held(const ChunkTable *ct, int c);
/* Offset of a held chunk in a buffer laid out like the params. */
size_t chunk_offset(const ChunkTable *ct, int c);

/* The chunks of one fragment that rank j of a learner of G owns, packed in
 * canonical order; enc_off and enc_size count the chunks that cross only
 * (a chunk that does not is never encoded: its enc_off is unused). */
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
