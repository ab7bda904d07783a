/* layers.cu — see layers.h. */
#include "layers.h"

#include <stdio.h>
#include <string.h>

#include "attention_tc.h"
#include "check.h"
#include "grid.h"

extern "C" {
#include "alloc.h"
#include "elementwise.h"
}
#include "codec_math.h"
#include "embed_buckets.h"

/* A kernel's output element: fp32, or bf16 rounded as codec_to_bf16 (the
 * bf16 path's stored operands), so one template gives both. */
__device__ static inline void put(float *p, float v) { *p = v; }
__device__ static inline void put(uint16_t *p, float v) { *p = codec_to_bf16(v); }
__device__ static inline float get(float v) { return v; }
__device__ static inline float get(uint16_t v) { return codec_from_bf16(v); }

__global__ static void to_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n) dst[i] = codec_to_bf16(src[i]);
}

extern "C" int cuda_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t stream)
{
    if (n) to_bf16_kernel<<<blocks_for(n), 256, 0, stream>>>(dst, src, n);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

__global__ static void encoder_forward_kernel(float *out, const int *tokens, const float *embed, size_t N, int D)
{
    GRID_STRIDE(k, N * (size_t)D) out[k] = embed[(size_t)tokens[k / D] * D + k % D];
}

/* One block per (token id, 256 columns): each id's rows added in position
 * order, as the CPU adds them (embed_buckets.h). */
__global__ static void encoder_backward_kernel(float *dembed, const float *dout, const int *ids, const int *start,
                                               const int *order, int D)
{
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < D) embed_bucket_column(dembed, dout, ids, start, order, blockIdx.x, c, D);
}

extern "C" int cuda_encoder_forward(float *out, const int *tokens, const float *embed, size_t N, int D,
                                    cudaStream_t stream)
{
    if (N && D) encoder_forward_kernel<<<blocks_for(N * (size_t)D), 256, 0, stream>>>(out, tokens, embed, N, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_encoder_backward(float *dembed, const float *dout, const int *ids, const int *start,
                                     const int *order, int n_ids, int D, cudaStream_t stream)
{
    if (n_ids && D)
        encoder_backward_kernel<<<dim3((unsigned)n_ids, (unsigned)((D + 255) / 256)), 256, 0, stream>>>(
            dembed, dout, ids, start, order, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

#define ROW_THREADS 256
#define RMS_CHUNKS 64 /* row ranges of the weight gradient's partial sums */

/* Sum of v over the block, the same tree every time; every thread gets it. */
__device__ static float block_sum(float v, float *shared)
{
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = ROW_THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    const float total = shared[0];
    __syncthreads();
    return total;
}

/* One block per row. */
template <typename Out>
__global__ static void rmsnorm_forward_kernel(Out *out, float *rstd, const float *inp, const float *weight, int D)
{
    __shared__ float shared[ROW_THREADS];
    const size_t t = blockIdx.x;
    const float *x = inp + t * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) ss += x[i] * x[i];
    const float r = rmsnorm_rstd(block_sum(ss, shared), D);
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) put(&out[t * D + i], x[i] * r * weight[i]);
    if (threadIdx.x == 0) rstd[t] = r;
}

/* h = a + b and out = rmsnorm(h) in one pass over the row: the residual
 * kernel's sums and rmsnorm_forward_kernel's arithmetic, in the same order
 * (each thread reads back only what it wrote), so the two kernels' bits. */
template <typename Out>
__global__ static void residual_rmsnorm_forward_kernel(float *h, Out *out, float *rstd, const float *a,
                                                       const float *b, const float *weight, int D)
{
    __shared__ float shared[ROW_THREADS];
    const size_t t = blockIdx.x;
    float *x = h + t * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) {
        const float v = a[t * D + i] + b[t * D + i];
        x[i] = v;
        ss += v * v;
    }
    const float r = rmsnorm_rstd(block_sum(ss, shared), D);
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) put(&out[t * D + i], x[i] * r * weight[i]);
    if (threadIdx.x == 0) rstd[t] = r;
}

template <typename Out>
static int residual_rmsnorm_forward(float *h, Out *out, float *rstd, const float *a, const float *b,
                                    const float *weight, size_t N, int D, cudaStream_t stream)
{
    if (N)
        residual_rmsnorm_forward_kernel<<<(unsigned)N, ROW_THREADS, 0, stream>>>(h, out, rstd, a, b, weight, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_residual_rmsnorm_forward(float *h, float *out, float *rstd, const float *a, const float *b,
                                             const float *weight, size_t N, int D, cudaStream_t stream)
{
    return residual_rmsnorm_forward(h, out, rstd, a, b, weight, N, D, stream);
}

extern "C" int cuda_residual_rmsnorm_forward_bf16(float *h, uint16_t *out, float *rstd, const float *a,
                                                  const float *b, const float *weight, size_t N, int D,
                                                  cudaStream_t stream)
{
    return residual_rmsnorm_forward(h, out, rstd, a, b, weight, N, D, stream);
}

/* One block per row: the input gradient. */
__global__ static void rmsnorm_backward_rows(float *dinp, const float *dout, const float *inp, const float *weight,
                                             const float *rstd, int D)
{
    __shared__ float shared[ROW_THREADS];
    const size_t t = blockIdx.x;
    const float *x = inp + t * D, *dy = dout + t * D;
    const float r = rstd[t];
    float dot = 0.0f; /* sum_i dy_i * g_i * x_i */
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) dot += dy[i] * weight[i] * x[i];
    const float k = r * r * r * block_sum(dot, shared) / (float)D;
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) dinp[t * D + i] += r * weight[i] * dy[i] - k * x[i];
}

/* partial[c][i] = sum over the rows of chunk c, in order, of dy * x * r. */
__global__ static void rmsnorm_backward_partials(float *partial, const float *dout, const float *inp, const float *rstd,
                                                 size_t N, int D)
{
    const int c = blockIdx.y;
    const size_t t0 = N * (size_t)c / RMS_CHUNKS, t1 = N * (size_t)(c + 1) / RMS_CHUNKS;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < D; i += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (size_t t = t0; t < t1; t++) s += dout[t * D + i] * inp[t * D + i] * rstd[t];
        partial[(size_t)c * D + i] = s;
    }
}

__global__ static void rmsnorm_backward_weight(float *dweight, const float *partial, int D)
{
    GRID_STRIDE(i, (size_t)D)
    {
        float s = 0.0f;
        for (int c = 0; c < RMS_CHUNKS; c++) s += partial[(size_t)c * D + i];
        dweight[i] += s;
    }
}

template <typename Out>
static int rmsnorm_forward(Out *out, float *rstd, const float *inp, const float *weight, size_t N, int D,
                           cudaStream_t stream)
{
    if (N) rmsnorm_forward_kernel<<<(unsigned)N, ROW_THREADS, 0, stream>>>(out, rstd, inp, weight, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, int D,
                                    cudaStream_t stream)
{
    return rmsnorm_forward(out, rstd, inp, weight, N, D, stream);
}

extern "C" int cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *inp, const float *weight, size_t N,
                                         int D, cudaStream_t stream)
{
    return rmsnorm_forward(out, rstd, inp, weight, N, D, stream);
}

extern "C" int cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, const float *rstd, size_t N, int D, cudaStream_t stream)
{
    if (!N) return ISTH_OK;
    float *partial;
    CHECK_CUDA(cudaMallocAsync((void **)&partial, sizeof(float) * RMS_CHUNKS * (size_t)D, stream));
    rmsnorm_backward_rows<<<(unsigned)N, ROW_THREADS, 0, stream>>>(dinp, dout, inp, weight, rstd, D);
    const dim3 grid((unsigned)((D + 255) / 256), RMS_CHUNKS);
    rmsnorm_backward_partials<<<grid, 256, 0, stream>>>(partial, dout, inp, rstd, N, D);
    rmsnorm_backward_weight<<<blocks_for((size_t)D), 256, 0, stream>>>(dweight, partial, D);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaFreeAsync(partial, stream));
    return ISTH_OK;
}

template <typename Out>
__global__ static void swiglu_forward_kernel(Out *h, const float *a, const float *u, size_t n)
{
    GRID_STRIDE(i, n) put(&h[i], swiglu_value(a[i], u[i]));
}

__global__ static void swiglu_backward_kernel(float *da, float *du, const float *dh, const float *a, const float *u,
                                              size_t n)
{
    GRID_STRIDE(i, n)
    {
        float dai, dui;
        swiglu_grads(dh[i], a[i], u[i], &dai, &dui);
        du[i] += dui;
        da[i] += dai;
    }
}

/* One thread per pair (b, t, h, i < Dh/2). */
__global__ static void rope_kernel(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                                   float direction)
{
    const int half = Dh / 2;
    const size_t pairs = (size_t)B * T * H * half;
    GRID_STRIDE(p, pairs)
    {
        const int i = (int)(p % half);
        const size_t bth = p / half;             /* (b, t, h) */
        const int t = (int)((bth / H) % T);
        float *v = x + bth * Dh;
        rope_rotate(&v[i], &v[i + half], cos_t[(size_t)t * half + i], direction * sin_t[(size_t)t * half + i]);
    }
}

template <typename Out>
static int swiglu_forward(Out *h, const float *a, const float *u, size_t n, cudaStream_t stream)
{
    if (n) swiglu_forward_kernel<<<blocks_for(n), 256, 0, stream>>>(h, a, u, n);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_swiglu_forward(float *h, const float *a, const float *u, size_t n, cudaStream_t stream)
{
    return swiglu_forward(h, a, u, n, stream);
}

extern "C" int cuda_swiglu_forward_bf16(uint16_t *h, const float *a, const float *u, size_t n, cudaStream_t stream)
{
    return swiglu_forward(h, a, u, n, stream);
}

extern "C" int cuda_swiglu_backward(float *da, float *du, const float *dh, const float *a, const float *u, size_t n,
                                    cudaStream_t stream)
{
    if (n) swiglu_backward_kernel<<<blocks_for(n), 256, 0, stream>>>(da, du, dh, a, u, n);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* One thread per pair of q and of k (rotated in fp32 as rope_kernel does,
 * then rounded) and the same two elements of v (rounded). */
__global__ static void rope_qkv_bf16_kernel(uint16_t *q, uint16_t *k, uint16_t *v, const float *qf, const float *kf,
                                            const float *vf, const float *cos_t, const float *sin_t, int B, int T,
                                            int H, int Dh)
{
    const int half = Dh / 2;
    const size_t pairs = (size_t)B * T * H * half;
    GRID_STRIDE(p, pairs)
    {
        const int i = (int)(p % half);
        const size_t bth = p / half, at = bth * Dh + i; /* element i of (b, t, h); its pair at + half */
        const int t = (int)((bth / H) % T);
        const float c = cos_t[(size_t)t * half + i], sn = sin_t[(size_t)t * half + i];
        float a = qf[at], b = qf[at + half];
        rope_rotate(&a, &b, c, sn);
        q[at] = codec_to_bf16(a);
        q[at + half] = codec_to_bf16(b);
        a = kf[at], b = kf[at + half];
        rope_rotate(&a, &b, c, sn);
        k[at] = codec_to_bf16(a);
        k[at + half] = codec_to_bf16(b);
        v[at] = codec_to_bf16(vf[at]);
        v[at + half] = codec_to_bf16(vf[at + half]);
    }
}

extern "C" int cuda_rope_qkv_bf16(uint16_t *q, uint16_t *k, uint16_t *v, const float *qf, const float *kf,
                                  const float *vf, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                                  cudaStream_t stream)
{
    const size_t pairs = (size_t)B * T * H * (Dh / 2);
    if (pairs)
        rope_qkv_bf16_kernel<<<blocks_for(pairs), 256, 0, stream>>>(q, k, v, qf, kf, vf, cos_t, sin_t, B, T, H, Dh);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

static int rope(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh, float direction,
                cudaStream_t stream)
{
    const size_t pairs = (size_t)B * T * H * (Dh / 2);
    if (pairs) rope_kernel<<<blocks_for(pairs), 256, 0, stream>>>(x, cos_t, sin_t, B, T, H, Dh, direction);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                                 cudaStream_t stream)
{
    return rope(x, cos_t, sin_t, B, T, H, Dh, 1.0f, stream);
}

extern "C" int cuda_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh,
                                  cudaStream_t stream)
{
    return rope(dx, cos_t, sin_t, B, T, H, Dh, -1.0f, stream);
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
    /* out^T (OC,N) = W^T (OC,C) . inp^T (C,N) */
    return gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, OC, (int)N, C, weight, OC, inp, C, 0.0f, out, OC);
}

extern "C" int cuda_matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                    const float *weight, size_t N, int C, int OC, const CudaBlas *blas)
{
    if (!N) return ISTH_OK;
    /* dinp^T (C,N) += W (C,OC) . dout^T (OC,N) */
    if (dinp) CHECK(gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, C, (int)N, OC, weight, OC, dout, OC, 1.0f, dinp, C));
    /* dW^T (OC,C) += dout^T (OC,N) . inp (N,C) */
    if (dweight) CHECK(gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, (int)N, dout, OC, inp, C, 1.0f, dweight, OC));
    return ISTH_OK;
}

extern "C" int cuda_matmul_forward_bf16(float *out, const uint16_t *inp, const uint16_t *weight, size_t N, int C,
                                        int OC, const CudaBlas *blas)
{
    return gemm_as(blas, 1, CUBLAS_OP_N, CUBLAS_OP_N, OC, (int)N, C, weight, OC, inp, C, 0.0f, out, OC);
}

extern "C" int cuda_matmul_backward_bf16(float *dinp, float *dweight, const float *dout, const uint16_t *inp,
                                         const uint16_t *weight, size_t N, int C, int OC, const CudaBlas *blas)
{
    if (!N || (!dinp && !dweight)) return ISTH_OK;
    const size_t n = N * (size_t)OC;
    uint16_t *d16; /* dout rounded once for both products */
    CHECK_CUDA(cudaMallocAsync((void **)&d16, n * sizeof(uint16_t), blas->stream));
    int rc = cuda_to_bf16(d16, dout, n, blas->stream);
    if (rc == ISTH_OK && dinp)
        rc = gemm_as(blas, 1, CUBLAS_OP_T, CUBLAS_OP_N, C, (int)N, OC, weight, OC, d16, OC, 1.0f, dinp, C);
    if (rc == ISTH_OK && dweight)
        rc = gemm_as(blas, 1, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, (int)N, d16, OC, inp, C, 1.0f, dweight, OC);
    CHECK_CUDA(cudaFreeAsync(d16, blas->stream)); /* stream-ordered: after the products */
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

/* --- many products in one call (layers.h: CudaGemmBatch) ---------------- */

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

/* --- attention: one thread per query (or key) row, tiles of keys (or
 * queries) in shared memory, an online softmax over the tiles ------------ */

#define ATT_ROWS 64 /* query (key) rows per block, one thread each */
#define ATT_TILE 32 /* key (query) rows per shared tile */

template <int DH>
__global__ static void attention_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                                                int T, int D, int H, float scale)
{
    __shared__ float ks[ATT_TILE][DH], vs[ATT_TILE][DH];
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int i0 = blockIdx.x * ATT_ROWS, i = i0 + threadIdx.x;
    const size_t base = (size_t)b * T * D + (size_t)h * DH;
    const bool live = i < T;
    float qr[DH], o[DH];
#pragma unroll
    for (int d = 0; d < DH; d++) {
        qr[d] = live ? q[base + (size_t)i * D + d] * scale : 0.0f;
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int last = min(i0 + ATT_ROWS, T) - 1; /* the block's last query: causal keys stop there */
    for (int j0 = 0; j0 <= last; j0 += ATT_TILE) {
        for (int x = threadIdx.x; x < ATT_TILE * DH; x += blockDim.x) {
            const int r = x / DH, d = x % DH, j = j0 + r;
            ks[r][d] = j < T ? k[base + (size_t)j * D + d] : 0.0f;
            vs[r][d] = j < T ? v[base + (size_t)j * D + d] : 0.0f;
        }
        __syncthreads();
        const int n = live ? min(ATT_TILE, i - j0 + 1) : 0; /* keys j0 .. i of this tile */
        if (n > 0) {
            float s[ATT_TILE], mt = m;
#pragma unroll
            for (int r = 0; r < ATT_TILE; r++) {
                float dot = 0.0f;
                if (r < n) {
#pragma unroll
                    for (int d = 0; d < DH; d++) dot += qr[d] * ks[r][d];
                    mt = fmaxf(mt, dot);
                }
                s[r] = dot;
            }
            const float corr = expf(m - mt); /* 0 on the first tile (m = -inf) */
            l *= corr;
#pragma unroll
            for (int d = 0; d < DH; d++) o[d] *= corr;
#pragma unroll
            for (int r = 0; r < ATT_TILE; r++)
                if (r < n) {
                    const float p = expf(s[r] - mt);
                    l += p;
#pragma unroll
                    for (int d = 0; d < DH; d++) o[d] += p * vs[r][d];
                }
            m = mt;
        }
        __syncthreads();
    }
    if (live) {
        const float inv = 1.0f / l;
#pragma unroll
        for (int d = 0; d < DH; d++) out[base + (size_t)i * D + d] = o[d] * inv;
        lse[(size_t)bh * T + i] = m + logf(l);
    }
}

/* dout as the backward's products read it beside an Out output: the
 * tensor-core kernels (bf16 out) read dout rounded to bf16, so delta does
 * too — its sum_j p_ij dp_ij then matches their dp and dS stays centred. */
__device__ static inline float as_read(float x, const float *) { return x; }
__device__ static inline float as_read(float x, const uint16_t *) { return codec_from_bf16(codec_to_bf16(x)); }

/* delta (B,H,T) = rowsum(dout * out) per head: sum_j p_ij dp_ij. */
template <typename Out>
__global__ static void attention_delta_kernel(float *delta, const float *dout, const Out *out, int B, int T, int D,
                                              int H)
{
    const int Dh = D / H;
    GRID_STRIDE(x, (size_t)B * H * T)
    {
        const int i = (int)(x % T);
        const size_t bh = x / T, b = bh / H, h = bh % H;
        const size_t at = b * T * D + (size_t)i * D + h * Dh;
        float s = 0.0f;
        for (int d = 0; d < Dh; d++) s += as_read(dout[at + d], out) * get(out[at + d]);
        delta[x] = s;
    }
}

/* dq: one thread per query, key tiles. */
template <int DH>
__global__ static void attention_dq_kernel(float *dq, const float *dout, const float *lse, const float *delta,
                                           const float *q, const float *k, const float *v, int T, int D, int H,
                                           float scale)
{
    __shared__ float ks[ATT_TILE][DH], vs[ATT_TILE][DH];
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int i0 = blockIdx.x * ATT_ROWS, i = i0 + threadIdx.x;
    const size_t base = (size_t)b * T * D + (size_t)h * DH;
    const bool live = i < T;
    float qr[DH], dor[DH], acc[DH];
#pragma unroll
    for (int d = 0; d < DH; d++) {
        qr[d] = live ? q[base + (size_t)i * D + d] * scale : 0.0f;
        dor[d] = live ? dout[base + (size_t)i * D + d] : 0.0f;
        acc[d] = 0.0f;
    }
    const float L = live ? lse[(size_t)bh * T + i] : 0.0f, Di = live ? delta[(size_t)bh * T + i] : 0.0f;
    const int last = min(i0 + ATT_ROWS, T) - 1;
    for (int j0 = 0; j0 <= last; j0 += ATT_TILE) {
        for (int x = threadIdx.x; x < ATT_TILE * DH; x += blockDim.x) {
            const int r = x / DH, d = x % DH, j = j0 + r;
            ks[r][d] = j < T ? k[base + (size_t)j * D + d] : 0.0f;
            vs[r][d] = j < T ? v[base + (size_t)j * D + d] : 0.0f;
        }
        __syncthreads();
        const int n = live ? min(ATT_TILE, i - j0 + 1) : 0;
        for (int r = 0; r < n; r++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < DH; d++) {
                s += qr[d] * ks[r][d];
                dp += dor[d] * vs[r][d];
            }
            const float ds = expf(s - L) * (dp - Di);
#pragma unroll
            for (int d = 0; d < DH; d++) acc[d] += ds * ks[r][d];
        }
        __syncthreads();
    }
    if (live)
#pragma unroll
        for (int d = 0; d < DH; d++) dq[base + (size_t)i * D + d] += acc[d] * scale;
}

/* dk, dv: one thread per key, query tiles from the block's first key on. */
template <int DH>
__global__ static void attention_dkdv_kernel(float *dk, float *dv, const float *dout, const float *lse,
                                             const float *delta, const float *q, const float *k, const float *v, int T,
                                             int D, int H, float scale)
{
    __shared__ float qs[ATT_TILE][DH], dos[ATT_TILE][DH], ls[ATT_TILE], ds_[ATT_TILE];
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int j0 = blockIdx.x * ATT_ROWS, j = j0 + threadIdx.x;
    const size_t base = (size_t)b * T * D + (size_t)h * DH;
    const bool live = j < T;
    float kr[DH], vr[DH], dka[DH], dva[DH];
#pragma unroll
    for (int d = 0; d < DH; d++) {
        kr[d] = live ? k[base + (size_t)j * D + d] : 0.0f;
        vr[d] = live ? v[base + (size_t)j * D + d] : 0.0f;
        dka[d] = dva[d] = 0.0f;
    }
    for (int i0 = j0; i0 < T; i0 += ATT_TILE) {
        for (int x = threadIdx.x; x < ATT_TILE * DH; x += blockDim.x) {
            const int r = x / DH, d = x % DH, i = i0 + r;
            qs[r][d] = i < T ? q[base + (size_t)i * D + d] * scale : 0.0f;
            dos[r][d] = i < T ? dout[base + (size_t)i * D + d] : 0.0f;
        }
        for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x) {
            const int i = i0 + r;
            ls[r] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
            ds_[r] = i < T ? delta[(size_t)bh * T + i] : 0.0f;
        }
        __syncthreads();
        if (live)
            for (int r = 0; r < ATT_TILE; r++) {
                const int i = i0 + r;
                if (i < j || i >= T) continue;
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < DH; d++) {
                    s += qs[r][d] * kr[d];
                    dp += dos[r][d] * vr[d];
                }
                const float p = expf(s - ls[r]), dsc = p * (dp - ds_[r]);
#pragma unroll
                for (int d = 0; d < DH; d++) {
                    dva[d] += p * dos[r][d];
                    dka[d] += dsc * qs[r][d]; /* qs holds scale * q */
                }
            }
        __syncthreads();
    }
    if (live)
#pragma unroll
        for (int d = 0; d < DH; d++) {
            dk[base + (size_t)j * D + d] += dka[d];
            dv[base + (size_t)j * D + d] += dva[d];
        }
}

extern "C" int cuda_attention_supports(int Dh) { return Dh == 16 || Dh == 32 || Dh == 64 || Dh == 128; }

#define ATT_DISPATCH(Dh, launch)                                                                  \
    switch (Dh) {                                                                                 \
    case 16: launch(16); break;                                                                   \
    case 32: launch(32); break;                                                                   \
    case 64: launch(64); break;                                                                   \
    case 128: launch(128); break;                                                                 \
    default: return isth_fail(ISTH_EINPUT, "CUDA attention: head dimension %d is not one of 16, 32, 64, 128", Dh); \
    }

extern "C" int cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                      int T, int D, int H, cudaStream_t stream)
{
    const int Dh = D / H;
    if (!B || !T) return ISTH_OK;
    const dim3 grid((unsigned)((T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)(B * H));
    const float scale = 1.0f / sqrtf((float)Dh);
#define LAUNCH_FWD(DH) attention_forward_kernel<DH><<<grid, ATT_ROWS, 0, stream>>>(out, lse, q, k, v, T, D, H, scale)
    ATT_DISPATCH(Dh, LAUNCH_FWD)
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* delta (B,H,T) = rowsum(dout * out), into scratch from the stream's pool
 * (the caller frees it on the stream). */
template <typename Out>
static int attention_delta(float **delta, const float *dout, const Out *out, int B, int T, int D, int H,
                           cudaStream_t stream)
{
    const size_t rows = (size_t)B * H * T;
    CHECK_CUDA(cudaMallocAsync((void **)delta, sizeof(float) * rows, stream));
    attention_delta_kernel<<<blocks_for(rows), 256, 0, stream>>>(*delta, dout, out, B, T, D, H);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        cudaFreeAsync(*delta, stream);
        *delta = NULL;
        CHECK_CUDA(e);
    }
    return ISTH_OK;
}

extern "C" int cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                       int D, int H, cudaStream_t stream)
{
    const int Dh = D / H;
    if (!B || !T) return ISTH_OK;
    if (!cuda_attention_supports(Dh))
        return isth_fail(ISTH_EINPUT, "CUDA attention: head dimension %d is not one of 16, 32, 64, 128", Dh);
    float *delta;
    CHECK(attention_delta(&delta, dout, out, B, T, D, H, stream));
    const dim3 grid((unsigned)((T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)(B * H));
    const float scale = 1.0f / sqrtf((float)Dh);
#define LAUNCH_BWD(DH)                                                                                        \
    attention_dq_kernel<DH><<<grid, ATT_ROWS, 0, stream>>>(dq, dout, lse, delta, q, k, v, T, D, H, scale);    \
    attention_dkdv_kernel<DH><<<grid, ATT_ROWS, 0, stream>>>(dk, dv, dout, lse, delta, q, k, v, T, D, H, scale)
    ATT_DISPATCH(Dh, LAUNCH_BWD)
    const cudaError_t e = cudaGetLastError();
    cudaFreeAsync(delta, stream); /* stream-ordered: after the kernels, or at once if none was queued */
    CHECK_CUDA(e);
    return ISTH_OK;
}

/* bf16 runs attention on the tensor cores only (a second set of the fp32
 * kernels reading and writing bf16 would triple this file's compile time
 * for head dimensions no bf16 config uses); cuda_acts_create refuses a
 * bf16 model whose head dimension they do not take. */
static int tc_only(int Dh)
{
    if (cuda_attention_tc_supports(Dh)) return ISTH_OK;
    return isth_fail(ISTH_EINPUT, "CUDA attention in bf16: head dimension %d: the tensor-core kernels take 64 and 128, "
                     "on a GPU with the shared memory they need; use train.precision = fp32", Dh);
}

extern "C" int cuda_attention_forward_as(int bf16, void *out, float *lse, const void *q, const void *k, const void *v,
                                         int B, int T, int D, int H, cudaStream_t stream)
{
    if (!bf16)
        return cuda_attention_forward((float *)out, lse, (const float *)q, (const float *)k, (const float *)v, B, T, D,
                                      H, stream);
    CHECK(tc_only(D / H));
    return cuda_attention_tc_forward((uint16_t *)out, lse, (const uint16_t *)q, (const uint16_t *)k,
                                     (const uint16_t *)v, B, T, D, H, stream);
}

extern "C" int cuda_attention_backward_as(int bf16, float *dq, float *dk, float *dv, const float *dout,
                                          const void *out, const float *lse, const void *q, const void *k,
                                          const void *v, int B, int T, int D, int H, cudaStream_t stream)
{
    if (!bf16)
        return cuda_attention_backward(dq, dk, dv, dout, (const float *)out, lse, (const float *)q, (const float *)k,
                                       (const float *)v, B, T, D, H, stream);
    CHECK(tc_only(D / H));
    if (!B || !T) return ISTH_OK;
    float *delta;
    CHECK(attention_delta(&delta, dout, (const uint16_t *)out, B, T, D, H, stream));
    const int rc = cuda_attention_tc_backward(dq, dk, dv, dout, lse, delta, (const uint16_t *)q, (const uint16_t *)k,
                                              (const uint16_t *)v, B, T, D, H, stream);
    CHECK_CUDA(cudaFreeAsync(delta, stream));
    return rc;
}

/* --- the fused softmax cross-entropy ------------------------------------- */

/* Max of v over the block, the same tree every time. */
__device__ static float block_max(float v, float *shared)
{
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = ROW_THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    const float total = shared[0];
    __syncthreads();
    return total;
}

__global__ static void crossentropy_forward_kernel(float *losses, float *probs_logits, const int *targets, int V)
{
    __shared__ float shared[ROW_THREADS];
    const size_t t = blockIdx.x;
    float *row = probs_logits + t * V;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += ROW_THREADS) mx = fmaxf(mx, row[j]);
    mx = block_max(mx, shared);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += ROW_THREADS) sum += expf(row[j] - mx);
    const float lse = logf(block_sum(sum, shared)) + mx;
    if (threadIdx.x == 0) losses[t] = targets[t] >= 0 ? lse - row[targets[t]] : 0.0f;
    __syncthreads(); /* the target's logit is read before the row becomes probabilities */
    for (int j = threadIdx.x; j < V; j += ROW_THREADS) row[j] = expf(row[j] - lse);
}

__global__ static void crossentropy_backward_kernel(float *dlogits, const float *probs, const int *targets, float scale,
                                                    size_t N, int V)
{
    GRID_STRIDE(x, N * (size_t)V)
    {
        const size_t t = x / V;
        const int j = (int)(x % V);
        const int y = targets[t];
        dlogits[x] = y < 0 ? 0.0f : probs[x] * scale - (j == y ? scale : 0.0f);
    }
}

extern "C" int cuda_crossentropy_forward(float *losses, float *probs_logits, const int *targets, size_t N, int V,
                                         cudaStream_t stream)
{
    if (N) crossentropy_forward_kernel<<<(unsigned)N, ROW_THREADS, 0, stream>>>(losses, probs_logits, targets, V);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_crossentropy_backward(float *dlogits, const float *probs, const int *targets, float scale,
                                          size_t N, int V, cudaStream_t stream)
{
    if (N) crossentropy_backward_kernel<<<blocks_for(N * (size_t)V), 256, 0, stream>>>(dlogits, probs, targets, scale, N, V);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

__global__ static void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ static void scale_kernel(float *v, float factor, size_t n)
{
    GRID_STRIDE(i, n) v[i] *= factor;
}

extern "C" int cuda_residual_forward(float *out, const float *a, const float *b, size_t n, cudaStream_t stream)
{
    if (n) residual_kernel<<<blocks_for(n), 256, 0, stream>>>(out, a, b, n);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_scale(float *v, float factor, size_t n, cudaStream_t stream)
{
    if (n) scale_kernel<<<blocks_for(n), 256, 0, stream>>>(v, factor, n);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}
