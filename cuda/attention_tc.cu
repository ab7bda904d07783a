/* attention_tc.cu — see attention_tc.h. */
#include "attention_tc.h"
#include "check.h"

#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

#include "codec_math.h" /* codec_to_bf16: the output rounded as every bf16 operand is */

using namespace nvcuda;

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_ROWS (TC_WARPS * 16) /* queries (forward, dq) or keys (dk, dv) per block: 16 per warp */
#define TC_TILE 64              /* keys (forward, dq) or queries (dk, dv) per step */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

/* rows [r0, r0 + n) of one head of x (B,T,D), as bf16 rows of DH in shared
 * memory; rows at or past T are zeros. x fp32 (dout: rounded here) or
 * already bf16 (q, k, v: copied). */
template <int DH>
__device__ static void load_rows(bf16 *dst, const float *x, size_t base, int r0, int n, int T, int D)
{
    for (int e = threadIdx.x; e < n * DH; e += TC_THREADS) {
        const int r = e / DH, d = e % DH, i = r0 + r;
        dst[e] = __float2bfloat16(i < T ? x[base + (size_t)i * D + d] : 0.0f);
    }
}

template <int DH>
__device__ static void load_rows(bf16 *dst, const uint16_t *x, size_t base, int r0, int n, int T, int D)
{
    for (int e = threadIdx.x; e < n * DH; e += TC_THREADS) {
        const int r = e / DH, d = e % DH, i = r0 + r;
        dst[e] = __ushort_as_bfloat16(i < T ? x[base + (size_t)i * D + d] : (uint16_t)0);
    }
}

/* S (16 x TC_TILE, fp32, row-major) = A (16 x DH rows of a) . B^T, B the
 * TC_TILE rows of b (both bf16, row-major with DH columns). */
template <int DH>
__device__ static void rows_dot_rows(float *S, const bf16 *a, const bf16 *b)
{
#pragma unroll
    for (int n = 0; n < TC_TILE / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            FragA fa;
            FragBt fb; /* b's rows as the columns of B^T */
            wmma::load_matrix_sync(fa, a + kk * 16, DH);
            wmma::load_matrix_sync(fb, b + n * 16 * DH + kk * 16, DH);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(S + n * 16, acc, TC_TILE, wmma::mem_row_major);
    }
}

/* acc (16 x 16) += P (16 x TC_TILE, bf16) . columns t*16 .. t*16+15 of X
 * (TC_TILE rows of DH, bf16). */
template <int DH>
__device__ static void accumulate_tile(FragC &acc, const bf16 *P, const bf16 *X, int t)
{
#pragma unroll
    for (int kk = 0; kk < TC_TILE / 16; kk++) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, P + kk * 16, TC_TILE);
        wmma::load_matrix_sync(fb, X + kk * 16 * DH + t * 16, DH);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

/* acc[t] (16 x 16 each, DH / 16 of them) += P . X, every column tile. */
template <int DH>
__device__ static void accumulate(FragC *acc, const bf16 *P, const bf16 *X)
{
#pragma unroll
    for (int t = 0; t < DH / 16; t++) accumulate_tile<DH>(acc[t], P, X, t);
}

template <int DH>
static size_t forward_smem(void)
{
    /* Q, K, V tiles (bf16); per warp S (fp32), P (bf16), O (fp32) */
    return sizeof(bf16) * (TC_ROWS + 2 * TC_TILE) * DH +
           TC_WARPS * 16 * (TC_TILE * sizeof(float) + TC_TILE * sizeof(bf16) + DH * sizeof(float));
}

/* One block: TC_ROWS queries of one (sequence, head); key tiles up to its
 * last query. Per warp 16 queries: S = Q K^T on tensor cores, the online
 * softmax in fp32 (two lanes per row), O = diag(corr) O + P V with O in
 * shared memory (a fragment's rows cannot be scaled in registers). */
template <int DH>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_forward_kernel(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v, int T, int D,
                      int H, float scale)
{
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + TC_ROWS * DH, *Vs = Ks + TC_TILE * DH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *S = (float *)(Vs + TC_TILE * DH) + warp * 16 * TC_TILE;
    bf16 *P = (bf16 *)((float *)(Vs + TC_TILE * DH) + TC_WARPS * 16 * TC_TILE) + warp * 16 * TC_TILE;
    float *O = (float *)((bf16 *)((float *)(Vs + TC_TILE * DH) + TC_WARPS * 16 * TC_TILE) + TC_WARPS * 16 * TC_TILE) +
               warp * 16 * DH;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, i0 = blockIdx.x * TC_ROWS;
    const size_t base = (size_t)b * T * D + (size_t)h * DH;
    load_rows<DH>(Qs, q, base, i0, TC_ROWS, T, D);
    const int r = lane / 2, half = lane % 2, i = i0 + warp * 16 + r; /* this lane's query row */
    /* a lane's columns start at its own offset: the 32 lanes, one per bank */
#define COL_S(c) (half * 32 + (((c) + lane) & 31))
#define COL_O(c) (half * (DH / 2) + (((c) + lane) % (DH / 2)))
    for (int c = 0; c < DH / 2; c++) O[r * DH + COL_O(c)] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int last = min(i0 + TC_ROWS, T) - 1;
    for (int j0 = 0; j0 <= last; j0 += TC_TILE) {
        __syncthreads(); /* the last step's K, V are read */
        load_rows<DH>(Ks, k, base, j0, TC_TILE, T, D);
        load_rows<DH>(Vs, v, base, j0, TC_TILE, T, D);
        __syncthreads();
        rows_dot_rows<DH>(S, Qs + warp * 16 * DH, Ks);
        __syncwarp();
        /* this lane's 32 columns of row r: scale, mask, the row's max */
        float mt = -INFINITY;
        for (int cc = 0; cc < 32; cc++) {
            const int c = COL_S(cc), j = j0 + c;
            const float s = j <= i && j < T && i < T ? S[r * TC_TILE + c] * scale : -INFINITY;
            S[r * TC_TILE + c] = s;
            mt = fmaxf(mt, s);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        const float mn = fmaxf(m, mt);
        /* a row with no key yet (padding past T) keeps m = -inf: p and corr 0 */
        const float corr = mn == -INFINITY ? 0.0f : expf(m - mn);
        float ls = 0.0f;
        for (int cc = 0; cc < 32; cc++) {
            const int c = COL_S(cc);
            const float p = mn == -INFINITY ? 0.0f : expf(S[r * TC_TILE + c] - mn);
            P[r * TC_TILE + c] = __float2bfloat16(p);
            ls += p;
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 1);
        l = l * corr + ls;
        m = mn;
        for (int c = 0; c < DH / 2; c++) O[r * DH + COL_O(c)] *= corr;
        __syncwarp();
#pragma unroll
        for (int t = 0; t < DH / 16; t++) {
            FragC acc;
            wmma::load_matrix_sync(acc, O + t * 16, DH, wmma::mem_row_major);
            accumulate_tile<DH>(acc, P, Vs, t);
            wmma::store_matrix_sync(O + t * 16, acc, DH, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (i < T) {
        const float inv = 1.0f / l;
        for (int c = half * (DH / 2); c < (half + 1) * (DH / 2); c++) /* in order: the row's writes coalesce */
            out[base + (size_t)i * D + c] = codec_to_bf16(O[r * DH + c] * inv);
        if (half == 0) lse[(size_t)bh * T + i] = m + logf(l);
    }
#undef COL_S
#undef COL_O
}

/* Scores to gradient factors for one warp's 16 x TC_TILE block, in place:
 * S (scores, fp32) and dP (fp32) become P and dS = P * (dP - delta) as
 * bf16 (Pb, dSb). Row `row0 + r` and column `col0 + c` are (query, key)
 * when `rows_are_queries`, else (key, query); lse, delta by query. */
__device__ static void grad_factors(const float *S, const float *dP, bf16 *Pb, bf16 *dSb, int rows_are_queries,
                                    int row0, int col0, const float *lse, const float *delta, int T, float scale)
{
    const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
    for (int cc = 0; cc < 32; cc++) {
        const int c = half * 32 + ((cc + lane) & 31); /* one bank per lane */
        const int qi = rows_are_queries ? row0 + r : col0 + c, kj = rows_are_queries ? col0 + c : row0 + r;
        const int qloc = rows_are_queries ? r : c; /* lse, delta are staged by the tile's query */
        const bool live = kj <= qi && qi < T && kj < T;
        const float p = live ? expf(S[r * TC_TILE + c] * scale - lse[qloc]) : 0.0f;
        Pb[r * TC_TILE + c] = __float2bfloat16(p);
        dSb[r * TC_TILE + c] = __float2bfloat16(live ? p * (dP[r * TC_TILE + c] - delta[qloc]) : 0.0f);
    }
}

/* The backward kernels' shared memory, the same carve for both: four bf16
 * tiles of TC_TILE rows (the block's two, the step's two), per warp an fp32
 * area (S and dP; at the end the block's gradient rows pass through it) and
 * P, dS in bf16, then the staged lse and delta of TC_TILE queries. */
static_assert(TC_ROWS == TC_TILE, "the backward's tiles are all TC_TILE rows");
/* floats per warp: S and dP (16 x TC_TILE each), or the 16 x DH output rows
 * that reuse them, whichever is larger (Dh 128: 112.5 KiB a block, two
 * blocks on an H100's SM) */
#define TC_WARP_F(DH) (2 * 16 * TC_TILE > 16 * (DH) ? 2 * 16 * TC_TILE : 16 * (DH))

template <int DH>
static size_t backward_smem(void)
{
    return sizeof(bf16) * 4 * TC_TILE * DH +
           TC_WARPS * (TC_WARP_F(DH) * sizeof(float) + 2 * 16 * TC_TILE * sizeof(bf16)) + 2 * TC_TILE * sizeof(float);
}

typedef struct {
    bf16 *tile[4];     /* each TC_TILE rows of DH */
    float *S, *dP;     /* this warp's 16 x TC_TILE; S is also its 16 x DH output area */
    bf16 *P, *dS;      /* this warp's 16 x TC_TILE */
    float *lse, *delta; /* TC_TILE each */
} BackSmem;

template <int DH>
__device__ static BackSmem carve_backward(unsigned char *smem, int warp)
{
    BackSmem m;
    bf16 *t = (bf16 *)smem;
    for (int i = 0; i < 4; i++) m.tile[i] = t + i * TC_TILE * DH;
    float *f = (float *)(t + 4 * TC_TILE * DH);
    m.S = f + warp * TC_WARP_F(DH);
    m.dP = m.S + 16 * TC_TILE;
    bf16 *pb = (bf16 *)(f + TC_WARPS * TC_WARP_F(DH));
    m.P = pb + warp * 2 * 16 * TC_TILE;
    m.dS = m.P + 16 * TC_TILE;
    m.lse = (float *)(pb + TC_WARPS * 2 * 16 * TC_TILE);
    m.delta = m.lse + TC_TILE;
    return m;
}

/* dK, dV for TC_ROWS keys of one head: query tiles from the block's first
 * key on; per warp 16 keys, S^T = K Q^T and dP^T = V dO^T on tensor cores,
 * then dV += P^T dO and dK += dS^T Q in fragments; no atomics. */
template <int DH>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_dkdv_kernel(float *dk, float *dv, const float *dout, const float *lse, const float *delta, const uint16_t *q,
                   const uint16_t *k, const uint16_t *v, int T, int D, int H, float scale)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x / 32;
    const BackSmem m = carve_backward<DH>(smem, warp);
    bf16 *Ks = m.tile[0], *Vs = m.tile[1], *Qs = m.tile[2], *dOs = m.tile[3];
    float *F = m.S, *St = m.S, *dPt = m.dP, *ls = m.lse, *ds = m.delta; /* S^T, dP^T: keys x queries */
    bf16 *Pt = m.P, *dSt = m.dS;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, j0 = blockIdx.x * TC_ROWS;
    const size_t base = (size_t)b * T * D + (size_t)h * DH;
    load_rows<DH>(Ks, k, base, j0, TC_ROWS, T, D);
    load_rows<DH>(Vs, v, base, j0, TC_ROWS, T, D);
    FragC dka[DH / 16], dva[DH / 16];
#pragma unroll
    for (int t = 0; t < DH / 16; t++) {
        wmma::fill_fragment(dka[t], 0.0f);
        wmma::fill_fragment(dva[t], 0.0f);
    }
    for (int i0 = j0 - j0 % TC_TILE; i0 < T; i0 += TC_TILE) {
        __syncthreads();
        load_rows<DH>(Qs, q, base, i0, TC_TILE, T, D);
        load_rows<DH>(dOs, dout, base, i0, TC_TILE, T, D);
        for (int x = threadIdx.x; x < TC_TILE; x += TC_THREADS) {
            ls[x] = i0 + x < T ? lse[(size_t)bh * T + i0 + x] : 0.0f;
            ds[x] = i0 + x < T ? delta[(size_t)bh * T + i0 + x] : 0.0f;
        }
        __syncthreads();
        rows_dot_rows<DH>(St, Ks + warp * 16 * DH, Qs);   /* S^T: keys x queries */
        rows_dot_rows<DH>(dPt, Vs + warp * 16 * DH, dOs); /* dP^T */
        __syncwarp();
        grad_factors(St, dPt, Pt, dSt, 0, j0 + warp * 16, i0, ls, ds, T, scale);
        __syncwarp();
        accumulate<DH>(dva, Pt, dOs);
        accumulate<DH>(dka, dSt, Qs);
    }
    /* out through the warp's fp32 area, one matrix at a time: += into dk, dv */
    const int lane = threadIdx.x % 32;
    for (int which = 0; which < 2; which++) {
        __syncwarp();
#pragma unroll
        for (int t = 0; t < DH / 16; t++)
            wmma::store_matrix_sync(F + t * 16, which ? dka[t] : dva[t], DH, wmma::mem_row_major);
        __syncwarp();
        float *dst = which ? dk : dv;
        const float f = which ? scale : 1.0f;
        for (int e = lane; e < 16 * DH; e += 32) {
            const int row = e / DH, c = e % DH, j = j0 + warp * 16 + row;
            if (j < T) dst[base + (size_t)j * D + c] += F[e] * f;
        }
    }
}

/* dQ for TC_ROWS queries of one head: key tiles up to its last query; per
 * warp 16 queries, S = Q K^T and dP = dO V^T, then dQ += dS K. */
template <int DH>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_dq_kernel(float *dq, const float *dout, const float *lse, const float *delta, const uint16_t *q,
                 const uint16_t *k, const uint16_t *v, int T, int D, int H, float scale)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x / 32;
    const BackSmem m = carve_backward<DH>(smem, warp);
    bf16 *Qs = m.tile[0], *dOs = m.tile[1], *Ks = m.tile[2], *Vs = m.tile[3];
    float *F = m.S, *S = m.S, *dP = m.dP, *ls = m.lse, *ds = m.delta; /* lse, delta: this block's queries */
    bf16 *Pb = m.P, *dSb = m.dS;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, i0 = blockIdx.x * TC_ROWS;
    const size_t base = (size_t)b * T * D + (size_t)h * DH;
    load_rows<DH>(Qs, q, base, i0, TC_ROWS, T, D);
    load_rows<DH>(dOs, dout, base, i0, TC_ROWS, T, D);
    for (int x = threadIdx.x; x < TC_ROWS; x += TC_THREADS) {
        ls[x] = i0 + x < T ? lse[(size_t)bh * T + i0 + x] : 0.0f;
        ds[x] = i0 + x < T ? delta[(size_t)bh * T + i0 + x] : 0.0f;
    }
    FragC dqa[DH / 16];
#pragma unroll
    for (int t = 0; t < DH / 16; t++) wmma::fill_fragment(dqa[t], 0.0f);
    const int last = min(i0 + TC_ROWS, T) - 1;
    for (int j0 = 0; j0 <= last; j0 += TC_TILE) {
        __syncthreads();
        load_rows<DH>(Ks, k, base, j0, TC_TILE, T, D);
        load_rows<DH>(Vs, v, base, j0, TC_TILE, T, D);
        __syncthreads();
        rows_dot_rows<DH>(S, Qs + warp * 16 * DH, Ks);
        rows_dot_rows<DH>(dP, dOs + warp * 16 * DH, Vs);
        __syncwarp();
        grad_factors(S, dP, Pb, dSb, 1, i0 + warp * 16, j0, ls + warp * 16, ds + warp * 16, T, scale);
        __syncwarp();
        accumulate<DH>(dqa, dSb, Ks);
    }
    const int lane = threadIdx.x % 32;
    __syncwarp();
#pragma unroll
    for (int t = 0; t < DH / 16; t++) wmma::store_matrix_sync(F + t * 16, dqa[t], DH, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * DH; e += 32) {
        const int row = e / DH, c = e % DH, i = i0 + warp * 16 + row;
        if (i < T) dq[base + (size_t)i * D + c] += F[e] * scale;
    }
}

/* Dh 64 or 128, and a device whose blocks may opt into the shared memory
 * the kernels take (sm_90 and later: up to 227 KiB; sm_86/89 have 99 KiB,
 * too little at 128): asked once per process (one device per rank). */
extern "C" int cuda_attention_tc_supports(int Dh)
{
    if (Dh != 64 && Dh != 128) return 0;
    static int optin = -1;
    if (optin < 0) {
        int dev = 0, bytes = 0;
        const int ok = cudaGetDevice(&dev) == cudaSuccess &&
                       cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess;
        optin = ok ? bytes : 0;
    }
    const size_t need = Dh == 64 ? backward_smem<64>() : backward_smem<128>(); /* the larger of the two */
    return (size_t)optin >= need && (size_t)optin >= (Dh == 64 ? forward_smem<64>() : forward_smem<128>());
}

template <int DH>
static int tc_launch_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                             int T, int D, int H, cudaStream_t stream)
{
    const size_t smem = forward_smem<DH>();
    static int opted; /* once per kernel and process */
    if (!opted)
        CHECK_CUDA(cudaFuncSetAttribute(tc_forward_kernel<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    opted = 1;
    const dim3 grid((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)(B * H));
    tc_forward_kernel<DH><<<grid, TC_THREADS, smem, stream>>>(out, lse, q, k, v, T, D, H, 1.0f / sqrtf((float)DH));
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

template <int DH>
static int tc_launch_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse,
                              const float *delta, const uint16_t *q, const uint16_t *k, const uint16_t *v, int B, int T,
                              int D, int H, cudaStream_t stream)
{
    const size_t smem = backward_smem<DH>();
    static int opted;
    if (!opted) {
        CHECK_CUDA(cudaFuncSetAttribute(tc_dkdv_kernel<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CHECK_CUDA(cudaFuncSetAttribute(tc_dq_kernel<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    opted = 1;
    const dim3 grid((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)(B * H));
    const float scale = 1.0f / sqrtf((float)DH);
    tc_dkdv_kernel<DH><<<grid, TC_THREADS, smem, stream>>>(dk, dv, dout, lse, delta, q, k, v, T, D, H, scale);
    tc_dq_kernel<DH><<<grid, TC_THREADS, smem, stream>>>(dq, dout, lse, delta, q, k, v, T, D, H, scale);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

extern "C" int cuda_attention_tc_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                         const uint16_t *v, int B, int T, int D, int H, cudaStream_t stream)
{
    if (!B || !T) return ISTH_OK;
    switch (D / H) {
    case 64: return tc_launch_forward<64>(out, lse, q, k, v, B, T, D, H, stream);
    case 128: return tc_launch_forward<128>(out, lse, q, k, v, B, T, D, H, stream);
    default: return isth_fail(ISTH_EINPUT, "CUDA tensor-core attention: head dimension %d is not 64 or 128", D / H);
    }
}

extern "C" int cuda_attention_tc_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse,
                                          const float *delta, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                          int B, int T, int D, int H, cudaStream_t stream)
{
    if (!B || !T) return ISTH_OK;
    switch (D / H) {
    case 64: return tc_launch_backward<64>(dq, dk, dv, dout, lse, delta, q, k, v, B, T, D, H, stream);
    case 128: return tc_launch_backward<128>(dq, dk, dv, dout, lse, delta, q, k, v, B, T, D, H, stream);
    default: return isth_fail(ISTH_EINPUT, "CUDA tensor-core attention: head dimension %d is not 64 or 128", D / H);
    }
}
