/* precond.c — see precond.h. */
#include "precond.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

_Static_assert(sizeof(lapack_int) == sizeof(float), "ssyevd's integer workspace is carved from a float buffer");

int precond_matrix_extent(const Model *m, int block, size_t *largest, size_t *side)
{
    *largest = *side = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        if (!(t->flags & PARAM_MATRIX)) continue;
        size_t r, c;
        precond_matrix_dims(t, &r, &c);
        if (r * c > *largest) *largest = r * c;
        if (r > *side) *side = r;
        if (c > *side) *side = c;
        if (block > 0 && (r % (size_t)block || c % (size_t)block))
            return isth_fail(ISTH_EINPUT, "[train] precond_block = %d does not divide %s's %zu x %zu matrices", block,
                             t->name, r, c);
    }
    return ISTH_OK;
}

int precond_create(Precond *p, const char *optimizer, const AdamW *opt, const Model *m, const TrainConfig *tc)
{
    memset(p, 0, sizeof *p);
    p->shampoo = !strcmp(optimizer, "shampoo");
    p->block = tc->precond_block;
    p->every = tc->precond_every;
    p->stats_every = tc->precond_stats_every;
    p->eps = tc->precond_eps;
    p->beta2 = tc->precond_beta2;
    p->threads = omp_get_max_threads();
    size_t largest, side;
    CHECK(precond_matrix_extent(m, p->shampoo ? p->block : 0, &largest, &side));
    const size_t n = opt->runs.total + 1, b = (size_t)p->block;
    const AllocCategory was = alloc_category(ALLOC_OPTIMIZER); /* memory.c predicts all of it there */
    p->dir = isth_malloc(sizeof(float) * (largest + 1));
    p->sdir = isth_malloc(sizeof(float) * (largest + 1));
    /* shampoo: one b x b product per thread; muon: X X^T and its square (side^2 each) */
    const size_t tmp = p->shampoo ? b * b * (size_t)p->threads : 2 * side * side;
    p->tmp = isth_malloc(sizeof(float) * (tmp + 1));
    if (p->shampoo) {
        p->l = isth_calloc(n, sizeof(float));
        p->r = isth_calloc(n, sizeof(float));
        p->lroot = isth_calloc(n, sizeof(float));
        p->rroot = isth_calloc(n, sizeof(float));
        p->work = isth_malloc(sizeof(float) * PRECOND_ROOT_WORK(b) * (size_t)p->threads);
        p->block_sums = isth_malloc(sizeof(double) * 2 * (largest / (b * b) + 1));
    }
    alloc_category(was);
    if (p->dir && p->sdir && p->tmp && (!p->shampoo || (p->l && p->r && p->lroot && p->rroot && p->work && p->block_sums)))
        return ISTH_OK;
    precond_destroy(p);
    return isth_fail(ISTH_ERUNTIME, "out of memory for the %s optimiser's state (%zu params)", optimizer,
                     opt->runs.total);
}

void precond_destroy(Precond *p)
{
    isth_free(p->l);
    isth_free(p->r);
    isth_free(p->lroot);
    isth_free(p->rroot);
    isth_free(p->dir);
    isth_free(p->sdir);
    isth_free(p->tmp);
    isth_free(p->work);
    isth_free(p->block_sums);
    memset(p, 0, sizeof *p);
}

int inverse_fourth_root(const float *a, int n, int lda, double eps, float *root, int ldr, float *work)
{
    const size_t nn = (size_t)n * n;
    float *q = work, *qs = work + nn, *prod = work + 2 * nn, *w = work + 3 * nn, *lwork = w + n;
    /* ssyevd's own workspace from ours: LAPACKE_ssyevd would allocate it per
     * call (fresh pages each time at these sizes) */
    lapack_int *iwork = (lapack_int *)(lwork + PRECOND_SYEVD_LWORK(n));
    /* a's upper triangle (row-major) is, read column-major, the lower one of
     * the same memory: LAPACK takes it as it is, with no transposed copies */
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) {
            const float v = a[(size_t)i * lda + j];
            if (!isfinite(v)) return -1;
            q[(size_t)i * n + j] = v;
        }
    /* Single precision: the statistic is stored in float32, so its small
     * eigenvalues are already uncertain by ~2^-24 of the largest; dsyevd
     * would find the exact root of that perturbed matrix at 1.7x the time. */
    if (LAPACKE_ssyevd_work(LAPACK_COL_MAJOR, 'V', 'L', n, q, n, w, lwork, (lapack_int)PRECOND_SYEVD_LWORK(n), iwork,
                            (lapack_int)PRECOND_SYEVD_LIWORK(n)) != 0)
        return -1;
    double lmax = 0, floor;
    for (int k = 0; k < n; k++) lmax = fmax(lmax, w[k]);
    if (!precond_root_floor(lmax, eps, &floor)) return -1; /* a zero (or broken) statistic has no root */
    /* root = Q diag(w) Q^T; eigenvector k is q's column k (contiguous) */
    for (int k = 0; k < n; k++) {
        const float wk = precond_root_weight(w[k], floor);
        for (int i = 0; i < n; i++) qs[(size_t)k * n + i] = q[(size_t)k * n + i] * wk;
    }
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, qs, n, q, n, 0.0f, prod, n);
    for (size_t k = 0; k < nn; k++)
        if (!isfinite(prod[k])) return -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) root[(size_t)i * ldr + j] = prod[(size_t)j * n + i];
    return 0;
}

/* The sum of squares of x[0 .. n), in eight float lanes (a vector loop)
 * added in double in a fixed order. */
static double sumsq_lanes(const float *x, size_t n)
{
    float lane[8] = {0};
    size_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) lane[l] += x[c + l] * x[c + l];
    double s = 0;
    for (int l = 0; l < 8; l++) s += lane[l];
    for (; c < n; c++) s += (double)x[c] * x[c];
    return s;
}

/* Adam's moments of a b x b block (row stride ld), its direction
 * m^ / (sqrt(v^) + eps) row by row into dir (row stride ld_dir: the
 * matrix's direction, or one row of scratch that each row overwrites);
 * returns the direction's sum of squares. */
static double adam_block(const float *g, float *m, float *v, size_t b, size_t ld, const AdamWStep *k, float *dir,
                         size_t ld_dir)
{
    double ss = 0;
    for (size_t r = 0; r < b; r++) {
        const size_t o = r * ld;
        float *d = dir + r * ld_dir;
        for (size_t c = 0; c < b; c++) {
            adam_moments(&m[o + c], &v[o + c], g[o + c], k);
            d[c] = adam_direction_of(m[o + c], v[o + c], k);
        }
        ss += sumsq_lanes(d, b);
    }
    return ss;
}

/* Adam's direction from moments already updated (the fallbacks' path). */
static void adam_direction(const float *m, const float *v, size_t n, const AdamWStep *k, float *dir)
{
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < n; j++) dir[j] = adam_direction_of(m[j], v[j], k);
}

static double sumsq_block(const float *x, size_t b, size_t ld)
{
    double s = 0;
    for (size_t r = 0; r < b; r++) s += sumsq_lanes(x + r * ld, b);
    return s;
}

static double sumsq(const float *x, size_t n)
{
    double s = 0;
    for (size_t j = 0; j < n; j++) s += (double)x[j] * x[j];
    return s;
}

/* p <- p * decay - lr * scale * dir */
static void apply(float *p, const float *dir, size_t n, float decay, float lr_scale)
{
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < n; j++) p[j] = p[j] * decay - lr_scale * dir[j];
}

/* Whether every value of the upper triangle of the b x b block at x (row
 * stride ld: a statistic, all that ssyrk forms and the roots read) is
 * finite. An IEEE single is infinite or NaN exactly when its exponent bits
 * are all ones: an integer test with no branch per row, so each row is one
 * vector loop (the scan runs every step over both statistics of every
 * block). */
static int upper_finite(const float *x, size_t b, size_t ld)
{
    uint32_t broken = 0;
    for (size_t r = 0; r < b; r++) {
        const float *row = x + r * ld;
        for (size_t c = r; c < b; c++) {
            uint32_t bits;
            memcpy(&bits, &row[c], sizeof bits);
            broken |= (bits & 0x7f800000u) == 0x7f800000u;
        }
    }
    return !broken;
}

/* One matrix (rows x cols at params + at, its state at packed) by Shampoo.
 * Everything but the final step is done block by block, each block's
 * gradient, moments and statistics once through the cache: Adam's moments,
 * the statistics, the roots when due, the direction. The two norms of the
 * grafting are summed per block and then in block order, so the result
 * does not depend on the thread count. */
static void shampoo_matrix(Precond *p, AdamW *opt, Model *m, size_t at, size_t packed, size_t rows, size_t cols,
                           const AdamWStep *k)
{
    const size_t n = rows * cols, b = (size_t)p->block, nb_r = rows / b, nb_c = cols / b;
    const float *g = m->grads + at;
    float *mom = opt->m + packed, *vel = opt->v + packed, *L = p->l + packed, *R = p->r + packed,
          *Lr = p->lroot + packed, *Rr = p->rroot + packed, *dir = p->dir, *sdir = p->sdir;
    double *adam_ss = p->block_sums, *shampoo_ss = p->block_sums + nb_r * nb_c;
    const float beta = (float)p->beta2;
    const PrecondSchedule when = precond_schedule(opt->t, p->every, p->stats_every);
    const int roots_now = when.roots_now, have_roots = when.have_roots, stats_now = when.stats_now;
    long failures = 0, resets = 0;
#pragma omp parallel for schedule(static) collapse(2) reduction(+ : failures, resets)
    for (size_t bi = 0; bi < nb_r; bi++)
        for (size_t bj = 0; bj < nb_c; bj++) {
            const size_t blk = bi * nb_c + bj, o = precond_block_start(blk, nb_c, b, cols); /* its first element */
            /* Adam's direction is kept only while it is the step (before the first roots);
             * after that only its norm counts, and each row goes through the scratch */
            float *tmp = p->tmp + b * b * (size_t)omp_get_thread_num();
            adam_ss[blk] = have_roots ? adam_block(g + o, mom + o, vel + o, b, cols, k, tmp, 0)
                                      : adam_block(g + o, mom + o, vel + o, b, cols, k, dir + o, cols);
            if (stats_now) { /* the upper triangles only (symmetric: half the products of a GEMM) */
                cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)b, (int)b, 1.0f - beta, g + o, (int)cols,
                            beta, L + o, (int)cols);
                cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)b, (int)b, 1.0f - beta, g + o, (int)cols,
                            beta, R + o, (int)cols);
                float *fac[2] = {L + o, R + o};
                for (int s = 0; s < 2; s++) { /* a broken statistic starts over rather than poison the next roots */
                    if (upper_finite(fac[s], b, cols)) continue;
                    for (size_t r = 0; r < b; r++) memset(fac[s] + r * cols, 0, sizeof(float) * b);
                    resets++;
                }
            }
            if (roots_now) {
                float *work = p->work + PRECOND_ROOT_WORK(b) * (size_t)omp_get_thread_num();
                if (inverse_fourth_root(L + o, (int)b, (int)cols, p->eps, Lr + o, (int)cols, work) != 0) failures++;
                if (inverse_fourth_root(R + o, (int)b, (int)cols, p->eps, Rr + o, (int)cols, work) != 0) failures++;
            }
            if (!have_roots) continue;
            /* the direction Lr m^ Rr, m^ = m c1 */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)b, (int)b, k->c1, Lr + o, (int)cols,
                        mom + o, (int)cols, 0.0f, tmp, (int)b);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)b, (int)b, 1.0f, tmp, (int)b, Rr + o,
                        (int)cols, 0.0f, sdir + o, (int)cols);
            shampoo_ss[blk] = sumsq_block(sdir + o, b, cols);
        }
    if (roots_now) p->roots += (long)(2 * nb_r * nb_c);
    p->root_failures += failures;
    p->stat_resets += resets;
    double adam2 = 0, s2 = 0;
    for (size_t blk = 0; blk < nb_r * nb_c; blk++) adam2 += adam_ss[blk];
    if (!have_roots) { /* before the first roots: Adam */
        apply(m->params + at, dir, n, k->decay, k->lr);
        return;
    }
    for (size_t blk = 0; blk < nb_r * nb_c; blk++) s2 += shampoo_ss[blk];
    /* grafting: Adam's step length over the matrix, Shampoo's direction */
    double scale;
    if (!precond_graft_scale(adam2, s2, &scale)) { /* no usable direction: Adam's, counted */
        p->fallbacks++;
        adam_direction(mom, vel, n, k, dir);
        apply(m->params + at, dir, n, k->decay, k->lr);
        return;
    }
    apply(m->params + at, sdir, n, k->decay, (float)(k->lr * scale));
}

/* One matrix by Muon: the Nesterov momentum orthogonalised by Newton-Schulz. */
static void muon_matrix(Precond *p, AdamW *opt, Model *m, size_t at, size_t packed, size_t rows, size_t cols,
                        const AdamWStep *k)
{
    const float A = MUON_NS_A, B = MUON_NS_B, C = MUON_NS_C;
    const size_t n = rows * cols;
    const float *g = m->grads + at;
    float *mom = opt->m + packed, *x = p->sdir, *y = p->dir, *s = p->tmp;
    const int wide = muon_wide(rows, cols); /* work on the Gram matrix of the shorter side */
    const size_t side = wide ? rows : cols;
    float *q = s + side * side;
    const float mu = (float)MUON_MOMENTUM;
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < n; j++) {
        mom[j] = mu * mom[j] + g[j];
        x[j] = g[j] + mu * mom[j];
    }
    const double norm = sqrt(sumsq(x, n));
    const float inv = muon_inverse_norm(norm);
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < n; j++) x[j] *= inv;
    const int R = (int)rows, Cc = (int)cols, S = (int)side;
    for (int it = 0; it < MUON_NS_STEPS; it++) {
        /* s = X X^T (wide) or X^T X; q = B s + C s s; y = A X + q X (wide) or A X + X q */
        if (wide) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, Cc, 1.0f, x, Cc, x, Cc, 0.0f, s, S);
        else cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, S, R, 1.0f, x, Cc, x, Cc, 0.0f, s, S);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, S, S, C, s, S, s, S, 0.0f, q, S);
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < side * side; j++) q[j] += B * s[j];
        memcpy(y, x, sizeof(float) * n);
        if (wide) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, Cc, R, 1.0f, q, S, x, Cc, A, y, Cc);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, Cc, Cc, 1.0f, x, Cc, q, S, A, y, Cc);
        float *t = x;
        x = y;
        y = t;
    }
    const double out = sqrt(sumsq(x, n));
    if (!isfinite(out)) { /* a broken gradient: no step for this matrix, counted */
        p->fallbacks++;
        return;
    }
    apply(m->params + at, x, n, k->decay, muon_lr_scale(k->lr, rows, cols));
}

void precond_step(Precond *p, AdamW *opt, Model *model, double lr, double weight_decay)
{
    opt->t++;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const AdamWStep k = adamw_constants(opt->t, lr, weight_decay, t->flags & PARAM_DECAY);
        size_t rows = 0, cols = 0;
        if (t->flags & PARAM_MATRIX) precond_matrix_dims(t, &rows, &cols);
        for (int r = 0; r < opt->runs.n; r++) {
            size_t at, packed, n;
            if (!run_segment(&opt->runs, r, t, &at, &packed, &n)) continue;
            if (!(t->flags & PARAM_MATRIX)) {
                float *pp = model->params + at, *g = model->grads + at, *mm = opt->m + packed, *vv = opt->v + packed;
#pragma omp parallel for schedule(static)
                for (size_t j = 0; j < n; j++) adamw_update(&pp[j], &mm[j], &vv[j], g[j], &k);
                continue;
            }
            /* runs hold whole chunks (owners are per chunk): one matrix after another */
            for (size_t o = 0; o + rows * cols <= n; o += rows * cols) {
                if (p->shampoo) shampoo_matrix(p, opt, model, at + o, packed + o, rows, cols, &k);
                else muon_matrix(p, opt, model, at + o, packed + o, rows, cols, &k);
            }
        }
    }
}
