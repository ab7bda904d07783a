/* attention_tc.h (cuda/) — causal attention on tensor cores for the bf16
 * path: FlashAttention-2's tiling with wmma bf16 products and fp32
 * accumulation, O(T) memory (the same log-sum-exp per row as attention.cu's
 * fp32 kernels, which stay the exact check against the CPU). Inputs are
 * q, k, v stored as bf16 (the bf16 path writes them so, rotated), the
 * output gradient fp32, rounded to bf16 as it is staged in shared
 * memory. Forward: one block of 64 queries walks the key tiles up to its
 * last query (online softmax in fp32). Backward without atomics (the same
 * bits every run): one kernel owns 64 keys (dK, dV over the query tiles
 * at or after them), another 64 queries (dQ over the key tiles up to
 * them); both recompute P from the log-sum-exp.
 *
 * Owns: these kernels. Must not: be used for fp32 runs (attention.cu's are).
 */
#ifndef ISTHMUS_CUDA_ATTENTION_TC_H
#define ISTHMUS_CUDA_ATTENTION_TC_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The head dimensions these kernels are built for (64, 128), on a device
 * whose blocks may take their shared memory (sm_90 and later). */
int cuda_attention_tc_supports(int Dh);
/* As cuda_attention_forward (attention.h): out (B,T,D) written as bf16 (the
 * output projection's stored operand), lse (B,H,T). */
int cuda_attention_tc_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                              int T, int D, int H, cudaStream_t stream);
/* dq, dk, dv (B,T,D) += ...; delta (B,H,T) = rowsum(dout * out). */
int cuda_attention_tc_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse,
                               const float *delta, const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                               int T, int D, int H, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
