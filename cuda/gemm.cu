/* gemm.cu — see gemm.h. */
#include "gemm.h"

#include <string.h>

#include "check.h"
#include "layers.h" /* cuda_to_bf16: a gradient rounded once for the bf16 products */

extern "C" {
#include "alloc.h"
}

/* --- matrix products (cuBLAS, column-major: a row-major (R,C) array is a
 * column-major (C,R) one, so each product is written transposed) ---------- */

extern "C" int cuda_blas_create(CudaBlas *b, cudaStream_t stream, int bf16)
{
    b->stream = stream;
    b->bf16 = bf16;
    b->handle = NULL; /* a failed create leaves nothing for cuda_blas_destroy */
    CHECK_CUBLAS(cublasCreate(&b->handle));
    CHECK_CUBLAS(cublasSetStream(b->handle, stream));
    /* fp32 stays fp32: no TF32 or other reduced precision. The bf16 path
     * asks for its precision per call (bf16 operands, or FAST_16BF on fp32
     * ones), so it takes the default mode: the library's fastest kernels
     * for what is asked */
    CHECK_CUBLAS(cublasSetMathMode(b->handle, bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
    return ISTH_OK;
}

extern "C" void cuda_blas_destroy(CudaBlas *b)
{
    if (b->handle) cublasDestroy(b->handle);
    b->handle = NULL;
}

/* C (m,n) = alpha op(A) op(B) + beta C, column-major; A and B fp32, or
 * both bf16 (bf16 != 0); C fp32. */
static int gemm_as(const CudaBlas *b, int bf16, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc)
{
    if (!m || !n) return ISTH_OK;
    const float alpha = 1.0f;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = bf16      ? CUBLAS_COMPUTE_32F
                                        : b->bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                  : CUBLAS_COMPUTE_32F_PEDANTIC;
    CHECK_CUBLAS(cublasGemmEx(b->handle, ta, tb, m, n, k, &alpha, A, type, lda, B, type, ldb, &beta, C, CUDA_R_32F,
                              ldc, compute, CUBLAS_GEMM_DEFAULT));
    return ISTH_OK;
}

static int gemm(const CudaBlas *b, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    return gemm_as(b, 0, ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
}

extern "C" int cuda_matmul_forward(float *out, const float *inp, const float *weight, size_t N, int C, int OC,
                                   const CudaBlas *blas)
{
    return cuda_matmul_forward_ldw(0, out, inp, weight, OC, N, C, OC, blas);
}

extern "C" int cuda_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                    const float *weight, size_t N, int C, int OC, const CudaBlas *blas)
{
    return cuda_matmul_backward_ldw(0, dinp, dweight, dout, inp, weight, OC, N, C, OC, blas);
}

extern "C" int cuda_matmul_forward_bf16(float *out, const uint16_t *inp, const uint16_t *weight, size_t N, int C,
                                        int OC, const CudaBlas *blas)
{
    return cuda_matmul_forward_ldw(1, out, inp, weight, OC, N, C, OC, blas);
}

extern "C" int cuda_matmul_backward_bf16(float *dinp, float *dweight, const float *dout, const uint16_t *inp,
                                         const uint16_t *weight, size_t N, int C, int OC, const CudaBlas *blas)
{
    return cuda_matmul_backward_ldw(1, dinp, dweight, dout, inp, weight, OC, N, C, OC, blas);
}

extern "C" int cuda_matmul_forward_ldw(int bf16, float *out, const void *inp, const void *weight, int ldw, size_t N,
                                       int C, int OC, const CudaBlas *blas)
{
    /* out^T (OC,N) = W^T (OC,C) . inp^T (C,N) */
    return gemm_as(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_N, OC, (int)N, C, weight, ldw, inp, C, 0.0f, out, OC);
}

extern "C" int cuda_matmul_backward_ldw(int bf16, float *dinp, float *dweight, const float *dout, const void *inp,
                                        const void *weight, int ldw, size_t N, int C, int OC, const CudaBlas *blas)
{
    if (!N || (!dinp && !dweight)) return ISTH_OK;
    const void *d = dout;
    uint16_t *d16 = NULL; /* bf16: dout rounded once for both products */
    const size_t n = N * (size_t)OC;
    if (bf16) {
        CHECK_CUDA(cudaMallocAsync((void **)&d16, n * sizeof(uint16_t), blas->stream));
        d = d16;
    }
    int rc = bf16 ? cuda_to_bf16(d16, dout, n, blas->stream) : ISTH_OK;
    /* dinp^T (C,N) += W (C,OC) . dout^T (OC,N) */
    if (rc == ISTH_OK && dinp)
        rc = gemm_as(blas, bf16, CUBLAS_OP_T, CUBLAS_OP_N, C, (int)N, OC, weight, ldw, d, OC, 1.0f, dinp, C);
    /* dW^T (OC,C) += dout^T (OC,N) . inp (N,C) */
    if (rc == ISTH_OK && dweight)
        rc = gemm_as(blas, bf16, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, (int)N, d, OC, inp, C, 1.0f, dweight, ldw);
    if (d16) CHECK_CUDA(cudaFreeAsync(d16, blas->stream)); /* stream-ordered: after the products */
    return rc;
}

extern "C" int cuda_tied_head_forward(float *logits, const float *x, const float *embed, size_t N, int D, int V,
                                      const CudaBlas *blas)
{
    /* logits^T (V,N) = embed (V,D) . x^T (D,N) */
    return gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, V, (int)N, D, embed, D, x, D, 0.0f, logits, V);
}

extern "C" int cuda_tied_head_backward(float *dx, float *dembed, const float *dlogits, const float *x,
                                       const float *embed, size_t N, int D, int V, const CudaBlas *blas)
{
    if (!N) return ISTH_OK;
    /* dx^T (D,N) += embed^T (D,V) . dlogits^T (V,N) */
    CHECK(gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, D, (int)N, V, embed, D, dlogits, V, 1.0f, dx, D));
    /* dembed^T (D,V) += x^T (D,N) . dlogits (N,V) */
    CHECK(gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, D, V, (int)N, x, D, dlogits, V, 1.0f, dembed, D));
    return ISTH_OK;
}

/* --- many products in one call (gemm.h: CudaGemmBatch) ---------------- */

/* The pointers of up to PTR_CHUNK problems, passed by value: a kernel's
 * arguments are captured at launch, so the host may refill its arrays at
 * once (an upload from host memory would have to wait for the DMA).
 * 3 * 128 pointers: 3 KiB, within the 4 KiB every architecture takes. */
#define PTR_CHUNK 128
struct PtrChunk {
    const void *p[3][PTR_CHUNK];
};

__global__ static void fill_ptrs_kernel(PtrChunk c, int n, void **d_a, void **d_b, void **d_c)
{
    const int i = threadIdx.x;
    if (i >= n) return;
    d_a[i] = (void *)c.p[0][i];
    d_b[i] = (void *)c.p[1][i];
    d_c[i] = (void *)c.p[2][i];
}

/* Once cuBLAS refuses a grouped call of a kind (fp32 operands in fp32,
 * fp32 operands in FAST_16BF, bf16 operands), the process runs that
 * kind's problems one by one; how the last batch ran (for the GPU test's
 * log). */
static int grouped_refused[3], last_grouped;

extern "C" int cuda_gemm_batch_last_grouped(void) { return last_grouped; }

extern "C" int cuda_gemm_batch_create(CudaGemmBatch *g, int cap)
{
    memset(g, 0, sizeof *g);
    if (cap < 1) cap = 1;
    g->cap = cap;
    const size_t n = (size_t)cap;
    g->ta = (cublasOperation_t *)isth_calloc(n, sizeof *g->ta);
    g->tb = (cublasOperation_t *)isth_calloc(n, sizeof *g->tb);
    int **ints[] = {&g->m, &g->nn, &g->k, &g->lda, &g->ldb, &g->ldc, &g->group_size};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) *ints[i] = (int *)isth_calloc(n, sizeof(int));
    g->alpha = (float *)isth_calloc(n, sizeof(float));
    g->beta = (float *)isth_calloc(n, sizeof(float));
    g->A = (const void **)isth_calloc(n, sizeof(void *));
    g->B = (const void **)isth_calloc(n, sizeof(void *));
    g->C = (float **)isth_calloc(n, sizeof(float *));
    int ok = g->ta && g->tb && g->alpha && g->beta && g->A && g->B && g->C;
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) ok = ok && *ints[i];
    if (!ok) {
        cuda_gemm_batch_destroy(g);
        return isth_fail(ISTH_ERUNTIME, "out of host memory for a batch of %d products", cap);
    }
    CHECK_CUDA(cudaMalloc((void **)&g->d_ptrs, 3 * n * sizeof(void *)));
    return ISTH_OK;
}

extern "C" void cuda_gemm_batch_destroy(CudaGemmBatch *g)
{
    void *host[] = {g->ta, g->tb, g->m, g->nn, g->k, g->lda, g->ldb, g->ldc, g->group_size, g->alpha, g->beta,
                    (void *)g->A, (void *)g->B, (void *)g->C};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) isth_free(host[i]);
    if (g->d_ptrs) cudaFree(g->d_ptrs);
    memset(g, 0, sizeof *g);
}

static int batch_add(CudaGemmBatch *g, int bf16, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc)
{
    if (!m || !n) return ISTH_OK;
    if (g->n == g->cap) return isth_fail(ISTH_ERUNTIME, "a batch of products holds %d; one more was queued", g->cap);
    if (!g->n) g->bf16_operands = bf16;
    if (g->bf16_operands != bf16)
        return isth_fail(ISTH_ERUNTIME, "a batch of products mixes fp32 and bf16 operands (one call takes one type)");
    const int i = g->n++;
    g->ta[i] = ta;
    g->tb[i] = tb;
    g->m[i] = m;
    g->nn[i] = n;
    g->k[i] = k;
    g->A[i] = A;
    g->lda[i] = lda;
    g->B[i] = B;
    g->ldb[i] = ldb;
    g->C[i] = C;
    g->ldc[i] = ldc;
    g->alpha[i] = 1.0f;
    g->beta[i] = beta;
    g->group_size[i] = 1;
    return ISTH_OK;
}

/* The same (transposed) products as cuda_matmul_forward / _backward. */
extern "C" int cuda_gemm_batch_forward(CudaGemmBatch *g, int bf16, float *out, const void *inp, const void *weight,
                                       size_t N, int C, int OC)
{
    return batch_add(g, bf16, CUBLAS_OP_N, CUBLAS_OP_N, OC, (int)N, C, weight, OC, inp, C, 0.0f, out, OC);
}

extern "C" int cuda_gemm_batch_dinp(CudaGemmBatch *g, int bf16, float *dinp, const void *dout, const void *weight,
                                    size_t N, int C, int OC)
{
    return batch_add(g, bf16, CUBLAS_OP_T, CUBLAS_OP_N, C, (int)N, OC, weight, OC, dout, OC, 1.0f, dinp, C);
}

extern "C" int cuda_gemm_batch_dweight(CudaGemmBatch *g, int bf16, float *dweight, const void *dout, const void *inp,
                                       size_t N, int C, int OC)
{
    if (!N) return ISTH_OK;
    return batch_add(g, bf16, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, (int)N, dout, OC, inp, C, 1.0f, dweight, OC);
}

extern "C" int cuda_gemm_batch_run(CudaGemmBatch *g, const CudaBlas *b)
{
    const int n = g->n;
    g->n = 0;
    if (!n) return ISTH_OK;
    last_grouped = 0;
    const int bf16 = g->bf16_operands, kind = bf16 ? 2 : b->bf16 ? 1 : 0;
    static const char *const kind_name[3] = {"fp32", "fp32-as-bf16 (FAST_16BF)", "bf16-operand"};
    if (!grouped_refused[kind] && n > 1) {
        void **d_a = g->d_ptrs, **d_b = g->d_ptrs + g->cap, **d_c = g->d_ptrs + 2 * g->cap;
        for (int at = 0; at < n; at += PTR_CHUNK) {
            const int c = n - at < PTR_CHUNK ? n - at : PTR_CHUNK;
            PtrChunk chunk;
            for (int i = 0; i < c; i++) {
                chunk.p[0][i] = g->A[at + i];
                chunk.p[1][i] = g->B[at + i];
                chunk.p[2][i] = g->C[at + i];
            }
            fill_ptrs_kernel<<<1, PTR_CHUNK, 0, b->stream>>>(chunk, c, d_a + at, d_b + at, d_c + at);
            CHECK_CUDA(cudaGetLastError());
        }
        /* fp32: COMPUTE_32F, the type the grouped call documents (the
         * handle's pedantic math mode keeps it from TF32); bf16 operands
         * with an fp32 C: COMPUTE_32F, which a library may not group */
        const cublasComputeType_t compute = kind == 1 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
        const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
        const cublasStatus_t st = cublasGemmGroupedBatchedEx(
            b->handle, g->ta, g->tb, g->m, g->nn, g->k, g->alpha, (const void *const *)d_a, type, g->lda,
            (const void *const *)d_b, type, g->ldb, g->beta, (void *const *)d_c, CUDA_R_32F, g->ldc, n,
            g->group_size, compute);
        if (st == CUBLAS_STATUS_SUCCESS) {
            last_grouped = 1;
            return ISTH_OK;
        }
        if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
            CHECK_CUBLAS(st); /* a real failure: reported as any cuBLAS error */
        grouped_refused[kind] = 1; /* this library does not group these types: one call each from now on */
        fprintf(stderr, "isthmus: cuBLAS does not group %s products (status %d): one call each\n", kind_name[kind],
                (int)st);
    }
    for (int i = 0; i < n; i++)
        CHECK(gemm_as(b, bf16, g->ta[i], g->tb[i], g->m[i], g->nn[i], g->k[i], g->A[i], g->lda[i], g->B[i],
                      g->ldb[i], g->beta[i], g->C[i], g->ldc[i]));
    return ISTH_OK;
}

