/* layers.h (cuda/) — the layers' kernels, mirroring src/cpu/layers.h
 * function for function: the same argument order (outputs, inputs, dims)
 * plus a trailing cudaStream_t, the same contract (backward accumulates
 * with +=), device pointers. The per-element math is src/elementwise.h's,
 * shared with the CPU. Sums are in a fixed order (a fixed tree per row,
 * fixed row chunks for the weight gradient, no atomics), so a run repeats
 * bit for bit on the same GPU. Matrix products go through cuBLAS (CudaBlas:
 * the handle, its stream and the precision); attention is tiled with an
 * online softmax and keeps only each row's log-sum-exp for backward, so its
 * memory is O(T), not the CPU's O(T^2).
 */
#ifndef ISTHMUS_CUDA_LAYERS_H
#define ISTHMUS_CUDA_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A cuBLAS handle bound to `stream`; bf16 != 0: products on bf16 tensor
 * cores with fp32 outputs and accumulation — operands stored as bf16 (the
 * *_bf16 functions below), or fp32 operands rounded inside cuBLAS
 * (CUBLAS_COMPUTE_32F_FAST_16BF) — else plain fp32 (no TF32). */
typedef struct {
    cublasHandle_t handle;
    cudaStream_t stream;
    int bf16;
} CudaBlas;

int cuda_blas_create(CudaBlas *b, cudaStream_t stream, int bf16);
void cuda_blas_destroy(CudaBlas *b);

/* The bf16 path's stored operands: a bfloat16's bits (uint16_t, so that C
 * callers need no CUDA type), rounded to nearest even as codec_math.h's
 * codec_to_bf16 — bit for bit. */
int cuda_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t stream);

/* out (N,D) = embed[tokens] ; embed (V,D). */
int cuda_encoder_forward(float *out, const int *tokens, const float *embed, size_t N, int D, cudaStream_t stream);
/* dembed (V,D) += scatter of dout (N,D) by token, from the tokens' buckets
 * (embed_buckets.h, built on the host; device arrays ids (n_ids), start
 * (n_ids+1), order (N)): parallel over ids and columns, each id's rows in
 * position order, so the sums are the CPU's, bit for bit (no atomics). */
int cuda_encoder_backward(float *dembed, const float *dout, const int *ids, const int *start, const int *order,
                          int n_ids, int D, cudaStream_t stream);

/* out (N,D) = inp / sqrt(mean(inp^2) + eps) * weight; rstd (N) saved. */
int cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, int D,
                         cudaStream_t stream);
/* h (N,D) = a + b, then out, rstd = rmsnorm_forward(h): the residual and
 * the norm after it in one pass, the same bits as the two kernels. */
int cuda_residual_rmsnorm_forward(float *h, float *out, float *rstd, const float *a, const float *b,
                                  const float *weight, size_t N, int D, cudaStream_t stream);
/* As the two above, out written as bf16 (the next product's operand): the
 * fp32 kernels' values, rounded once. */
int cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *inp, const float *weight, size_t N, int D,
                              cudaStream_t stream);
int cuda_residual_rmsnorm_forward_bf16(float *h, uint16_t *out, float *rstd, const float *a, const float *b,
                                       const float *weight, size_t N, int D, cudaStream_t stream);
/* dinp (N,D) += ..., dweight (D) += ...; its scratch comes from the
 * stream's memory pool. */
int cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, size_t N, int D, cudaStream_t stream);

/* h = silu(a) * u, n elements. */
int cuda_swiglu_forward(float *h, const float *a, const float *u, size_t n, cudaStream_t stream);
/* As cuda_swiglu_forward, h written as bf16. */
int cuda_swiglu_forward_bf16(uint16_t *h, const float *a, const float *u, size_t n, cudaStream_t stream);
/* da += dh * d(silu(a) u)/da, du += dh * silu(a). */
int cuda_swiglu_backward(float *da, float *du, const float *dh, const float *a, const float *u, size_t n,
                         cudaStream_t stream);
/* x (B,T,H,Dh) rotated in place by the tables (T, Dh/2) of rope_tables
 * (half-split: element i pairs with i + Dh/2); backward rotates back. */
int cuda_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                      cudaStream_t stream);
int cuda_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                       cudaStream_t stream);

/* The bf16 path's q, k, v (B,T,H,Dh): the projections' fp32 outputs qf,
 * kf (rotated as cuda_rope_forward rotates) and vf, rounded once to bf16:
 * one launch for the three. */
int cuda_rope_qkv_bf16(uint16_t *q, uint16_t *k, uint16_t *v, const float *qf, const float *kf, const float *vf,
                       const float *cos_t, const float *sin_t, int B, int T, int H, int Dh, cudaStream_t stream);

/* out (N,OC) = inp (N,C) . weight (C,OC)   [weights stored (in, out)] */
int cuda_matmul_forward(float *out, const float *inp, const float *weight, size_t N, int C, int OC,
                        const CudaBlas *blas);
/* dinp (N,C) += dout . weight^T ; dweight (C,OC) += inp^T . dout. Either may be NULL. */
int cuda_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         size_t N, int C, int OC, const CudaBlas *blas);
/* The same products with operands stored as bf16 (activations written so
 * by their kernels, weights from the step's bf16 copy): native bf16
 * tensor-core products, fp32 outputs and accumulation (CUBLAS_COMPUTE_32F).
 * A gradient (dout) is fp32: backward rounds it to bf16 once, into
 * scratch from the stream's pool, for both of its products. */
int cuda_matmul_forward_bf16(float *out, const uint16_t *inp, const uint16_t *weight, size_t N, int C, int OC,
                             const CudaBlas *blas);
int cuda_matmul_backward_bf16(float *dinp, float *dweight, const float *dout, const uint16_t *inp,
                              const uint16_t *weight, size_t N, int C, int OC, const CudaBlas *blas);

/* Many products in one cuBLAS call (cublasGemmGroupedBatchedEx: one
 * launch for problems of different shapes — a layer's experts, whose row
 * counts differ). Each problem is one of the matmul products above,
 * queued with the add functions; the problems of one batch must write
 * distinct outputs. run queues them on the stream and empties the batch.
 * Where the library refuses the grouped call (a compute type it does not
 * group), they run one cublasGemmEx after another — the same products —
 * for the rest of the process. The device pointer arrays are filled by a
 * kernel from its arguments, so the host never waits. */
typedef struct {
    int cap, n;
    int bf16_operands; /* the queued problems' A and B are bf16, else fp32; one kind per batch */
    cublasOperation_t *ta, *tb;
    int *m, *nn, *k, *lda, *ldb, *ldc, *group_size;
    float *alpha, *beta;
    const void **A, **B;
    float **C;
    void **d_ptrs; /* device: A (cap), B (cap), C (cap) */
} CudaGemmBatch;

int cuda_gemm_batch_create(CudaGemmBatch *g, int cap);
void cuda_gemm_batch_destroy(CudaGemmBatch *g);
/* Queue one product; bf16: inp/dout and weight are bf16 (the bf16 path's
 * stored operands), else fp32; the output is fp32 either way, and one
 * batch holds one kind. As cuda_matmul_forward: out (N,OC) = inp . weight
 * (N = 0: nothing queued). */
int cuda_gemm_batch_forward(CudaGemmBatch *g, int bf16, float *out, const void *inp, const void *weight, size_t N,
                            int C, int OC);
/* dinp (N,C) += dout . weight^T, as cuda_matmul_backward's first product. */
int cuda_gemm_batch_dinp(CudaGemmBatch *g, int bf16, float *dinp, const void *dout, const void *weight, size_t N,
                         int C, int OC);
/* dweight (C,OC) += inp^T . dout, as cuda_matmul_backward's second product. */
int cuda_gemm_batch_dweight(CudaGemmBatch *g, int bf16, float *dweight, const void *dout, const void *inp, size_t N,
                            int C, int OC);
int cuda_gemm_batch_run(CudaGemmBatch *g, const CudaBlas *blas);
/* 1 when the last run's products went in one grouped call. */
int cuda_gemm_batch_last_grouped(void);

/* The tied output head: logits (N,V) = x (N,D) . embed (V,D)^T. In bf16
 * it keeps fp32 operands (FAST_16BF): a bf16 copy of its gradient would
 * take N*V*2 more bytes at the step's peak. */
int cuda_tied_head_forward(float *logits, const float *x, const float *embed, size_t N, int D, int V,
                           const CudaBlas *blas);
/* dx (N,D) += dlogits . embed ; dembed (V,D) += dlogits^T . x. */
int cuda_tied_head_backward(float *dx, float *dembed, const float *dlogits, const float *x, const float *embed,
                            size_t N, int D, int V, const CudaBlas *blas);

/* The head dimensions the attention kernels are built for. */
int cuda_attention_supports(int Dh);
/* Causal attention, q,k,v,out (B,T,D) with head h in columns [h*Dh,(h+1)*Dh)
 * (the CPU's layout); lse (B,H,T) keeps each row's log-sum-exp of the
 * scaled scores for backward in place of the CPU's (B,H,T,T) probabilities. */
int cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                           int D, int H, cudaStream_t stream);
/* dq,dk,dv (B,T,D) += ...; recomputes the probabilities from lse. Needs
 * the forward's out; scratch from the stream's pool. */
int cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, int B, int T, int D, int H,
                            cudaStream_t stream);
/* The attention a precision runs: bf16 == 0 is cuda_attention_forward /
 * _backward (fp32 throughout); bf16 != 0 the tensor-core kernels
 * (attention_tc.h: head dimensions 64 and 128, any other refused with a
 * one-line error), q, k, v read as bf16 (cuda_rope_qkv_bf16) and out
 * written as bf16 (the output projection's stored operand). */
int cuda_attention_forward_as(int bf16, void *out, float *lse, const void *q, const void *k, const void *v, int B,
                              int T, int D, int H, cudaStream_t stream);
int cuda_attention_backward_as(int bf16, float *dq, float *dk, float *dv, const float *dout, const void *out,
                               const float *lse, const void *q, const void *k, const void *v, int B, int T, int D,
                               int H, cudaStream_t stream);

/* probs (N,V) = softmax(logits) in place; losses (N) = -log probs[target]
 * (0 where target < 0): the fused softmax cross-entropy, one block per row. */
int cuda_crossentropy_forward(float *losses, float *probs_logits, const int *targets, size_t N, int V,
                              cudaStream_t stream);
/* dlogits (N,V) = (probs - onehot(target)) * scale, rows with target < 0 zeroed. */
int cuda_crossentropy_backward(float *dlogits, const float *probs, const int *targets, float scale, size_t N, int V,
                               cudaStream_t stream);

/* out (n) = a + b */
int cuda_residual_forward(float *out, const float *a, const float *b, size_t n, cudaStream_t stream);
/* out (n) *= factor */
int cuda_scale(float *v, float factor, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
