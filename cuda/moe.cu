/* moe.cu — see moe.h. */
#include "moe.h"
#include "layers.h" /* SwiGLU, bf16 rounding */
#include "check.h"
#include "grid.h"
#include "route_plan.h" /* static inline, __host__ __device__ */
#include "route_softmax.h"
#include "route_topk.h"
#include "acts_plan.h" /* CUDA_ROUTE_CHUNK */

/* One thread per token: the CPU's row (route_softmax.h). */
__global__ static void router_softmax_kernel(float *probs, float *lse, const float *logits, size_t N, int E)
{
    GRID_STRIDE(t, N) lse[t] = route_softmax_row(probs + t * E, logits + t * E, E);
}

/* One thread per token: the CPU's choice (route_topk.h). */
__global__ static void router_topk_kernel(int *choice, const float *probs, size_t N, int E, int K)
{
    GRID_STRIDE(t, N) route_topk_token(choice + t * K, probs + t * E, E, K);
}

/* One block per expert: 256 strided partial sums in double, then a fixed
 * tree (the same bits every run; within ~1e-16 of the CPU's token-order
 * sum: the mean only feeds the logged balance loss, no gradient). One
 * thread per expert over every token was E threads on the whole GPU. */
__global__ static void router_mean_prob_kernel(double *mean_prob, const float *probs, size_t N, int E)
{
    __shared__ double part[256];
    const int e = blockIdx.x;
    double s = 0.0;
    for (size_t t = threadIdx.x; t < N; t += blockDim.x) s += probs[t * E + e];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = 128; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) mean_prob[e] = N ? part[0] / (double)N : 0.0;
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
    if (E) router_mean_prob_kernel<<<E, 256, 0, stream>>>(mean_prob, probs, N, E);
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

/* Row (or chunk) i of `width` elements of a stored operand: fp32, or bf16. */
static const void *op_at(const void *p, int bf16, size_t i, size_t width)
{
    return (const char *)p + i * width * (bf16 ? sizeof(uint16_t) : sizeof(float));
}

extern "C" int cuda_experts_forward(int bf16, float *y, float *a, float *u, void *h, const void *x, const void *wg,
                                    const void *wu, const void *wd, const int *start, int El, int D, int F,
                                    CudaGemmBatch *g, const CudaBlas *blas)
{
    const size_t DF = (size_t)D * F;
    g->n = 0; /* nothing left over from a step that failed midway */
    for (int e = 0; e < El; e++) {
        const size_t r0 = (size_t)start[e], n = (size_t)start[e + 1] - r0;
        CHECK(cuda_gemm_batch_forward(g, bf16, a + r0 * F, op_at(x, bf16, r0, D), op_at(wg, bf16, e, DF), n, D, F));
        CHECK(cuda_gemm_batch_forward(g, bf16, u + r0 * F, op_at(x, bf16, r0, D), op_at(wu, bf16, e, DF), n, D, F));
    }
    CHECK(cuda_gemm_batch_run(g, blas));
    const size_t nF = (size_t)start[El] * F;
    CHECK(bf16 ? cuda_swiglu_forward_bf16((uint16_t *)h, a, u, nF, blas->stream)
               : cuda_swiglu_forward((float *)h, a, u, nF, blas->stream));
    for (int e = 0; e < El; e++) {
        const size_t r0 = (size_t)start[e], n = (size_t)start[e + 1] - r0;
        CHECK(cuda_gemm_batch_forward(g, bf16, y + r0 * D, op_at(h, bf16, r0, F), op_at(wd, bf16, e, DF), n, F, D));
    }
    return cuda_gemm_batch_run(g, blas);
}

/* bf16: dy arrives in fp32 and is rounded once (pool scratch); da and du,
 * once the SwiGLU backward has made them from dh, are rounded into dh's
 * floats (2 * rows * F bf16 fit the rows * F floats dh no longer needs). */
extern "C" int cuda_experts_backward(int bf16, float *dx, float *dwg, float *dwu, float *dwd, float *scratch,
                                     const float *dy, const void *x, const float *a, const float *u, const void *h,
                                     const void *wg, const void *wu, const void *wd, const int *start, int El, int D,
                                     int F, CudaGemmBatch *g, const CudaBlas *blas)
{
    const size_t DF = (size_t)D * F, rows = (size_t)start[El], nF = rows * F;
    const cudaStream_t s = blas->stream;
    float *dh = scratch, *da = scratch + nF, *du = scratch + 2 * nF;
    g->n = 0;
    if (!rows) return ISTH_OK;
    CHECK_CUDA(cudaMemsetAsync(scratch, 0, 3 * nF * sizeof(float), s));
    const void *dyq = dy, *daq = da, *duq = du; /* the gradients as the products take them */
    uint16_t *dy16 = NULL;
    if (bf16) {
        CHECK_CUDA(cudaMallocAsync((void **)&dy16, rows * D * sizeof(uint16_t), s));
        dyq = dy16;
    }
    int rc = bf16 ? cuda_to_bf16(dy16, dy, rows * D, s) : ISTH_OK;
    for (int e = 0; e < El && rc == ISTH_OK; e++) {
        const size_t r0 = (size_t)start[e], n = (size_t)start[e + 1] - r0;
        const void *dye = op_at(dyq, bf16, r0, D);
        rc = cuda_gemm_batch_dinp(g, bf16, dh + r0 * F, dye, op_at(wd, bf16, e, DF), n, F, D);
        if (rc == ISTH_OK) rc = cuda_gemm_batch_dweight(g, bf16, dwd + e * DF, dye, op_at(h, bf16, r0, F), n, F, D);
    }
    if (rc == ISTH_OK) rc = cuda_gemm_batch_run(g, blas);
    if (dy16) CHECK_CUDA(cudaFreeAsync(dy16, s)); /* stream-ordered: after the products that read it */
    CHECK(rc);
    CHECK(cuda_swiglu_backward(da, du, dh, a, u, nF, s));
    if (bf16) {
        uint16_t *da16 = (uint16_t *)dh, *du16 = da16 + nF;
        CHECK(cuda_to_bf16(da16, da, nF, s));
        CHECK(cuda_to_bf16(du16, du, nF, s));
        daq = da16;
        duq = du16;
    }
    for (int pass = 0; pass < 2; pass++) { /* dx += the gate's product, then += the up's, as on the CPU */
        for (int e = 0; e < El; e++) {
            const size_t r0 = (size_t)start[e], n = (size_t)start[e + 1] - r0;
            const void *dae = op_at(daq, bf16, r0, F), *due = op_at(duq, bf16, r0, F), *xe = op_at(x, bf16, r0, D);
            if (pass == 0) {
                CHECK(cuda_gemm_batch_dinp(g, bf16, dx + r0 * D, dae, op_at(wg, bf16, e, DF), n, D, F));
                CHECK(cuda_gemm_batch_dweight(g, bf16, dwg + e * DF, dae, xe, n, D, F));
                CHECK(cuda_gemm_batch_dweight(g, bf16, dwu + e * DF, due, xe, n, D, F));
            } else {
                CHECK(cuda_gemm_batch_dinp(g, bf16, dx + r0 * D, due, op_at(wu, bf16, e, DF), n, D, F));
            }
        }
        CHECK(cuda_gemm_batch_run(g, blas));
    }
    return ISTH_OK;
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

/* --- the dispatch plan on the device (route_plan.h) ------------------------ */

__global__ static void route_histogram_kernel(int *counts, const int *choice, size_t copies)
{
    GRID_STRIDE(i, copies) atomicAdd(&counts[choice[i]], 1); /* integers: the same counts in any order */
}

extern "C" int cuda_route_histogram(int *counts, const int *choice, size_t copies, int E, cudaStream_t stream)
{
    CHECK_CUDA(cudaMemsetAsync(counts, 0, sizeof(int) * (size_t)E, stream));
    if (copies) route_histogram_kernel<<<blocks_for(copies), 256, 0, stream>>>(counts, choice, copies);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* One block: frac by expert in parallel; the header and the bases by one
 * thread with route_plan.h's functions (O(E*G) each: small beside a layer),
 * after it has narrowed the count matrix to the learner's experts. */
__global__ static void route_plan_kernel(int *hdr, int *bases, double *frac, int *cnt, int G, int El, int me, int cap,
                                         double learner_copies, int E, int off)
{
    const int Es = G * El, W = route_slot_groups(Es, E);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int total = 0;
        for (int s = 0; s < G; s++) total += cnt[s * E + e];
        frac[e] = total / learner_copies;
    }
    __syncthreads(); /* every read of the whole matrix before it narrows */
    if (threadIdx.x) return;
    int remote = 0;
    if (Es < E) {
        for (int e = 0; e < E; e++) remote += route_local_expert(e, off, Es) == Es ? cnt[me * E + e] : 0;
        route_keep_columns(cnt, G, E, off, Es);
    }
    hdr[ROUTE_HDR_REMOTE] = remote;
    int *send_counts = hdr + ROUTE_HDR_COUNTS, *recv_counts = send_counts + G, *expert_start = recv_counts + G;
    hdr[ROUTE_HDR_SENT] = route_source_bases_split(cnt, Es, W, me, cap, bases, bases + W, bases + 2 * W);
    for (int d = 0; d < G; d++) send_counts[d] = route_send_count(cnt, Es, El, me, d, cap);
    hdr[ROUTE_HDR_RECV] = route_owner_counts(cnt, G, El, me, cap, recv_counts, expert_start, &hdr[ROUTE_HDR_DROPPED]);
}

extern "C" int cuda_route_plan(int *hdr, int *bases, double *frac, int *cnt, int G, int El, int me, int cap,
                               double learner_copies, int E, int off, cudaStream_t stream)
{
    route_plan_kernel<<<1, 256, 0, stream>>>(hdr, bases, frac, cnt, G, El, me, cap, learner_copies, E, off);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* Each copy's position among this rank's copies of its expert, in copy
 * order, in three passes over chunks of CUDA_ROUTE_CHUNK copies (one
 * block each), so the whole GPU counts: (1) a copy's rank in its chunk —
 * a warp's copies of one expert find each other (__match_any_sync) and
 * rank by lane, the warps' counts per expert (shared memory) order the
 * warps — and each chunk's count per expert; (2) per expert, those counts
 * as an exclusive prefix over the chunks (a warp scan); (3) in the slots'
 * kernel, rank + the chunk's prefix. The same integers whatever the
 * schedule: no atomics. */
#define ROUTE_WARPS (CUDA_ROUTE_CHUNK / 32)

/* E here: the groups (route_plan.h's route_slot_groups; a copy's group is
 * its expert's local index, or Es for one held elsewhere). */
__global__ static void route_chunk_rank_kernel(int *pos, int *chunk_count, const int *choice, size_t copies, int E,
                                               int off, int Es)
{
    extern __shared__ int warp_count[]; /* (ROUTE_WARPS, E) */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    for (int x = tid; x < ROUTE_WARPS * E; x += CUDA_ROUTE_CHUNK) warp_count[x] = 0;
    __syncthreads();
    const size_t i = (size_t)blockIdx.x * CUDA_ROUTE_CHUNK + tid;
    /* past the end: -1, matching only each other */
    const int live = i < copies, e = live ? route_local_expert(choice[i], off, Es) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (live && rank == 0) warp_count[warp * E + e] = __popc(peers);
    __syncthreads();
    if (live) {
        int before = rank;
        for (int w = 0; w < warp; w++) before += warp_count[w * E + e];
        pos[i] = before;
    }
    for (int x = tid; x < E; x += CUDA_ROUTE_CHUNK) {
        int n = 0;
        for (int w = 0; w < ROUTE_WARPS; w++) n += warp_count[w * E + x];
        chunk_count[(size_t)blockIdx.x * E + x] = n;
    }
}

/* One warp per expert: chunk_count (chunks, E) -> the copies of that
 * expert in the chunks before, in place. */
__global__ static void route_chunk_scan_kernel(int *chunk_count, size_t chunks, int E)
{
    const int e = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (e >= E) return; /* the whole warp: e is the warp's */
    int carry = 0;
    for (size_t c0 = 0; c0 < chunks; c0 += 32) {
        const size_t c = c0 + lane;
        const int n = c < chunks ? chunk_count[c * E + e] : 0;
        int incl = n;
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += v;
        }
        if (c < chunks) chunk_count[c * E + e] = carry + incl - n;
        carry += __shfl_sync(0xffffffffu, incl, 31);
    }
}

__global__ static void route_slots_kernel(int *copy_slot, int *send_token, const int *pos, const int *chunk_base,
                                          const int *choice, const int *bases, const int *hdr, size_t copies, int K,
                                          int E, int off, int Es)
{
    const int n_sent = hdr[ROUTE_HDR_SENT];
    GRID_STRIDE(i, copies)
    {
        const int e = route_local_expert(choice[i], off, Es), p = pos[i] + chunk_base[i / CUDA_ROUTE_CHUNK * E + e];
        const int slot = route_slot_from_bases(bases, bases + E, bases + 2 * E, e, p);
        copy_slot[i] = slot;
        /* the slots are a permutation of the copies: every entry written;
         * a dropped copy's row gathers as zeros */
        send_token[slot] = slot < n_sent ? (int)(i / K) : -1;
    }
}

extern "C" int cuda_route_slots(int *copy_slot, int *send_token, int *pos, const int *choice, const int *bases,
                                const int *hdr, size_t N, int K, int E_router, int off, int Es, cudaStream_t stream)
{
    const size_t copies = N * (size_t)K, chunks = (copies + CUDA_ROUTE_CHUNK - 1) / CUDA_ROUTE_CHUNK;
    const int E = route_slot_groups(Es, E_router); /* the groups: what the kernels below call E */
    if (!copies) return ISTH_OK;
    int *chunk_count = pos + copies;
    const size_t shared = sizeof(int) * ROUTE_WARPS * (size_t)E; /* 128 KiB at E = 4096 */
    if (shared > 48 * 1024)
        CHECK_CUDA(cudaFuncSetAttribute(route_chunk_rank_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared));
    route_chunk_rank_kernel<<<(unsigned)chunks, CUDA_ROUTE_CHUNK, shared, stream>>>(pos, chunk_count, choice, copies,
                                                                                   E, off, Es);
    route_chunk_scan_kernel<<<(unsigned)(((size_t)E * 32 + 255) / 256), 256, 0, stream>>>(chunk_count, chunks, E);
    route_slots_kernel<<<blocks_for(copies), 256, 0, stream>>>(copy_slot, send_token, pos, chunk_count, choice, bases,
                                                               hdr, copies, K, E, off, Es);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

__global__ static void route_owner_map_kernel(int *recv_row, int *row_src, const int *cnt, const int *hdr, int G,
                                              int El, int me, int cap, int n_recv)
{
    const int *recv_counts = hdr + ROUTE_HDR_COUNTS + G, *expert_start = recv_counts + G;
    GRID_STRIDE(a, (size_t)n_recv)
    {
        const int row = route_arrival_row(cnt, G, El, me, cap, recv_counts, expert_start, (int)a);
        recv_row[a] = row;
        row_src[row] = (int)a;
    }
}

extern "C" int cuda_route_owner_map(int *recv_row, int *row_src, const int *cnt, const int *hdr, int G, int El,
                                    int me, int cap, int n_recv, cudaStream_t stream)
{
    if (n_recv > 0)
        route_owner_map_kernel<<<blocks_for((size_t)n_recv), 256, 0, stream>>>(recv_row, row_src, cnt, hdr, G, El, me,
                                                                               cap, n_recv);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* One block: the z loss's sum of lse^2 as a fixed tree (within ~1e-16 of
 * moe.c's token-order sum: a logged statistic, no gradient depends on it),
 * the balance loss in expert order as moe.c. */
__global__ static void route_losses_kernel(double *stats, const double *frac, const double *mean_prob,
                                           const float *lse, const int *hdr, size_t N, int E, double aux_coef,
                                           double z_coef)
{
    __shared__ double part[256];
    double z = 0.0;
    for (size_t t = threadIdx.x; t < N; t += blockDim.x) z += (double)lse[t] * lse[t];
    part[threadIdx.x] = z;
    __syncthreads();
    for (int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x) return;
    double s = 0.0;
    for (int e = 0; e < E; e++) s += frac[e] * mean_prob[e];
    stats[0] += aux_coef * E * s;
    stats[1] += N ? z_coef * part[0] / (double)N : 0.0;
    stats[2] += hdr[ROUTE_HDR_DROPPED];
}

extern "C" int cuda_route_losses(double *stats, const double *frac, const double *mean_prob, const float *lse,
                                 const int *hdr, size_t N, int E, double aux_coef, double z_coef, cudaStream_t stream)
{
    route_losses_kernel<<<1, 256, 0, stream>>>(stats, frac, mean_prob, lse, hdr, N, E, aux_coef, z_coef);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}
