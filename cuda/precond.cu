/* precond.cu — see precond.h. The order of the work per matrix is the
 * CPU's (src/cpu/precond.c); where the CPU loops over blocks, a kernel
 * runs one CUDA block per b x b block, and the products of all blocks go in
 * one batched call. */
#include "precond.h"
#include "check.h"
#include "grid.h"
#include "precond_plan.h"

#include <stdint.h>
#include <string.h>

extern "C" {
#include "alloc.h"
#include "cpu/optim.h"   /* adamw_constants, run_segment: host arithmetic shared with the CPU */
#include "cpu/precond.h" /* precond_matrix_extent, precond_matrix_dims: the same */
#include "elementwise.h"
#include "status.h"
}

/* threads of every per-block kernel and of the fixed trees */
#define TREE_THREADS 256
/* the most blocks one batched product takes (a grid's third dimension) */
#define GEMM_BATCH_MAX 65535
/* which of the pointer arrays (CUDA_PRECOND_POINTER_ARRAYS of them, `blocks` each) */
enum { PTR_G, PTR_M, PTR_LROOT, PTR_RROOT, PTR_SDIR, PTR_TMP };
/* which of the per-block flags (3 x blocks) */
enum { FLAG_RESET, FLAG_FAILED, FLAG_USABLE };
/* the scalars of the matrix in hand */
enum { SC_SHAMPOO, SC_LR, SC_NORM, SC_OUT };
/* the counters */
enum { CNT_FAILED, CNT_RESET, CNT_FALLBACK };

/* --- fixed trees ------------------------------------------------------------------------- */

/* The sum of every thread's x over the CUDA block (TREE_THREADS threads), a
 * fixed tree; every thread gets it. part: TREE_THREADS shared doubles. */
__device__ static double tree_sum(double *part, double x)
{
    __syncthreads(); /* a previous tree's result has been read */
    part[threadIdx.x] = x;
    __syncthreads();
    for (int h = TREE_THREADS / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    return part[0];
}

/* The same with fmax (NaN ignored, as the CPU's fmax loop). */
__device__ static double tree_max(double *part, double x)
{
    __syncthreads();
    part[threadIdx.x] = x;
    __syncthreads();
    for (int h = TREE_THREADS / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) part[threadIdx.x] = fmax(part[threadIdx.x], part[threadIdx.x + h]);
        __syncthreads();
    }
    return part[0];
}

/* --- Shampoo's kernels: one CUDA block per b x b block (blockIdx.x) --------------------------- */

/* Adam's moments of each block (row stride cols), its direction into dir
 * (laid out like the matrix: the step until the first roots, the fallback
 * after) and the direction's sum of squares per block. */
__global__ static void adam_blocks(const float *g, float *m, float *v, float *dir, double *ss, size_t b, size_t nb_c,
                                   size_t cols, AdamWStep k)
{
    __shared__ double part[TREE_THREADS];
    const size_t start = precond_block_start(blockIdx.x, nb_c, b, cols);
    double s = 0.0;
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) {
        const size_t j = precond_block_element(start, e, b, cols);
        adam_moments(&m[j], &v[j], g[j], &k);
        const float d = adam_direction_of(m[j], v[j], &k);
        dir[j] = d;
        s += (double)d * d;
    }
    s = tree_sum(part, s);
    if (threadIdx.x == 0) ss[blockIdx.x] = s;
}

/* The sum of squares of each block of x (laid out like the matrix). */
__global__ static void block_sumsq(const float *x, double *ss, size_t b, size_t nb_c, size_t cols)
{
    __shared__ double part[TREE_THREADS];
    const size_t start = precond_block_start(blockIdx.x, nb_c, b, cols);
    double s = 0.0;
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) {
        const float d = x[precond_block_element(start, e, b, cols)];
        s += (double)d * d;
    }
    s = tree_sum(part, s);
    if (threadIdx.x == 0) ss[blockIdx.x] = s;
}

/* Every block's address in the operands of the batched products: the
 * gradient, the first moment, the two roots and Shampoo's direction in
 * place (row stride cols), and the block's own b x b slot of tmp. */
__global__ static void block_pointers(void **ptrs, size_t stride, size_t blocks, size_t b, size_t nb_c, size_t cols,
                                      const float *g, const float *m, const float *lroot, const float *rroot,
                                      float *sdir, float *tmp)
{
    GRID_STRIDE(k, blocks) {
        const size_t o = precond_block_start(k, nb_c, b, cols);
        ptrs[PTR_G * stride + k] = (void *)(g + o);
        ptrs[PTR_M * stride + k] = (void *)(m + o);
        ptrs[PTR_LROOT * stride + k] = (void *)(lroot + o);
        ptrs[PTR_RROOT * stride + k] = (void *)(rroot + o);
        ptrs[PTR_SDIR * stride + k] = (void *)(sdir + o);
        ptrs[PTR_TMP * stride + k] = (void *)(tmp + k * b * b);
    }
}

/* The statistic's update, as ssyrk forms it on the CPU: the upper triangle
 * of each block of s (row stride cols) becomes (1 - beta) t + beta s, t
 * the block's product (b x b, contiguous). A block with a value that is
 * not finite starts over (zeroed, as the CPU zeroes it, and flagged)
 * rather than poison the next roots. */
__global__ static void stat_fold(float *s, const float *t, size_t b, size_t nb_c, size_t cols, float beta, int *reset)
{
    const size_t start = precond_block_start(blockIdx.x, nb_c, b, cols);
    const float *tb = t + (size_t)blockIdx.x * b * b;
    const float w = 1.0f - beta;
    int broken = 0;
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) {
        if (e % b < e / b) continue; /* below the diagonal: never formed nor read */
        const size_t j = precond_block_element(start, e, b, cols);
        const float x = w * tb[e] + beta * s[j];
        s[j] = x;
        broken |= !isfinite(x);
    }
    if (!__syncthreads_or(broken)) return;
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) s[precond_block_element(start, e, b, cols)] = 0.0f;
    if (threadIdx.x == 0) reset[blockIdx.x]++;
}

/* Each block's statistic (its upper triangle, row stride cols) to the
 * block's contiguous b x b slot of a, made symmetric from that triangle
 * (whatever part the solver reads, it reads the statistic; the lower
 * triangle of s is never kept up to date). A block whose triangle is not
 * finite has no root: the identity goes to the solver instead (a matrix
 * it handles) and the block is marked unusable. */
__global__ static void root_gather(const float *s, float *a, int *usable, size_t b, size_t nb_c, size_t cols)
{
    const size_t start = precond_block_start(blockIdx.x, nb_c, b, cols);
    float *ab = a + (size_t)blockIdx.x * b * b;
    int broken = 0;
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) {
        const size_t r = e / b, c = e % b, lo = r < c ? r : c, hi = r < c ? c : r;
        const float x = s[precond_block_element(start, lo * b + hi, b, cols)];
        ab[e] = x;
        broken |= !isfinite(x);
    }
    broken = __syncthreads_or(broken);
    if (broken)
        for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) ab[e] = e / b == e % b ? 1.0f : 0.0f;
    if (threadIdx.x == 0) usable[blockIdx.x] = !broken;
}

/* After the solver: each block's eigenvalues w (b) and eigenvectors q
 * (column k of its slot, contiguous). The floor eps * lmax from the
 * largest eigenvalue (at least 0); a block the solver failed, or whose
 * statistic has no root, is marked unusable; else qs = Q diag(weights)
 * (the weights, precond_math.h's, replace the eigenvalues in w). */
__global__ static void root_weights(const float *q, float *w, float *qs, const int *info, int *usable, size_t b,
                                    double eps)
{
    __shared__ double part[TREE_THREADS];
    const size_t blk = blockIdx.x;
    float *wb = w + blk * b;
    double lmax = 0.0;
    for (size_t k = threadIdx.x; k < b; k += TREE_THREADS) lmax = fmax(lmax, (double)wb[k]);
    lmax = tree_max(part, lmax);
    double floor_add;
    const int ok = precond_root_floor(lmax, eps, &floor_add) && info[blk] == 0 && usable[blk];
    __syncthreads(); /* every thread has read usable and w before they change */
    if (!ok) { /* the same for every thread of the block */
        if (threadIdx.x == 0) usable[blk] = 0;
        return;
    }
    for (size_t k = threadIdx.x; k < b; k += TREE_THREADS) wb[k] = precond_root_weight(wb[k], floor_add);
    __syncthreads();
    const float *qb = q + blk * b * b;
    float *out = qs + blk * b * b;
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) out[e] = qb[e] * wb[e / b];
}

/* Each usable block's root, prod = Q diag(weights) Q^T (column-major,
 * contiguous; symmetric), over the block's previous root (row stride
 * cols) when every value is finite; otherwise the previous root stays and
 * the block counts a failure. */
__global__ static void root_store(const float *prod, float *root, const int *usable, int *failed, size_t b,
                                  size_t nb_c, size_t cols)
{
    const size_t start = precond_block_start(blockIdx.x, nb_c, b, cols);
    const float *pb = prod + (size_t)blockIdx.x * b * b;
    int broken = !usable[blockIdx.x];
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS) broken |= !isfinite(pb[e]);
    if (__syncthreads_or(broken)) {
        if (threadIdx.x == 0) failed[blockIdx.x]++;
        return;
    }
    /* row-major (i, j) of the root = column-major (i, j) of prod, as the CPU stores it */
    for (size_t e = threadIdx.x; e < b * b; e += TREE_THREADS)
        root[precond_block_element(start, e, b, cols)] = pb[(e % b) * b + e / b];
}

/* The matrix's decision, on the device (one CUDA block): the grafting's
 * norms (per-block sums in a fixed tree), Shampoo's direction at lr * scale
 * or Adam's at lr (before the first roots; or counted, when Shampoo's is
 * unusable); the matrix's block flags added to the counters. */
__global__ static void graft(const double *ss, const int *flags, size_t blocks, size_t stride, int have_roots, float lr,
                             double *scalars, long long *counters)
{
    __shared__ double part[TREE_THREADS];
    double a = 0.0, s = 0.0, resets = 0.0, failed = 0.0; /* counts: exact in double */
    for (size_t k = threadIdx.x; k < blocks; k += TREE_THREADS) {
        a += ss[k];
        if (have_roots) s += ss[blocks + k];
        resets += flags[FLAG_RESET * stride + k];
        failed += flags[FLAG_FAILED * stride + k];
    }
    const double adam2 = tree_sum(part, a), s2 = tree_sum(part, s);
    resets = tree_sum(part, resets);
    failed = tree_sum(part, failed);
    if (threadIdx.x != 0) return;
    counters[CNT_RESET] += (long long)resets;
    counters[CNT_FAILED] += (long long)failed;
    double scale;
    if (have_roots && precond_graft_scale(adam2, s2, &scale)) {
        scalars[SC_SHAMPOO] = 1.0;
        scalars[SC_LR] = (float)(lr * scale); /* the CPU's float lr * scale, rounded as it rounds it */
        return;
    }
    if (have_roots) counters[CNT_FALLBACK]++; /* no usable direction: Adam's, counted */
    scalars[SC_SHAMPOO] = 0.0;
    scalars[SC_LR] = lr;
}

/* p <- p * decay - lr' * direction, with the decision graft() made. */
__global__ static void graft_apply(float *p, const float *dir, const float *sdir, size_t n, float decay,
                                   const double *scalars)
{
    const float *d = scalars[SC_SHAMPOO] != 0.0 ? sdir : dir;
    const float lr = (float)scalars[SC_LR];
    GRID_STRIDE(j, n) p[j] = p[j] * decay - lr * d[j];
}

/* --- Muon's kernels ---------------------------------------------------------------------------- */

/* The momentum and its Nesterov look-ahead x. */
__global__ static void muon_momentum(const float *g, float *m, float *x, size_t n, float mu)
{
    GRID_STRIDE(j, n) {
        m[j] = mu * m[j] + g[j];
        x[j] = g[j] + mu * m[j];
    }
}

/* Part c (blockIdx.x of CUDA_PRECOND_PARTS) of the sum of squares of x:
 * [n c / parts, n (c + 1) / parts), a fixed tree. */
__global__ static void sumsq_parts(const float *x, size_t n, double *parts)
{
    __shared__ double part[TREE_THREADS];
    const size_t j0 = n * blockIdx.x / CUDA_PRECOND_PARTS, j1 = n * (blockIdx.x + 1) / CUDA_PRECOND_PARTS;
    double s = 0.0;
    for (size_t j = j0 + threadIdx.x; j < j1; j += TREE_THREADS) s += (double)x[j] * x[j];
    s = tree_sum(part, s);
    if (threadIdx.x == 0) parts[blockIdx.x] = s;
}

/* *out = the parts added in a fixed tree (one CUDA block); with a counter,
 * a sum whose root is not finite counts once (Muon's skipped matrix). */
__global__ static void sum_parts(const double *parts, double *out, long long *not_finite)
{
    __shared__ double part[TREE_THREADS];
    double s = 0.0;
    for (int c = threadIdx.x; c < CUDA_PRECOND_PARTS; c += TREE_THREADS) s += parts[c];
    s = tree_sum(part, s);
    if (threadIdx.x != 0) return;
    *out = s;
    if (not_finite && !isfinite(sqrt(s))) (*not_finite)++;
}

/* x <- x / (|x| + 1e-7), |x|^2 = *sumsq. */
__global__ static void scale_by_norm(float *x, size_t n, const double *sumsq)
{
    const float inv = muon_inverse_norm(sqrt(*sumsq));
    GRID_STRIDE(j, n) x[j] *= inv;
}

/* q += beta s */
__global__ static void add_scaled(float *q, const float *s, size_t n, float beta)
{
    GRID_STRIDE(j, n) q[j] += beta * s[j];
}

/* p <- p * decay - lr_scale x, unless |x| (from *sumsq) is not finite: a
 * broken gradient, no step for this matrix (sum_parts counted it). */
__global__ static void muon_apply(float *p, const float *x, size_t n, float decay, float lr_scale, const double *sumsq)
{
    if (!isfinite(sqrt(*sumsq))) return;
    GRID_STRIDE(j, n) p[j] = p[j] * decay - lr_scale * x[j];
}

/* --- products ---------------------------------------------------------------------------------- */

/* Row-major C (M x N) = alpha op(A) op(B) + beta C in float32, as cuBLAS's
 * column-major C^T = op(B)^T op(A)^T: the CPU's cblas_sgemm(CblasRowMajor,
 * ...) call, argument for argument. */
static int rm_gemm(const CudaBlas *bl, cublasOperation_t ta, cublasOperation_t tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    CHECK_CUBLAS(cublasGemmEx(bl->handle, tb, ta, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C,
                              CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    return ISTH_OK;
}

/* The same product for every block: b x b operands at the addresses of
 * pointer arrays A, B, C (device), `count` blocks. */
static int rm_gemm_blocks(const CudaBlas *bl, cublasOperation_t ta, cublasOperation_t tb, int b, float alpha,
                          void *const *A, int lda, void *const *B, int ldb, float beta, void *const *C, int ldc,
                          size_t count)
{
    for (size_t first = 0; first < count; first += GEMM_BATCH_MAX) {
        const int n = (int)(count - first < GEMM_BATCH_MAX ? count - first : GEMM_BATCH_MAX);
        CHECK_CUBLAS(cublasGemmBatchedEx(bl->handle, tb, ta, b, b, b, &alpha, (const void *const *)(B + first),
                                         CUDA_R_32F, ldb, (const void *const *)(A + first), CUDA_R_32F, lda, &beta,
                                         C + first, CUDA_R_32F, ldc, n, CUBLAS_COMPUTE_32F_PEDANTIC,
                                         CUBLAS_GEMM_DEFAULT));
    }
    return ISTH_OK;
}

/* --- the roots ---------------------------------------------------------------------------------- */

/* Eigenvalues (val) and eigenvectors (over vec) of `blocks` symmetric b x b
 * matrices, contiguous and column-major in vec, the lower triangle read;
 * the solver's verdicts in info. */
static int eigen(CudaPrecond *p, size_t blocks)
{
    const int64_t n = p->block;
    const size_t nn = (size_t)n * (size_t)n;
    if (p->batched) {
        for (size_t first = 0; first < blocks; first += (size_t)p->batch) {
            const int64_t count = (int64_t)(blocks - first < (size_t)p->batch ? blocks - first : (size_t)p->batch);
            CHECK_CUSOLVER(cusolverDnXsyevBatched(p->solver, p->params, CUSOLVER_EIG_MODE_VECTOR,
                                                  CUBLAS_FILL_MODE_LOWER, n, CUDA_R_32F, p->vec + first * nn, n,
                                                  CUDA_R_32F, p->val + first * (size_t)n, CUDA_R_32F, p->work,
                                                  p->work_bytes, p->host_work, p->host_work_bytes, p->info + first,
                                                  count));
        }
        return ISTH_OK;
    }
    for (size_t k = 0; k < blocks; k++)
        CHECK_CUSOLVER(cusolverDnXsyevd(p->solver, p->params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n,
                                        CUDA_R_32F, p->vec + k * nn, n, CUDA_R_32F, p->val + k * (size_t)n, CUDA_R_32F,
                                        p->work, p->work_bytes, p->host_work, p->host_work_bytes, p->info + k));
    return ISTH_OK;
}

/* The inverse fourth roots (s + eps lmax I)^(-1/4) of every block of the
 * statistic s into root (both row stride cols, packed state), the CPU's
 * inverse_fourth_root block by block: a block whose statistic is not
 * finite, whose decomposition fails, that has no root, or whose root is
 * not finite keeps its previous root (flagged: a failure). Scratch: vec
 * (the eigenvectors), val, tmp (Q diag(weights)), sdir (the products). */
static int roots(CudaPrecond *p, const float *s, float *root, size_t blocks, size_t nb_c, size_t cols,
                 cudaStream_t stream)
{
    const size_t b = (size_t)p->block, bb = b * b;
    int *usable = p->flags + FLAG_USABLE * p->blocks, *failed = p->flags + FLAG_FAILED * p->blocks;
    root_gather<<<(unsigned)blocks, TREE_THREADS, 0, stream>>>(s, p->vec, usable, b, nb_c, cols);
    CHECK_CUDA(cudaGetLastError());
    CHECK(eigen(p, blocks));
    root_weights<<<(unsigned)blocks, TREE_THREADS, 0, stream>>>(p->vec, p->val, p->tmp, p->info, usable, b, p->eps);
    CHECK_CUDA(cudaGetLastError());
    /* prod = (Q diag(weights)) Q^T, column-major like the CPU's cblas_sgemm(CblasColMajor, NoTrans, Trans) */
    const float one = 1.0f, zero = 0.0f;
    for (size_t first = 0; first < blocks; first += GEMM_BATCH_MAX) {
        const int n = (int)(blocks - first < GEMM_BATCH_MAX ? blocks - first : GEMM_BATCH_MAX);
        CHECK_CUBLAS(cublasGemmStridedBatchedEx(p->blas.handle, CUBLAS_OP_N, CUBLAS_OP_T, (int)b, (int)b, (int)b, &one,
                                                p->tmp + first * bb, CUDA_R_32F, (int)b, (long long)bb,
                                                p->vec + first * bb, CUDA_R_32F, (int)b, (long long)bb, &zero,
                                                p->sdir + first * bb, CUDA_R_32F, (int)b, (long long)bb, n,
                                                CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    }
    root_store<<<(unsigned)blocks, TREE_THREADS, 0, stream>>>(p->sdir, root, usable, failed, b, nb_c, cols);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* --- one matrix ------------------------------------------------------------------------------------ */

/* One matrix (rows x cols at params + at, its state at packed) by Shampoo:
 * Adam's moments, the statistics when due, the roots when due, the
 * direction, the grafting, the step. */
static int shampoo_matrix(CudaPrecond *p, CudaAdamW *opt, float *params, const float *grads, size_t at, size_t packed,
                          size_t rows, size_t cols, const AdamWStep *k, cudaStream_t stream)
{
    const size_t n = rows * cols, b = (size_t)p->block, nb_c = cols / b, blocks = n / (b * b), stride = p->blocks;
    const PrecondSchedule when = precond_schedule(opt->t, p->every, p->stats_every);
    const float *g = grads + at;
    float *mom = opt->m + packed, *vel = opt->v + packed, *L = p->l + packed, *R = p->r + packed,
          *Lr = p->lroot + packed, *Rr = p->rroot + packed;
    void **ptr = p->ptrs;
    const int B = (int)b, ld = (int)cols;
    const unsigned grid = (unsigned)blocks;
    CHECK_CUDA(cudaMemsetAsync(p->flags, 0, sizeof(int) * 3 * stride, stream));
    block_pointers<<<blocks_for(blocks), 256, 0, stream>>>(ptr, stride, blocks, b, nb_c, cols, g, mom, Lr, Rr, p->sdir,
                                                          p->tmp);
    adam_blocks<<<grid, TREE_THREADS, 0, stream>>>(g, mom, vel, p->dir, p->sums, b, nb_c, cols, *k);
    CHECK_CUDA(cudaGetLastError());
    if (when.stats_now) { /* the CPU's two ssyrk: the products whole, only their upper triangles folded in */
        CHECK(rm_gemm_blocks(&p->blas, CUBLAS_OP_N, CUBLAS_OP_T, B, 1.0f, ptr + PTR_G * stride, ld, ptr + PTR_G * stride,
                             ld, 0.0f, ptr + PTR_TMP * stride, B, blocks));
        stat_fold<<<grid, TREE_THREADS, 0, stream>>>(L, p->tmp, b, nb_c, cols, (float)p->beta2,
                                                     p->flags + FLAG_RESET * stride);
        CHECK_CUDA(cudaGetLastError());
        CHECK(rm_gemm_blocks(&p->blas, CUBLAS_OP_T, CUBLAS_OP_N, B, 1.0f, ptr + PTR_G * stride, ld, ptr + PTR_G * stride,
                             ld, 0.0f, ptr + PTR_TMP * stride, B, blocks));
        stat_fold<<<grid, TREE_THREADS, 0, stream>>>(R, p->tmp, b, nb_c, cols, (float)p->beta2,
                                                     p->flags + FLAG_RESET * stride);
        CHECK_CUDA(cudaGetLastError());
    }
    if (when.roots_now) {
        CHECK(roots(p, L, Lr, blocks, nb_c, cols, stream));
        CHECK(roots(p, R, Rr, blocks, nb_c, cols, stream));
        p->roots += (long)(2 * blocks);
    }
    if (when.have_roots) { /* the direction Lr m^ Rr, m^ = m c1, then its norm per block */
        CHECK(rm_gemm_blocks(&p->blas, CUBLAS_OP_N, CUBLAS_OP_N, B, k->c1, ptr + PTR_LROOT * stride, ld,
                             ptr + PTR_M * stride, ld, 0.0f, ptr + PTR_TMP * stride, B, blocks));
        CHECK(rm_gemm_blocks(&p->blas, CUBLAS_OP_N, CUBLAS_OP_N, B, 1.0f, ptr + PTR_TMP * stride, B,
                             ptr + PTR_RROOT * stride, ld, 0.0f, ptr + PTR_SDIR * stride, ld, blocks));
        block_sumsq<<<grid, TREE_THREADS, 0, stream>>>(p->sdir, p->sums + blocks, b, nb_c, cols);
    }
    graft<<<1, TREE_THREADS, 0, stream>>>(p->sums, p->flags, blocks, stride, when.have_roots, k->lr, p->scalars,
                                          p->counters);
    graft_apply<<<blocks_for(n), 256, 0, stream>>>(params + at, p->dir, p->sdir, n, k->decay, p->scalars);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* One matrix by Muon: the Nesterov momentum orthogonalised by Newton-Schulz. */
static int muon_matrix(CudaPrecond *p, CudaAdamW *opt, float *params, const float *grads, size_t at, size_t packed,
                       size_t rows, size_t cols, const AdamWStep *k, cudaStream_t stream)
{
    const float A = MUON_NS_A, B = MUON_NS_B, C = MUON_NS_C;
    const size_t n = rows * cols;
    const int wide = muon_wide(rows, cols);
    const size_t side = wide ? rows : cols;
    float *x = p->sdir, *y = p->dir, *s = p->tmp, *q = p->tmp + side * side;
    const CudaBlas *bl = &p->blas;
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    muon_momentum<<<blocks_for(n), 256, 0, stream>>>(grads + at, opt->m + packed, x, n, (float)MUON_MOMENTUM);
    sumsq_parts<<<CUDA_PRECOND_PARTS, TREE_THREADS, 0, stream>>>(x, n, p->sums);
    sum_parts<<<1, TREE_THREADS, 0, stream>>>(p->sums, p->scalars + SC_NORM, NULL);
    scale_by_norm<<<blocks_for(n), 256, 0, stream>>>(x, n, p->scalars + SC_NORM);
    CHECK_CUDA(cudaGetLastError());
    const int R = (int)rows, Cc = (int)cols, S = (int)side;
    for (int it = 0; it < MUON_NS_STEPS; it++) {
        /* s = X X^T (wide) or X^T X; q = B s + C s s; y = A X + q X (wide) or A X + X q */
        if (wide) CHECK(rm_gemm(bl, N, T, S, S, Cc, 1.0f, x, Cc, x, Cc, 0.0f, s, S));
        else CHECK(rm_gemm(bl, T, N, S, S, R, 1.0f, x, Cc, x, Cc, 0.0f, s, S));
        CHECK(rm_gemm(bl, N, N, S, S, S, C, s, S, s, S, 0.0f, q, S));
        add_scaled<<<blocks_for(side * side), 256, 0, stream>>>(q, s, side * side, B);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaMemcpyAsync(y, x, sizeof(float) * n, cudaMemcpyDeviceToDevice, stream));
        if (wide) CHECK(rm_gemm(bl, N, N, R, Cc, R, 1.0f, q, S, x, Cc, A, y, Cc));
        else CHECK(rm_gemm(bl, N, N, R, Cc, Cc, 1.0f, x, Cc, q, S, A, y, Cc));
        float *t = x;
        x = y;
        y = t;
    }
    sumsq_parts<<<CUDA_PRECOND_PARTS, TREE_THREADS, 0, stream>>>(x, n, p->sums);
    sum_parts<<<1, TREE_THREADS, 0, stream>>>(p->sums, p->scalars + SC_OUT, p->counters + CNT_FALLBACK);
    muon_apply<<<blocks_for(n), 256, 0, stream>>>(params + at, x, n, k->decay, muon_lr_scale(k->lr, rows, cols),
                                                 p->scalars + SC_OUT);
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

/* --- the state ------------------------------------------------------------------------------------- */

/* The solver for `blocks` b x b blocks: cusolverDnXsyevBatched when it
 * takes blocks of this size (its workspace for the largest call, tried
 * once on the zeroed scratch), else cusolverDnXsyevd block by block. */
static int create_solver(CudaPrecond *p, cudaStream_t stream)
{
    const int64_t n = p->block;
    CHECK_CUSOLVER(cusolverDnCreate(&p->solver));
    CHECK_CUSOLVER(cusolverDnSetStream(p->solver, stream));
    CHECK_CUSOLVER(cusolverDnSetDeterministicMode(p->solver, CUSOLVER_DETERMINISTIC_RESULTS));
    CHECK_CUSOLVER(cusolverDnCreateParams(&p->params));
    /* one call takes at most n * n * batch <= INT32_MAX values (the routine's limit) */
    const int64_t most = (int64_t)(INT32_MAX / ((size_t)n * (size_t)n));
    p->batch = (int64_t)p->blocks < most ? (int64_t)p->blocks : most;
    if (p->batch < 1) p->batch = 1;
    size_t dev = 0, host = 0;
    cusolverStatus_t st = cusolverDnXsyevBatched_bufferSize(p->solver, p->params, CUSOLVER_EIG_MODE_VECTOR,
                                                            CUBLAS_FILL_MODE_LOWER, n, CUDA_R_32F, p->vec, n,
                                                            CUDA_R_32F, p->val, CUDA_R_32F, &dev, &host, p->batch);
    if (st == CUSOLVER_STATUS_SUCCESS) {
        p->batched = 1;
        p->work_bytes = dev;
        p->host_work_bytes = host;
        CHECK_CUDA(cudaMalloc(&p->work, dev ? dev : 1));
        p->host_work = isth_malloc(host ? host : 1);
        CHECK_ALLOC(p->host_work);
        st = cusolverDnXsyevBatched(p->solver, p->params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n,
                                    CUDA_R_32F, p->vec, n, CUDA_R_32F, p->val, CUDA_R_32F, p->work, p->work_bytes,
                                    p->host_work, p->host_work_bytes, p->info, p->batch);
        if (st == CUSOLVER_STATUS_SUCCESS) return ISTH_OK;
        CHECK_CUDA(cudaFree(p->work));
        isth_free(p->host_work);
        p->work = p->host_work = NULL;
    }
    if (st != CUSOLVER_STATUS_NOT_SUPPORTED && st != CUSOLVER_STATUS_INVALID_VALUE) CHECK_CUSOLVER(st);
    p->batched = 0; /* refused for blocks of this size: one syevd per block */
    CHECK_CUSOLVER(cusolverDnXsyevd_bufferSize(p->solver, p->params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER,
                                               n, CUDA_R_32F, p->vec, n, CUDA_R_32F, p->val, CUDA_R_32F, &dev,
                                               &host));
    p->work_bytes = dev;
    p->host_work_bytes = host;
    CHECK_CUDA(cudaMalloc(&p->work, dev ? dev : 1));
    p->host_work = isth_malloc(host ? host : 1);
    CHECK_ALLOC(p->host_work);
    return ISTH_OK;
}

/* The device block (cuda/precond_plan.h's pieces, zeroed), the handles. */
static int create(CudaPrecond *p, size_t state, size_t largest, size_t side, cudaStream_t stream)
{
    size_t bytes[CUDA_PRECOND_PIECES];
    const size_t total = cuda_precond_pieces(bytes, p->shampoo, state, largest, side, (size_t)p->block);
    void **where[CUDA_PRECOND_PIECES] = {
        (void **)&p->l, (void **)&p->r, (void **)&p->lroot, (void **)&p->rroot, (void **)&p->dir,
        (void **)&p->sdir, (void **)&p->tmp, (void **)&p->vec, (void **)&p->val, (void **)&p->info,
        (void **)&p->flags, (void **)&p->sums, (void **)&p->scalars, (void **)&p->counters, (void **)&p->ptrs,
    };
    CHECK_CUDA(cudaMalloc(&p->base, total));
    size_t off = 0;
    for (int i = 0; i < CUDA_PRECOND_PIECES; i++) {
        *where[i] = bytes[i] ? (char *)p->base + off : NULL; /* muon: no statistics, roots or solver scratch */
        off += (bytes[i] + 255) & ~(size_t)255;
    }
    CHECK_CUDA(cudaMemsetAsync(p->base, 0, total, stream));
    CHECK(cuda_blas_create(&p->blas, stream, 0)); /* float32 whatever the model's precision */
    if (p->shampoo) CHECK(create_solver(p, stream));
    /* the state is zero before anything (a resume's put of the roots, the
     * first update) can be queued on another stream */
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return ISTH_OK;
}

extern "C" int cuda_precond_create(CudaPrecond *p, const char *optimizer, const CudaAdamW *opt, const Model *m,
                                   const TrainConfig *tc, cudaStream_t stream)
{
    memset(p, 0, sizeof *p);
    p->shampoo = !strcmp(optimizer, "shampoo");
    p->block = tc->precond_block;
    p->every = tc->precond_every;
    p->stats_every = tc->precond_stats_every;
    p->eps = tc->precond_eps;
    p->beta2 = tc->precond_beta2;
    size_t largest, side;
    CHECK(precond_matrix_extent(m, p->shampoo ? p->block : 0, &largest, &side));
    if (p->shampoo) p->blocks = largest / ((size_t)p->block * (size_t)p->block);
    const int rc = create(p, opt->runs.total, largest, side, stream);
    if (rc == ISTH_OK) return ISTH_OK;
    cuda_precond_destroy(p);
    return isth_fail(rc, "cuda: the %s optimiser's state (%zu params) could not be created on the GPU", optimizer,
                     opt->runs.total);
}

extern "C" void cuda_precond_destroy(CudaPrecond *p)
{
    if (p->base) cudaFree(p->base);
    if (p->work) cudaFree(p->work);
    isth_free(p->host_work);
    if (p->params) cusolverDnDestroyParams(p->params);
    if (p->solver) cusolverDnDestroy(p->solver);
    cuda_blas_destroy(&p->blas);
    memset(p, 0, sizeof *p);
}

extern "C" int cuda_precond_step(CudaPrecond *p, CudaAdamW *opt, const Model *model, float *params,
                                 const float *grads, double lr, double weight_decay, cudaStream_t stream)
{
    if (p->blas.stream != stream) { /* the handles work where the caller queues */
        CHECK_CUBLAS(cublasSetStream(p->blas.handle, stream));
        if (p->solver) CHECK_CUSOLVER(cusolverDnSetStream(p->solver, stream));
        p->blas.stream = stream;
    }
    opt->t++;
    CHECK_CUDA(cudaMemsetAsync(p->counters, 0, sizeof(long long) * CUDA_PRECOND_COUNTERS, stream));
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const AdamWStep k = adamw_constants(opt->t, lr, weight_decay, t->flags & PARAM_DECAY);
        size_t rows = 0, cols = 0;
        if (t->flags & PARAM_MATRIX) precond_matrix_dims(t, &rows, &cols);
        for (int r = 0; r < opt->runs.n; r++) {
            size_t at, packed, n;
            if (!run_segment(&opt->runs, r, t, &at, &packed, &n)) continue;
            if (!(t->flags & PARAM_MATRIX)) {
                CHECK(cuda_adamw_update(params + at, grads + at, opt->m + packed, opt->v + packed, n, &k, stream));
                continue;
            }
            /* runs hold whole chunks (owners are per chunk): one matrix after another */
            for (size_t o = 0; o + rows * cols <= n; o += rows * cols) {
                if (p->shampoo) CHECK(shampoo_matrix(p, opt, params, grads, at + o, packed + o, rows, cols, &k, stream));
                else CHECK(muon_matrix(p, opt, params, grads, at + o, packed + o, rows, cols, &k, stream));
            }
        }
    }
    /* the counters of this update: one synchronisation per step (the
     * decisions themselves were made on the device) */
    long long counted[CUDA_PRECOND_COUNTERS];
    CHECK_CUDA(cudaMemcpyAsync(counted, p->counters, sizeof counted, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    p->root_failures += (long)counted[CNT_FAILED];
    p->stat_resets += (long)counted[CNT_RESET];
    p->fallbacks += (long)counted[CNT_FALLBACK];
    return ISTH_OK;
}
