/* moe.cu — see moe.h. */
#include "moe.h"
#include "check.h"
#include "grid.h"

/* The softmax of one token's E logits, the CPU's loop. */
__global__ static void router_softmax_kernel(float *probs, float *lse, const float *logits, size_t N, int E)
{
    GRID_STRIDE(t, N)
    {
        const float *z = logits + t * E;
        float *p = probs + t * E;
        float mx = z[0];
        for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += expf(z[e] - mx);
        const float l = logf(sum) + mx;
        for (int e = 0; e < E; e++) p[e] = expf(z[e] - l);
        lse[t] = l;
    }
}

/* Repeated argmax; strict '>' keeps the lower index on ties (as the CPU). */
__global__ static void router_topk_kernel(int *choice, const float *probs, size_t N, int E, int K)
{
    GRID_STRIDE(t, N)
    {
        const float *p = probs + t * E;
        int *c = choice + t * K;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= c[j] == e;
                if (taken) continue;
                if (best < 0 || p[e] > p[best]) best = e;
            }
            c[k] = best;
        }
    }
}

/* One thread per expert, tokens in order. */
__global__ static void router_mean_prob_kernel(double *mean_prob, const float *probs, size_t N, int E)
{
    GRID_STRIDE(e, (size_t)E)
    {
        double s = 0.0;
        for (size_t t = 0; t < N; t++) s += probs[t * E + e];
        mean_prob[e] = N ? s / (double)N : 0.0;
    }
}

__global__ static void balance_backward_kernel(float *dprobs, const double *frac, size_t N, int E, double coef,
                                               float scale)
{
    GRID_STRIDE(x, N * (size_t)E) dprobs[x] += (float)(scale * coef * E * frac[x % E] / (double)N);
}

__global__ static void router_softmax_backward_kernel(float *dlogits, const float *dprobs, const float *probs,
                                                      const float *lse, size_t N, int E, float zc)
{
    GRID_STRIDE(t, N)
    {
        const float *p = probs + t * E, *dp = dprobs + t * E;
        float *dz = dlogits + t * E;
        float dot = 0.0f;
        for (int e = 0; e < E; e++) dot += p[e] * dp[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dp[e] - dot) + zc * lse[t] * p[e];
    }
}

extern "C" int cuda_router_softmax_forward(float *probs, float *lse, const float *logits, size_t N, int E,
                                           cudaStream_t stream)
{
    if (N) router_softmax_kernel<<<blocks_for(N), 256, 0, stream>>>(probs, lse, logits, N, E);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_router_topk(int *choice, const float *probs, size_t N, int E, int K, cudaStream_t stream)
{
    if (N) router_topk_kernel<<<blocks_for(N), 256, 0, stream>>>(choice, probs, N, E, K);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_router_mean_prob(double *mean_prob, const float *probs, size_t N, int E, cudaStream_t stream)
{
    router_mean_prob_kernel<<<blocks_for((size_t)E), 256, 0, stream>>>(mean_prob, probs, N, E);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_moe_balance_backward(float *dprobs, const double *frac, size_t N, int E, double coef, float scale,
                                         cudaStream_t stream)
{
    if (N) balance_backward_kernel<<<blocks_for(N * (size_t)E), 256, 0, stream>>>(dprobs, frac, N, E, coef, scale);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_router_softmax_backward(float *dlogits, const float *dprobs, const float *probs, const float *lse,
                                            size_t N, int E, double z_coef, float scale, cudaStream_t stream)
{
    const float zc = N ? (float)(scale * z_coef * 2.0 / (double)N) : 0.0f; /* d(lse^2) = 2 lse p */
    if (N) router_softmax_backward_kernel<<<blocks_for(N), 256, 0, stream>>>(dlogits, dprobs, probs, lse, N, E, zc);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_expert_forward(float *y, float *a, float *u, float *h, const float *x, const float *wg,
                                   const float *wu, const float *wd, size_t n, int D, int F, const CudaBlas *blas)
{
    if (!n) return ISTH_OK;
    CHECK(cuda_matmul_forward(a, x, wg, n, D, F, blas));
    CHECK(cuda_matmul_forward(u, x, wu, n, D, F, blas));
    CHECK(cuda_swiglu_forward(h, a, u, n * (size_t)F, blas->stream));
    return cuda_matmul_forward(y, h, wd, n, F, D, blas);
}

extern "C" int cuda_expert_backward(float *dx, float *dwg, float *dwu, float *dwd, float *scratch, const float *dy,
                                    const float *x, const float *a, const float *u, const float *h, const float *wg,
                                    const float *wu, const float *wd, size_t n, int D, int F, const CudaBlas *blas)
{
    if (!n) return ISTH_OK;
    const size_t nF = n * (size_t)F;
    float *dh = scratch, *da = scratch + nF, *du = scratch + 2 * nF;
    CHECK_CUDA(cudaMemsetAsync(scratch, 0, 3 * nF * sizeof(float), blas->stream));
    CHECK(cuda_matmul_backward(dh, dwd, dy, h, wd, n, F, D, blas));
    CHECK(cuda_swiglu_backward(da, du, dh, a, u, nF, blas->stream));
    CHECK(cuda_matmul_backward(dx, dwg, da, x, wg, n, D, F, blas));
    return cuda_matmul_backward(dx, dwu, du, x, wu, n, D, F, blas);
}

__global__ static void rows_gather_kernel(float *dst, const float *src, const int *index, size_t n, int D)
{
    GRID_STRIDE(x, n * (size_t)D)
    {
        const int from = index[x / D];
        dst[x] = from >= 0 ? src[(size_t)from * D + x % D] : 0.0f;
    }
}

/* One thread per (token, column): the K copies in order, as the CPU. */
__global__ static void combine_forward_kernel(float *out, const float *probs, const int *choice, const int *copy_slot,
                                              const float *y_back, size_t N, int E, int K, int D)
{
    GRID_STRIDE(x, N * (size_t)D)
    {
        const size_t t = x / D, i = x % D;
        float o = 0.0f;
        for (int k = 0; k < K; k++) {
            const size_t copy = t * K + k;
            o += probs[t * E + choice[copy]] * y_back[(size_t)copy_slot[copy] * D + i];
        }
        out[x] = o;
    }
}

__global__ static void combine_backward_rows(float *dy_send, const float *dout, const float *probs, const int *choice,
                                             const int *copy_slot, size_t N, int E, int K, int D)
{
    GRID_STRIDE(x, N * (size_t)K * D)
    {
        const size_t copy = x / D, t = copy / K, i = x % D;
        dy_send[(size_t)copy_slot[copy] * D + i] = probs[t * E + choice[copy]] * dout[t * D + i];
    }
}

/* One thread per copy: the dot product in column order, as the CPU. */
__global__ static void combine_backward_gates(float *dprobs, const float *dout, const int *choice,
                                              const int *copy_slot, const float *y_back, size_t N, int E, int K, int D)
{
    GRID_STRIDE(copy, N * (size_t)K)
    {
        const size_t t = copy / K;
        const float *d = dout + t * D, *y = y_back + (size_t)copy_slot[copy] * D;
        float dot = 0.0f;
        for (int i = 0; i < D; i++) dot += d[i] * y[i];
        /* K distinct experts per token: no two threads add to one entry */
        dprobs[t * E + choice[copy]] += dot;
    }
}

__global__ static void scatter_add_kernel(float *dinp, const float *dx_send, const int *copy_slot, size_t N, int K,
                                          int D)
{
    GRID_STRIDE(x, N * (size_t)D)
    {
        const size_t t = x / D, i = x % D;
        float s = dinp[x];
        for (int k = 0; k < K; k++) s += dx_send[(size_t)copy_slot[t * K + k] * D + i];
        dinp[x] = s;
    }
}

extern "C" int cuda_rows_gather(float *dst, const float *src, const int *index, size_t n, int D, cudaStream_t stream)
{
    if (n) rows_gather_kernel<<<blocks_for(n * (size_t)D), 256, 0, stream>>>(dst, src, index, n, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_moe_combine_forward(float *out, const CudaRouting *r, size_t N, int E, int K, int D,
                                        cudaStream_t stream)
{
    if (N)
        combine_forward_kernel<<<blocks_for(N * (size_t)D), 256, 0, stream>>>(out, r->d_probs, r->d_choice,
                                                                              r->d_copy_slot, r->d_y_back, N, E, K, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_moe_combine_backward(float *dy_send, float *dprobs, const float *dout, const CudaRouting *r,
                                         size_t N, int E, int K, int D, cudaStream_t stream)
{
    if (!N) return ISTH_OK;
    combine_backward_rows<<<blocks_for(N * (size_t)K * D), 256, 0, stream>>>(dy_send, dout, r->d_probs, r->d_choice,
                                                                             r->d_copy_slot, N, E, K, D);
    combine_backward_gates<<<blocks_for(N * (size_t)K), 256, 0, stream>>>(dprobs, dout, r->d_choice, r->d_copy_slot,
                                                                          r->d_y_back, N, E, K, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_moe_scatter_add(float *dinp, const float *dx_send, const CudaRouting *r, size_t N, int K, int D,
                                    cudaStream_t stream)
{
    if (N) scatter_add_kernel<<<blocks_for(N * (size_t)D), 256, 0, stream>>>(dinp, dx_send, r->d_copy_slot, N, K, D);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}
