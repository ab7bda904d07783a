/* precond_math.h — the arithmetic of the matrix optimisers (Shampoo and
 * Muon) that both backends run, written once like elementwise.h: inline
 * functions the CPU backend (src/cpu/precond.c) calls in its loops and the
 * CUDA backend (cuda/precond.cu) in its kernels and on the host
 * (__host__ __device__ under nvcc), so the host's tests
 * (tests/test_precond.c) cover the GPU's schedule, block layout and
 * decisions too.
 *
 * Owns: when the statistics and the roots are due, where each b x b block
 * of a row-major matrix and each of its elements lie, the floor and the
 * weight an eigenvalue takes in an inverse fourth root, the grafting's
 * scale and when it is unusable, Muon's momentum, Newton-Schulz
 * coefficients, Gram side, normalisation and scale.
 * Must not: loop over matrices, allocate, or call BLAS or a solver.
 */
#ifndef ISTHMUS_PRECOND_MATH_H
#define ISTHMUS_PRECOND_MATH_H

#include <stddef.h>

#include "elementwise.h" /* ISTH_HD; math.h on the host */

#define MUON_MOMENTUM 0.95
#define MUON_NS_STEPS 5
/* the quintic's coefficients (Jordan et al.): X <- A X + (B S + C S^2) X, S the Gram matrix */
#define MUON_NS_A 3.4445f
#define MUON_NS_B (-4.7750f)
#define MUON_NS_C 2.0315f

/* What update t (1-based) of Shampoo does: fold its gradient into the
 * statistics (every stats_every updates), compute the inverse roots (every
 * `every`), and whether roots exist yet (else the step is Adam's). */
typedef struct {
    int stats_now, roots_now, have_roots;
} PrecondSchedule;

static inline ISTH_HD PrecondSchedule precond_schedule(long t, int every, int stats_every)
{
    PrecondSchedule s;
    s.stats_now = t % stats_every == 0;
    s.roots_now = t % every == 0;
    s.have_roots = t >= every;
    return s;
}

/* Block k of a row-major matrix of `cols` columns tiled by b x b blocks,
 * nb_c blocks to a row of blocks, the blocks numbered row of blocks after
 * row of blocks: the offset of its first element. */
static inline ISTH_HD size_t precond_block_start(size_t k, size_t nb_c, size_t b, size_t cols)
{
    return (k / nb_c) * b * cols + (k % nb_c) * b;
}

/* Element e (row-major inside the block: row e / b, column e % b) of the
 * block whose first element is at `start`. */
static inline ISTH_HD size_t precond_block_element(size_t start, size_t e, size_t b, size_t cols)
{
    return start + (e / b) * cols + e % b;
}

/* The floor eps * lmax added to every eigenvalue of a statistic whose
 * largest is lmax; 0 when the statistic has no root (zero, or not finite:
 * its previous root stays). */
static inline ISTH_HD int precond_root_floor(double lmax, double eps, double *floor_out)
{
    const double f = eps * lmax;
    *floor_out = f;
    return f > 0 && isfinite(f);
}

/* The weight of eigenvalue w in the inverse fourth root: (max(w, 0) +
 * floor)^(-1/4), in double, rounded once (negative eigenvalues are float32
 * rounding of a positive semi-definite matrix: taken as 0). */
static inline ISTH_HD float precond_root_weight(float w, double floor_add)
{
    return (float)pow(fmax((double)w, 0.0) + floor_add, -0.25);
}

/* Grafting: the scale that gives Shampoo's direction (sum of squares s2
 * over the matrix) the length of Adam's (adam2); 0 when there is no
 * usable Shampoo direction (zero, or not finite: Adam's step instead).
 * An infinite s2 is unusable too: its scale would be 0, and 0 times the
 * infinite values a NaN in the weights. */
static inline ISTH_HD int precond_graft_scale(double adam2, double s2, double *scale)
{
    *scale = sqrt(adam2 / s2);
    return s2 > 0 && isfinite(s2) && isfinite(*scale);
}

/* Muon works on the Gram matrix of the shorter side: X X^T when the
 * matrix is wide (rows <= cols), else X^T X. */
static inline ISTH_HD int muon_wide(size_t rows, size_t cols) { return rows <= cols; }

/* The factor that makes the orthogonalised momentum of unit norm. */
static inline ISTH_HD float muon_inverse_norm(double norm) { return (float)(1.0 / (norm + 1e-7)); }

/* The learning rate times the step's scale 0.2 sqrt(max(rows, cols)) (Liu
 * et al. 2025): an RMS like AdamW's, so its lr and weight decay carry over. */
static inline ISTH_HD float muon_lr_scale(float lr, size_t rows, size_t cols)
{
    return (float)(lr * 0.2 * sqrt((double)(rows > cols ? rows : cols)));
}

#endif
