/* test_optim_gpu.c — the CUDA optimisers (cuda/optim.cu, cuda/precond.cu)
 * against the CPU backend's (src/cpu/optim.c, src/cpu/precond.c) on random
 * weights and gradients:
 *  - three AdamW steps over runs that cross tensor boundaries and leave
 *    gaps: the weights and both moments element by element;
 *  - seven Shampoo steps (blocks of 32 on 64 x 64, 64 x 96 and 96 x 64
 *    matrices: square, wide and tall block grids; roots at updates 3 and 6,
 *    so roots are computed, used and recomputed) and seven Muon steps (wide
 *    and tall Gram sides), over two runs that skip a tensor (so the packed
 *    layout is not the params' own), a fresh gradient each step, one element
 *    of layer 1's wq infinite at update 6: the weights' update, the
 *    moments, Shampoo's statistics and roots, the counters (roots
 *    computed, kept, statistics reset, fallbacks: equal, and the reset and
 *    fallback ones hit), and the same steps again on the GPU, bit for bit.
 * Tolerances (the figure each check prints is the measured one):
 *  - AdamW and every moment: both compute src/elementwise.h in float32;
 *    nvcc may fuse multiply-adds, which changes the last bit or two, so
 *    |gpu - cpu| <= 1e-5 * max(|cpu|, 1e-3) (non-finite values: the same
 *    class on both).
 *  - Shampoo's statistics: sums of 32 float products in another order
 *    (cuBLAS, OpenBLAS): 1e-5 of the matrix's statistic's RMS; below the
 *    diagonal (never formed) exactly 0 on both.
 *  - Shampoo's roots: LAPACK's ssyevd and cuSOLVER's batched solver give
 *    different eigenvectors of the same float32 statistic (the root is the
 *    same function of it, up to rounding): a relative error of about
 *    (1/4) kappa n 2^-24 ~ 1e-5 here (n = 32; kappa <= ~34: each statistic
 *    sums the Gram matrices of two or more independent 32 x 32 gradient
 *    blocks), so 1e-3 of the
 *    root's RMS, a hundredfold margin. The weights' update (w - w0 over the
 *    seven steps) within 1e-3 of its RMS per tensor, for the same reason.
 *  - Muon's update: five Newton-Schulz steps stretch the smallest singular
 *    directions of a random matrix (about 1/n^1.5 of its norm) by up to
 *    3.4445^5 ~ 470, and with them the products' rounding differences
 *    (~5e-7 relative): ~2e-4 in those directions, ~1e-3 at the worst
 *    element, so 5e-3 of the update's RMS per tensor.
 * Output is TAP (the suite's driver), its plan and check names from
 * tests/gpu/plans.h: without a CUDA device the plan is "1..0 # SKIP" with
 * the reason, never a pass. The count of failures decides the exit code. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "config.h"
#include "gpu_tap.h"
#include "cpu/optim.h"
#include "cpu/precond.h"
#include "model.h"
#include "optim.h"
#include "plans.h"
#include "precond.h"
#include "rng.h"

static int test_no, failures;

/* Report check `what` (the plan's next one, else a failure). */
static void report(int pass, const char *what, const char *fmt, ...)
{
    const int planned = plan_matches(plan_optim_checks, test_no, what);
    if (!planned) {
        char want[128] = "(beyond the plan)";
        plan_optim_checks(test_no, want, sizeof want);
        fprintf(stderr, "check %d is '%s', the plan (tests/gpu/plans.h) says '%s'\n", test_no + 1, what, want);
    }
    printf("%s %d - %s: ", pass && planned ? "ok" : "not ok", ++test_no, what);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    failures += !pass || !planned;
}

/* Both non-finite, and of the same kind (NaN, or the same infinity). */
static int same_nonfinite(float a, float b) { return (isnan(a) && isnan(b)) || (isinf(a) && a == b); }

/* Values of gpu outside 1e-5 * max(|cpu|, 1e-3) of cpu. */
static size_t elementwise_bad(const char *what, const float *gpu, const float *cpu, size_t n)
{
    size_t bad = 0;
    for (size_t j = 0; j < n; j++) {
        if (same_nonfinite(gpu[j], cpu[j])) continue;
        const double tol = 1e-5 * fmax(fabs(cpu[j]), 1e-3);
        if (!(fabs((double)gpu[j] - cpu[j]) <= tol)) {
            if (bad < 5) fprintf(stderr, "%s[%zu]: gpu %.9g cpu %.9g\n", what, j, gpu[j], cpu[j]);
            bad++;
        }
    }
    return bad;
}

/* max |gpu - cpu| / rms(cpu) over n values, non-finite values skipped when
 * they agree (a disagreement: infinity). */
static double rms_err(const float *gpu, const float *cpu, size_t n)
{
    double ss = 0;
    size_t finite = 0;
    for (size_t j = 0; j < n; j++)
        if (isfinite(cpu[j])) ss += (double)cpu[j] * cpu[j], finite++;
    const double rms = sqrt(ss / (double)(finite ? finite : 1));
    double worst = 0;
    for (size_t j = 0; j < n; j++) {
        if (same_nonfinite(gpu[j], cpu[j])) continue;
        const double d = fabs((double)gpu[j] - cpu[j]);
        const double e = rms > 0 ? d / rms : (d > 0 ? INFINITY : 0);
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
    }
    return worst;
}

static float *download(const float *d, size_t n)
{
    float *h = malloc(sizeof(float) * (n + 1));
    if (!h) exit(1);
    GPU_CHECK(cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}

/* --- AdamW --------------------------------------------------------------------------------- */

static int test_adamw(Model *m)
{
    const size_t n = m->n_params;
    for (size_t j = 0; j < n; j++) {
        m->params[j] = (float)rng_normal(3, 1, j);
        m->grads[j] = (float)(0.01 * rng_normal(3, 2, j));
    }
    const size_t t1 = m->tensors[1].offset;
    const size_t off[3] = {3, t1 - 5, t1 + 100}, len[3] = {t1 - 20, 40, n - (t1 + 100)};
    AdamW cpu;
    CudaAdamW gpu;
    if (adamw_create(&cpu, off, len, 3) != 0 || cuda_adamw_create(&gpu, off, len, 3) != 0) return 1;
    float *d_params, *d_grads;
    GPU_CHECK(cudaMalloc((void **)&d_params, n * sizeof(float)));
    GPU_CHECK(cudaMalloc((void **)&d_grads, n * sizeof(float)));
    GPU_CHECK(cudaMemcpy(d_params, m->params, n * sizeof(float), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(d_grads, m->grads, n * sizeof(float), cudaMemcpyHostToDevice));
    for (int step = 0; step < 3; step++) {
        adamw_step(&cpu, m, 1e-2, 0.1);
        if (cuda_adamw_step(&gpu, m, d_params, d_grads, 1e-2, 0.1, 0) != 0) return 1;
    }
    GPU_CHECK(cudaDeviceSynchronize());
    float *p = download(d_params, n), *mm = download(gpu.m, cpu.runs.total), *vv = download(gpu.v, cpu.runs.total);
    const char *what[3] = {"adamw weights", "adamw first moment", "adamw second moment"};
    const float *g[3] = {p, mm, vv}, *c[3] = {m->params, cpu.m, cpu.v};
    const size_t len_of[3] = {n, cpu.runs.total, cpu.runs.total};
    for (int i = 0; i < 3; i++) {
        const size_t bad = elementwise_bad(what[i], g[i], c[i], len_of[i]);
        report(bad == 0, what[i], "%zu values, %zu outside 1e-5 relative", len_of[i], bad);
    }
    free(p), free(mm), free(vv);
    GPU_CHECK(cudaFree(d_params));
    GPU_CHECK(cudaFree(d_grads));
    cuda_adamw_destroy(&gpu);
    adamw_destroy(&cpu);
    return 0;
}

/* --- Shampoo and Muon ------------------------------------------------------------------------- */

#define STEPS 7
/* the update whose gradient has an infinite value: a roots update (every 3),
 * so the block's statistics are reset and their roots fail in the same
 * update (a zero statistic has no root): every failure path runs */
#define BROKEN_STEP 6

/* The gradient of update s (1-based): fresh random values, and at
 * BROKEN_STEP one infinite value in layer 1's wq. */
static void gradient(Model *m, int s)
{
    for (size_t j = 0; j < m->n_params; j++) m->grads[j] = (float)(0.01 * rng_normal(11, (uint64_t)s, j));
    if (s == BROKEN_STEP) model_grad(m, T_WQ, 1)[77] = INFINITY;
}

/* The GPU's side of a run: its optimiser over the runs, STEPS updates on
 * `stream` from the weights w0 and gradient(), the state left on the device. */
typedef struct {
    CudaAdamW opt;
    CudaPrecond pre;
    float *params, *grads; /* device */
} GpuRun;

static int gpu_run(GpuRun *g, const char *optimizer, Model *m, const Config *cfg, const float *w0, const size_t *off,
                   const size_t *len, int n_runs, cudaStream_t stream)
{
    memset(g, 0, sizeof *g);
    const size_t n = m->n_params;
    if (cuda_adamw_create(&g->opt, off, len, n_runs) != 0 ||
        cuda_precond_create(&g->pre, optimizer, &g->opt, m, &cfg->train, stream) != 0)
        return 1;
    GPU_CHECK(cudaMalloc((void **)&g->params, n * sizeof(float)));
    GPU_CHECK(cudaMalloc((void **)&g->grads, n * sizeof(float)));
    GPU_CHECK(cudaMemcpyAsync(g->params, w0, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    for (int s = 1; s <= STEPS; s++) {
        gradient(m, s);
        GPU_CHECK(cudaMemcpyAsync(g->grads, m->grads, n * sizeof(float), cudaMemcpyHostToDevice, stream));
        GPU_CHECK(cudaStreamSynchronize(stream)); /* m->grads is rewritten next step */
        if (cuda_precond_step(&g->pre, &g->opt, m, g->params, g->grads, 1e-2, 0.1, stream) != 0) return 1;
    }
    GPU_CHECK(cudaStreamSynchronize(stream));
    return 0;
}

static void gpu_run_destroy(GpuRun *g)
{
    cuda_precond_destroy(&g->pre);
    cuda_adamw_destroy(&g->opt);
    if (g->params) GPU_CHECK(cudaFree(g->params));
    if (g->grads) GPU_CHECK(cudaFree(g->grads));
}

/* The largest error over the tensors of buffers laid out like the table
 * (or packed by the runs: `packed`), each tensor's error against its own
 * RMS; matrices only when `matrices`. */
static double worst_tensor(const Model *m, const ParamRuns *runs, int packed, int matrices, const float *gpu,
                           const float *cpu)
{
    double worst = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        if (matrices && !(t->flags & PARAM_MATRIX)) continue;
        for (int r = 0; r < runs->n; r++) {
            size_t at, pk, n;
            if (!run_segment(runs, r, t, &at, &pk, &n)) continue;
            const size_t o = packed ? pk : at;
            const double e = rms_err(gpu + o, cpu + o, n);
            if (!(e <= worst)) worst = e;
        }
    }
    return worst;
}

/* Shampoo's statistics: the upper triangle of every block within 1e-5 of
 * each matrix's statistic's RMS, below it exactly 0 on both. */
static int statistics_ok(const Model *m, const ParamRuns *runs, int b, const float *gpu, const float *cpu,
                         double *worst)
{
    int lower_ok = 1;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        if (!(t->flags & PARAM_MATRIX)) continue;
        const size_t rows = t->local[t->ndim - 2], cols = t->local[t->ndim - 1], nb_c = cols / (size_t)b;
        for (int r = 0; r < runs->n; r++) {
            size_t at, pk, n;
            if (!run_segment(runs, r, t, &at, &pk, &n)) continue;
            for (size_t o = pk; o + rows * cols <= pk + n; o += rows * cols) {
                double ss = 0, d = 0;
                for (size_t k = 0; k < rows * cols / ((size_t)b * b); k++) {
                    const size_t start = o + precond_block_start(k, nb_c, (size_t)b, cols);
                    for (size_t e = 0; e < (size_t)b * b; e++) {
                        const size_t j = precond_block_element(start, e, (size_t)b, cols);
                        if (e % (size_t)b < e / (size_t)b) {
                            lower_ok &= gpu[j] == 0.0f && cpu[j] == 0.0f;
                            continue;
                        }
                        ss += (double)cpu[j] * cpu[j];
                        d = fmax(d, fabs((double)gpu[j] - cpu[j]));
                        if (!isfinite(gpu[j]) || !isfinite(cpu[j])) d = INFINITY;
                    }
                }
                const double rms = sqrt(ss / (rows * cols / 2.0)), e = rms > 0 ? d / rms : (d > 0 ? INFINITY : 0);
                if (!(e <= *worst)) *worst = e;
            }
        }
    }
    return lower_ok && *worst <= 1e-5;
}

static int test_precond(const char *optimizer, Model *m)
{
    const int shampoo = !strcmp(optimizer, "shampoo");
    Config cfg; /* lives as long as the optimisers that read its train settings */
    char opt_over[64];
    snprintf(opt_over, sizeof opt_over, "train.optimizer=%s", optimizer);
    const char *over[] = {"model.layers=3",  "model.dim=64", "model.ffn=96", "model.experts=4", opt_over,
                          "train.precond_block=32", "train.precond_every=3", "train.precond_stats_every=1"};
    if (config_load_text(&cfg, "", "test", over, 8) != 0) return 1;
    const size_t n = m->n_params;
    /* two runs of whole tensors with wv left out: packed offsets differ from the params' */
    const size_t wv = m->tensors[T_WV].offset, wo = m->tensors[T_WO].offset;
    const size_t off[2] = {0, wo}, len[2] = {wv, n - wo};
    float *w0 = malloc(sizeof(float) * n);
    if (!w0) return 1;
    for (size_t j = 0; j < n; j++) w0[j] = (float)(0.02 * rng_normal(5, 1, j));

    AdamW copt;
    Precond cpre;
    if (adamw_create(&copt, off, len, 2) != 0 || precond_create(&cpre, optimizer, &copt, m, &cfg.train) != 0) return 1;
    memcpy(m->params, w0, sizeof(float) * n);
    for (int s = 1; s <= STEPS; s++) {
        gradient(m, s);
        precond_step(&cpre, &copt, m, 1e-2, 0.1);
    }

    cudaStream_t stream;
    GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    GpuRun g, again;
    if (gpu_run(&g, optimizer, m, &cfg, w0, off, len, 2, stream) != 0) {
        fprintf(stderr, "%s on the GPU failed\n", optimizer);
        return 1;
    }
    const size_t total = copt.runs.total;
    float *p = download(g.params, n), *mm = download(g.opt.m, total), *vv = download(g.opt.v, total);

    /* the weights' update over the steps, per tensor against its RMS */
    char name[64];
    float *dg = malloc(sizeof(float) * n), *dc = malloc(sizeof(float) * n);
    if (!dg || !dc) return 1;
    for (size_t j = 0; j < n; j++) dg[j] = p[j] - w0[j], dc[j] = m->params[j] - w0[j];
    const double tol = shampoo ? 1e-3 : 5e-3;
    const double upd = worst_tensor(m, &copt.runs, 0, 0, dg, dc);
    snprintf(name, sizeof name, "%s weights' update", optimizer);
    report(upd <= tol, name, "%d steps, worst tensor %.2e of its update's RMS (tolerance %g)", STEPS, upd, tol);

    const size_t bad = elementwise_bad("m", mm, copt.m, total) + elementwise_bad("v", vv, copt.v, total);
    snprintf(name, sizeof name, "%s moments", optimizer);
    report(bad == 0, name, "2 x %zu values, %zu outside 1e-5 relative", total, bad);

    if (shampoo) {
        float *l = download(g.pre.l, total), *r = download(g.pre.r, total);
        double worst = 0;
        const int ok = statistics_ok(m, &copt.runs, cfg.train.precond_block, l, cpre.l, &worst) &
                       statistics_ok(m, &copt.runs, cfg.train.precond_block, r, cpre.r, &worst);
        report(ok, "shampoo statistics L, R", "upper triangles: worst matrix %.2e of its RMS (tolerance 1e-5), "
               "below the diagonals 0 on both", worst);
        free(l), free(r);
        float *lr = download(g.pre.lroot, total), *rr = download(g.pre.rroot, total);
        const double root = fmax(worst_tensor(m, &copt.runs, 1, 1, lr, cpre.lroot),
                                 worst_tensor(m, &copt.runs, 1, 1, rr, cpre.rroot));
        report(root <= 1e-3, "shampoo inverse roots", "worst tensor %.2e of its RMS (tolerance 1e-3)", root);
        free(lr), free(rr);
    }

    /* the counters: the same decisions on both, and the broken gradient hit them */
    const long gr[4] = {g.pre.roots, g.pre.root_failures, g.pre.stat_resets, g.pre.fallbacks},
               cr[4] = {cpre.roots, cpre.root_failures, cpre.stat_resets, cpre.fallbacks};
    const int same = !memcmp(gr, cr, sizeof gr), hit = cr[3] > 0 && (!shampoo || (cr[0] > 0 && cr[1] > 0 && cr[2] > 0));
    snprintf(name, sizeof name, "%s counters", optimizer);
    report(same && hit, name, "roots %ld/%ld, kept %ld/%ld, statistics reset %ld/%ld, fallbacks %ld/%ld (GPU/CPU)",
           gr[0], cr[0], gr[1], cr[1], gr[2], cr[2], gr[3], cr[3]);

    /* the same steps again: the same bits (no atomics, fixed trees, the same library calls) */
    if (gpu_run(&again, optimizer, m, &cfg, w0, off, len, 2, stream) != 0) return 1;
    float *p2 = download(again.params, n), *m2 = download(again.opt.m, total);
    int identical = !memcmp(p, p2, sizeof(float) * n) && !memcmp(mm, m2, sizeof(float) * total);
    if (shampoo) {
        float *a = download(g.pre.lroot, total), *b = download(again.pre.lroot, total);
        identical &= !memcmp(a, b, sizeof(float) * total);
        free(a), free(b);
    }
    snprintf(name, sizeof name, "%s the same bits again", optimizer);
    report(identical, name, "weights, first moment%s of a second GPU run", shampoo ? " and left roots" : "");
    free(p2), free(m2);

    gpu_run_destroy(&again);
    gpu_run_destroy(&g);
    GPU_CHECK(cudaStreamDestroy(stream));
    free(p), free(mm), free(vv), free(dg), free(dc), free(w0);
    precond_destroy(&cpre);
    adamw_destroy(&copt);
    return 0;
}

int main(void)
{
    if (!gpu_present_or_skip()) return 0;
    char unused[8];
    const int planned = plan_optim_checks(-1, unused, sizeof unused);
    printf("1..%d\n", planned);
    Config cfg;
    const char *over[] = {"model.layers=3", "model.dim=64", "model.ffn=96", "model.experts=4"};
    if (config_load_text(&cfg, "", "test", over, 4) != 0) return 1;
    Model m;
    if (model_create(&m, &cfg.model, 0, cfg.model.experts) != 0) return 1;
    if (test_adamw(&m) || test_precond("shampoo", &m) || test_precond("muon", &m)) return 1;
    model_destroy(&m);
    if (test_no != planned) {
        fprintf(stderr, "the plan counted %d checks, %d ran\n", planned, test_no);
        return 1;
    }
    return failures ? 1 : 0;
}
