/* sync.h — `sync` mode: every step, gradients summed over all learners of
 * all sites, so every learner applies the same update (the baseline the
 * low-communication modes are compared with).
 *
 * Owns: the reduction plan and the byte accounting of the gradient exchange.
 * Each rank "owns" a part of the model inside its learner: a 1/G slice of
 * the dense (replicated) parameters and its own experts. The reduction runs
 *   1. inside the learner: reduce-scatter of the dense gradient to owners;
 *   2. inside the site: owners with the same position in the site's learners
 *      exchange their parts and sum them in learner order;
 *   3. across sites: the first learner of each site exchanges its site sums
 *      with the first learner of every other site, on canonical element
 *      ranges (the overlap of each pair of owned parts — learners of
 *      different sites may shard experts differently) and sums in site order;
 *   4. back down: broadcast to the site's other learners, all-gather of the
 *      dense slices inside the learner.
 * Every learner ends with bit-identical gradients, whatever its layout.
 * Callers pre-scale each rank's gradients by its share of the step's tokens,
 * so the sum is the token-weighted average over learners.
 * Must not: compute gradients or apply updates.
 */
#ifndef ISTHMUS_SYNC_H
#define ISTHMUS_SYNC_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "topology.h"

typedef struct {
    size_t local, remote, len; /* offsets in my buffer and in the peer's buffer */
} Segment;

typedef struct {
    int world_rank;            /* the peer */
    int site;                  /* its site */
    Segment *segs;
    int n_segs;
    size_t elems;
} PeerPlan;

typedef struct {
    const Topology *topo;
    MPI_Comm world;
    MPI_Comm site_peers;       /* same site, same learner_rank: one rank per learner of the site */
    int *dense_counts, *dense_displs; /* (G) dense slice of each learner rank */
    size_t dense_lo, dense_hi; /* my dense slice */
    size_t owned;              /* elements I own: dense slice + my expert region */
    int leader;                /* my learner is the first of its site */
    PeerPlan *peers;           /* other sites' leader-learner ranks whose parts overlap mine */
    int n_peers;
    float *staging;            /* (n_sites * owned) per-site sums of my owned part */
    float *packed;             /* (owned) */
    float *sendbuf, *recvbuf;  /* packed peer segments */
    size_t peer_elems_total;
    double inter_site_bytes;   /* sent + received across sites, cumulative */
    double intra_site_bytes;
} SyncPlan;

int sync_plan_create(SyncPlan *p, const Topology *t, const Model *m, MPI_Comm world);
void sync_plan_destroy(SyncPlan *p);

/* Sum m->grads over every learner (see the header comment). Collective over
 * the world. */
int sync_reduce_grads(SyncPlan *p, Model *m);

/* Squared L2 norm of the full (canonical) gradient of this learner, the same
 * number on every rank of every learner whatever the sharding: dense part
 * summed by every rank over the whole dense prefix, expert part gathered per
 * (tensor, layer, expert) block and summed in canonical order. */
int grad_norm_sq_learner(const Model *m, MPI_Comm learner_comm, double *out);

/* A 64-bit hash of the learner's canonical parameters (bit-exact, the same
 * whatever the sharding): learners that hold identical models have equal
 * fingerprints. Collective over the learner. */
int model_fingerprint(const Model *m, MPI_Comm learner_comm, uint64_t *out);

#endif
