/* layers.h (cuda/) — the layers' kernels, mirroring src/cpu/layers.h
 * function for function: the same argument order (outputs, inputs, dims)
 * plus a trailing cudaStream_t, the same contract (backward accumulates
 * with +=), device pointers. The per-element math is src/elementwise.h's,
 * shared with the CPU. So far: the embedding, RMSNorm, SwiGLU and rotary
 * embedding; the
 * rest of the layers are the GPU backend issue's remaining work. Sums are
 * in a fixed order (a fixed tree per row, fixed row chunks for the weight
 * gradient), so a run repeats bit for bit on the same GPU.
 */
#ifndef ISTHMUS_CUDA_LAYERS_H
#define ISTHMUS_CUDA_LAYERS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out (N,D) = embed[tokens] ; embed (V,D). */
int cuda_encoder_forward(float *out, const int *tokens, const float *embed, size_t N, int D, cudaStream_t stream);
/* dembed (V,D) += scatter of dout (N,D) by token: one thread per column,
 * tokens in order, so the sums are the CPU's, bit for bit (no atomics). */
int cuda_encoder_backward(float *dembed, const float *dout, const int *tokens, size_t N, int D, cudaStream_t stream);

/* out (N,D) = inp / sqrt(mean(inp^2) + eps) * weight; rstd (N) saved. */
int cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, int D,
                         cudaStream_t stream);
/* dinp (N,D) += ..., dweight (D) += ...; its scratch comes from the
 * stream's memory pool. */
int cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, size_t N, int D, cudaStream_t stream);

/* h = silu(a) * u, n elements. */
int cuda_swiglu_forward(float *h, const float *a, const float *u, size_t n, cudaStream_t stream);
/* da += dh * d(silu(a) u)/da, du += dh * silu(a). */
int cuda_swiglu_backward(float *da, float *du, const float *dh, const float *a, const float *u, size_t n,
                         cudaStream_t stream);
/* x (B,T,H,Dh) rotated in place by the tables (T, Dh/2) of rope_tables
 * (half-split: element i pairs with i + Dh/2); backward rotates back. */
int cuda_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                      cudaStream_t stream);
int cuda_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
