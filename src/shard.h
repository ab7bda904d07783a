/* shard.h — this rank's share of the model inside its learner, as the
 * exchanges between learners see it.
 *
 * Owns: the chunk table (plan.h) and, per fragment, the chunks this rank
 * owns (their packed layout), the runs of the chunks it holds and of the
 * dense chunks with their owners; the optimiser's runs (ZeRO-1: what this
 * rank updates); moving owned chunks between the backend's state and
 * packed host staging through the backend's verbs (get, put, sum_runs,
 * share_runs); the pool of staging slots (an exchange in flight, or a
 * result waiting to be applied, holds one: staging grows with the
 * exchanges in flight, not with the fragments or the partners); the
 * error-feedback residuals of the payloads this rank encodes; the run's
 * payload codec (payload.h's type; others read it through shard_codec);
 * the count of exchanges (checkpointed). With experts split the table
 * knows the site's experts (topology.h): this rank owns its shard of them,
 * never another site's.
 * Must not: exchange anything between learners (reduce.c, mix.c), decide
 * what the values mean (outer.c), or touch backend memory except through
 * its verbs.
 */
#ifndef ISTHMUS_SHARD_H
#define ISTHMUS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "payload.h"
#include "plan.h"
#include "topology.h"

/* A staging slot: what one exchange in flight needs. */
typedef struct {
    float *values;        /* (rows, size): per-site sums, or mine then theirs */
    float *gather;        /* (gather_rows, size), or NULL */
    unsigned char *enc;   /* (enc_bytes) my encoded chunks */
    unsigned char *send, *recv; /* peers' frames */
    int user;             /* fragment holding it, -1 free, -2 retired (MPI may still write it) */
} Slot;

typedef struct {
    Slot *slots;
    int n;
    size_t size, rows, gather_rows, enc_bytes, send_bytes, recv_bytes; /* per slot */
} StagePool;

/* One fragment as this rank holds it. */
typedef struct {
    Owned own;
    size_t *held_off, *held_len; /* local runs of every chunk of the fragment this rank holds */
    int n_held;
    size_t *dense_off, *dense_len; /* runs of every dense chunk of the fragment, canonical order */
    int *dense_owner;          /* their owners' ranks in the learner */
    int n_dense;
    size_t *own_off, *own_len; /* runs of my owned chunks, in the packed (own) order */
    float *residual;           /* (own.size) error feedback of the payloads I encode, or NULL */
    Slot *slot;                /* staging while in flight or holding a result */
    int has_result;            /* the slot holds a finished exchange's result */
    int slot_stuck;            /* a message into the slot could not be cancelled (lost site): renew it */
} ShardFragment;

typedef struct {
    const Topology *topo;
    const Model *model;
    ChunkTable table;
    int fragments;
    ShardFragment *frag;
    size_t *owned_pos;         /* (n_chunks) offset of an owned chunk in its fragment's packed layout, else SIZE_MAX */
    size_t *run_pos;           /* (n_chunks) offset of an owned chunk in the optimiser's packed runs, else SIZE_MAX */
    size_t *run_off, *run_len; /* (n_runs) the owned chunks as runs of the params, ascending, adjacent ones merged */
    int n_runs;
    PayloadCodec codec;
    StagePool pool;            /* allocated at the first exchange, once every plan said what it needs */
    int slots;                 /* exchanges in flight at once (shard_set_slots) */
    size_t result_row;         /* the row of a slot's values that holds a finished exchange's result */
    uint64_t exchanges;        /* exchanges started by this rank (site or pair), numbered alike everywhere */
    int max_peer_learners;     /* most other learners one finished exchange of mine waited on */
} Shard;

/* codec: the run's payload codec (payload_codec_init), copied. */
int shard_create(Shard *s, const Topology *t, const Model *m, int fragments, const PayloadCodec *codec);
/* leak: a message into the staging could not be retired (MPI may still
 * write it): the slots' buffers are left alone. */
void shard_destroy(Shard *s, int leak);

/* My owned chunks of fragment f (packed layout of outer state). */
const Owned *shard_owned(const Shard *s, int f);
/* The run's payload codec (read-only to the exchanges). */
static inline const PayloadCodec *shard_codec(const Shard *s) { return &s->codec; }
/* Local runs (offset, length) of fragment f's chunks on this rank. */
void shard_fragment_runs(const Shard *s, int f, const size_t **off, const size_t **len, int *n);
/* The chunks this rank owns as runs of the params (ascending, disjoint):
 * what its optimiser updates and keeps state for. */
void shard_owned_runs(const Shard *s, const size_t **off, const size_t **len, int *n);
/* Canonical element count (all chunks). */
size_t shard_canonical_params(const Shard *s);
/* Does this rank own chunk c inside its learner? */
int shard_owns(const Shard *s, int c);

/* My owned chunks of fragment f between the state and host staging (the
 * packed shard_owned layout). */
int shard_get(const Shard *s, Backend *be, int f, StateKind which, float *packed);
int shard_put(const Shard *s, Backend *be, int f, StateKind which, const float *packed);
/* Dense chunks of fragment f summed over the learner's ranks, in place. */
int shard_sum_dense(const Shard *s, Backend *be, int f, StateKind which);
/* Dense chunks of fragment f of the state copied from their owners to
 * every rank of the learner (after the owners updated them). */
int shard_share_dense(const Shard *s, Backend *be, int f, StateKind which);
/* Every dense chunk of the weights copied from its owner to every rank of
 * the learner: after each owner's optimiser step. */
int shard_share_params(const Shard *s, Backend *be);
/* Only the learner part of a gradient reduction: dense gradients summed
 * over the learner's ranks (the outer modes train each learner alone). */
int shard_learner_sum(const Shard *s, Backend *be);

/* Staging. How many exchanges may be in flight at once (default 1). */
void shard_set_slots(Shard *s, int slots);
/* An exchange plan's needs (before the first shard_stage; an error after): frame bytes,
 * and the rows of values per slot, the row that ends as the result, and
 * the rows of a site gather (0: none). */
int shard_stage_need(Shard *s, size_t send_bytes, size_t recv_bytes);
int shard_stage_rows(Shard *s, size_t rows, size_t result_row, size_t gather_rows);
/* A slot for fragment f (NULL, with the error set, when every slot is
 * taken); the fragment holds it until shard_release. */
Slot *shard_stage(Shard *s, int f);
/* The slot fragment f holds, or NULL. */
Slot *shard_slot(const Shard *s, int f);
/* Values per row of a slot. */
size_t shard_row_size(const Shard *s);
/* Fragment f's exchange finished: its slot holds the result. */
void shard_set_result(Shard *s, int f);
/* The result a finished fragment still holds (NULL: none). */
float *shard_result(const Shard *s, int f);
/* Resume: take a slot for fragment f as if it had finished; returns where
 * its result goes. */
float *shard_hold(Shard *s, int f);
/* A message into f's slot could not be cancelled: the slot gets new
 * buffers at its release. */
void shard_mark_stuck(Shard *s, int f);
void shard_release(Shard *s, int f);

/* Error feedback. Residuals for every fragment (zeros), where this rank
 * encodes payloads with a lossy codec and error feedback on; idempotent. */
int shard_alloc_residuals(Shard *s);
/* Residuals of fragment f (packed, shard_owned layout), or NULL. */
float *shard_residual(const Shard *s, int f);
/* Chunk (tensor, layer, expert) of the residuals, NULL when not mine. */
float *shard_residual_at(const Shard *s, int tensor, int layer, int expert);
/* Every residual back to zero (a fresh start, or before a load). */
void shard_zero_residuals(Shard *s);
/* Has this rank error-feedback state? */
int shard_has_residual(const Shard *s);
/* Does any rank of this run keep error feedback (a lossy codec between
 * several sites)? The same answer on every rank. */
int shard_any_residual(const Shard *s);

/* The exchange count: the next exchange's number, and a checkpoint's. */
uint64_t shard_next_exchange(Shard *s);
void shard_restore_exchanges(Shard *s, uint64_t exchanges);
/* An exchange of mine waited on n other learners (the traffic summary). */
void shard_waited_on(Shard *s, int n);

#endif
