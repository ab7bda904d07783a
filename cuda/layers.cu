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
