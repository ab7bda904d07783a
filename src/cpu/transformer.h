/* transformer.h — the CPU backend's whole-model forward and backward.
 *
 * Owns: the activation buffers of one micro-batch and the order in which the
 * layers of layers.c and moe.c are applied:
 *   x = embed[byte]; per layer h = x + Attn(RMSNorm(x)), x = h + MoE(RMSNorm(h));
 *   logits = RMSNorm(x) . embed^T ; cross-entropy on the next byte,
 *   plus per-layer load-balancing and z losses while training.
 * Must not: update parameters, reduce gradients across ranks, read data.
 */
#ifndef ISTHMUS_TRANSFORMER_H
#define ISTHMUS_TRANSFORMER_H

#include <stddef.h>

#include "backend.h"
#include "coll.h"
#include "model.h"
#include "moe.h"

typedef struct {
    int B, T;                 /* allocated for up to B sequences of T */
    ModelDims dims;           /* the model's sizes (model.h) */
    int G, El;                /* ranks in the learner, experts a rank holds at most (E / G: the
                               * buffers'); a model with split experts holds fewer (model.h) */
    Coll *ep;                 /* expert-parallel group (the learner) */
    int B_cur, T_cur;         /* sizes of the last forward */
    size_t N;                 /* B_cur*T_cur */
    /* saved for backward, per layer l: pointer + l * (N_max * width); Lk
     * layers of them: L, or 1 slot all layers share with RECOMPUTE_LAYER */
    float *x;                 /* (L+1,N,D) residual stream entering each layer: always every layer's */
    float *xn1, *rstd1;       /* (Lk,N,D), (Lk,N) */
    float *q, *k, *v, *ao;    /* (Lk,N,D) q,k rotated; ao = attention output */
    float *att;               /* (L,B,H,T,T); (1,B,H,T,T) when recomputed */
    Recompute recompute;      /* ATTENTION: backward computes each layer's att again; LAYER: the whole
                               * layer, from its x, before its backward */
    int Lk;                   /* layers whose activations are kept */
    float *h, *xn2, *rstd2;   /* (Lk,N,D), (Lk,N,D), (Lk,N) */
    MoeRouting *route;        /* (Lk) routing, dispatch and expert rows */
    float *xf, *rstdf;        /* (N,D), (N) final norm */
    float *probs;             /* (N,V) output softmax; (N, max(V,E)) floats, dlogits in backward */
    float *losses;            /* (N) */
    float *rope_cos, *rope_sin; /* (T, Dh/2) */
    /* backward scratch */
    float *dx, *dh, *dxn, *dq, *dk, *dv, *dao, *dtmp; /* (N,D) */
    float *dlogits;           /* (N, max(V,E)): probs' buffer (backward overwrites the probabilities) */
    float *dprobs;            /* (N,E) */
    float *send_rows;         /* (N*K,D) rows leaving this rank (x, dy) */
    float *back_rows;         /* (N*K,D) rows coming back (dx) */
    float *att_scratch;       /* (threads,T,T) */
    float *router_logits;     /* (N,E) */
    int *counts;              /* (E) this rank's histogram, then 4E of the plan's scratch */
    int *counts_all;          /* (G,E) the learner's histograms: the dispatch plan's input */
    /* owner-side scratch, grown on demand */
    float *recv_rows, *recv_rows2, *row_tmp, *row_tmp2; /* (n_recv,D) each */
    float *ffn_scratch;                                 /* (3*n_recv*F) */
    size_t recv_caps[4], ffn_cap;
    int training;             /* capacity and aux losses were applied */
    /* called before each layer of the forward and the backward pass, outside
     * any parallel region and collective ([outer] progress = poll: the
     * link's messages move while the layers compute); NULL: none */
    void (*progress)(void *ctx);
    void *progress_ctx;
    float *block;             /* the one allocation holding all of the above */
} Activations;

/* Buffers for up to B sequences of T tokens on this rank; `ep` is the
 * learner's expert-parallel group (its size shards the experts). With
 * RECOMPUTE_ATTENTION one layer's attention probabilities are kept instead
 * of every layer's (backward computes them again from q, k: the same
 * function on the same inputs, so the same bits). With RECOMPUTE_LAYER
 * only the residual stream entering each layer is kept: backward runs each
 * layer's forward again from it (its expert rows exchanged again, the
 * learner's ranks in step as in the forward) into one layer's buffers —
 * the same bits, for one more forward pass of compute. */
int acts_create(Activations *a, const ModelConfig *cfg, int B, int T, Coll *ep, Recompute recompute);
void acts_destroy(Activations *a);
/* Bytes acts_create allocates for that shape with G ranks per learner and
 * `threads` OpenMP threads (the memory report). */
double acts_bytes(const ModelConfig *cfg, int B, int T, int G, int threads, Recompute recompute);
/* Bytes of the expert-row buffers once a layer has received n routed rows. */
double acts_expert_row_bytes(const ModelConfig *cfg, double n, Recompute recompute);

/* Forward B sequences of length T (T <= context). targets < 0 are not scored.
 * training != 0: capacity limits and auxiliary losses apply. */
int transformer_forward(const Model *m, Activations *a, const int *tokens, const int *targets,
                        int B, int T, int training, ForwardStats *st);
/* Every rank of the learner must make the same sequence of forward and
 * backward calls (they exchange expert rows). aux_loss/z_loss/dropped/
 * remote_dropped in ForwardStats are this rank's share: sum them over the
 * learner's ranks and divide aux/z by G for the learner's values. The
 * model's routing policy (model.h) applies, training or not; the model
 * must fit the learner (model_route_check: a one-line error otherwise). */

/* Accumulate into m->grads the gradient of
 *   loss_scale * (ce_sum / n_targets + aux_loss + z_loss)
 * for the last transformer_forward (which must have had training != 0). */
int transformer_backward(Model *m, Activations *a, const int *tokens, const int *targets,
                         float loss_scale);

#endif
