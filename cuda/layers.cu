/* layers.cu — see layers.h: the element-wise and row kernels. The matrix
 * products are gemm.cu's, the fp32 attention attention.cu's. */
#include "layers.h"

#include <stdio.h>
#include <string.h>

#include "check.h"
#include "grid.h"
#include "operand.h"

extern "C" {
#include "alloc.h"
#include "elementwise.h"
}
#include "codec_math.h"
#include "embed_buckets.h"

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
