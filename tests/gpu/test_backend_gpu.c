/* test_backend_gpu.c — the CUDA backend as a whole against the CPU
 * backend, through the verbs the trainer uses (backend.h), one rank:
 *   - both initialise the same weights (get: bit-identical);
 *   - one training micro-batch: the loss, auxiliary losses and drops, then
 *     every tensor's gradient;
 *   - sumsq and run_sumsq of the gradients; an AdamW step on the same
 *     gradients (its update against the update's RMS); put/get and
 *     copy_state round trips;
 *   - 20 training steps (zero, micro-batch, AdamW): the loss of every step;
 *   - score (the evaluation forward) after them;
 *   - bf16 (two backends of a model with head dimension 64): the step
 *     after an optimiser update reads the updated weights — the same loss,
 *     bit for bit, as a fresh backend given those weights with put — and
 *     not the last step's (the bf16 copy of the weights is rounded again).
 * Tolerances: a whole-model gradient is a chain of ~20 kernels, each within
 * 1e-5 of the CPU's (test_kernels_gpu), so 1e-4 of the tensor's RMS; the
 * loss of each of 20 steps within 1e-4 relative (the bound for
 * fp32 training); exact where the arithmetic is a copy.
 * MPI singleton (or mpirun -np 1); TAP; without a device a SKIP line. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_choose.h"
#include "config.h"
#include "gpu_tap.h"
#include "rng.h"

static int test_no, failures;

static void ok(int pass, const char *fmt, const char *what, double figure)
{
    printf("%s %d - ", pass ? "ok" : "not ok", ++test_no);
    printf(fmt, what, figure);
    printf("\n");
    failures += !pass;
}

/* max |a - b| / max(|b|, rms(b)) over n values */
static double rel_err(const float *a, const float *b, size_t n)
{
    double ss = 0.0, worst = 0.0;
    for (size_t j = 0; j < n; j++) ss += (double)b[j] * b[j];
    const double floor = fmax(sqrt(ss / (double)(n ? n : 1)), 1e-30);
    for (size_t j = 0; j < n; j++) {
        const double e = fabs((double)a[j] - b[j]) / fmax(fabs(b[j]), floor);
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
    }
    return worst;
}

static const char *CONFIG_TEXT = "[model]\nlayers = 2\ndim = 64\nheads = 2\nexperts = 4\ntop_k = 2\nffn = 96\n"
                                 "context = 48\n[train]\nmicro_batch = 3\nlr = 0.003\nwarmup = 0\n";

/* The bf16 path takes head dimensions of 64 and 128 (tensor-core attention). */
static const char *CONFIG16_TEXT = "[model]\nlayers = 2\ndim = 128\nheads = 2\nexperts = 4\ntop_k = 2\nffn = 96\n"
                                   "context = 48\n[train]\nmicro_batch = 3\nlr = 0.003\nwarmup = 0\n"
                                   "precision = bf16\n";

/* The config outlives the backend: backends keep pointers into it (the
 * optimiser's name, the model's shapes), so each lives in static storage. */
static int make_from(Backend **be, const char *text, const char *backend, Coll *ep)
{
    static Config cfgs[4];
    static int made;
    if (made == 4) return 1;
    Config *const cfg = &cfgs[made++];
    char over[64], share[] = "train.gpu_share=1";
    snprintf(over, sizeof over, "train.backend=%s", backend);
    const char *overrides[2] = {over, share};
    if (config_load_text(cfg, text, "test_backend_gpu", overrides, 2)) return 1;
    return backend_create(be, cfg, cfg->train.micro_batch, 0, cfg->model.experts, ep);
}

static int make(Backend **be, const char *backend, Coll *ep) { return make_from(be, CONFIG_TEXT, backend, ep); }

/* bf16: a step after an update against a fresh backend given the updated
 * weights (see the header). */
static int test_bf16_weights_follow_updates(Coll *ep, const int *tok, const int *tgt, int B, int T)
{
    Backend *g1 = NULL, *g2 = NULL;
    if (make_from(&g1, CONFIG16_TEXT, "cuda", ep) || make_from(&g2, CONFIG16_TEXT, "cuda", ep)) return 1;
    const size_t P = g1->table.n_params, all = 0;
    float *w = malloc(P * sizeof(float));
    if (!w) return 1;
    ForwardStats s0, s1, s2;
    if (g1->ops->zero_grads(g1) || g1->ops->train_micro(g1, tok, tgt, B, T, 1.0f, &s0) ||
        g1->ops->optimizer_step(g1, 3e-3))
        return 1;
    if (g1->ops->get(g1, STATE_PARAMS, &all, &P, 1, w) || g2->ops->put(g2, STATE_PARAMS, &all, &P, 1, w)) return 1;
    if (g1->ops->zero_grads(g1) || g2->ops->zero_grads(g2) || g1->ops->train_micro(g1, tok, tgt, B, T, 1.0f, &s1) ||
        g2->ops->train_micro(g2, tok, tgt, B, T, 1.0f, &s2))
        return 1;
    ok(s1.ce_sum == s2.ce_sum, "%s: %.9g on both",
       "bf16: the step after an update, as a fresh backend given its weights", s1.ce_sum);
    ok(s1.ce_sum != s0.ce_sum, "%s: %.9g (the same batch scored otherwise before it)",
       "bf16: the update changed the loss", s1.ce_sum);
    free(w);
    backend_destroy(g2);
    backend_destroy(g1);
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (!gpu_present_or_skip()) {
        MPI_Finalize();
        return 0;
    }
    printf("1..%d\n", 15);
    Coll ep;
    Backend *cpu = NULL, *gpu = NULL;
    if (coll_init(&ep, MPI_COMM_WORLD) || make(&cpu, "cpu", &ep) || make(&gpu, "cuda", &ep)) return 1;
    const size_t P = cpu->table.n_params, all = 0;
    const int B = 3, T = 48;
    const size_t N = (size_t)B * T;
    float *a = malloc(P * sizeof(float)), *b = malloc(P * sizeof(float));
    int *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    if (!a || !b || !tok || !tgt) return 1;

    cpu->ops->get(cpu, STATE_PARAMS, &all, &P, 1, a);
    if (gpu->ops->get(gpu, STATE_PARAMS, &all, &P, 1, b)) return 1;
    ok(!memcmp(a, b, P * sizeof(float)), "%s: bit-identical weights", "init", 0);

    for (size_t t = 0; t < N; t++) {
        tok[t] = (int)(rng_bits(5, 1, t) % 256);
        tgt[t] = t % 11 == 4 ? -1 : (int)(rng_bits(5, 2, t) % 256);
    }
    ForwardStats sc, sg;
    if (cpu->ops->zero_grads(cpu) || gpu->ops->zero_grads(gpu)) return 1;
    if (cpu->ops->train_micro(cpu, tok, tgt, B, T, 1.0f, &sc) || gpu->ops->train_micro(gpu, tok, tgt, B, T, 1.0f, &sg))
        return 1;
    const double ce_err = fabs(sg.ce_sum - sc.ce_sum) / sc.ce_sum;
    ok(ce_err <= 1e-5 && sg.n_targets == sc.n_targets, "%s: relative difference %.2e", "train_micro cross-entropy",
       ce_err);
    const double aux_err = fabs(sg.aux_loss - sc.aux_loss) / fmax(sc.aux_loss, 1e-30),
                 z_err = fabs(sg.z_loss - sc.z_loss) / fmax(sc.z_loss, 1e-30);
    ok(aux_err <= 1e-5 && z_err <= 1e-5, "%s: relative difference %.2e", "train_micro balance and z losses",
       fmax(aux_err, z_err));
    ok(sg.dropped == sc.dropped, "%s: %g copies dropped on both", "train_micro capacity drops", (double)sc.dropped);

    cpu->ops->get(cpu, STATE_GRADS, &all, &P, 1, a);
    if (gpu->ops->get(gpu, STATE_GRADS, &all, &P, 1, b)) return 1;
    double worst = 0.0;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &cpu->table.tensors[i];
        const double e = rel_err(b + t->offset, a + t->offset, t->numel);
        if (!(e <= 1e-4)) fprintf(stderr, "gradient of %s: %.3e of its RMS\n", t->name, e);
        if (!(e <= worst)) worst = e;
    }
    ok(worst <= 1e-4, "%s: worst tensor %.2e of its RMS", "gradients of one micro-batch", worst);

    double qc, qg, rc2[2], rg[2];
    const size_t off[2] = {0, P / 2}, len[2] = {P / 3, P - P / 2};
    if (cpu->ops->sumsq(cpu, STATE_GRADS, 0, 0, &qc) || gpu->ops->sumsq(gpu, STATE_GRADS, 0, 0, &qg)) return 1;
    if (cpu->ops->run_sumsq(cpu, STATE_GRADS, off, len, 2, rc2) || gpu->ops->run_sumsq(gpu, STATE_GRADS, off, len, 2, rg))
        return 1;
    const double sq_err = fmax(fabs(qg - qc) / qc, fmax(fabs(rg[0] - rc2[0]) / rc2[0], fabs(rg[1] - rc2[1]) / rc2[1]));
    ok(sq_err <= 2e-4, "%s: relative difference %.2e", "sumsq and run_sumsq", sq_err);

    /* The AdamW step on the same gradients (the CPU's, put on the GPU):
     * on a first step the update is lr * g / (|g| + eps), so for |g| near
     * eps a gradient's rounding difference dg becomes lr / eps * dg — the
     * optimiser amplifies what the gradient check above already judged.
     * Given equal gradients, only the update's own arithmetic differs: its
     * error is judged against the update's RMS (an update is ~lr, the
     * weights ~100 lr: against them any error would vanish). */
    float *w0 = malloc(P * sizeof(float)), *gc = malloc(P * sizeof(float));
    if (!w0 || !gc) return 1;
    cpu->ops->get(cpu, STATE_PARAMS, &all, &P, 1, w0);
    cpu->ops->get(cpu, STATE_GRADS, &all, &P, 1, gc);
    if (gpu->ops->put(gpu, STATE_GRADS, &all, &P, 1, gc)) return 1;
    if (cpu->ops->optimizer_step(cpu, 1e-3) || gpu->ops->optimizer_step(gpu, 1e-3)) return 1;
    cpu->ops->get(cpu, STATE_PARAMS, &all, &P, 1, a);
    if (gpu->ops->get(gpu, STATE_PARAMS, &all, &P, 1, b)) return 1;
    for (size_t j = 0; j < P; j++) a[j] -= w0[j], b[j] -= w0[j];
    const double step_err = rel_err(b, a, P);
    ok(step_err <= 1e-5, "%s: %.2e of the update's RMS", "one AdamW step on the same gradients", step_err);
    for (size_t j = 0; j < P; j++) a[j] += w0[j], b[j] += w0[j];
    free(w0);
    free(gc);

    for (size_t j = 0; j < P; j++) a[j] = (float)rng_normal(5, 3, j);
    if (gpu->ops->put(gpu, STATE_GRADS, &all, &P, 1, a) || gpu->ops->get(gpu, STATE_GRADS, &all, &P, 1, b)) return 1;
    ok(!memcmp(a, b, P * sizeof(float)), "%s: exact", "put then get", 0);
    float *keep = malloc(P * sizeof(float));
    if (!keep || gpu->ops->get(gpu, STATE_PARAMS, &all, &P, 1, keep)) return 1;
    if (gpu->ops->copy_state(gpu, STATE_PARAMS, STATE_GRADS) || gpu->ops->get(gpu, STATE_PARAMS, &all, &P, 1, b))
        return 1;
    ok(!memcmp(a, b, P * sizeof(float)), "%s: exact", "copy_state", 0);
    if (gpu->ops->put(gpu, STATE_PARAMS, &all, &P, 1, keep)) return 1;
    const size_t moff = 5, mlen = 1000;
    if (gpu->ops->put(gpu, STATE_ADAM_M, &moff, &mlen, 1, a) || gpu->ops->get(gpu, STATE_ADAM_M, &moff, &mlen, 1, b))
        return 1;
    ok(!memcmp(a, b, mlen * sizeof(float)), "%s: exact", "the AdamW moments through put and get", 0);
    /* both back to the same state: the CPU's moments and weights into the GPU */
    float *mc = malloc(P * sizeof(float));
    if (!mc) return 1;
    cpu->ops->get(cpu, STATE_ADAM_M, &all, &P, 1, mc);
    if (gpu->ops->put(gpu, STATE_ADAM_M, &all, &P, 1, mc)) return 1;
    cpu->ops->get(cpu, STATE_ADAM_V, &all, &P, 1, mc);
    if (gpu->ops->put(gpu, STATE_ADAM_V, &all, &P, 1, mc)) return 1;
    cpu->ops->get(cpu, STATE_PARAMS, &all, &P, 1, mc);
    if (gpu->ops->put(gpu, STATE_PARAMS, &all, &P, 1, mc)) return 1;
    gpu->optimizer_t = cpu->optimizer_t;

    double worst_loss = 0.0;
    for (int step = 0; step < 20; step++) {
        for (size_t t = 0; t < N; t++) {
            tok[t] = (int)(rng_bits(6, (uint64_t)step, t) % 64); /* a learnable stream: few symbols */
            tgt[t] = (tok[t] * 7 + 3) % 64;
        }
        if (cpu->ops->zero_grads(cpu) || gpu->ops->zero_grads(gpu)) return 1;
        if (cpu->ops->train_micro(cpu, tok, tgt, B, T, 1.0f, &sc) || gpu->ops->train_micro(gpu, tok, tgt, B, T, 1.0f, &sg))
            return 1;
        if (cpu->ops->optimizer_step(cpu, 3e-3) || gpu->ops->optimizer_step(gpu, 3e-3)) return 1;
        const double e = fabs(sg.ce_sum - sc.ce_sum) / sc.ce_sum;
        if (!(e <= worst_loss)) worst_loss = e;
        if (step == 0 || step == 19)
            fprintf(stderr, "step %d: loss cpu %.7f gpu %.7f\n", step, sc.ce_sum / sc.n_targets, sg.ce_sum / sg.n_targets);
    }
    ok(worst_loss <= 1e-4, "%s: worst relative difference %.2e", "losses of 20 training steps", worst_loss);
    float *lc = malloc(N * sizeof(float)), *lg = malloc(N * sizeof(float));
    if (!lc || !lg || cpu->ops->score(cpu, tok, tgt, B, T, lc) || gpu->ops->score(gpu, tok, tgt, B, T, lg)) return 1;
    const double score_err = rel_err(lg, lc, N);
    ok(score_err <= 1e-4, "%s: %.2e of the losses' RMS", "score after 20 steps", score_err);
    cpu->ops->get(cpu, STATE_PARAMS, &all, &P, 1, a);
    if (gpu->ops->get(gpu, STATE_PARAMS, &all, &P, 1, b)) return 1;
    const double w_err = rel_err(b, a, P);
    ok(w_err <= 1e-3, "%s: %.2e of the weights' RMS", "weights after 20 steps", w_err);
    backend_destroy(gpu);
    backend_destroy(cpu);
    if (test_bf16_weights_follow_updates(&ep, tok, tgt, B, T)) return 1;
    MPI_Finalize();
    return failures ? 1 : 0;
}
