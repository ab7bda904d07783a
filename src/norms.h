/* norms.h — numbers every rank of every learner agrees on whatever the
 * sharding: the learner's gradient norm, and the fingerprint of a
 * learner's state (the replica checks).
 *
 * Owns: the order in which blocks are summed or hashed (so the result does
 * not depend on the rank count).
 * Must not: change any state it reads.
 */
#ifndef ISTHMUS_NORMS_H
#define ISTHMUS_NORMS_H

#include <mpi.h>
#include <stdint.h>

#include "backend.h"
#include "plan.h"

/* Squared L2 norm of the learner's full gradient, the same number on every
 * rank of every learner whatever the sharding. */
int grad_norm_sq_learner(Backend *be, MPI_Comm learner_comm, double *out);
/* Where chunk (tensor, layer, expert) of a model-shaped state lives on this
 * rank, or NULL when another rank of the learner is responsible for it. */
typedef const float *(*ChunkView)(void *ctx, int tensor, int layer, int expert);
/* 64-bit hashes of a learner's canonical state, each chunk taken from the
 * one rank `view` names; equal on learners holding identical values: *out
 * of every chunk, *crossing of those that cross between sites (plan.h's
 * chunk_crosses: the dense part when the experts are split, else the
 * same as *out). */
int model_fingerprint(const ChunkTable *ct, ChunkView view, void *ctx, MPI_Comm learner_comm, uint64_t *out,
                      uint64_t *crossing);

#endif
