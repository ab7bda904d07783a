/* attention.cu — see attention.h. */
#include "attention.h"

#include "attention_tc.h"
#include "check.h"
#include "grid.h"
#include "operand.h"

extern "C" {
#include "status.h"
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

