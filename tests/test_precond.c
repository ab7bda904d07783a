/* test_precond.c — the matrix optimisers (src/cpu/precond.c) against
 * independent computations:
 *  - inverse fourth roots of random SPD matrices: R^4 (A + eps lmax I) = I,
 *    multiplied out in double precision (not through LAPACK), with NaN
 *    below the diagonal (only the upper triangle is the statistic);
 *  - a zero or NaN statistic has no root: the previous root stays;
 *  - on an ill-conditioned quadratic with rotated Kronecker curvature,
 *    f(W) = 1/2 <H_L (W - W*) H_R, W - W*>, Shampoo (each at its best
 *    learning rate of a grid) comes within 1/10 of the starting distance to
 *    the minimum in fewer steps than AdamW;
 *  - a NaN poked into a statistic never reaches the weights (reset,
 *    counted; the step still moves the weights, all finite);
 *  - with statistics every other update: none after the first, exactly
 *    (1 - beta2) G G^T and G^T G (upper triangles) after the second;
 *  - Shampoo's updates are the same bit for bit with one and two threads;
 *  - Muon's step is an orthogonalised matrix: its singular values, from
 *    the eigenvalues of X^T X, lie in the quintic's band around 1;
 *  - the arithmetic both backends share (src/precond_math.h, which the CUDA
 *    backend's kernels run too): the blocks tile a matrix exactly once
 *    with every element where row / b and column / b put it, the schedule
 *    of statistics and roots, the root's floor and weights, the grafting's
 *    fallback conditions, Muon's Gram side and scale. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <lapacke.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/precond.h"
#include "cpu/optim.h"
#include "model.h"

#define D 16 /* the test matrix: wq of layer 0, D x D */

static double urand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * 0x1.0p-53;
}

/* a random orthogonal n x n matrix (Gram-Schmidt of a random one), row-major */
static void random_rotation(double *q, int n, uint64_t *s)
{
    for (int i = 0; i < n * n; i++) q[i] = urand(s) - 0.5;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++) {
            double d = 0;
            for (int k = 0; k < n; k++) d += q[i * n + k] * q[j * n + k];
            for (int k = 0; k < n; k++) q[i * n + k] -= d * q[j * n + k];
        }
        double nn = 0;
        for (int k = 0; k < n; k++) nn += q[i * n + k] * q[i * n + k];
        for (int k = 0; k < n; k++) q[i * n + k] /= sqrt(nn);
    }
}

/* a = q diag(lam) q^T */
static void spd(double *a, const double *q, const double *lam, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += q[k * n + i] * lam[k] * q[k * n + j];
            a[i * n + j] = s;
        }
}

static void matmul(const double *a, const double *b, double *c, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

static void test_inverse_fourth_root(void **state)
{
    (void)state;
    uint64_t s = 7;
    const int sizes[] = {8, 32, 128}; /* 128: the default block */
    for (int z = 0; z < 3; z++) {
        const int n = sizes[z];
        double *q = malloc(sizeof(double) * n * n), *a = malloc(sizeof(double) * n * n), *lam = malloc(sizeof(double) * n);
        double *r = malloc(sizeof(double) * n * n), *t1 = malloc(sizeof(double) * n * n), *t2 = malloc(sizeof(double) * n * n);
        float *af = malloc(sizeof(float) * n * n), *rf = malloc(sizeof(float) * n * n);
        float *work = malloc(sizeof(float) * PRECOND_ROOT_WORK(n));
        random_rotation(q, n, &s);
        for (int k = 0; k < n; k++) lam[k] = pow(10.0, -3.0 * k / (n - 1)); /* condition number 1e3 */
        spd(a, q, lam, n);
        for (int i = 0; i < n; i++) /* only the upper triangle may be read: the rest is poison */
            for (int j = 0; j < n; j++) af[i * n + j] = j >= i ? (float)a[i * n + j] : NAN;
        const double eps = 1e-6;
        assert_int_equal(inverse_fourth_root(af, n, n, eps, rf, n, work), 0);
        for (int i = 0; i < n * n; i++) r[i] = rf[i];
        /* r^4 (a + eps lmax I) should be I; lmax = 1 */
        for (int i = 0; i < n; i++) a[i * n + i] += eps;
        matmul(r, r, t1, n);
        matmul(t1, t1, t2, n);
        matmul(t2, a, t1, n);
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) worst = fmax(worst, fabs(t1[i * n + j] - (i == j)));
        /* single precision throughout (2^-24 relative, in the statistic's
         * storage as much as in ssyevd) amplified by the condition number of
         * r^4 (1e3), times a few: ~2.4e-4; measured 1.7e-5 to 3.9e-5
         * (OpenBLAS, 2026-12-03) */
        print_message("# n %d: max |R^4 (A + eps I) - I| %.2e\n", n, worst);
        assert_true(worst < 4e-4);
        free(q), free(a), free(lam), free(r), free(t1), free(t2), free(af), free(rf), free(work);
    }
}

static void test_broken_statistic_has_no_root(void **state)
{
    (void)state;
    const int n = 8;
    float a[64], root[64];
    float work[PRECOND_ROOT_WORK(8)];
    for (int i = 0; i < 64; i++) root[i] = 42.0f;
    memset(a, 0, sizeof a); /* a zero statistic (a matrix whose gradient was always zero) */
    assert_int_equal(inverse_fourth_root(a, n, n, 1e-6, root, n, work), -1);
    for (int i = 0; i < 64; i++) assert_true(root[i] == 42.0f);
    for (int i = 0; i < 64; i++) a[i] = (i % 9 == 0) ? 1.0f : 0.0f;
    a[10] = NAN;
    assert_int_equal(inverse_fourth_root(a, n, n, 1e-6, root, n, work), -1);
    for (int i = 0; i < 64; i++) assert_true(root[i] == 42.0f);
}

/* --- the quadratic ---------------------------------------------------------------------- */

typedef struct {
    Model m;
    AdamW opt;
    Precond pre;
    double hl[D * D], hr[D * D], target[D * D];
} Problem;

static ModelConfig small_model(void)
{
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.layers = 1, c.dim = D, c.heads = 2, c.experts = 2, c.top_k = 1, c.ffn = D, c.context = 8, c.vocab = 256;
    c.capacity_factor = 1.25, c.init_seed = 1;
    return c;
}

static TrainConfig shampoo_settings(void)
{
    TrainConfig t;
    memset(&t, 0, sizeof t);
    t.precond_block = 8, t.precond_every = 5, t.precond_stats_every = 1, t.precond_eps = 1e-6, t.precond_beta2 = 0.99;
    return t;
}

/* f and its gradient at the weights (wq of layer 0) */
static double quadratic(Problem *p)
{
    float *w = model_param(&p->m, T_WQ, 0), *g = model_grad(&p->m, T_WQ, 0);
    double e[D * D], t[D * D], grad[D * D];
    for (int i = 0; i < D * D; i++) e[i] = w[i] - p->target[i];
    matmul(p->hl, e, t, D);
    matmul(t, p->hr, grad, D);
    double f = 0;
    for (int i = 0; i < D * D; i++) {
        f += 0.5 * grad[i] * e[i];
        g[i] = (float)grad[i];
    }
    return f;
}

static void problem_create(Problem *p, const char *optimizer)
{
    memset(p, 0, sizeof *p);
    const ModelConfig mc = small_model();
    assert_int_equal(model_create(&p->m, &mc, 0, mc.experts), 0);
    memset(p->m.params, 0, sizeof(float) * p->m.n_params);
    memset(p->m.grads, 0, sizeof(float) * p->m.n_params);
    const size_t off = (size_t)(model_param(&p->m, T_WQ, 0) - p->m.params), len = D * D;
    assert_int_equal(adamw_create(&p->opt, &off, &len, 1), 0);
    const TrainConfig tc = shampoo_settings();
    if (optimizer) assert_int_equal(precond_create(&p->pre, optimizer, &p->opt, &p->m, &tc), 0);
    uint64_t s = 11;
    double q[D * D], lam[D];
    for (int k = 0; k < D; k++) lam[k] = pow(10.0, -3.0 * k / (D - 1)); /* 1 .. 1e-3 each side: 1e6 in all */
    random_rotation(q, D, &s);
    spd(p->hl, q, lam, D);
    random_rotation(q, D, &s);
    spd(p->hr, q, lam, D);
    for (int i = 0; i < D * D; i++) p->target[i] = urand(&s) - 0.5;
}

static void problem_destroy(Problem *p)
{
    precond_destroy(&p->pre);
    adamw_destroy(&p->opt);
    model_destroy(&p->m);
}

/* The distance to the minimum: the low-curvature directions hold most of
 * it (while f hardly sees them), so it shows how well the curvature is
 * undone. */
static double distance(Problem *p)
{
    const float *w = model_param(&p->m, T_WQ, 0);
    double s = 0;
    for (int i = 0; i < D * D; i++) s += (w[i] - p->target[i]) * (w[i] - p->target[i]);
    return sqrt(s);
}

/* Steps to come within 1/10 of the starting distance (max_steps + 1: never). */
static int steps_to_converge(const char *optimizer, double lr, int max_steps)
{
    Problem *p = calloc(1, sizeof *p);
    problem_create(p, optimizer);
    quadratic(p);
    const double d0 = distance(p);
    int steps = max_steps + 1;
    for (int t = 1; t <= max_steps; t++) {
        if (optimizer) precond_step(&p->pre, &p->opt, &p->m, lr, 0.0);
        else adamw_step(&p->opt, &p->m, lr, 0.0);
        const double f = quadratic(p);
        if (!isfinite(f)) break;
        if (distance(p) <= 0.1 * d0) {
            steps = t;
            break;
        }
    }
    problem_destroy(p);
    free(p);
    return steps;
}

static int best_steps(const char *optimizer, int max_steps, double *best_lr)
{
    const double lrs[] = {0.3, 0.1, 0.03, 0.01, 0.003};
    int best = max_steps + 1;
    for (int i = 0; i < 5; i++) {
        const int s = steps_to_converge(optimizer, lrs[i], max_steps);
        if (s < best) best = s, *best_lr = lrs[i];
    }
    return best;
}

static void test_shampoo_beats_adam_on_an_ill_conditioned_quadratic(void **state)
{
    (void)state;
    double lr_a = 0, lr_s = 0;
    const int adam = best_steps(NULL, 3000, &lr_a), shampoo = best_steps("shampoo", 3000, &lr_s);
    print_message("# steps to 1/10 of the distance: adamw %d (lr %g), shampoo %d (lr %g)\n", adam, lr_a, shampoo, lr_s);
    assert_true(shampoo <= 3000);
    assert_true(shampoo < adam);
}

static void test_nan_statistic_does_not_reach_the_weights(void **state)
{
    (void)state;
    Problem *p = calloc(1, sizeof *p);
    problem_create(p, "shampoo");
    for (int t = 1; t <= 12; t++) { /* roots at 5 and 10 */
        quadratic(p);
        precond_step(&p->pre, &p->opt, &p->m, 0.01, 0.0);
    }
    const long resets = p->pre.stat_resets;
    const float *w = model_param(&p->m, T_WQ, 0);
    float before[D * D];
    memcpy(before, w, sizeof before);
    /* poke NaN into the left statistic of block (0, 0), in its upper triangle (the statistic) */
    const size_t packed = 0;
    p->pre.l[packed + 2 * D + 3] = NAN;
    for (int t = 13; t <= 16; t++) { /* a root step at 15 */
        quadratic(p);
        precond_step(&p->pre, &p->opt, &p->m, 0.01, 0.0);
    }
    assert_true(p->pre.stat_resets > resets);
    /* and an infinity in the right statistic (the other non-finite class) */
    const long resets_nan = p->pre.stat_resets;
    p->pre.r[packed + 5 * D + 7] = -INFINITY;
    quadratic(p);
    precond_step(&p->pre, &p->opt, &p->m, 0.01, 0.0);
    assert_int_equal(p->pre.stat_resets, resets_nan + 1);
    int moved = 0;
    for (int i = 0; i < D * D; i++) {
        assert_true(isfinite(w[i]));
        moved |= w[i] != before[i];
    }
    assert_true(moved);
    for (size_t i = 0; i < p->opt.runs.total; i++)
        assert_true(isfinite(p->pre.lroot[i]) && isfinite(p->pre.l[i]) && isfinite(p->pre.r[i]));
    problem_destroy(p);
    free(p);
}

/* With statistics every other update, the first update leaves them zero and
 * the second forms L = (1 - beta2) G G^T and R = (1 - beta2) G^T G of its
 * gradient per block, checked against sums in double: the upper triangles
 * only, the rest stays zero. */
static void test_statistics_every_other_step(void **state)
{
    (void)state;
    Problem *p = calloc(1, sizeof *p);
    problem_create(p, "shampoo");
    precond_destroy(&p->pre);
    TrainConfig tc = shampoo_settings();
    tc.precond_stats_every = 2;
    assert_int_equal(precond_create(&p->pre, "shampoo", &p->opt, &p->m, &tc), 0);
    quadratic(p);
    precond_step(&p->pre, &p->opt, &p->m, 0.01, 0.0);
    for (size_t i = 0; i < p->opt.runs.total; i++) assert_true(p->pre.l[i] == 0.0f && p->pre.r[i] == 0.0f);
    quadratic(p);
    const float *g = model_grad(&p->m, T_WQ, 0);
    precond_step(&p->pre, &p->opt, &p->m, 0.01, 0.0);
    const int b = tc.precond_block;
    const double w = 1.0f - (float)tc.precond_beta2; /* the weight as the code forms it, in float */
    for (int bi = 0; bi < D / b; bi++)
        for (int bj = 0; bj < D / b; bj++) {
            const size_t o = (size_t)bi * b * D + (size_t)bj * b;
            for (int i = 0; i < b; i++)
                for (int j = 0; j < b; j++) {
                    const float l = p->pre.l[o + (size_t)i * D + j], r = p->pre.r[o + (size_t)i * D + j];
                    if (j < i) {
                        assert_true(l == 0.0f && r == 0.0f);
                        continue;
                    }
                    double el = 0, er = 0, scale_l = 0, scale_r = 0;
                    for (int k = 0; k < b; k++) {
                        el += (double)g[o + (size_t)i * D + k] * g[o + (size_t)j * D + k];
                        er += (double)g[o + (size_t)k * D + i] * g[o + (size_t)k * D + j];
                        scale_l += fabs((double)g[o + (size_t)i * D + k] * g[o + (size_t)j * D + k]);
                        scale_r += fabs((double)g[o + (size_t)k * D + i] * g[o + (size_t)k * D + j]);
                    }
                    /* b float products summed in float, then scaled: (b + 2) ulps of the sum of magnitudes */
                    const double ulp = 0x1.0p-24;
                    assert_true(fabs(l - w * el) <= (b + 2) * ulp * w * scale_l + 1e-30);
                    assert_true(fabs(r - w * er) <= (b + 2) * ulp * w * scale_r + 1e-30);
                }
        }
    problem_destroy(p);
    free(p);
}

/* The same 12 updates (roots at 5 and 10) with one thread and with two
 * (the blocks split between them): weights, statistics and roots equal bit
 * for bit — the grafting's norms are summed per block, then in block order. */
static void test_shampoo_independent_of_thread_count(void **state)
{
    (void)state;
    float *seen[2][3];
    const size_t n = D * D;
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run + 1);
        Problem *p = calloc(1, sizeof *p);
        problem_create(p, "shampoo");
        for (int t = 1; t <= 12; t++) {
            quadratic(p);
            precond_step(&p->pre, &p->opt, &p->m, 0.01, 0.0);
        }
        const float *from[3] = {model_param(&p->m, T_WQ, 0), p->pre.l, p->pre.lroot};
        for (int k = 0; k < 3; k++) {
            seen[run][k] = malloc(sizeof(float) * n);
            memcpy(seen[run][k], from[k], sizeof(float) * n);
        }
        problem_destroy(p);
        free(p);
    }
    omp_set_num_threads(1);
    for (int k = 0; k < 3; k++) {
        assert_memory_equal(seen[0][k], seen[1][k], sizeof(float) * n);
        free(seen[0][k]), free(seen[1][k]);
    }
}

static void test_muon_step_is_orthogonal(void **state)
{
    (void)state;
    Problem *p = calloc(1, sizeof *p);
    problem_create(p, "muon");
    float *w = model_param(&p->m, T_WQ, 0), *g = model_grad(&p->m, T_WQ, 0);
    uint64_t s = 5;
    for (int i = 0; i < D * D; i++) g[i] = (float)(urand(&s) - 0.5); /* a well-spread random gradient */
    const double lr = 0.01;
    precond_step(&p->pre, &p->opt, &p->m, lr, 0.0);
    /* the step x = -w / (lr 0.2 sqrt(D)) (w started at 0); its singular values^2 = eig(x^T x) */
    double xtx[D * D], ev[D], x[D * D];
    for (int i = 0; i < D * D; i++) x[i] = -w[i] / (lr * 0.2 * sqrt((double)D));
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) {
            double s = 0;
            for (int k = 0; k < D; k++) s += x[k * D + i] * x[k * D + j];
            xtx[i * D + j] = s;
        }
    assert_int_equal(LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'N', 'U', D, xtx, D, ev), 0);
    for (int k = 0; k < D; k++) {
        const double sv = sqrt(fmax(ev[k], 0));
        /* five quintic steps send the singular values of a unit-norm
         * matrix into roughly [0.7, 1.2] (Jordan et al.), unless one
         * started below ~1e-3 of the norm (not so for a random matrix) */
        assert_true(sv > 0.5 && sv < 1.3);
    }
    problem_destroy(p);
    free(p);
}

/* Every element of a rows x cols matrix belongs to exactly one block, at
 * the place its row and column give, for square and oblong matrices. */
static void test_block_layout(void **state)
{
    (void)state;
    const size_t shapes[4][3] = {{16, 16, 8}, {32, 96, 16}, {96, 32, 32}, {12, 6, 2}}; /* rows, cols, b */
    for (int z = 0; z < 4; z++) {
        const size_t rows = shapes[z][0], cols = shapes[z][1], b = shapes[z][2], nb_c = cols / b;
        const size_t blocks = rows * cols / (b * b);
        unsigned char *seen = calloc(rows * cols, 1);
        for (size_t k = 0; k < blocks; k++) {
            const size_t start = precond_block_start(k, nb_c, b, cols);
            assert_int_equal(start, (k / nb_c) * b * cols + (k % nb_c) * b); /* the CPU's bi * b * cols + bj * b */
            for (size_t e = 0; e < b * b; e++) {
                const size_t j = precond_block_element(start, e, b, cols), r = j / cols, c = j % cols;
                assert_true(j < rows * cols);
                assert_int_equal(r / b * nb_c + c / b, k); /* the block the element's row and column name */
                assert_int_equal((r % b) * b + c % b, e); /* row-major inside the block */
                seen[j]++;
            }
        }
        for (size_t j = 0; j < rows * cols; j++) assert_int_equal(seen[j], 1);
        free(seen);
    }
}

static void test_schedule_and_decisions(void **state)
{
    (void)state;
    /* roots every 3, statistics every 2: Adam's step until update 3 */
    for (long t = 1; t <= 12; t++) {
        const PrecondSchedule s = precond_schedule(t, 3, 2);
        assert_int_equal(s.roots_now, t % 3 == 0);
        assert_int_equal(s.stats_now, t % 2 == 0);
        assert_int_equal(s.have_roots, t >= 3);
    }
    double floor_add = -1;
    assert_true(precond_root_floor(2.0, 1e-6, &floor_add) && floor_add == 2e-6);
    assert_false(precond_root_floor(0.0, 1e-6, &floor_add));      /* a zero statistic has no root */
    assert_false(precond_root_floor(INFINITY, 1e-6, &floor_add)); /* nor a broken one */
    assert_false(precond_root_floor(NAN, 1e-6, &floor_add));
    /* a negative eigenvalue (rounding of a semi-definite matrix) weighs as 0 */
    assert_true(precond_root_weight(-3e-7f, 1e-4) == precond_root_weight(0.0f, 1e-4));
    assert_true(fabs(precond_root_weight(16.0f, 0.0) - 0.5) < 1e-7);
    double scale = 0;
    assert_true(precond_graft_scale(4.0, 1.0, &scale) && scale == 2.0);
    assert_false(precond_graft_scale(4.0, 0.0, &scale)); /* no Shampoo direction */
    assert_false(precond_graft_scale(NAN, 1.0, &scale)); /* Adam's norm broken */
    assert_false(precond_graft_scale(4.0, INFINITY, &scale)); /* Shampoo's direction broken */
    assert_true(muon_wide(64, 96) && muon_wide(64, 64) && !muon_wide(96, 64));
    assert_true(muon_lr_scale(0.01f, 64, 256) == (float)(0.01f * 0.2 * 16.0));
    assert_true(muon_inverse_norm(0.0) == (float)1e7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_layout),
        cmocka_unit_test(test_schedule_and_decisions),
        cmocka_unit_test(test_inverse_fourth_root),
        cmocka_unit_test(test_broken_statistic_has_no_root),
        cmocka_unit_test(test_shampoo_beats_adam_on_an_ill_conditioned_quadratic),
        cmocka_unit_test(test_nan_statistic_does_not_reach_the_weights),
        cmocka_unit_test(test_statistics_every_other_step),
        cmocka_unit_test(test_shampoo_independent_of_thread_count),
        cmocka_unit_test(test_muon_step_is_orthogonal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
