/* transformer.h — the CPU backend: whole-model forward and backward.
 *
 * Owns: the activation buffers of one micro-batch and the order in which the
 * layers of layers.c and moe.c are applied (DESIGN.md "Model"):
 *   x = embed[byte]; per layer h = x + Attn(RMSNorm(x)), x = h + MoE(RMSNorm(h));
 *   logits = RMSNorm(x) . embed^T ; cross-entropy on the next byte,
 *   plus per-layer load-balancing and z losses while training.
 * Must not: update parameters, reduce gradients across ranks, read data.
 */
#ifndef ISTHMUS_TRANSFORMER_H
#define ISTHMUS_TRANSFORMER_H

#include <stddef.h>

#include "model.h"
#include "moe.h"

typedef struct {
    double ce_sum;     /* sum of cross-entropy (nats) over counted targets */
    size_t n_targets;  /* targets >= 0 */
    double aux_loss;   /* sum over layers of the load-balancing loss */
    double z_loss;     /* sum over layers of the router z-loss */
    long dropped;      /* routed copies skipped for capacity, all layers */
} ForwardStats;

typedef struct {
    int B, T;                 /* allocated for up to B sequences of T */
    int L, D, H, E, K, F, V;
    int B_cur, T_cur;         /* sizes of the last forward */
    size_t N;                 /* B_cur*T_cur */
    /* saved for backward, per layer l: pointer + l * (N_max * width) */
    float *x;                 /* (L+1,N,D) residual stream entering each layer */
    float *xn1, *rstd1;       /* (L,N,D), (L,N) */
    float *q, *k, *v, *ao;    /* (L,N,D) q,k rotated; ao = attention output */
    float *att;               /* (L,B,H,T,T) */
    float *h, *xn2, *rstd2;   /* (L,N,D), (L,N,D), (L,N) */
    float *rows_x, *rows_a, *rows_u, *rows_h, *rows_y; /* (L,N*K,D|F) expert rows */
    MoeRouting *route;        /* (L) */
    float *xf, *rstdf;        /* (N,D), (N) final norm */
    float *probs;             /* (N,V) output softmax */
    float *losses;            /* (N) */
    float *rope_cos, *rope_sin; /* (T, Dh/2) */
    /* backward scratch */
    float *dx, *dh, *dxn, *dq, *dk, *dv, *dao, *dtmp; /* (N,D) */
    float *dlogits;           /* (N, max(V,E)) */
    float *dprobs;            /* (N,E) */
    float *drows_x, *drows_y; /* (N*K,D) */
    float *dscratch;          /* max(threads*T*T, 3*N*K*F) */
    float *router_logits;     /* (N,E) */
    int training;             /* capacity and aux losses were applied */
    float *block;             /* the one allocation holding all of the above */
} Activations;

int acts_create(Activations *a, const ModelConfig *cfg, int B, int T);
void acts_destroy(Activations *a);

/* Forward B sequences of length T (T <= context). targets < 0 are not scored.
 * training != 0: capacity limits and auxiliary losses apply. */
int transformer_forward(const Model *m, Activations *a, const int *tokens, const int *targets,
                        int B, int T, int training, ForwardStats *st);

/* Accumulate into m->grads the gradient of
 *   loss_scale * (ce_sum / n_targets + aux_loss + z_loss)
 * for the last transformer_forward (which must have had training != 0). */
void transformer_backward(Model *m, Activations *a, const int *tokens, const int *targets,
                          float loss_scale);

#endif
