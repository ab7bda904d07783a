/* plan.h — the model's canonical chunks, who owns each inside a learner,
 * and the exchange plans and staging pool built on them.
 *
 * Owns: the decomposition of the model into chunks (one per dense tensor
 * and layer, one per expert tensor, layer and expert; canonical order
 * tensor, layer, expert), the fragment of each chunk, the owner of each
 * chunk inside a learner of G ranks, the packed layout of the chunks a rank
 * owns in a fragment (the layout of outer state, residuals and staging),
 * the peers of an exchange (which chunks of mine each of their ranks owns),
 * the framing and checking of payloads, and the pool of staging slots: an exchange in flight holds one
 * slot (its packed values, encodings and messages), so staging grows with
 * the exchanges in flight, not with the fragments or the partners.
 * Must not: decide when to exchange or what the values mean (reduce.c,
 * mix.c, outer.c); touch a buffer it was not handed.
 */
#ifndef ISTHMUS_PLAN_H
#define ISTHMUS_PLAN_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "link.h"
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

/* Copy owned chunks between a params-shaped buffer and the packed layout. */
void owned_pack(const ChunkTable *ct, const Owned *o, const float *buf, float *packed);
void owned_unpack(const ChunkTable *ct, const Owned *o, const float *packed, float *buf);

/* One rank of another learner: which of my owned chunks it owns too, and
 * the messages (payload buffers borrowed from a staging slot). */
typedef struct {
    int world_rank, site;
    int *chunks;               /* indices into the Owned list */
    int n;
    size_t values, enc_bytes;
    size_t send_off, recv_off; /* its frames in a slot's send/recv areas */
    LinkMsg msg, verdict;
    int verdict_waited;        /* a verdict was posted to and is awaited from it (reduce.c) */
} Peer;

typedef struct {
    Peer *peers;
    int n;
    LinkMsg **links;           /* (2n) payload messages, then verdicts */
    size_t send_bytes, recv_bytes; /* the frames of every peer */
} PeerSet;

/* The peers among the G ranks of another learner (first world rank
 * `first`, at site `site`) for my owned chunks `own` of fragment f. */
int peers_add(PeerSet *ps, ChunkTable *ct, const Owned *own, int G, int first, int site, int f, Codec codec,
              CodecParams cp, uint8_t values_kind, size_t verdict_bytes, int local);
/* The frame bytes peers_add would stage for those G ranks (planning). */
size_t peers_frame_bytes(ChunkTable *ct, const Owned *own, int G, Codec codec, CodecParams cp);
/* Build the link list once every peer is in. */
int peers_index(PeerSet *ps);
/* Returns 1 when every message was retired (borrowed buffers may go). */
int peers_free(PeerSet *ps);

/* A staging slot: what one exchange in flight needs. */
typedef struct {
    float *values;        /* (rows, size): per-site sums, or mine then theirs */
    float *gather;        /* (gather_rows, size), or NULL */
    unsigned char *enc;   /* (enc_bytes) my encoded chunks */
    unsigned char *send, *recv; /* peers' frames */
    int user;             /* fragment holding it, -1 free */
} Slot;

typedef struct {
    Slot *slots;
    int n;
    size_t size, rows, gather_rows, enc_bytes, send_bytes, recv_bytes; /* per slot */
} StagePool;

/* Raise the per-slot needs (before pool_alloc). */
void pool_need(StagePool *p, size_t size, size_t enc_bytes, size_t send_bytes, size_t recv_bytes);
int pool_alloc(StagePool *p, int slots, size_t rows, size_t gather_rows);
/* A free slot for `user`, or NULL when every slot is taken. */
Slot *pool_take(StagePool *p, int user);
void pool_give(Slot *s);
/* Slot s gets new buffers; the old ones are left to MPI (a request to a
 * lost site that could not be cancelled may still write them). */
int pool_renew(StagePool *p, Slot *s);
/* leak: some message could not be retired, MPI may still write the slots */
void pool_free(StagePool *p, int leak);
/* Point the peers' payload messages into slot s. */
void peers_bind(PeerSet *ps, Slot *s);

/* A fragment's owned chunks, encoded: chunk k at bytes + off[k]. */
typedef struct {
    Codec codec;
    const unsigned char *bytes;
    const size_t *off;
} Encoded;

/* Frame each peer's chunks of `enc` and post the receives (and the sends
 * unless send_now is 0). corrupt: the test hook flips a byte. */
int peers_post(Link *l, const ChunkTable *ct, const Owned *own, Encoded enc, PeerSet *ps, CodecParams cp, uint8_t kind,
               int f, uint32_t from, uint64_t exchange, int send_now, int corrupt);
/* Check a peer's frame and decode its chunks into dst (packed layout).
 * NULL, or the reason for rejecting it. */
const char *peer_take(Link *l, const ChunkTable *ct, const Owned *own, Codec codec, CodecParams cp, const Peer *p,
                      uint8_t kind,
                      int f, uint64_t exchange, float *dst);

#endif
