/* backend.h — the one seam between the training loop and the code that
 * computes: a table of verbs, like nccl-tests' function table. The CPU
 * backend (src/cpu/) is the first implementation and the specification;
 * the CUDA backend (cuda/) mirrors it.
 *
 * Owns: the contract of every verb, and which memory is the backend's: the
 * training state (weights, grads, inner optimiser state) and the
 * activations live in the backend, laid out like the model table
 * (model.h). Nothing outside a backend allocates, frees or computes on that
 * memory except through these verbs.
 * Must not: know about sites, other learners or the link (the trainer and
 * the exchange modules do: outer, shard, payload, reduce, mix; its own
 * learner it knows only as the coll it is given, for expert dispatch and
 * the state's learner sums), or read data and files.
 *
 * Host staging: outer algorithms, reductions, codecs and checkpoints work
 * on host buffers of the chunks they handle, filled and written back with
 * get and put (runs of a state, packed one after the other); collectives
 * on the state inside the learner (dense sums, owners sharing their
 * chunks) are verbs too, so a device backend does them where the state
 * lives (NCCL for CUDA) and nobody outside the backend holds a pointer into
 * its memory.
 */
#ifndef ISTHMUS_BACKEND_H
#define ISTHMUS_BACKEND_H

#include <stddef.h>

#include "codec.h"
#include "coll.h"
#include "config.h"
#include "model.h"

/* What one forward pass reports. */
typedef struct {
    double ce_sum;     /* sum of cross-entropy (nats) over counted targets */
    size_t n_targets;  /* targets >= 0 */
    double aux_loss;   /* sum over layers of the load-balancing loss */
    double z_loss;     /* sum over layers of the router z-loss */
    long dropped;      /* routed copies skipped for capacity, all layers */
    long remote_dropped; /* routed copies to experts the learner does not hold (ROUTE_DROP: dropped,
                          * model.h), all layers; training or not */
} ForwardStats;

/* The state a backend holds: params and grads laid out like the model
 * table; the inner optimiser's state packed by runs (optimizer_shard): the
 * AdamW moments (every optimiser but sgd), and with shampoo its
 * statistics and inverse roots (src/cpu/precond.h). */
typedef enum {
    STATE_PARAMS, STATE_GRADS, STATE_ADAM_M, STATE_ADAM_V,
    STATE_SHAMPOO_L, STATE_SHAMPOO_R, STATE_SHAMPOO_LROOT, STATE_SHAMPOO_RROOT, STATE_KINDS
} StateKind;
/* Is the state packed by the optimiser's runs (not laid out like the table)? */
static inline int state_is_packed(StateKind k) { return k >= STATE_ADAM_M && k < STATE_KINDS; }

typedef struct Backend Backend;

typedef struct {
    const char *name;
    void (*destroy)(Backend *b);
    /* One micro-batch: forward with capacity and auxiliary losses, then
     * backward accumulating (+=) into the grads the gradient of
     * loss_scale * (ce_sum / n_targets + aux + z). Learner collective. */
    int (*train_micro)(Backend *b, const int *tokens, const int *targets, int B, int T, float loss_scale,
                       ForwardStats *st);
    /* Forward without capacity limits: per-position cross-entropy into
     * losses (B*T, host). Learner collective. */
    int (*score)(Backend *b, const int *tokens, const int *targets, int B, int T, float *losses);
    /* Starts a step. The parameters hold still from here to the step's
     * last train_micro (the CUDA backend's bf16 path rounds its copy of
     * them once, at the first train_micro after this, or after a verb that
     * wrote them). */
    int (*zero_grads)(Backend *b);
    /* *out = sum of squares of `which` over the tensors whose flags & mask
     * == want (fixed chunking, summed in order: deterministic). */
    int (*sumsq)(Backend *b, StateKind which, unsigned mask, unsigned want, double *out);
    /* Sums of squares of n runs (offset, length) of `which`, in order. */
    int (*run_sumsq)(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, double *out);
    int (*scale_grads)(Backend *b, float factor);
    /* The runs (offset, length into the model table; ascending, disjoint)
     * this rank's inner optimiser updates and keeps state for: its share
     * of the dense chunks and its experts (ZeRO stage 1; the trainer then
     * shares the dense weights inside the learner). The moments' views
     * (STATE_ADAM_M, STATE_ADAM_V) hold the runs packed, one after the
     * other, zeroed here. Until called: one run, every parameter. */
    int (*optimizer_shard)(Backend *b, const size_t *off, const size_t *len, int n);
    /* The inner optimiser's update of the runs (grads read, not changed). */
    int (*optimizer_step)(Backend *b, double lr);
    /* Host staging <-> the state: n runs (offset, length) of `which`,
     * packed one after the other in `host`. Offsets index the model table
     * for params and grads, the packed moments for ADAM_M and ADAM_V. */
    int (*get)(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, float *host);
    int (*put)(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, const float *host);
    /* Learner collectives on params or grads (every rank of the learner,
     * the same runs in the same order): sum_runs adds each run over the
     * learner in place; share_runs copies run i from learner rank owner[i]
     * to every rank. Runs go in batches of whole runs (a run larger than
     * the batch alone), so the sums are the same on every rank and run. */
    int (*sum_runs)(Backend *b, StateKind which, const size_t *off, const size_t *len, int n);
    int (*share_runs)(Backend *b, StateKind which, const size_t *off, const size_t *len, const int *owner, int n);
    /* dst = src over the whole table (params and grads). */
    int (*copy_state)(Backend *b, StateKind dst, StateKind src);
    /* Optional (NULL: payload.c encodes on the host): codec.h's
     * codec_encode_ef on host buffers, computed where the backend computes
     * (the CUDA backend: kernels on its copy stream), producing the host
     * codec's bytes, decoded values and residual bit for bit. Called for
     * the element-wise codecs (none, bf16, int8, fp4) with plain feedback
     * (decay 1) only: topk and a decaying residual are encoded on the host. */
    int (*encode_ef)(Backend *b, Codec c, const float *x, float *residual, size_t n, int block, unsigned char *out,
                     float *decoded, double *err2, double *norm2);
    /* Optional (NULL: not offered): call fn(ctx) between the layers of
     * train_micro, on the calling thread, outside any collective; fn NULL
     * stops it. The trainer's way to keep the link's messages moving. */
    void (*set_progress)(Backend *b, void (*fn)(void *ctx), void *ctx);
    /* Forward of one sequence of T tokens without capacity limits; probs
     * (V, host) = the distribution of the token after the last (what
     * train.sample_every draws from). Learner collective. */
    int (*predict)(Backend *b, const int *tokens, int T, float *probs);
    /* Optional (NULL: not offered; the CUDA backend's, from CUDA events):
     * start != 0 starts timing the steps by phase from zero (each step then
     * waits for the device at its end); start == 0 reads the totals so far:
     * names[i], ms[i] for i < *n (<= max), in milliseconds. */
    int (*phases)(Backend *b, int start, const char **names, double *ms, int max, int *n);
    /* The MoE layers' routing from here on (model.h's RoutePolicy): this
     * learner holds the experts from learner_begin (its ranks' slices as
     * created); until called ROUTE_ALL. Every forward follows it: training,
     * score and predict. A policy that does not fit the learner
     * (model_set_route, model_route_check): a one-line error, the routing
     * unchanged. The same call on every rank of the learner. */
    int (*set_route)(Backend *b, RoutePolicy policy, int learner_begin);
} BackendOps;

/* The largest batch of a learner sum through host scratch, in floats (64
 * MiB; the CPU backend). Larger runs are summed in place. */
#define BACKEND_SUM_BATCH ((size_t)16 << 20)

struct Backend {
    const BackendOps *ops;
    Model table;        /* shapes and offsets of this rank's state (no buffers) */
    long optimizer_t;   /* inner updates applied (AdamW's bias correction); checkpointed */
    long precond_roots, precond_failures; /* shampoo: inverse roots computed; roots kept, statistics reset
                                           * and directions fallen back (precond.h); this process */
    int threads;        /* compute threads per rank (for the log) */
    void *impl;
};

void backend_destroy(Backend *b);

#endif
