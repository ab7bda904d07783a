/* attention.h (cuda/) — causal attention in fp32, mirroring src/cpu/layers.h's
 * attention_forward / _backward: tiled with an online softmax, one thread
 * per query (key) row, keeping only each row's log-sum-exp for backward
 * (O(T) memory, not the CPU's O(T^2)); and the choice per precision
 * between these kernels and the tensor-core ones (attention_tc.h).
 *
 * Owns: the fp32 kernels (the exact check of the tensor-core ones), the
 * head dimensions they are built for, the dispatch by precision.
 * Must not: allocate beyond the stream's pool scratch of backward.
 */
#ifndef ISTHMUS_CUDA_ATTENTION_H
#define ISTHMUS_CUDA_ATTENTION_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif
