/* layers.h (cuda/) — the layers' kernels, mirroring src/cpu/layers.h
 * function for function: the same argument order (outputs, inputs, dims)
 * plus a trailing cudaStream_t, the same contract (backward accumulates
 * with +=), device pointers. The per-element math is src/elementwise.h's,
 * shared with the CPU. Sums are in a fixed order (a fixed tree per row,
 * fixed row chunks for the weight gradient, no atomics), so a run repeats
 * bit for bit on the same GPU.
 *
 * Owns: the element-wise and row kernels (bf16 rounding, embedding,
 * RMSNorm, SwiGLU, rotary, the fused softmax cross-entropy, residuals).
 * Must not: allocate beyond the stream's pool scratch of a backward.
 * src/cpu/layers.h's matrix products are gemm.h's here (cuBLAS handles
 * and grouped calls), its attention attention.h's (tiled, O(T)) and
 * attention_tc.h's (tensor cores): on the GPU each is a concern of its own.
 */
#ifndef ISTHMUS_CUDA_LAYERS_H
#define ISTHMUS_CUDA_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

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
