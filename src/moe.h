/* moe.h — mixture-of-experts routing and expert computation on the CPU.
 *
 * Owns: the router (softmax over experts, top-k with ties to the lower
 * index, gates = router probabilities without renormalisation), the
 * load-balancing and z auxiliary losses, the capacity rule (tokens beyond an
 * expert's capacity skip it, in (source, position) order), the dispatch plan
 * that groups routed token copies by expert ("rows"), the SwiGLU experts and
 * the gate-weighted combine.
 * Must not: know about attention, the residual stream or other layers; move
 * data between ranks (the dispatch plan is what a communicator will use).
 *
 * Shapes: N tokens, D model width, E experts, K = top_k, F expert width,
 * R = number of kept routed rows (<= N*K).
 */
#ifndef ISTHMUS_MOE_H
#define ISTHMUS_MOE_H

#include <stddef.h>

/* Routing decisions of one MoE layer for N tokens. */
typedef struct {
    float *probs;   /* (N,E) softmax of router logits */
    float *lse;     /* (N) logsumexp of router logits (z-loss) */
    int *choice;    /* (N,K) chosen experts, by descending prob, ties -> lower index */
    int *row;       /* (N,K) row of the routed copy in expert-major order, -1 if dropped */
    int *row_token; /* (N*K) token of each row */
    int *expert_start; /* (E+1) rows [expert_start[e], expert_start[e+1]) go to expert e */
    double *frac;   /* (E) f_e: share of the N*K choices that picked e (before capacity) */
    double *mean_prob; /* (E) P_e: mean router probability of e over tokens */
    int rows;       /* R: kept rows */
    int dropped;    /* routed copies skipped because of capacity */
} MoeRouting;

/* Capacity of each expert for a group of `tokens` tokens; no limit when
 * capacity_factor <= 0 (evaluation). */
int moe_capacity(double capacity_factor, size_t tokens, int K, int E);

/* probs, lse from logits (N,E) */
void router_softmax_forward(float *probs, float *lse, const float *logits, size_t N, int E);
/* choice (N,K) = top-K of probs per token, ties to the lower expert index */
void router_topk(int *choice, const float *probs, size_t N, int E, int K);
/* frac, mean_prob from choices/probs; returns nothing, see MoeRouting. */
void router_stats(double *frac, double *mean_prob, const int *choice, const float *probs, size_t N,
                  int E, int K);
/* Assign rows: copies in token order, then choice order; an expert keeps at
 * most `capacity` copies (capacity < 0: no limit). Fills row, row_token,
 * expert_start, rows, dropped. */
void moe_plan(MoeRouting *r, size_t N, int E, int K, int capacity);

/* aux = coef * E * sum_e f_e P_e ; z = coef * mean_t lse_t^2 */
double moe_balance_loss(const double *frac, const double *mean_prob, int E, double coef);
double moe_z_loss(const float *lse, size_t N, double coef);

/* dprobs (N,E) += gradient of scale*aux_loss w.r.t. probs (f_e held fixed) */
void moe_balance_backward(float *dprobs, const double *frac, size_t N, int E, double coef, float scale);
/* dlogits (N,E) = softmax backward of dprobs + gradient of scale*z_loss */
void router_softmax_backward(float *dlogits, const float *dprobs, const float *probs,
                             const float *lse, size_t N, int E, double z_coef, float scale);

/* One SwiGLU expert on n rows: y (n,D) = (silu(x.wg) * (x.wu)) . wd;
 * a, u, h (n,F) saved. wg, wu (D,F), wd (F,D). */
void expert_forward(float *y, float *a, float *u, float *h, const float *x, const float *wg,
                    const float *wu, const float *wd, size_t n, int D, int F);
/* dx (n,D), dwg, dwu, dwd += ... ; scratch: 3*n*F floats */
void expert_backward(float *dx, float *dwg, float *dwu, float *dwd, float *scratch,
                     const float *dy, const float *x, const float *a, const float *u,
                     const float *h, const float *wg, const float *wu, const float *wd, size_t n,
                     int D, int F);

/* xrows (R,D) = inp[row_token] */
void moe_gather(float *xrows, const float *inp, const MoeRouting *r, int D);
/* out (N,D) = sum_k gate[t,k] * y[row[t,k]] over kept copies (overwrites) */
void moe_combine_forward(float *out, const float *y, const MoeRouting *r, size_t N, int E, int K,
                         int D);
/* dy (R,D) = gate * dout ; dprobs[t,choice] += dout . y  (overwrites dy) */
void moe_combine_backward(float *dy, float *dprobs, const float *dout, const float *y,
                          const MoeRouting *r, size_t N, int E, int K, int D);
/* dinp (N,D) += sum of dxrows over the token's kept copies */
void moe_scatter_add(float *dinp, const float *dxrows, const MoeRouting *r, size_t N, int K, int D);

#endif
