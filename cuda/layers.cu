/* layers.cu — see layers.h. */
#include "layers.h"
#include "check.h"

extern "C" {
#include "elementwise.h"
}

/* Grid of at most 4096 blocks of 256 threads; kernels stride over the rest. */
static unsigned blocks_for(size_t n) { return (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ static void encoder_forward_kernel(float *out, const int *tokens, const float *embed, size_t N, int D)
{
    GRID_STRIDE(k, N * (size_t)D) out[k] = embed[(size_t)tokens[k / D] * D + k % D];
}

__global__ static void encoder_backward_kernel(float *dembed, const float *dout, const int *tokens, size_t N, int D)
{
    GRID_STRIDE(c, (size_t)D)
    for (size_t t = 0; t < N; t++) dembed[(size_t)tokens[t] * D + c] += dout[t * D + c];
}

extern "C" int cuda_encoder_forward(float *out, const int *tokens, const float *embed, size_t N, int D,
                                    cudaStream_t stream)
{
    if (N && D) encoder_forward_kernel<<<blocks_for(N * (size_t)D), 256, 0, stream>>>(out, tokens, embed, N, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_encoder_backward(float *dembed, const float *dout, const int *tokens, size_t N, int D,
                                     cudaStream_t stream)
{
    if (N && D) encoder_backward_kernel<<<blocks_for((size_t)D), 256, 0, stream>>>(dembed, dout, tokens, N, D);
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
__global__ static void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *weight, int D)
{
    __shared__ float shared[ROW_THREADS];
    const size_t t = blockIdx.x;
    const float *x = inp + t * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) ss += x[i] * x[i];
    const float r = rmsnorm_rstd(block_sum(ss, shared), D);
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) out[t * D + i] = x[i] * r * weight[i];
    if (threadIdx.x == 0) rstd[t] = r;
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

extern "C" int cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, int D,
                                    cudaStream_t stream)
{
    if (N) rmsnorm_forward_kernel<<<(unsigned)N, ROW_THREADS, 0, stream>>>(out, rstd, inp, weight, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
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

__global__ static void swiglu_forward_kernel(float *h, const float *a, const float *u, size_t n)
{
    GRID_STRIDE(i, n) h[i] = swiglu_value(a[i], u[i]);
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

extern "C" int cuda_swiglu_forward(float *h, const float *a, const float *u, size_t n, cudaStream_t stream)
{
    if (n) swiglu_forward_kernel<<<blocks_for(n), 256, 0, stream>>>(h, a, u, n);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_swiglu_backward(float *da, float *du, const float *dh, const float *a, const float *u, size_t n,
                                    cudaStream_t stream)
{
    if (n) swiglu_backward_kernel<<<blocks_for(n), 256, 0, stream>>>(da, du, dh, a, u, n);
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
