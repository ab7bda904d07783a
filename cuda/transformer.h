/* transformer.h (cuda/) — the whole-model forward and backward on the GPU,
 * mirroring src/cpu/transformer.h: the same layer order, the
 * same expert parallelism over the learner (the counts and rows over
 * NCCL, the dispatch plan on the device), the same ForwardStats.
 *
 * Owns: the device activations of one micro-batch (the attention keeps each
 * row's log-sum-exp, O(T), instead of the CPU's (B,H,T,T) probabilities)
 * and the dispatch plan's scratch and the header the host reads per layer.
 * Must not: update parameters, reduce gradients across ranks, read data.
 */
#ifndef ISTHMUS_CUDA_TRANSFORMER_H
#define ISTHMUS_CUDA_TRANSFORMER_H

#include <stddef.h>

#include "coll_nccl.h"
#include "gemm.h"
#include "layers.h"
#include "moe.h"
#include "phases.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h" /* ForwardStats */
#include "model.h"

typedef struct {
    int B, T, G, El;         /* El: the most experts a rank holds (E / G: the buffers'); split experts hold fewer */
    ModelDims dims;          /* the model's sizes (model.h) */
    int B_cur, T_cur, training;
    size_t N;
    CudaColl *ep;            /* the learner: counts and rows over NCCL */
    const CudaBlas *blas;    /* products, and the stream everything is queued on */
    /* device, saved for backward per layer l: pointer + l * (N_max * width);
     * Lk layers of them: L, or 1 slot all layers share with RECOMPUTE_LAYER */
    Recompute recompute;     /* LAYER: backward runs each layer's forward again from its x */
    int Lk;
    /* train.precision = bf16: the stored operands of the products and the
     * attention — xn1, q, k, v, ao, xn2 and each layer's expert rows
     * d_xrows, d_hrows — hold bf16 (their float
     * pointers name bf16 bytes), and w16 a bf16 copy of the parameters
     * after the tied embedding, rounded from them by the step's first
     * training forward (w16_step: done this step; the backend clears it
     * in zero_grads and in every verb that writes the parameters) and by
     * every scoring forward */
    int act16;
    uint16_t *w16;           /* (n_params - model_after_embed) when act16 */
    size_t w16_n;
    int w16_step;
    float *x;                /* (L+1,N,D): always every layer's */
    float *xn1, *rstd1;      /* (Lk,N,D), (Lk,N) */
    float *q, *k, *v, *ao;   /* (Lk,N,D) */
    float *att_lse;          /* (Lk,B,H,T) */
    float *h, *xn2, *rstd2;  /* (Lk,N,D), (Lk,N,D), (Lk,N) */
    float *xf, *rstdf, *probs, *losses; /* (N,D), (N), (N,max(V,E)), (N) */
    float *rope_cos, *rope_sin;         /* (T, Dh/2) */
    float *dx, *dxn, *dq, *dk, *dv, *dao, *dtmp;      /* (N,D) */
    float *dlogits, *dprobs, *router_logits;          /* (N,max(V,E)): probs' buffer, (N,E), (N,E) */
    float *send_rows, *back_rows;                     /* (N*K,D) */
    int *tokens, *targets, *send_token;               /* (N), (N), (N*K) */
    int *embed_plan;         /* (3N+1): the tokens' buckets (embed_buckets.h): ids (N), start (N+1), order (N) */
    float *block;            /* the one device allocation holding the floats above */
    CudaRouting *route;      /* (Lk) */
    /* the dispatch plan on the device (cuda/moe.h) and the header the host reads */
    int *d_counts, *d_cnt, *d_hdr, *d_bases, *d_pos; /* (E), (G,E), (cuda_route_hdr_ints), (3E), (..._pos_ints) */
    double *d_mean_prob, *d_fstats;                  /* (E), (3: the forward's aux, z, dropped) */
    int *h_hdr;                                      /* (cuda_route_hdr_ints), pinned: copied while the GPU works */
    cudaEvent_t hdr_ready;                           /* the header has reached h_hdr */
    int *h_embed_plan, *h_embed_count, n_embed_ids;  /* (3N+1), (V) scratch, the distinct ids of this batch */
    float *h_losses;                                 /* (N) */
    /* owner-side device scratch, grown on demand */
    float *recv_rows, *recv_rows2, *row_tmp, *row_tmp2, *ffn_scratch;
    CudaGemmBatch gemms;     /* a layer's expert products, grouped (gemm.h) */
    size_t recv_caps[4], ffn_cap;
    /* called on the host before each layer's launches, forward and backward
     * ([outer] progress = poll, as the CPU backend): the link moves while
     * the GPU works through what was queued; outside every collective */
    void (*progress)(void *ctx);
    void *progress_ctx;
    PhaseClock *clock;       /* NULL: the phases are not timed (phases.h) */
    long remote_dropped;     /* this forward's copies to experts the learner does not hold (the headers') */
} CudaActivations;

/* Buffers for up to B sequences of T tokens; the Dh the attention kernels
 * support is checked here (a one-line error otherwise). RECOMPUTE_LAYER
 * keeps one layer's buffers, as the CPU backend does (RECOMPUTE_ATTENTION
 * changes nothing here: the attention never keeps its probabilities). */
int cuda_acts_create(CudaActivations *a, const ModelConfig *cfg, int B, int T, CudaColl *ep, const CudaBlas *blas,
                     Recompute recompute);
void cuda_acts_destroy(CudaActivations *a);
/* m: the table with device params and grads. tokens, targets on the host
 * (copied in; targets < 0 not scored). As transformer_forward; leaves the
 * per-position losses in a->h_losses. */
int cuda_transformer_forward(const Model *m, CudaActivations *a, const int *tokens, const int *targets, int B, int T,
                             int training, ForwardStats *st);
/* As transformer_backward: accumulates into m->grads (device); n_targets
 * is the number of targets >= 0 of the last forward. */
int cuda_transformer_backward(Model *m, CudaActivations *a, size_t n_targets, float loss_scale);

#ifdef __cplusplus
}
#endif

#endif
