/* moe.h (cuda/) — mixture-of-experts routing and experts on the GPU,
 * mirroring src/cpu/moe.h function for function (device pointers, a
 * trailing stream or CudaBlas).
 *
 * Owns: the kernels of the router softmax, top-k (ties to the lower index,
 * the CPU's selection loop), the mean router probability, the balance and
 * z-loss gradients, the SwiGLU experts (cuBLAS products), the row gathers
 * and the gate-weighted combine; and the routing state of one layer
 * (CudaRouting).
 * The routing's bookkeeping on integers — the plan every rank derives from
 * the learner's count matrix (src/route_plan.h: slots, arrivals, rows, the
 * capacity rule) — runs on the device with route_plan.h's arithmetic (the
 * same functions moe.c's host loops use, tested there against the rule
 * applied directly); the host reads one small header per layer: the
 * all-to-all's counts (NCCL takes them on the host) and the experts' row
 * ranges (the products' sizes).
 * Must not: move data between ranks (transformer.cu does, through coll).
 */
#ifndef ISTHMUS_CUDA_MOE_H
#define ISTHMUS_CUDA_MOE_H

#include <stddef.h>

#include "gemm.h" /* CudaBlas, CudaGemmBatch */

#ifdef __cplusplus
extern "C" {
#endif

/* One MoE layer's routing for this rank: device arrays (d_) beside the
 * host ones the bookkeeping uses (h_). Shapes as in cpu/moe.h (with split
 * experts E is the router's probabilities' width, Er: model.h). */
typedef struct {
    float *d_probs, *d_lse;        /* (N,E), (N) */
    int *d_choice, *d_copy_slot;   /* (N*K) */
    double *d_frac;                /* (E) */
    float *d_y_back;               /* (N*K,D) */
    /* the plan's header, read once per layer: kept rows to / from each
     * rank, the experts' row ranges, the slots sent */
    int *h_send_counts, *h_recv_counts, *h_expert_start; /* (G), (G), (El+1) */
    int n_sent;                    /* slots [0, n_sent) are sent; the rest were dropped */
    /* owner side: grows with the arrivals */
    int n_recv, recv_cap, rows, dropped;
    int *d_recv_row, *d_row_src;   /* (cap) */
    float *d_xrows;                /* (cap,D) expert inputs, saved for backward */
    float *d_arows, *d_urows, *d_hrows; /* (cap,F) */
} CudaRouting;

/* The plan's header on the device, as the host reads it (ints). */
#define ROUTE_HDR_SENT 0    /* kept copies this rank sends */
#define ROUTE_HDR_RECV 1    /* rows it receives (all kept) */
#define ROUTE_HDR_DROPPED 2 /* copies of its experts beyond capacity */
#define ROUTE_HDR_REMOTE 3  /* its copies to experts the learner does not hold (ROUTE_DROP) */
#define ROUTE_HDR_COUNTS 4  /* then send_counts (G), recv_counts (G), expert_start (El+1) */
static inline size_t cuda_route_hdr_ints(int G, int El) { return ROUTE_HDR_COUNTS + 2 * (size_t)G + (size_t)El + 1; }

/* counts (E) = this rank's copies per expert (overwrites). */
int cuda_route_histogram(int *counts, const int *choice, size_t copies, int E, cudaStream_t stream);
/* From the learner's count matrix cnt (G,E) over the router's E experts
 * (its probabilities' width): frac (E, the learner's share of each
 * expert), then, when the learner holds fewer (Es = G*El < E: ROUTE_DROP,
 * from expert `off`), cnt becomes in place the matrix (G,Es) of its own
 * (route_plan.h); the header and the source's slot bases (3W ints: kept,
 * base, dbase; W = route_slot_groups(Es, E)). `me`: this rank in the
 * learner; cap < 0: no capacity. */
int cuda_route_plan(int *hdr, int *bases, double *frac, int *cnt, int G, int El, int me, int cap,
                    double learner_copies, int E, int off, cudaStream_t stream);
/* copy_slot (N*K) and send_token (N*K: the token of each sent slot, -1
 * for a dropped copy's) from the bases; choice: experts of the router's
 * E, the learner's [off, off + Es) (all: off 0, Es = E); pos:
 * cuda_route_pos_ints(N*K, E) ints of scratch (acts_plan.h: each copy's
 * position among this rank's copies of its expert, in copy order, counted
 * by chunks). */
int cuda_route_slots(int *copy_slot, int *send_token, int *pos, const int *choice, const int *bases, const int *hdr,
                     size_t N, int K, int E, int off, int Es, cudaStream_t stream);
/* The owner's maps for its n_recv arrivals: recv_row, row_src. */
int cuda_route_owner_map(int *recv_row, int *row_src, const int *cnt, const int *hdr, int G, int El, int me, int cap,
                         int n_recv, cudaStream_t stream);
/* stats[0] += the balance loss, stats[1] += the z loss (moe.c's sums),
 * stats[2] += the dropped copies (the header's), all in double. */
int cuda_route_losses(double *stats, const double *frac, const double *mean_prob, const float *lse, const int *hdr,
                      size_t N, int E, double aux_coef, double z_coef, cudaStream_t stream);

/* probs, lse from logits (N,E): one thread per token. */
int cuda_router_softmax_forward(float *probs, float *lse, const float *logits, size_t N, int E, cudaStream_t stream);
/* choice (N,K) = top-K of probs per token, ties to the lower expert index. */
int cuda_router_topk(int *choice, const float *probs, size_t N, int E, int K, cudaStream_t stream);
/* mean_prob (E, device doubles) = mean router probability over the N
 * tokens, summed in double as a fixed tree (within ~1e-16 of the CPU's). */
int cuda_router_mean_prob(double *mean_prob, const float *probs, size_t N, int E, cudaStream_t stream);
/* dprobs (N,E) += gradient of scale*aux_loss w.r.t. probs; frac (E, device). */
int cuda_moe_balance_backward(float *dprobs, const double *frac, size_t N, int E, double coef, float scale,
                              cudaStream_t stream);
/* dlogits (N,E) = softmax backward of dprobs + gradient of scale*z_loss. */
int cuda_router_softmax_backward(float *dlogits, const float *dprobs, const float *probs, const float *lse, size_t N,
                                 int E, double z_coef, float scale, cudaStream_t stream);

/* A layer's El SwiGLU experts on their rows: expert e's rows are
 * start[e] .. start[e+1] (on the host; start[0] = 0) of x, a, u, h, y (and
 * dx, dy), its weights (and their gradients) at wg + e*D*F, wu + e*D*F,
 * wd + e*F*D (the model's expert chunks). y = (silu(x.wg) * (x.wu)) . wd;
 * a, u, h (rows, F) saved. Each stage's products in one grouped call (g
 * holds at least 3*El); the same products as cpu/moe's expert_forward.
 * bf16: x, h and the weights are stored as bf16 (the bf16 path's rows and
 * weight copy), else fp32; a, u, y, dy, dx and the weight gradients are
 * fp32 either way. */
int cuda_experts_forward(int bf16, float *y, float *a, float *u, void *h, const void *x, const void *wg,
                         const void *wu, const void *wd, const int *start, int El, int D, int F, CudaGemmBatch *g,
                         const CudaBlas *blas);
/* dx (rows,D), dwg, dwu, dwd += ...; scratch: 3*start[El]*F floats (device). */
int cuda_experts_backward(int bf16, float *dx, float *dwg, float *dwu, float *dwd, float *scratch, const float *dy,
                          const void *x, const float *a, const float *u, const void *h, const void *wg,
                          const void *wu, const void *wd, const int *start, int El, int D, int F, CudaGemmBatch *g,
                          const CudaBlas *blas);

/* dst (n,D) = src[index[i]] (index < 0: zero row); index on the device.
 * Rows are copied as bits: bf16 rows of an even D go through as rows of
 * D/2 floats. */
int cuda_rows_gather(float *dst, const float *src, const int *index, size_t n, int D, cudaStream_t stream);
/* out (N,D) = sum_k gate[t,k] * y_back[slot of (t,k)] (overwrites). */
int cuda_moe_combine_forward(float *out, const CudaRouting *r, size_t N, int E, int K, int D, cudaStream_t stream);
/* dy_send (N*K,D) = gate * dout in send order (overwrites); dprobs[t,choice] += dout . y_back. */
int cuda_moe_combine_backward(float *dy_send, float *dprobs, const float *dout, const CudaRouting *r, size_t N, int E,
                              int K, int D, cudaStream_t stream);
/* dinp (N,D) += sum_k dx_send[slot of (t,k)]. */
int cuda_moe_scatter_add(float *dinp, const float *dx_send, const CudaRouting *r, size_t N, int K, int D,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
