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

/* Routing and dispatch state of one MoE layer for this rank.
 * Source side: this rank's N tokens and their K routed copies; a copy is
 * numbered t*K+k. The kept copies go to the rank that owns their expert,
 * in slots grouped by expert (so by destination rank), each expert's in
 * copy order; dropped copies (beyond capacity: the learner's count matrix
 * says which, route_plan.h) take the slots after them and are not sent.
 * Owner side: the copies received for this rank's El experts, from each
 * source in rank order — the (source rank, position) order the capacity
 * rule uses — grouped by expert into compute rows.
 * Split experts (model.h's RoutePolicy): the learner's experts may be a
 * range of the router's; probs, choice, frac and mean_prob are as wide as
 * the router's probabilities (Er: RouteSpan), the plan's experts are the
 * learner's. ROUTE_DROP's copies to experts it does not hold take the
 * slots after every copy of its own experts (route_plan.h) and are not
 * sent: zeros, as the capacity's dropped ones. */
typedef struct {
    float *probs;       /* (N,E) softmax of router logits */
    float *lse;         /* (N) logsumexp of router logits (z-loss) */
    int *choice;        /* (N,K) experts by descending prob, ties -> lower index */
    double *frac;       /* (E) f_e over all tokens of the learner (before capacity) */
    double *mean_prob;  /* (E) P_e over this rank's tokens */
    int *send_copy;     /* (N*K) send slot -> copy */
    int *copy_slot;     /* (N*K) copy -> send slot */
    int *send_counts;   /* (G) kept copies sent to each rank */
    int n_sent;         /* kept copies: slots [0, n_sent) are sent, the rest dropped */
    float *y_back;      /* (N*K,D) expert output of each copy's slot, 0 if dropped */
    /* owner side; arrays grow as needed (caps) */
    int n_recv, recv_cap;
    int *recv_counts;   /* (G) copies received from each rank */
    int *recv_row;      /* (n_recv) compute row of each received copy */
    int *row_src;       /* (rows) received index of each compute row */
    int *expert_start;  /* (El+1) rows [expert_start[e], expert_start[e+1]) are expert e */
    int rows, dropped;  /* rows = n_recv; dropped: copies of this rank's experts beyond capacity */
    int remote;         /* this rank's copies to experts the learner does not hold (ROUTE_DROP) */
    int row_cap, row_cap_f;
    float *xrows;       /* (rows,D) expert inputs, saved for backward */
    float *arows, *urows, *hrows; /* (rows,F) */
} MoeRouting;

/* Capacity of each expert for a group of `tokens` tokens; no limit when
 * capacity_factor <= 0 (evaluation). */
int moe_capacity(double capacity_factor, size_t tokens, int K, int E);

/* probs, lse from logits (N,E) */
void router_softmax_forward(float *probs, float *lse, const float *logits, size_t N, int E);
/* choice (N,K) = top-K of probs per token, ties to the lower expert index */
void router_topk(int *choice, const float *probs, size_t N, int E, int K);
/* counts (E) = number of the N*K choices that picked each expert;
 * mean_prob (E) = mean router probability over the N tokens. */
void router_stats(int *counts, double *mean_prob, const int *choice, const float *probs, size_t N,
                  int E, int K);
/* The dispatch plan of learner rank `me` from the learner's count matrix
 * cnt (G, G*El: its experts') and the capacity (route_plan.h says how every
 * rank derives the same plan). choice: experts of the router's E; the
 * learner's expert is choice - off, a copy outside [0, G*El) goes to an
 * expert held elsewhere (ROUTE_DROP; off = 0 and E = G*El when it holds
 * them all). Source side: copy_slot (N*K: copy -> slot), send_copy (slot
 * -> copy), send_counts (G: kept rows to each rank, in slot order); kept
 * copies take the first slots, in expert order; returns how many;
 * *n_remote = the copies to experts held elsewhere (the last slots). pos:
 * 4*E ints of scratch. */
int moe_send_plan(int *send_copy, int *copy_slot, int *send_counts, int *pos, const int *choice, const int *cnt,
                  size_t N, int K, int G, int El, int me, int cap, int off, int E, int *n_remote);
/* Owner side: recv_counts (G: rows arriving from each rank); returns their sum. */
int moe_recv_count(int *recv_counts, const int *cnt, int G, int El, int me, int cap);
/* Owner side: recv_row (arrival -> compute row), row_src (row -> arrival),
 * expert_start (El+1); *dropped = copies of its experts beyond capacity
 * (never sent). Returns the rows (= the arrivals: all are kept). */
int moe_owner_plan(int *recv_row, int *row_src, int *expert_start, int *dropped, const int *cnt, int G, int El,
                   int me, int cap);
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

/* dst (n,D) = src[index[i]] (index < 0: zero row) */
void rows_gather(float *dst, const float *src, const int *index, size_t n, int D);
/* out (N,D) = sum_k gate[t,k] * y_back[slot of (t,k)]  (overwrites) */
void moe_combine_forward(float *out, const MoeRouting *r, size_t N, int E, int K, int D);
/* dy_send (N*K,D) = gate * dout in send order (overwrites);
 * dprobs[t,choice] += dout . y_back */
void moe_combine_backward(float *dy_send, float *dprobs, const float *dout, const MoeRouting *r,
                          size_t N, int E, int K, int D);
/* dinp (N,D) += sum_k dx_send[slot of (t,k)] */
void moe_scatter_add(float *dinp, const float *dx_send, const MoeRouting *r, size_t N, int K, int D);

/* Expert-row buffers (every backend's) grow to a quarter more than asked,
 * plus a little: a few growths cover the routing's drift instead of one per
 * step. */
static inline size_t moe_rows_grow_target(size_t n) { return n + n / 4 + 64; }

#endif
