/* gemm.h (cuda/) — the matrix products through cuBLAS, mirroring the
 * products of src/cpu/layers.h (matmul, the tied head; cblas there):
 * column-major underneath (a row-major (R,C) array is a column-major (C,R)
 * one, so each product is written transposed), fp32 pedantic or bf16
 * operands with fp32 accumulation, and a layer's experts' products of
 * different shapes grouped into one call.
 *
 * Owns: the cuBLAS handle bound to a stream (CudaBlas), the precision a
 * product runs in, the grouped batches and when cuBLAS refuses to group.
 * Must not: allocate activations (callers hand device buffers), or know
 * which layer a product belongs to.
 */
#ifndef ISTHMUS_CUDA_GEMM_H
#define ISTHMUS_CUDA_GEMM_H

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
/* The products above (bf16: the _bf16 ones) on OC columns of a weight and
 * its gradient stored with rows of ldw >= OC elements, weight and dweight
 * pointing at the first column used (a router's columns of one site's
 * experts, cpu/layers.h's matmul_*_ldw). ldw = OC: the products above. */
int cuda_matmul_forward_ldw(int bf16, float *out, const void *inp, const void *weight, int ldw, size_t N, int C,
                            int OC, const CudaBlas *blas);
int cuda_matmul_backward_ldw(int bf16, float *dinp, float *dweight, const float *dout, const void *inp,
                             const void *weight, int ldw, size_t N, int C, int OC, const CudaBlas *blas);

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

#ifdef __cplusplus
}
#endif

#endif
