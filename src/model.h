/* model.h — the parameter table and the flat parameter buffer.
 *
 * Owns: the list of model tensors (their stable names and canonical shapes),
 * where each lives in this rank's flat buffer, per-tensor flags, and
 * initialisation; the model's sizes under the compute code's short names
 * (ModelDims, filled by model_dims only). Optimisers, reductions and checkpoints are loops over
 * model->tensors; nothing else hard-codes a tensor's position.
 * Must not: compute activations (layers.c, transformer.c) or do I/O.
 *
 * Expert tensors (w_gate, w_up, w_down) are sharded over the ranks of a
 * learner: this rank holds experts [expert_begin, expert_begin+experts_local).
 * Every other tensor is replicated (the router too: all E columns).
 * Also owns how the MoE layers route when the learner holds only some of
 * the experts (split experts, issue 56): the policy and the learner's first
 * expert (route, route_begin; model_set_route), and what they mean for one
 * layer's routing (RouteSpan: model_route_span), which both backends read.
 */
#ifndef ISTHMUS_MODEL_H
#define ISTHMUS_MODEL_H

#include <stddef.h>

#include "config.h"

enum {
    PARAM_DECAY = 1u << 0,  /* AdamW weight decay applies (matrices only) */
    PARAM_EXPERT = 1u << 1, /* axis 1 is the expert axis, sharded in a learner */
    PARAM_LAYERED = 1u << 2, /* axis 0 is the layer axis */
    PARAM_MATRIX = 1u << 3,  /* each chunk is a matrix (the last two axes) that a matrix optimiser
                              * (shampoo, muon) preconditions; the others take AdamW */
    PARAM_AT_END = 1u << 4   /* not layered, but used after the last layer: it travels in that
                              * layer's streaming fragment (unlayered others: layer 0's) */
};

/* Storage order: every replicated ("dense") tensor first, then the expert
 * tensors, so that the dense parameters are one contiguous prefix of the
 * flat buffer, identical on every rank: [0, dense_end). */
typedef enum {
    T_EMBED, T_ATTN_NORM, T_WQ, T_WK, T_WV, T_WO, T_MOE_NORM, T_ROUTER, T_FINAL_NORM,
    T_W_GATE, T_W_UP, T_W_DOWN, N_TENSORS
} TensorId;

#define TENSOR_MAX_DIMS 4
#define MODEL_INIT_STD 0.02

/* The model's sizes under the short names the compute code uses: L
 * layers, D width, H heads, E experts, K = top_k, F expert width, V
 * vocabulary. One struct that both backends' activations
 * (cpu/transformer.h, cuda/transformer.h) and the decoder hold, filled
 * here only. */
typedef struct {
    int L, D, H, E, K, F, V;
} ModelDims;

static inline ModelDims model_dims(const ModelConfig *c)
{
    ModelDims d = {c->layers, c->dim, c->heads, c->experts, c->top_k, c->ffn, c->vocab};
    return d;
}

typedef struct {
    const char *name;                 /* dataset name under /model */
    int ndim;
    size_t shape[TENSOR_MAX_DIMS];    /* canonical (all experts) */
    size_t local[TENSOR_MAX_DIMS];    /* on this rank */
    size_t numel;                     /* local element count */
    size_t chunk_numel;               /* one canonical chunk: one layer (and one expert) */
    size_t offset;                    /* into the flat buffer */
    unsigned flags;
    double init_std;                  /* 0: initialise to 1 (norm gains) */
} Tensor;

/* How the MoE layers route. A learner of G ranks holds the experts
 * [route_begin, route_begin + Es), Es = G * experts_local, rank j the
 * slice [route_begin + j * experts_local, ...) (expert_begin); the router
 * keeps all E columns either way.
 *  - ROUTE_ALL: the learner holds every expert (route_begin 0, Es = E):
 *    softmax and top-k over all E. The default; what every learner did
 *    before split experts.
 *  - ROUTE_LOCAL: the router restricted to the learner's experts: softmax
 *    and top-k over the logits of [route_begin, route_begin + Es) only (the
 *    others' probability 0, no gradient into their router columns); the
 *    balance and z losses and the capacity as for a model of Es experts.
 *    Exactly a model of Es experts whose router is that column slice.
 *  - ROUTE_DROP: the full router (softmax, top-k, balance and z losses and
 *    capacity over all E); a copy routed to an expert the learner does not
 *    hold is dropped: never sent, its output zero, its gate weight lost
 *    (not renormalised), no gradient through it (FoMoE's skipping).
 *    ForwardStats.remote_dropped counts those copies. */
typedef enum { ROUTE_ALL, ROUTE_LOCAL, ROUTE_DROP } RoutePolicy;

typedef struct {
    ModelConfig cfg;
    int expert_begin, experts_local;
    RoutePolicy route;                /* ROUTE_ALL unless model_set_route */
    int route_begin;                  /* the learner's first expert (0 unless model_set_route) */
    Tensor tensors[N_TENSORS];
    size_t n_params;                  /* local */
    size_t dense_end;                 /* replicated tensors occupy [0, dense_end) */
    float *params;                    /* (n_params) */
    float *grads;                     /* (n_params) */
} Model;

/* Build the table for a rank owning `experts_local` experts starting at
 * `expert_begin`, allocate params and grads (grads zeroed). Routing:
 * ROUTE_ALL, route_begin 0. */
int model_create(Model *m, const ModelConfig *cfg, int expert_begin, int experts_local);
/* The table alone (names, shapes, offsets), no buffers: for checking files. */
void model_describe(Model *m, const ModelConfig *cfg, int expert_begin, int experts_local);
void model_destroy(Model *m);

/* The learner's routing: `policy` with its experts starting at
 * learner_begin (<= expert_begin, this rank's slice a whole number of
 * experts_local past it). ROUTE_ALL needs learner_begin 0. Bad values: a
 * one-line error (ISTH_EINPUT), the model unchanged. */
int model_set_route(Model *m, RoutePolicy policy, int learner_begin);
/* Does the routing fit a learner of G ranks of which this is `rank`: the
 * learner's Es = G * experts_local experts inside [0, E), this rank's
 * slice where rank j's is, ROUTE_ALL holding all E, ROUTE_LOCAL at least
 * top_k? The forwards check it (a one-line error, ISTH_ERUNTIME). */
int model_route_check(const Model *m, int G, int rank);

/* One MoE layer's routing for a learner of G ranks, from the policy:
 * Es the learner's experts; Er the width of the router's probabilities
 * (and of its logits, top-k, counts, balance loss and capacity): Es under
 * ROUTE_LOCAL, else E; col the router's first column read (route_begin
 * under ROUTE_LOCAL, else 0); off: a chosen expert c is the learner's
 * expert c - off when that lies in [0, Es) (route_begin under ROUTE_DROP,
 * else 0), and is held elsewhere otherwise (route_plan.h). */
typedef struct {
    int Es, Er, col, off;
} RouteSpan;

static inline RouteSpan model_route_span(const Model *m, int G)
{
    const int E = m->cfg.experts, Es = G * m->experts_local, b = m->route_begin;
    RouteSpan s = {Es, E, 0, 0};
    if (m->route == ROUTE_LOCAL) {
        s.Er = Es;
        s.col = b;
    } else if (m->route == ROUTE_DROP) {
        s.off = b;
    }
    return s;
}

/* N(0, std) with std from the table; norm gains 1. Values depend only on
 * (init_seed, tensor, canonical element index), not on the sharding. */
void model_init(Model *m);
/* The initial values model_init gives chunk (tensor T, layer, expert e) of
 * an expert tensor, whichever rank holds it (they depend on the global
 * ids only): chunk_numel values into out. Split experts' copies start
 * from them at every site. */
void model_init_expert_chunk(const Model *m, TensorId T, int layer, int e, float *out);

/* The first parameter after the tied embedding (the first tensor): the
 * GPU's bf16 products read [model_after_embed, n_params), never the
 * embedding (the encoder and the head read it in fp32). */
static inline size_t model_after_embed(const Model *m) { return m->tensors[T_ATTN_NORM].offset; }

/* Pointer to layer `l` of a layered tensor (or the whole tensor). */
float *model_param(const Model *m, TensorId t, int layer);
float *model_grad(const Model *m, TensorId t, int layer);
/* Local expert `e` of layer `l` of an expert tensor (one chunk). */
float *model_expert_param(const Model *m, TensorId t, int layer, int e);
float *model_expert_grad(const Model *m, TensorId t, int layer, int e);

/* Canonical element count of a tensor (all experts). */
size_t tensor_canonical_numel(const Tensor *t);

/* Matrix parameters touched per token (attention, router, top_k experts,
 * output head): the "N" of the 6N FLOP estimate. */
double model_active_matrix_params(const ModelConfig *cfg);
/* Total canonical parameters. */
double model_total_params(const ModelConfig *cfg);

#endif
