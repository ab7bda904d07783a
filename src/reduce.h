/* reduce.h — reductions over all learners of all sites: the gradient sum of
 * `sync` mode and the pseudo-gradient average of the DiLoCo modes
 * (reduce.c); butterfly mixing between two learners (mix.c); the gradient
 * norm and replica fingerprints (norms.c).
 *
 * Owns: the reducer — per fragment my owned chunks (plan.h), the site
 * exchange's peers, its staging slot while in flight, the error-feedback
 * state of the owned chunks — and the agreement on which sites' payloads
 * are applied. Values are host staging packed in the owned layout; the
 * backend's state is reached only through its verbs (get/put of the owned
 * runs, sum_runs and share_runs of the dense runs).
 *
 * A reduction of fragment f runs in two halves so that the wide-area part
 * can overlap with training:
 *   start   (1) gradients only: dense chunks summed inside the learner;
 *           (2) every rank packs the chunks it owns; the learners of a site
 *               sum them in learner order (site network, blocking);
 *           (3) the first learner of each site encodes its site sum chunk
 *               by chunk (codec + error feedback; its own contribution is
 *               the decoded value, exactly what the other sites will
 *               decode) and posts non-blocking sends of the chunks each
 *               rank of every other site's first learner owns, and the
 *               matching receives (canonical-chunk plans: layouts may
 *               differ between sites);
 *   finish  (4) completes the link against the deadline, checks every
 *               payload (checksum, size, finite values), and agrees —
 *               inside the site, then across sites with a small verdict
 *               message — on the set of sites whose payloads every site
 *               accepted; the rejected ones are left out and the rest
 *               re-weighted;
 *           (5) sums the accepted sites in site order, broadcasts to the
 *               site's other learners and shares dense chunks inside the
 *               learner.
 * Every rank of every learner ends with the same values for the chunks it
 * holds. Callers pre-scale their values by their token share.
 * Must not: apply updates (optim.c, outer.c) or compute gradients.
 */
#ifndef ISTHMUS_REDUCE_H
#define ISTHMUS_REDUCE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "codec.h"
#include "link.h"
#include "metrics.h"
#include "model.h"
#include "plan.h"
#include "topology.h"

/* One fragment: my owned chunks, the site exchange's peers, and the
 * exchange in flight. */
typedef struct {
    Owned own;
    size_t *held_off, *held_len; /* local runs of every chunk of the fragment this rank holds */
    int n_held;
    size_t *dense_off, *dense_len; /* runs of every dense chunk of the fragment, canonical order */
    int *dense_owner;          /* their owners' ranks in the learner */
    int n_dense;
    size_t *own_off, *own_len; /* runs of my owned chunks, in the packed (own) order */
    size_t *raw_off;           /* byte offsets of owned chunks as raw float32 (uncompressed payloads) */
    PeerSet site;              /* ranks of the other sites' first learners (first learner of a site) */
    float *residual;           /* (own.size) error feedback of the site sums, first learner of a site */
    Slot *slot;                /* staging while in flight or holding a result */
    int in_flight, has_result, polls, arrived_poll, sends_deferred, sent_poll;
    int slot_stuck;            /* a message into the slot could not be cancelled (lost site): renew it */
    uint64_t exchange;
    double err2, norm2;
    double started_s;          /* now_s() when the exchange started */
    int late_warned;           /* its lateness was logged */
    int paced;                 /* its sends are posted across the window */
    int window_polls_seen;     /* polls since the start on every rank of the site (polls: the leaders' own) */
    /* the site's verdict: agreed and posted (at the finish, or one poll
     * before it when everything had arrived), with what it was made of */
    int verdict_posted;
    unsigned char verdict[3 * CONFIG_MAX_SITES];
    unsigned char early_ok[CONFIG_MAX_SITES + 1], early_alive[CONFIG_MAX_SITES];
    char early_rejected[512];
} FragPlan;

typedef struct {
    int fragment;
    uint64_t exchange;
    double payload_bytes;      /* encoded bytes this site sent (all its ranks) */
    double codec_rel_error;    /* ||sent - decoded|| / ||sent|| over this site */
    int accepted_sites, n_sites;
    char rejected[512];        /* "site: reason; ..." */
    int arrived_poll;          /* polls (inner steps) until everything had arrived; -1: at finish */
    int partner, crosses;      /* butterfly: partner learner, in another site */
    Codec codec;               /* butterfly: the payloads' codec (none in the final exact rounds) */
    int sent_poll;             /* polls before this rank posted its sends (0: at start; test hook) */
} ReduceReport;

/* A payload's sums over ranks for its report (doubles only: reduced as an
 * array): encoded bytes sent, and the codec's error and signal energies. */
typedef struct {
    double bytes, err2, norm2;
} PayloadSums;
#define PAYLOAD_SUMS (sizeof(PayloadSums) / sizeof(double))

enum { REDUCE_GRADS, REDUCE_REPLICATED };

/* A butterfly exchange of one fragment with one partner learner. */
typedef struct {
    int partner, fragment, crosses;  /* partner learner id; in another site? */
    Codec codec;                     /* the reducer's, or none for exact averaging */
    PeerSet peers;                   /* the partner's ranks whose chunks overlap mine */
    double w_me, w_them;
    int in_flight, polls, arrived_poll;
    uint64_t exchange;
    double err2, norm2;
} PairPlan;

typedef struct {
    const Topology *topo;
    const Model *model;
    ChunkTable table;
    size_t *owned_pos;         /* (n_chunks) offset of an owned chunk in its fragment's packed layout, else SIZE_MAX */
    size_t *run_pos;           /* (n_chunks) offset of an owned chunk in the optimiser's packed runs, else SIZE_MAX */
    size_t *run_off, *run_len; /* (n_runs) the owned chunks as runs of the params, ascending, adjacent ones merged */
    int n_runs;
    int fragments;
    FragPlan *frag;
    PairPlan *pairs;           /* butterfly: (fragments, pair_bits, 2) plans (lossy, exact) */
    int pair_bits;             /* k: learners = 2^k */
    float **mix_residual;      /* (fragments) error feedback of butterfly payloads */
    StagePool pool;            /* staging of the exchanges in flight */
    int slots;                 /* exchanges in flight at once (reduce_set_slots) */
    float *scratch;            /* (largest owned chunk) decoded values while encoding */
    Backend *encoder;          /* encodes payloads (reduce_encode_on), NULL: the host codec */
    Codec codec;
    CodecParams cp;            /* the codec's parameters (block, topk_k, topk_bits, decay) */
    int error_feedback;
    int sender_mean;           /* topk: each index averaged over the sites that sent it */
    int leader;                /* my learner is the first of its site */
    MPI_Comm world, site_peers;
    Link link;
    double *site_weight;       /* token share of each site */
    uint64_t exchanges;
    int max_peer_learners;     /* most other learners one finished exchange of mine waited on */
    /* the stop vote between sites rides on the verdicts (run.c sets the
     * request, the same on every rank of a site; see docs/architecture.md) */
    int stop_request;          /* this site asks to stop */
    int stop_agreed;           /* a finished site exchange carried a stop request */
    unsigned char stop_sites[CONFIG_MAX_SITES]; /* which sites asked (site exchanges; not butterfly) */
    long stop_round;           /* butterfly: earliest round in which a learner asked to stop, -1 none */
    /* a site exchange's window: the polls (inner steps) before its result
     * is applied (streaming: overlap); 0 when it is awaited at once. With
     * pace on, its pieces are posted across the window; either way an
     * exchange that will not arrive in it is logged before it stalls */
    int window_polls;
    int pace;
    int pace_ok;               /* the link kept up with this rank's last exchange (reduce_finish_staged) */
    int log;                   /* print and record warnings (the trainer's logging rank) */
    Metrics *metrics;          /* where they are recorded; NULL: none */
    long late_exchanges;       /* exchanges found late before their window ended */
} Reducer;

int reducer_create(Reducer *r, const Topology *t, const Model *m, int fragments, Codec codec,
                   CodecParams cp, int error_feedback, double timeout_s, MPI_Comm world);
void reducer_destroy(Reducer *r);
/* How many exchanges may be in flight at once (default 1); the staging pool
 * is allocated for that many at the first exchange. */
void reduce_set_slots(Reducer *r, int slots);
/* Encode payloads with the backend's encode_ef where it has one (the same
 * bytes as the host codec; the CUDA backend's GPU), else on the host. */
void reduce_encode_on(Reducer *r, Backend *be);
/* Resume: exchanges numbered on from a checkpoint's count. */
void reduce_restore(Reducer *r, uint64_t exchanges);

/* My owned chunks of fragment f (packed layout of outer state). */
const Owned *reduce_owned(const Reducer *r, int f);

/* Begin reducing fragment f of the backend's state `which`. REDUCE_GRADS
 * sums the dense chunks inside the learner first; REDUCE_REPLICATED takes
 * them as they are (every rank of a learner holds the same dense values).
 * The caller must not change f's chunks of the state until reduce_finish. */
int reduce_start(Reducer *r, Backend *be, int f, StateKind which, int kind);
/* The same from packed values: reduce_stage takes a staging slot and
 * returns where to put my owned chunks of f (reduce_owned layout);
 * reduce_start_staged begins the exchange. */
float *reduce_stage(Reducer *r, int f);
int reduce_start_staged(Reducer *r, int f);
/* Only the learner part of a gradient reduction: dense gradients summed
 * over the learner's ranks (the outer modes train each learner alone). */
int reduce_learner_sum(const Reducer *r, Backend *be);
/* Progress every exchange in flight (call once per inner step). */
int reduce_poll(Reducer *r);
/* Test the messages of the site exchanges in flight, nothing else (MPI
 * moves them on the way): what the backend calls between layers with
 * [outer] progress = poll. No MPI call when nothing is in flight. */
void reduce_progress(void *reducer);
/* Finish fragment f: the reduced values of every chunk of f this rank holds
 * are written into the state. */
int reduce_finish(Reducer *r, Backend *be, int f, StateKind which, ReduceReport *rep);
/* Finish fragment f keeping the result (my owned chunks, packed) in its
 * slot until reduce_release; *result points at it. */
int reduce_finish_staged(Reducer *r, int f, ReduceReport *rep, float **result);
/* The result a finished fragment still holds (NULL: none). */
float *reduce_result(const Reducer *r, int f);
/* Resume: take a slot for fragment f as if it had finished; returns where
 * its result goes. */
float *reduce_hold(Reducer *r, int f);
void reduce_release(Reducer *r, int f);
/* Internal to reduce.c and mix.c: a free staging slot for fragment f. */
Slot *reduce_take_slot(Reducer *r, int f);
/* Abandon the posted messages of peers on lost sites (federated launch);
 * any that MPI would not cancel marks the fragment's slot for renewal. */
void reduce_abandon_lost(Reducer *r, int f, PeerSet *ps);
/* codec_encode_ef of one chunk, where reduce_encode_on said. */
int reduce_encode_chunk(const Reducer *r, const float *x, float *residual, size_t n, unsigned char *out,
                        float *decoded, double *err2, double *norm2);
/* Dense chunks of fragment f of the state copied from their owners to
 * every rank of the learner (after the owners updated them). */
int reduce_share_dense(const Reducer *r, Backend *be, int f, StateKind which);
/* My owned chunks of fragment f between the state and host staging (the
 * packed reduce_owned layout). */
int reduce_get_owned(const Reducer *r, Backend *be, int f, StateKind which, float *packed);
int reduce_put_owned(const Reducer *r, Backend *be, int f, StateKind which, const float *packed);

/* Every dense chunk of the weights copied from its owner to every rank of
 * the learner: after each owner's optimiser step. */
int reduce_share_params(const Reducer *r, Backend *be);
/* The chunks this rank owns as runs of the params (ascending, disjoint):
 * what its optimiser updates and keeps state for. */
void reduce_owned_runs(const Reducer *r, const size_t **off, const size_t **len, int *n);

/* Local runs (offset, length) of fragment f's chunks on this rank. */
void reduce_fragment_runs(const Reducer *r, int f, const size_t **off, const size_t **len, int *n);
/* Canonical element count (all chunks). */
size_t reduce_canonical_params(const Reducer *r);

/* Does this rank own chunk c inside its learner? */
int reduce_owns(const Reducer *r, int c);
/* Error-feedback residuals of fragment f (packed, reduce_owned layout), or
 * NULL: the butterfly's (every learner) or the site sums' (first learner of
 * a site). */
float *reduce_residual(const Reducer *r, int f);
/* Chunk (tensor, layer, expert) of the residuals, NULL when not mine. */
float *reduce_residual_at(const Reducer *r, int tensor, int layer, int expert);
/* Every residual back to zero (a fresh start, or before a load). */
void reduce_zero_residuals(Reducer *r);
/* Has this rank error-feedback state (first learner of a site, codec on)? */
int reduce_has_residual(const Reducer *r);
/* Does any rank of this run keep outer-mode / sync error feedback (a lossy
 * codec between several sites)? The same answer on every rank. */
int reduce_any_residual(const Reducer *r);

/* Butterfly mixing of fragment f with learner `partner` (point-to-point
 * between the two learners' ranks on canonical chunk plans, codec and error
 * feedback as for the outer modes). start posts the exchange of `values`
 * (my owned chunks of f, packed in the reduce_owned layout); finish writes the pair's weighted average
 *   (w_lo*v_lo + w_hi*v_hi) / (w_lo + w_hi)   (lower learner id first)
 * of the decoded values into `values`, identically on both learners, or
 * leaves them unchanged on both when either side rejected a payload. `exact`:
 * send the values uncompressed and without error feedback (the final
 * exact averaging: learners holding equal values send equal payloads and
 * the result is the mean of the values themselves, not of a codec's
 * rendering); otherwise the reducer's codec with error feedback. */
/* Prepare butterfly plans and error-feedback state (before any mix_start). */
int reduce_enable_mixing(Reducer *r);
int mix_start(Reducer *r, int f, int partner, const float *values, double w_me, double w_partner, int exact);
int mix_finish(Reducer *r, int f, float *values, ReduceReport *rep, double *pair_distance);
/* The same keeping the result: *mixed (packed, reduce_owned layout) holds
 * the pair's average until reduce_release; when a payload was rejected
 * (*accepted 0) it holds what this learner encoded (the decoded values, not
 * the values themselves: the caller keeps its own, outer.c its sent copy). */
int mix_finish_staged(Reducer *r, int f, ReduceReport *rep, double *pair_distance, float **mixed, int *accepted);
/* Progress the butterfly exchanges in flight (reduce_poll calls it). */
int mix_poll(Reducer *r);

/* Squared L2 norm of the learner's full gradient, the same number on every
 * rank of every learner whatever the sharding. */
int grad_norm_sq_learner(Backend *be, MPI_Comm learner_comm, double *out);
/* Where chunk (tensor, layer, expert) of a model-shaped state lives on this
 * rank, or NULL when another rank of the learner is responsible for it. */
typedef const float *(*ChunkView)(void *ctx, int tensor, int layer, int expert);
/* 64-bit hash of a learner's canonical state, each chunk taken from the one
 * rank `view` names; equal on learners holding identical values. */
int model_fingerprint(Reducer *r, ChunkView view, void *ctx, MPI_Comm learner_comm, uint64_t *out);

#endif
