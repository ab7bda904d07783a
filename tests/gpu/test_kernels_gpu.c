/* test_kernels_gpu.c — the CUDA backend's products, attention, fused
 * cross-entropy and MoE kernels (cuda/layers.cu, gemm.cu, attention.cu, moe.cu) against the
 * CPU backend's (src/cpu/layers.c, src/cpu/moe.c) on random inputs whose
 * sizes are not multiples of the blocks or tiles.
 * Tolerance (fp32): |gpu - cpu| <= 1e-5 * max(|cpu|, floor). Products,
 * attention and other sums are taken in another order on the GPU; a sum
 * that nearly cancels moves by ulps of its terms, so there floor is the
 * vector's RMS (as test_layers_gpu). Top-k, the gathers and the
 * dispatch plan are exact; the mean probability (double partial sums) and
 * the plan's losses within 1e-12. bf16
 * products: 1e-2 of the RMS (the bound; bf16 keeps 8 bits).
 * TAP; without a device "1..0 # SKIP" with the reason. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cpu/layers.h"
#include "cpu/moe.h"
#include "attention.h"
#include "attention_tc.h"
#include "gemm.h"
#include "gpu_tap.h"
#include "layers.h"
#include "acts_plan.h"
#include "plans.h"
#include "moe.h"
#include "route_plan.h"
#include "codec_math.h"
#include "rng.h"
#include "../route_draw.h"

static int test_no, failures;

/* Is this check the plan's next one (plans.h)? A check out of its place
 * fails, whatever its values. */
static int in_plan(const char *what)
{
    if (plan_matches(plan_kernels, test_no, what)) return 1;
    char want[128] = "(beyond the plan)";
    plan_kernels(test_no, want, sizeof want);
    fprintf(stderr, "check %d is '%s', the plan (tests/gpu/plans.h) says '%s'\n", test_no + 1, what, want);
    return 0;
}

static void check_tol(const char *what, const float *gpu, const float *cpu, size_t n, double tol, int rms_floor)
{
    double floor = 1e-3;
    if (rms_floor) {
        double ss = 0.0;
        for (size_t j = 0; j < n; j++) ss += (double)cpu[j] * cpu[j];
        floor = fmax(floor, sqrt(ss / (double)(n ? n : 1)));
    }
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
        if (!(fabs((double)gpu[j] - cpu[j]) <= tol * fmax(fabs(cpu[j]), floor))) {
            if (bad < 3) fprintf(stderr, "%s[%zu]: gpu %.9g cpu %.9g\n", what, j, gpu[j], cpu[j]);
            bad++;
        }
    const int planned = in_plan(what);
    printf("%s %d - %s: %zu values, %zu outside %g relative\n", bad || !planned ? "not ok" : "ok", ++test_no, what, n,
           bad, tol);
    failures += bad != 0 || !planned;
}

static void check_sums(const char *what, const float *gpu, const float *cpu, size_t n)
{
    check_tol(what, gpu, cpu, n, 1e-5, 1);
}

static void check_same(const char *what, const void *gpu, const void *cpu, size_t bytes)
{
    const int same = !memcmp(gpu, cpu, bytes), planned = in_plan(what);
    printf("%s %d - %s: identical to the CPU\n", same && planned ? "ok" : "not ok", ++test_no, what);
    failures += !same || !planned;
}

static float *rnd(size_t n, uint64_t stream, double scale)
{
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t j = 0; v && j < n; j++) v[j] = (float)(scale * rng_normal(21, stream, j));
    return v;
}

/* A device copy of n bytes (h NULL: uninitialised); a failed call ends the test (GPU_CHECK). */
static void *dev(const void *h, size_t bytes)
{
    void *d = NULL;
    GPU_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    if (h) GPU_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void back(void *h, const void *d, size_t bytes)
{
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* A device bf16 copy of n host floats, rounded as the GPU rounds (codec_to_bf16). */
static uint16_t *dev16(const float *h, size_t n)
{
    uint16_t *b = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!b) return NULL;
    for (size_t j = 0; j < n; j++) b[j] = codec_to_bf16(h[j]);
    uint16_t *d = dev(b, n * sizeof(uint16_t));
    free(b);
    return d;
}

/* v rounded to bf16 values in place: what a bf16 operand holds, so a
 * product of bf16 operands can be checked against the CPU's fp32 product
 * of the same numbers, leaving only the order of fp32 sums to differ. */
static void round_bf16(float *v, size_t n)
{
    for (size_t j = 0; v && j < n; j++) v[j] = codec_from_bf16(codec_to_bf16(v[j]));
}

/* A rounded copy (NULL on failure). */
static float *bf16_copy(const float *v, size_t n)
{
    float *c = malloc((n ? n : 1) * sizeof(float));
    if (c) memcpy(c, v, n * sizeof(float));
    round_bf16(c, n);
    return c;
}

#define F4(n) ((size_t)(n) * sizeof(float))
#define NEED(p) do { if (!(p)) { fprintf(stderr, "allocation failed: %s\n", #p); return 1; } } while (0)

/* fp32 products on the pedantic handle; with a bf16 handle, fp32 operands
 * that cuBLAS rounds to bf16 itself (FAST_16BF): those are given values
 * bf16 holds already, so its rounding changes nothing and the products
 * match the CPU's as closely as fp32 ones do, up to the tensor cores' sum
 * order (2e-4 of the RMS: a wrong layout or a rounding of its own is off
 * by 2^-9 of the values or more). */
static int test_products(CudaBlas *blas)
{
    const int bf16 = blas->bf16;
    const double tol = bf16 ? 2e-4 : 1e-5;
    const char *tag = bf16 ? " (bf16)" : "";
    char name[96];
    const size_t N = 203;
    const int C = 97, OC = 130, V = 259;
    float *x = rnd(N * C, 1, 1.0), *w = rnd((size_t)C * OC, 2, 0.2), *dy = rnd(N * OC, 3, 1.0);
    float *dx = rnd(N * C, 4, 0.1), *dw = rnd((size_t)C * OC, 5, 0.1), *y = malloc(F4(N * OC));
    float *got = malloc(F4(N * V + (size_t)V * C + N * OC + (size_t)C * OC));
    NEED(x && w && dy && dx && dw && y && got);
    if (bf16) round_bf16(x, N * C), round_bf16(w, (size_t)C * OC), round_bf16(dy, N * OC);
    float *d_x = dev(x, F4(N * C)), *d_w = dev(w, F4((size_t)C * OC)), *d_dy = dev(dy, F4(N * OC)),
          *d_dx = dev(dx, F4(N * C)), *d_dw = dev(dw, F4((size_t)C * OC)), *d_y = dev(NULL, F4(N * OC));
    NEED(d_x && d_w && d_dy && d_dx && d_dw && d_y);
    matmul_forward(y, x, w, N, C, OC);
    if (cuda_matmul_forward(d_y, d_x, d_w, N, C, OC, blas)) return 1;
    back(got, d_y, F4(N * OC));
    snprintf(name, sizeof name, "matmul_forward%s", tag);
    check_tol(name, got, y, N * OC, tol, 1);
    matmul_backward(dx, dw, dy, x, w, N, C, OC);
    if (cuda_matmul_backward(d_dx, d_dw, d_dy, d_x, d_w, N, C, OC, blas)) return 1;
    back(got, d_dx, F4(N * C));
    snprintf(name, sizeof name, "matmul_backward dinp (+=)%s", tag);
    check_tol(name, got, dx, N * C, tol, 1);
    back(got, d_dw, F4((size_t)C * OC));
    snprintf(name, sizeof name, "matmul_backward dweight (+=)%s", tag);
    check_tol(name, got, dw, (size_t)C * OC, tol, 1);
    /* tied head: x (N,C) . embed (V,C)^T */
    float *emb = rnd((size_t)V * C, 6, 0.2), *dl = rnd(N * V, 7, 1.0), *logits = malloc(F4(N * V));
    float *dE = rnd((size_t)V * C, 8, 0.1), *dx2 = rnd(N * C, 9, 0.1);
    NEED(emb && dl && logits && dE && dx2);
    if (bf16) round_bf16(emb, (size_t)V * C), round_bf16(dl, N * V);
    float *d_emb = dev(emb, F4((size_t)V * C)), *d_dl = dev(dl, F4(N * V)), *d_logits = dev(NULL, F4(N * V)),
          *d_dE = dev(dE, F4((size_t)V * C)), *d_dx2 = dev(dx2, F4(N * C));
    NEED(d_emb && d_dl && d_logits && d_dE && d_dx2);
    tied_head_forward(logits, x, emb, N, C, V);
    if (cuda_tied_head_forward(d_logits, d_x, d_emb, N, C, V, blas)) return 1;
    back(got, d_logits, F4(N * V));
    snprintf(name, sizeof name, "tied_head_forward%s", tag);
    check_tol(name, got, logits, N * V, tol, 1);
    tied_head_backward(dx2, dE, dl, x, emb, N, C, V);
    if (cuda_tied_head_backward(d_dx2, d_dE, d_dl, d_x, d_emb, N, C, V, blas)) return 1;
    back(got, d_dx2, F4(N * C));
    snprintf(name, sizeof name, "tied_head_backward dx (+=)%s", tag);
    check_tol(name, got, dx2, N * C, tol, 1);
    back(got, d_dE, F4((size_t)V * C));
    snprintf(name, sizeof name, "tied_head_backward dembed (+=)%s", tag);
    check_tol(name, got, dE, (size_t)V * C, tol, 1);
    return 0;
}

/* The products with operands stored as bf16 (the bf16 path's activations
 * and weight copy; dout rounded by the backward itself), on the bf16
 * handle: against the CPU's fp32 products of the same bf16 values, 2e-4
 * of the RMS as above. */
static int test_products_stored(CudaBlas *blas)
{
    const size_t N = 203;
    const int C = 97, OC = 130;
    float *x = rnd(N * C, 1, 1.0), *w = rnd((size_t)C * OC, 2, 0.2), *dy = rnd(N * OC, 3, 1.0);
    float *dx = rnd(N * C, 4, 0.1), *dw = rnd((size_t)C * OC, 5, 0.1), *y = malloc(F4(N * OC));
    float *got = malloc(F4(N * OC + (size_t)C * OC + N * C));
    NEED(x && w && dy && dx && dw && y && got);
    round_bf16(x, N * C), round_bf16(w, (size_t)C * OC), round_bf16(dy, N * OC);
    uint16_t *d_x = dev16(x, N * C), *d_w = dev16(w, (size_t)C * OC);
    float *d_dy = dev(dy, F4(N * OC)), *d_dx = dev(dx, F4(N * C)), *d_dw = dev(dw, F4((size_t)C * OC)),
          *d_y = dev(NULL, F4(N * OC));
    NEED(d_x && d_w && d_dy && d_dx && d_dw && d_y);
    matmul_forward(y, x, w, N, C, OC);
    if (cuda_matmul_forward_bf16(d_y, d_x, d_w, N, C, OC, blas)) return 1;
    back(got, d_y, F4(N * OC));
    check_tol("matmul_forward (bf16 stored)", got, y, N * OC, 2e-4, 1);
    matmul_backward(dx, dw, dy, x, w, N, C, OC);
    if (cuda_matmul_backward_bf16(d_dx, d_dw, d_dy, d_x, d_w, N, C, OC, blas)) return 1;
    back(got, d_dx, F4(N * C));
    check_tol("matmul_backward dinp (+=) (bf16 stored)", got, dx, N * C, 2e-4, 1);
    back(got, d_dw, F4((size_t)C * OC));
    check_tol("matmul_backward dweight (+=) (bf16 stored)", got, dw, (size_t)C * OC, 2e-4, 1);
    void *d[] = {d_x, d_w, d_dy, d_dx, d_dw, d_y};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) GPU_CHECK(cudaFree(d[i]));
    free(x), free(w), free(dy), free(dx), free(dw), free(y), free(got);
    return 0;
}

static int test_attention(int Dh, int T)
{
    const int B = 2, H = 3, D = H * Dh;
    const size_t n = (size_t)B * T * D;
    char name[96];
    float *q = rnd(n, 10, 1.0), *k = rnd(n, 11, 1.0), *v = rnd(n, 12, 1.0), *dout = rnd(n, 13, 1.0);
    float *dq = rnd(n, 14, 0.1), *dk = rnd(n, 15, 0.1), *dv = rnd(n, 16, 0.1), *out = malloc(F4(n));
    float *att = malloc(F4((size_t)B * H * T * T)), *scratch = malloc(F4((size_t)64 * T * T)), *got = malloc(F4(n));
    NEED(q && k && v && dout && dq && dk && dv && out && att && scratch && got);
    float *d_q = dev(q, F4(n)), *d_k = dev(k, F4(n)), *d_v = dev(v, F4(n)), *d_dout = dev(dout, F4(n)),
          *d_dq = dev(dq, F4(n)), *d_dk = dev(dk, F4(n)), *d_dv = dev(dv, F4(n)), *d_out = dev(NULL, F4(n)),
          *d_lse = dev(NULL, F4((size_t)B * H * T));
    NEED(d_q && d_k && d_v && d_dout && d_dq && d_dk && d_dv && d_out && d_lse);
    attention_forward(out, att, q, k, v, B, T, D, H);
    if (cuda_attention_forward(d_out, d_lse, d_q, d_k, d_v, B, T, D, H, 0)) return 1;
    back(got, d_out, F4(n));
    snprintf(name, sizeof name, "attention_forward Dh=%d T=%d", Dh, T);
    check_sums(name, got, out, n);
    attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, T, D, H);
    if (cuda_attention_backward(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, B, T, D, H, 0)) return 1;
    const float *want[3] = {dq, dk, dv};
    float *have[3] = {d_dq, d_dk, d_dv};
    const char *which[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        back(got, have[i], F4(n));
        snprintf(name, sizeof name, "attention_backward %s (+=) Dh=%d T=%d", which[i], Dh, T);
        check_sums(name, got, want[i], n);
    }
    GPU_CHECK(cudaFree(d_q)), GPU_CHECK(cudaFree(d_k)), GPU_CHECK(cudaFree(d_v)), GPU_CHECK(cudaFree(d_dout)), GPU_CHECK(cudaFree(d_dq)), GPU_CHECK(cudaFree(d_dk)), GPU_CHECK(cudaFree(d_dv));
    GPU_CHECK(cudaFree(d_out)), GPU_CHECK(cudaFree(d_lse));
    free(q), free(k), free(v), free(dout), free(dq), free(dk), free(dv), free(out), free(att), free(scratch), free(got);
    return 0;
}

/* The tensor-core kernels (bf16 products, fp32 softmax and accumulation)
 * against the fp32 kernels just checked against the CPU, on the same
 * inputs, rounded to bf16 (by the host, or by the bf16 path as it reads
 * dout) so that both read the same numbers and
 * only the kernels' own roundings differ (unrounded, q's rounding alone
 * moves the output by up to 6% of its RMS at these score spreads). Those
 * roundings: P before P.V, forward (a host port of the kernels, same tiles
 * and rounding points, against float64: worst 0.7% of the RMS at Dh 64
 * and 128, T up to 200: tolerance 2e-2), and P and dS before the
 * gradients' products, whose sums cancel (a row of dS sums to zero):
 * worst 5.0% (dk, Dh 128, T 200), tolerance 1e-1. A wrong mask or index
 * is off by the values themselves (~1 RMS). */
static int test_attention_tc(int Dh, int T)
{
    const int B = 2, H = 3, D = H * Dh;
    const size_t n = (size_t)B * T * D, rows = (size_t)B * H * T;
    char name[96];
    if (!cuda_attention_tc_supports(Dh)) { /* the *_as calls would refuse bf16 here: nothing checked */
        const char *parts[] = {"forward", "lse", "backward dq (+=)", "backward dk (+=)", "backward dv (+=)"};
        for (int i = 0; i < 5; i++) {
            snprintf(name, sizeof name, "attention_tc %s Dh=%d T=%d", parts[i], Dh, T);
            in_plan(name);
            printf("not ok %d - %s: the tensor-core kernels do not run on this GPU\n", ++test_no, name);
            failures++;
        }
        return 0;
    }
    /* q x 4: scores with a spread (a flat softmax would hide a mask off by one) */
    float *q = rnd(n, 50, 4.0), *k = rnd(n, 51, 1.0), *v = rnd(n, 52, 1.0), *dout = rnd(n, 53, 1.0);
    float *want = malloc(F4(n)), *got = malloc(F4(n)), *lse_want = malloc(F4(rows)), *lse_got = malloc(F4(rows));
    float *g0 = rnd(n, 54, 0.1); /* both start from the same gradients: += is checked */
    NEED(q && k && v && dout && want && got && lse_want && lse_got && g0);
    round_bf16(q, n), round_bf16(k, n), round_bf16(v, n);
    /* dout arrives in fp32 (the next layer's gradient): the bf16 path rounds
     * it where it reads it (its products and the delta), the reference is
     * given it rounded */
    float *dout_r = bf16_copy(dout, n);
    NEED(dout_r);
    float *d_q = dev(q, F4(n)), *d_k = dev(k, F4(n)), *d_v = dev(v, F4(n)), *d_dout = dev(dout, F4(n)),
          *d_dout_r = dev(dout_r, F4(n)),
          *d_out32 = dev(NULL, F4(n)), *d_lse32 = dev(NULL, F4(rows)), *d_lse = dev(NULL, F4(rows)), *d_g32[3],
          *d_g[3];
    uint16_t *d_out = dev(NULL, n * sizeof(uint16_t)), *out16 = malloc(n * sizeof(uint16_t)); /* bf16 writes bf16 */
    uint16_t *d_q16 = dev16(q, n), *d_k16 = dev16(k, n), *d_v16 = dev16(v, n); /* and reads q, k, v as bf16 */
    NEED(d_q && d_k && d_v && d_dout && d_dout_r && d_out32 && d_lse32 && d_out && d_lse && out16 && d_q16 && d_k16 &&
         d_v16);
    for (int i = 0; i < 3; i++) {
        d_g32[i] = dev(g0, F4(n));
        d_g[i] = dev(g0, F4(n));
        NEED(d_g32[i] && d_g[i]);
    }
    if (cuda_attention_forward(d_out32, d_lse32, d_q, d_k, d_v, B, T, D, H, 0) ||
        cuda_attention_forward_as(1, d_out, d_lse, d_q16, d_k16, d_v16, B, T, D, H, 0))
        return 1;
    back(want, d_out32, F4(n));
    back(out16, d_out, n * sizeof(uint16_t));
    for (size_t j = 0; j < n; j++) got[j] = codec_from_bf16(out16[j]);
    snprintf(name, sizeof name, "attention_tc forward Dh=%d T=%d", Dh, T);
    check_tol(name, got, want, n, 2e-2, 1);
    back(lse_want, d_lse32, F4(rows));
    back(lse_got, d_lse, F4(rows));
    snprintf(name, sizeof name, "attention_tc lse Dh=%d T=%d", Dh, T);
    check_tol(name, lse_got, lse_want, rows, 2e-2, 1);
    if (cuda_attention_backward(d_g32[0], d_g32[1], d_g32[2], d_dout_r, d_out32, d_lse32, d_q, d_k, d_v, B, T, D, H,
                                0) ||
        cuda_attention_backward_as(1, d_g[0], d_g[1], d_g[2], d_dout, d_out, d_lse, d_q16, d_k16, d_v16, B, T, D, H,
                                   0))
        return 1;
    GPU_CHECK(cudaFree(d_q16)), GPU_CHECK(cudaFree(d_k16)), GPU_CHECK(cudaFree(d_v16));
    const char *which[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        back(want, d_g32[i], F4(n));
        back(got, d_g[i], F4(n));
        snprintf(name, sizeof name, "attention_tc backward %s (+=) Dh=%d T=%d", which[i], Dh, T);
        check_tol(name, got, want, n, 1e-1, 1);
        GPU_CHECK(cudaFree(d_g32[i])), GPU_CHECK(cudaFree(d_g[i]));
    }
    GPU_CHECK(cudaFree(d_q)), GPU_CHECK(cudaFree(d_k)), GPU_CHECK(cudaFree(d_v)), GPU_CHECK(cudaFree(d_dout)), GPU_CHECK(cudaFree(d_dout_r)), GPU_CHECK(cudaFree(d_out32));
    GPU_CHECK(cudaFree(d_lse32)), GPU_CHECK(cudaFree(d_out)), GPU_CHECK(cudaFree(d_lse));
    free(q), free(k), free(v), free(dout), free(dout_r), free(want), free(got), free(lse_want), free(lse_got), free(g0);
    free(out16);
    return 0;
}

static int test_crossentropy(void)
{
    const size_t N = 157;
    const int V = 259;
    float *logits = rnd(N * V, 17, 3.0), *probs = malloc(F4(N * V)), *losses = malloc(F4(N));
    float *dl = malloc(F4(N * V)), *got = malloc(F4(N * V));
    int *targets = malloc(N * sizeof(int));
    NEED(logits && probs && losses && dl && got && targets);
    for (size_t t = 0; t < N; t++) targets[t] = t % 7 == 3 ? -1 : (int)(rng_bits(21, 18, t) % V);
    float *d_p = dev(logits, F4(N * V)), *d_loss = dev(NULL, F4(N)), *d_dl = dev(NULL, F4(N * V));
    int *d_t = dev(targets, N * sizeof(int));
    NEED(d_p && d_loss && d_dl && d_t);
    memcpy(probs, logits, F4(N * V));
    crossentropy_forward(losses, probs, targets, N, V);
    if (cuda_crossentropy_forward(d_loss, d_p, d_t, N, V, 0)) return 1;
    back(got, d_loss, F4(N));
    check_sums("crossentropy_forward losses", got, losses, N);
    back(got, d_p, F4(N * V));
    check_tol("crossentropy_forward probs", got, probs, N * V, 1e-5, 0);
    crossentropy_backward(dl, probs, targets, 0.37f, N, V);
    if (cuda_crossentropy_backward(d_dl, d_p, d_t, 0.37f, N, V, 0)) return 1;
    back(got, d_dl, F4(N * V));
    check_tol("crossentropy_backward", got, dl, N * V, 1e-5, 0);
    return 0;
}

/* Grouped products (cuda_gemm_batch_*, as cuda_experts_* queue them):
 * experts of 0, 5, 77 and 130 rows, the three kinds of product in one
 * batch, against the CPU's products per expert. */
static int test_gemm_batch(CudaBlas *blas, CudaBlas *blas16, int D, int F)
{
    enum { X = 4 };
    const size_t rows[X] = {0, 5, 77, 130}, total = 212;
    size_t at[X + 1] = {0};
    for (int e = 0; e < X; e++) at[e + 1] = at[e] + rows[e];
    float *x = rnd(total * D, 40, 1.0), *dy = rnd(total * D, 41, 1.0), *h = rnd(total * F, 42, 1.0),
          *w1 = rnd((size_t)X * D * F, 43, 0.2), *w2 = rnd((size_t)X * F * D, 44, 0.2),
          *dh = rnd(total * F, 45, 0.1), *dw2 = rnd((size_t)X * F * D, 46, 0.1);
    float *a = malloc(F4(total * F)), *got = malloc(F4((size_t)X * F * D > total * F ? (size_t)X * F * D : total * F));
    NEED(x && dy && h && w1 && w2 && dh && dw2 && a && got);
    float *d_x = dev(x, F4(total * D)), *d_dy = dev(dy, F4(total * D)), *d_h = dev(h, F4(total * F)),
          *d_w1 = dev(w1, F4((size_t)X * D * F)), *d_w2 = dev(w2, F4((size_t)X * F * D)),
          *d_dh = dev(dh, F4(total * F)), *d_dw2 = dev(dw2, F4((size_t)X * F * D)), *d_a = dev(NULL, F4(total * F));
    NEED(d_x && d_dy && d_h && d_w1 && d_w2 && d_dh && d_dw2 && d_a);
    CudaGemmBatch g;
    if (cuda_gemm_batch_create(&g, 3 * X)) return 1;
    for (int e = 0; e < X; e++) {
        const size_t DF = (size_t)D * F;
        matmul_forward(a + at[e] * F, x + at[e] * D, w1 + e * DF, rows[e], D, F);
        matmul_backward(dh + at[e] * F, dw2 + e * DF, dy + at[e] * D, h + at[e] * F, w2 + e * DF, rows[e], F, D);
        if (cuda_gemm_batch_forward(&g, 0, d_a + at[e] * F, d_x + at[e] * D, d_w1 + e * DF, rows[e], D, F) ||
            cuda_gemm_batch_dinp(&g, 0, d_dh + at[e] * F, d_dy + at[e] * D, d_w2 + e * DF, rows[e], F, D) ||
            cuda_gemm_batch_dweight(&g, 0, d_dw2 + e * DF, d_dy + at[e] * D, d_h + at[e] * F, rows[e], F, D))
            return 1;
    }
    if (cuda_gemm_batch_run(&g, blas)) return 1;
    /* which path ran, for the log: the grouped call, or one call each where cuBLAS refused */
    printf("# gemm_batch (fp32): %s\n", cuda_gemm_batch_last_grouped() ? "one grouped call" : "one call each");
    cuda_gemm_batch_destroy(&g);
    back(got, d_a, F4(total * F));
    check_sums("gemm_batch forward (experts of 0-130 rows)", got, a, total * F);
    back(got, d_dh, F4(total * F));
    check_sums("gemm_batch dinp (+=)", got, dh, total * F);
    back(got, d_dw2, F4((size_t)X * F * D));
    check_sums("gemm_batch dweight (+=)", got, dw2, (size_t)X * F * D);
    { /* the same three kinds with bf16 operands (the bf16 path's experts),
       * on the bf16 handle, against the CPU's products of the same bf16
       * values: 2e-4 of the RMS as test_products_stored; dinp and dweight
       * add to the results above, so the reference goes on from them */
        const size_t DF = (size_t)D * F;
        float *xr = bf16_copy(x, total * D), *dyr = bf16_copy(dy, total * D), *hr = bf16_copy(h, total * F),
              *w1r = bf16_copy(w1, X * DF), *w2r = bf16_copy(w2, X * DF);
        NEED(xr && dyr && hr && w1r && w2r);
        uint16_t *d_x16 = dev16(xr, total * D), *d_dy16 = dev16(dyr, total * D), *d_h16 = dev16(hr, total * F),
                 *d_w1_16 = dev16(w1r, X * DF), *d_w2_16 = dev16(w2r, X * DF);
        NEED(d_x16 && d_dy16 && d_h16 && d_w1_16 && d_w2_16);
        CudaGemmBatch g16;
        if (cuda_gemm_batch_create(&g16, 3 * X)) return 1;
        for (int e = 0; e < X; e++) {
            matmul_forward(a + at[e] * F, xr + at[e] * D, w1r + e * DF, rows[e], D, F);
            matmul_backward(dh + at[e] * F, dw2 + e * DF, dyr + at[e] * D, hr + at[e] * F, w2r + e * DF, rows[e], F,
                            D);
            if (cuda_gemm_batch_forward(&g16, 1, d_a + at[e] * F, d_x16 + at[e] * D, d_w1_16 + e * DF, rows[e], D,
                                        F) ||
                cuda_gemm_batch_dinp(&g16, 1, d_dh + at[e] * F, d_dy16 + at[e] * D, d_w2_16 + e * DF, rows[e], F, D) ||
                cuda_gemm_batch_dweight(&g16, 1, d_dw2 + e * DF, d_dy16 + at[e] * D, d_h16 + at[e] * F, rows[e], F,
                                        D))
                return 1;
        }
        if (cuda_gemm_batch_run(&g16, blas16)) return 1;
        printf("# gemm_batch (bf16 operands): %s\n",
               cuda_gemm_batch_last_grouped() ? "one grouped call" : "one call each");
        cuda_gemm_batch_destroy(&g16);
        back(got, d_a, F4(total * F));
        check_tol("gemm_batch forward (bf16 stored)", got, a, total * F, 2e-4, 1);
        back(got, d_dh, F4(total * F));
        check_tol("gemm_batch dinp (+=) (bf16 stored)", got, dh, total * F, 2e-4, 1);
        back(got, d_dw2, F4(X * DF));
        check_tol("gemm_batch dweight (+=) (bf16 stored)", got, dw2, X * DF, 2e-4, 1);
        void *d16[] = {d_x16, d_dy16, d_h16, d_w1_16, d_w2_16};
        for (size_t i = 0; i < sizeof d16 / sizeof *d16; i++) GPU_CHECK(cudaFree(d16[i]));
        free(xr), free(dyr), free(hr), free(w1r), free(w2r);
    }
    return 0;
}

/* Router, top-k, gates, combine and experts on one rank's routing. */
static int test_moe(CudaBlas *blas, CudaBlas *blas16)
{
    const size_t N = 211;
    const int E = 8, K = 2, D = 40, F = 72;
    const size_t NK = N * K;
    float *logits = rnd(N * E, 19, 2.0), *probs = malloc(F4(N * E)), *lse = malloc(F4(N)), *got = malloc(F4(NK * F));
    int *choice = malloc(NK * sizeof(int)), *gotc = malloc(NK * sizeof(int)), *counts = malloc(E * sizeof(int));
    double *mean = malloc(E * sizeof(double)), *gotd = malloc(E * sizeof(double)), frac[8];
    NEED(logits && probs && lse && got && choice && gotc && counts && mean && gotd);
    for (size_t t = 0; t < N; t += 13) logits[t * E + 5] = logits[t * E + 2]; /* ties: the lower index wins */
    float *d_logits = dev(logits, F4(N * E)), *d_probs = dev(NULL, F4(N * E)), *d_lse = dev(NULL, F4(N));
    int *d_choice = dev(NULL, NK * sizeof(int));
    double *d_mean = dev(NULL, E * sizeof(double));
    NEED(d_logits && d_probs && d_lse && d_choice && d_mean);
    router_softmax_forward(probs, lse, logits, N, E);
    if (cuda_router_softmax_forward(d_probs, d_lse, d_logits, N, E, 0)) return 1;
    back(got, d_probs, F4(N * E));
    check_tol("router_softmax_forward probs", got, probs, N * E, 1e-5, 0);
    back(got, d_lse, F4(N));
    check_tol("router_softmax_forward lse", got, lse, N, 1e-5, 0);
    /* from here on both sides start from the CPU's probabilities */
    GPU_CHECK(cudaMemcpy(d_probs, probs, F4(N * E), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(d_lse, lse, F4(N), cudaMemcpyHostToDevice));
    router_topk(choice, probs, N, E, K);
    if (cuda_router_topk(d_choice, d_probs, N, E, K, 0)) return 1;
    back(gotc, d_choice, NK * sizeof(int));
    check_same("router_topk (ties to the lower index)", gotc, choice, NK * sizeof(int));
    router_stats(counts, mean, choice, probs, N, E, K);
    if (cuda_router_mean_prob(d_mean, d_probs, N, E, 0)) return 1;
    back(gotd, d_mean, E * sizeof(double));
    double worst_mean = 0.0; /* a tree of double partial sums against the CPU's token order */
    for (int e = 0; e < E; e++) worst_mean = fmax(worst_mean, fabs(gotd[e] - mean[e]) / fmax(fabs(mean[e]), 1e-300));
    const int planned_mean = in_plan("router_mean_prob");
    printf("%s %d - router_mean_prob: worst relative %.2g (<= 1e-12)\n", worst_mean <= 1e-12 && planned_mean ? "ok" : "not ok",
           ++test_no, worst_mean);
    failures += !(worst_mean <= 1e-12) || !planned_mean;
    for (int e = 0; e < E; e++) frac[e] = counts[e] / (double)NK;
    /* balance + softmax backward */
    float *dprobs = rnd(N * E, 20, 0.3), *dlog = malloc(F4(N * E));
    NEED(dprobs && dlog);
    float *d_dprobs = dev(dprobs, F4(N * E)), *d_dlog = dev(NULL, F4(N * E));
    double *d_frac = dev(frac, E * sizeof(double));
    NEED(d_dprobs && d_dlog && d_frac);
    moe_balance_backward(dprobs, frac, N, E, 0.01, 0.7f);
    if (cuda_moe_balance_backward(d_dprobs, d_frac, N, E, 0.01, 0.7f, 0)) return 1;
    back(got, d_dprobs, F4(N * E));
    check_tol("moe_balance_backward (+=)", got, dprobs, N * E, 1e-5, 0);
    GPU_CHECK(cudaMemcpy(d_dprobs, dprobs, F4(N * E), cudaMemcpyHostToDevice));
    router_softmax_backward(dlog, dprobs, probs, lse, N, E, 0.001, 0.7f);
    if (cuda_router_softmax_backward(d_dlog, d_dprobs, d_probs, d_lse, N, E, 0.001, 0.7f, 0)) return 1;
    back(got, d_dlog, F4(N * E));
    check_sums("router_softmax_backward", got, dlog, N * E);

    /* combine: one rank, no capacity: the slots are the copies grouped by expert */
    MoeRouting r = {0};
    int *send_copy = malloc(NK * sizeof(int)), *copy_slot = malloc(NK * sizeof(int)), send_counts[1];
    int *pos = malloc(4 * E * sizeof(int));
    NEED(send_copy && copy_slot && pos);
    int remote;
    moe_send_plan(send_copy, copy_slot, send_counts, pos, choice, counts, N, K, 1, E, 0, -1, 0, E, &remote);
    float *y_back = rnd(NK * D, 22, 1.0), *dout = rnd(N * D, 23, 1.0), *out = malloc(F4(N * D));
    float *dysend = malloc(F4(NK * D)), *dpr = rnd(N * E, 24, 0.1), *dinp = rnd(N * D, 25, 0.1);
    NEED(y_back && dout && out && dysend && dpr && dinp);
    for (size_t s = 0; s < NK; s += 9) memset(y_back + s * D, 0, F4(D)); /* dropped copies return zeros */
    r.probs = probs;
    r.choice = choice;
    r.copy_slot = copy_slot;
    r.y_back = y_back;
    CudaRouting cr = {0};
    cr.d_probs = d_probs;
    cr.d_choice = dev(choice, NK * sizeof(int));
    cr.d_copy_slot = dev(copy_slot, NK * sizeof(int));
    cr.d_y_back = dev(y_back, F4(NK * D));
    float *d_out = dev(NULL, F4(N * D)), *d_dout = dev(dout, F4(N * D)), *d_dysend = dev(NULL, F4(NK * D)),
          *d_dpr = dev(dpr, F4(N * E)), *d_dinp = dev(dinp, F4(N * D));
    NEED(cr.d_choice && cr.d_copy_slot && cr.d_y_back && d_out && d_dout && d_dysend && d_dpr && d_dinp);
    moe_combine_forward(out, &r, N, E, K, D);
    if (cuda_moe_combine_forward(d_out, &cr, N, E, K, D, 0)) return 1;
    back(got, d_out, F4(N * D));
    check_tol("moe_combine_forward", got, out, N * D, 1e-5, 1); /* gate-weighted sums: they can nearly cancel */
    moe_combine_backward(dysend, dpr, dout, &r, N, E, K, D);
    if (cuda_moe_combine_backward(d_dysend, d_dpr, d_dout, &cr, N, E, K, D, 0)) return 1;
    back(got, d_dysend, F4(NK * D));
    check_same("moe_combine_backward rows", got, dysend, F4(NK * D));
    back(got, d_dpr, F4(N * E));
    check_sums("moe_combine_backward gates (+=)", got, dpr, N * E);
    moe_scatter_add(dinp, y_back, &r, N, K, D);
    if (cuda_moe_scatter_add(d_dinp, cr.d_y_back, &cr, N, K, D, 0)) return 1;
    back(got, d_dinp, F4(N * D));
    check_tol("moe_scatter_add (+=)", got, dinp, N * D, 1e-5, 0);
    /* gather with dropped rows (-1) */
    int *index = malloc(NK * sizeof(int));
    float *gath = malloc(F4(NK * D));
    NEED(index && gath);
    for (size_t i = 0; i < NK; i++) index[i] = i % 5 == 1 ? -1 : (int)((i * 7) % NK);
    int *d_index = dev(index, NK * sizeof(int));
    float *d_gath = dev(NULL, F4(NK * D));
    NEED(d_index && d_gath);
    rows_gather(gath, y_back, index, NK, D);
    if (cuda_rows_gather(d_gath, cr.d_y_back, d_index, NK, D, 0)) return 1;
    back(got, d_gath, F4(NK * D));
    check_same("rows_gather", got, gath, F4(NK * D));

    /* a layer's SwiGLU experts (rows 0, 77 and 30: one expert with none),
     * forward and backward, against the CPU's expert one at a time */
    enum { XE = 3 };
    const int start[XE + 1] = {0, 0, 77, 107};
    const size_t n = (size_t)start[XE], DF = (size_t)D * F, W = XE * DF;
    float *x = rnd(n * D, 26, 1.0), *wg = rnd(W, 27, 0.2), *wu = rnd(W, 28, 0.2), *wd = rnd(W, 29, 0.2),
          *dy = rnd(n * D, 30, 1.0), *dx = rnd(n * D, 31, 0.1), *dwg = rnd(W, 32, 0.1), *dwu = rnd(W, 33, 0.1),
          *dwd = rnd(W, 34, 0.1);
    float *y = malloc(F4(n * D)), *a = malloc(F4(n * F)), *u = malloc(F4(n * F)), *h = malloc(F4(n * F)),
          *scratch = malloc(F4(3 * n * F));
    NEED(x && wg && wu && wd && dy && dx && dwg && dwu && dwd && y && a && u && h && scratch);
    float *d_x = dev(x, F4(n * D)), *d_wg = dev(wg, F4(W)), *d_wu = dev(wu, F4(W)), *d_wd = dev(wd, F4(W)),
          *d_dy = dev(dy, F4(n * D)), *d_dx = dev(dx, F4(n * D)), *d_dwg = dev(dwg, F4(W)), *d_dwu = dev(dwu, F4(W)),
          *d_dwd = dev(dwd, F4(W)), *d_y = dev(NULL, F4(n * D)), *d_a = dev(NULL, F4(n * F)),
          *d_u = dev(NULL, F4(n * F)), *d_h = dev(NULL, F4(n * F)), *d_scr = dev(NULL, F4(3 * n * F));
    NEED(d_x && d_wg && d_wu && d_wd && d_dy && d_dx && d_dwg && d_dwu && d_dwd && d_y && d_a && d_u && d_h && d_scr);
    CudaGemmBatch g;
    if (cuda_gemm_batch_create(&g, 3 * XE)) return 1;
    for (int e = 0; e < XE; e++) {
        const size_t r0 = (size_t)start[e], ne = (size_t)start[e + 1] - r0;
        if (ne)
            expert_forward(y + r0 * D, a + r0 * F, u + r0 * F, h + r0 * F, x + r0 * D, wg + e * DF, wu + e * DF,
                           wd + e * DF, ne, D, F);
    }
    if (cuda_experts_forward(0, d_y, d_a, d_u, d_h, d_x, d_wg, d_wu, d_wd, start, XE, D, F, &g, blas)) return 1;
    back(got, d_y, F4(n * D));
    check_sums("expert_forward", got, y, n * D);
    /* the backward from the CPU's saved activations on both sides */
    GPU_CHECK(cudaMemcpy(d_a, a, F4(n * F), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(d_u, u, F4(n * F), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(d_h, h, F4(n * F), cudaMemcpyHostToDevice));
    for (int e = 0; e < XE; e++) {
        const size_t r0 = (size_t)start[e], ne = (size_t)start[e + 1] - r0;
        if (ne)
            expert_backward(dx + r0 * D, dwg + e * DF, dwu + e * DF, dwd + e * DF, scratch, dy + r0 * D, x + r0 * D,
                            a + r0 * F, u + r0 * F, h + r0 * F, wg + e * DF, wu + e * DF, wd + e * DF, ne, D, F);
    }
    if (cuda_experts_backward(0, d_dx, d_dwg, d_dwu, d_dwd, d_scr, d_dy, d_x, d_a, d_u, d_h, d_wg, d_wu, d_wd, start,
                              XE, D, F, &g, blas))
        return 1;
    cuda_gemm_batch_destroy(&g);
    back(got, d_dx, F4(n * D));
    check_sums("expert_backward dx (+=)", got, dx, n * D);
    back(got, d_dwg, F4(W));
    check_sums("expert_backward dwg (+=)", got, dwg, W);
    back(got, d_dwu, F4(W));
    check_sums("expert_backward dwu (+=)", got, dwu, W);
    back(got, d_dwd, F4(W));
    check_sums("expert_backward dwd (+=)", got, dwd, W);
    { /* the bf16 path's experts (x, h and the weights stored as bf16; dy,
       * da, du rounded once), on the bf16 handle: against the CPU's fp32
       * experts from the same bf16 inputs (x, the weights, dy), so what
       * differs is the roundings inside the chain — h before the down
       * product, then da and du before theirs — 2^-9 each: per value
       * ~2e-3 of the RMS, so 3e-2 for the largest of some thousand */
        float *y2 = malloc(F4(n * D)), *dx2 = rnd(n * D, 35, 0.1), *dwg2 = rnd(W, 36, 0.1), *dwu2 = rnd(W, 37, 0.1),
              *dwd2 = rnd(W, 38, 0.1);
        float *xr = bf16_copy(x, n * D), *wgr = bf16_copy(wg, W), *wur = bf16_copy(wu, W), *wdr = bf16_copy(wd, W),
              *dyr = bf16_copy(dy, n * D);
        NEED(y2 && dx2 && dwg2 && dwu2 && dwd2 && xr && wgr && wur && wdr && dyr);
        float *d_dyr = dev(dyr, F4(n * D));
        uint16_t *d_x16 = dev16(xr, n * D), *d_wg16 = dev16(wgr, W), *d_wu16 = dev16(wur, W),
                 *d_wd16 = dev16(wdr, W), *d_h16 = dev(NULL, n * F * sizeof(uint16_t));
        float *d_dx2 = dev(dx2, F4(n * D)), *d_dwg2 = dev(dwg2, F4(W)), *d_dwu2 = dev(dwu2, F4(W)),
              *d_dwd2 = dev(dwd2, F4(W));
        NEED(d_dyr && d_x16 && d_wg16 && d_wu16 && d_wd16 && d_h16 && d_dx2 && d_dwg2 && d_dwu2 && d_dwd2);
        CudaGemmBatch g16;
        if (cuda_gemm_batch_create(&g16, 3 * XE)) return 1;
        for (int e = 0; e < XE; e++) {
            const size_t r0 = (size_t)start[e], ne = (size_t)start[e + 1] - r0;
            if (ne) {
                expert_forward(y2 + r0 * D, a + r0 * F, u + r0 * F, h + r0 * F, xr + r0 * D, wgr + e * DF,
                               wur + e * DF, wdr + e * DF, ne, D, F);
                expert_backward(dx2 + r0 * D, dwg2 + e * DF, dwu2 + e * DF, dwd2 + e * DF, scratch, dyr + r0 * D,
                                xr + r0 * D, a + r0 * F, u + r0 * F, h + r0 * F, wgr + e * DF, wur + e * DF,
                                wdr + e * DF, ne, D, F);
            }
        }
        if (cuda_experts_forward(1, d_y, d_a, d_u, d_h16, d_x16, d_wg16, d_wu16, d_wd16, start, XE, D, F, &g16,
                                 blas16))
            return 1;
        back(got, d_y, F4(n * D));
        check_tol("expert_forward (bf16 stored)", got, y2, n * D, 3e-2, 1);
        /* backward from the GPU's own forward (a, u fp32 and h bf16, as training keeps them) */
        if (cuda_experts_backward(1, d_dx2, d_dwg2, d_dwu2, d_dwd2, d_scr, d_dyr, d_x16, d_a, d_u, d_h16, d_wg16,
                                  d_wu16, d_wd16, start, XE, D, F, &g16, blas16))
            return 1;
        cuda_gemm_batch_destroy(&g16);
        back(got, d_dx2, F4(n * D));
        check_tol("expert_backward dx (+=) (bf16 stored)", got, dx2, n * D, 3e-2, 1);
        back(got, d_dwg2, F4(W));
        check_tol("expert_backward dwg (+=) (bf16 stored)", got, dwg2, W, 3e-2, 1);
        back(got, d_dwu2, F4(W));
        check_tol("expert_backward dwu (+=) (bf16 stored)", got, dwu2, W, 3e-2, 1);
        back(got, d_dwd2, F4(W));
        check_tol("expert_backward dwd (+=) (bf16 stored)", got, dwd2, W, 3e-2, 1);
        void *d16[] = {d_dyr, d_x16, d_wg16, d_wu16, d_wd16, d_h16, d_dx2, d_dwg2, d_dwu2, d_dwd2};
        for (size_t i = 0; i < sizeof d16 / sizeof *d16; i++) GPU_CHECK(cudaFree(d16[i]));
        free(y2), free(dx2), free(dwg2), free(dwu2), free(dwd2), free(xr), free(wgr), free(wur), free(wdr), free(dyr);
    }
    return test_gemm_batch(blas, blas16, D, F);
}

/* The dispatch plan on the device (cuda_route_*: route_plan.h in kernels)
 * against moe.c's host plan, for every rank of a simulated learner of G
 * ranks: the kernels take the count matrix and the rank, so one GPU can
 * play each rank in turn. Skewed random routings, capacity that drops.
 * One learner of El experts per rank and N tokens per rank (Ex > 0: a
 * router of Ex more, held elsewhere: ROUTE_DROP): *bad counts the
 * differences, *worst the losses' largest relative difference. */
static int route_plan_case(int El, int N, int Ex, size_t *bad, double *worst)
{
    enum { G = 4, K = 2 };
    const int Es = G * El, E = Es + Ex, off = Ex / 2, C = N * K; /* Ex > 0: ROUTE_DROP's split experts */
    int *choice = malloc(sizeof(int) * (size_t)G * C), *cnt = calloc((size_t)G * E, sizeof(int));
    int *lcnt = malloc(sizeof(int) * G * E), remote; /* the learner's own experts' counts */
    int *send_copy = malloc(sizeof(int) * C), *copy_slot = malloc(sizeof(int) * C), *pos = malloc(sizeof(int) * 4 * E);
    int *recv_row = malloc(sizeof(int) * G * C), *row_src = malloc(sizeof(int) * G * C),
        *start = malloc(sizeof(int) * (El + 1)), *hdr = malloc(sizeof(int) * (4 + 2 * G + El + 1)),
        *got_slot = malloc(sizeof(int) * C), *got_token = malloc(sizeof(int) * C), *got_counts = malloc(sizeof(int) * E),
        *got_row = malloc(sizeof(int) * G * C), *got_src = malloc(sizeof(int) * G * C);
    double *frac = malloc(sizeof(double) * E), *got_frac = malloc(sizeof(double) * E),
           *mean = malloc(sizeof(double) * E);
    NEED(lcnt && choice && cnt && send_copy && copy_slot && pos && recv_row && row_src && start && hdr && got_slot &&
         got_token && got_counts && got_row && got_src && frac && got_frac && mean);
    unsigned seed = 7;
    for (int s = 0; s < G; s++) route_draw(choice + (size_t)s * C, cnt + s * E, N, K, E, &seed);
    memcpy(lcnt, cnt, sizeof(int) * G * E);
    route_keep_columns(lcnt, G, E, off, Es);
    const int cap = moe_capacity(1.0, (size_t)N * G, K, E);
    const double learner_copies = (double)N * G * K;
    const size_t hdr_n = cuda_route_hdr_ints(G, El);
    int *d_choice = dev(NULL, sizeof(int) * C), *d_counts = dev(NULL, sizeof(int) * E),
        *d_cnt = dev(cnt, sizeof(int) * G * E), *d_hdr = dev(NULL, sizeof(int) * hdr_n),
        *d_bases = dev(NULL, sizeof(int) * 3 * E), *d_pos = dev(NULL, sizeof(int) * cuda_route_pos_ints(C, E)),
        *d_slot = dev(NULL, sizeof(int) * C), *d_token = dev(NULL, sizeof(int) * C),
        *d_recv_row = dev(NULL, sizeof(int) * G * C), *d_row_src = dev(NULL, sizeof(int) * G * C);
    double *d_frac = dev(NULL, sizeof(double) * E), *d_mean = dev(NULL, sizeof(double) * E),
           *d_stats = dev(NULL, sizeof(double) * 3);
    float *d_lse = dev(NULL, sizeof(float) * N);
    NEED(d_choice && d_counts && d_cnt && d_hdr && d_bases && d_pos && d_slot && d_token && d_recv_row && d_row_src &&
         d_frac && d_mean && d_stats && d_lse);
    for (int me = 0; me < G; me++) {
        int send_counts[G], recv_counts[G], dropped;
        double stats[3];
        const int *mine = choice + (size_t)me * C;
        const int n_sent =
            moe_send_plan(send_copy, copy_slot, send_counts, pos, mine, lcnt, N, K, G, El, me, cap, off, E, &remote);
        const int n_recv = moe_recv_count(recv_counts, lcnt, G, El, me, cap);
        moe_owner_plan(recv_row, row_src, start, &dropped, lcnt, G, El, me, cap);
        GPU_CHECK(cudaMemcpy(d_choice, mine, sizeof(int) * C, cudaMemcpyHostToDevice));
        GPU_CHECK(cudaMemcpy(d_cnt, cnt, sizeof(int) * G * E, cudaMemcpyHostToDevice)); /* the plan narrows it in place */
        if (cuda_route_histogram(d_counts, d_choice, C, E, 0) ||
            cuda_route_plan(d_hdr, d_bases, d_frac, d_cnt, G, El, me, cap, learner_copies, E, off, 0) ||
            cuda_route_slots(d_slot, d_token, d_pos, d_choice, d_bases, d_hdr, N, K, E, off, Es, 0) ||
            cuda_route_owner_map(d_recv_row, d_row_src, d_cnt, d_hdr, G, El, me, cap, n_recv, 0))
            return 1;
        back(got_counts, d_counts, sizeof(int) * E);
        back(hdr, d_hdr, sizeof(int) * hdr_n);
        back(got_slot, d_slot, sizeof(int) * C);
        back(got_token, d_token, sizeof(int) * C);
        back(got_row, d_recv_row, sizeof(int) * n_recv);
        back(got_src, d_row_src, sizeof(int) * n_recv);
        back(got_frac, d_frac, sizeof(double) * E);
        *bad += memcmp(got_counts, cnt + me * E, sizeof(int) * E) != 0;
        *bad += hdr[ROUTE_HDR_SENT] != n_sent || hdr[ROUTE_HDR_RECV] != n_recv || hdr[ROUTE_HDR_DROPPED] != dropped ||
                hdr[ROUTE_HDR_REMOTE] != remote || (Ex > 0 && !remote);
        *bad += memcmp(hdr + ROUTE_HDR_COUNTS, send_counts, sizeof send_counts) != 0;
        *bad += memcmp(hdr + ROUTE_HDR_COUNTS + G, recv_counts, sizeof recv_counts) != 0;
        *bad += memcmp(hdr + ROUTE_HDR_COUNTS + 2 * G, start, sizeof(int) * (El + 1)) != 0;
        *bad += memcmp(got_slot, copy_slot, sizeof(int) * C) != 0;
        for (int i = 0; i < n_sent; i++) *bad += got_token[i] != send_copy[i] / K;
        for (int i = n_sent; i < C; i++) *bad += got_token[i] != -1; /* dropped: gathered as zero rows */
        *bad += memcmp(got_row, recv_row, sizeof(int) * n_recv) != 0 || memcmp(got_src, row_src, sizeof(int) * n_recv);
        for (int e = 0; e < E; e++) {
            int total = 0;
            for (int q = 0; q < G; q++) total += cnt[q * E + e];
            frac[e] = total / learner_copies;
            mean[e] = (e + 1.0) / (E * (E + 1.0) / 2.0);
        }
        *bad += memcmp(got_frac, frac, sizeof(double) * E) != 0;
        /* the losses the forward logs: moe.c's sums, the z loss's as a tree */
        float *lse = rnd(N, 40 + me, 2.0);
        NEED(lse);
        GPU_CHECK(cudaMemcpy(d_lse, lse, sizeof(float) * N, cudaMemcpyHostToDevice));
        GPU_CHECK(cudaMemcpy(d_mean, mean, sizeof(double) * E, cudaMemcpyHostToDevice));
        GPU_CHECK(cudaMemset(d_stats, 0, sizeof stats));
        if (cuda_route_losses(d_stats, d_frac, d_mean, d_lse, d_hdr, N, E, 0.01, 0.001, 0)) return 1;
        back(stats, d_stats, sizeof stats);
        const double aux = moe_balance_loss(frac, mean, E, 0.01), z = moe_z_loss(lse, N, 0.001);
        *worst = fmax(*worst, fmax(fabs(stats[0] - aux) / aux, fabs(stats[1] - z) / z));
        *bad += stats[2] != dropped;
        free(lse);
    }
    void *bufs[] = {d_choice, d_counts, d_cnt, d_hdr, d_bases, d_pos, d_slot, d_token, d_recv_row, d_row_src,
                    d_frac, d_mean, d_stats, d_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) GPU_CHECK(cudaFree(bufs[i]));
    void *host[] = {lcnt, choice, cnt, send_copy, copy_slot, pos, recv_row, row_src, start, hdr, got_slot, got_token,
                    got_counts, got_row, got_src, frac, got_frac, mean};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    return 0;
}

/* Two learners: 12 experts, 1400 copies per rank (positions counted in 6
 * chunks); 2048 experts (the positions' per-warp counts past 48 KiB of
 * shared memory: the opt-in path), 600 copies per rank. */
static int test_route_plan(void)
{
    size_t bad = 0;
    double worst = 0.0;
    if (route_plan_case(3, 700, 0, &bad, &worst) || route_plan_case(512, 300, 0, &bad, &worst) ||
        route_plan_case(3, 700, 5, &bad, &worst))
        return 1;
    const int planned = in_plan("dispatch plan (4 ranks, every one)");
    printf("%s %d - dispatch plan (4 ranks, every one; 12, 2048, 12 of 17 experts): %zu differences from the host\n",
           bad || !planned ? "not ok" : "ok", ++test_no, bad);
    failures += bad != 0 || !planned;
    const int planned2 = in_plan("dispatch plan losses (balance, z, dropped)");
    printf("%s %d - dispatch plan losses (balance, z, dropped): worst relative %.2g (<= 1e-12)\n",
           worst <= 1e-12 && planned2 ? "ok" : "not ok", ++test_no, worst);
    failures += !(worst <= 1e-12) || !planned2;
    return 0;
}

int main(void)
{
    if (!gpu_present_or_skip()) return 0;
    char unused[8];
    const int PLAN = plan_kernels(-1, unused, sizeof unused); /* 2 x 6 products, 4 x 4 + 2 x 5 attention, 3 + 18 */
    printf("1..%d\n", PLAN);
    CudaBlas blas, blas16; /* as the backend makes them: fp32 (pedantic), bf16 (default math) */
    if (cuda_blas_create(&blas, 0, 0) || cuda_blas_create(&blas16, 0, 1)) return 1;
    if (test_products(&blas) || test_products(&blas16) || test_products_stored(&blas16)) return 1;
    for (int i = 0; i < 4; i++)
        if (test_attention(plan_attention_dh[i], plan_attention_t[i])) return 1;
    for (int i = 0; i < 2; i++)
        if (test_attention_tc(plan_attention_tc_dh[i], plan_attention_tc_t[i])) return 1;
    if (test_crossentropy() || test_moe(&blas, &blas16) || test_route_plan()) return 1;
    cuda_blas_destroy(&blas);
    cuda_blas_destroy(&blas16);
    if (test_no != PLAN) {
        fprintf(stderr, "the plan counted %d checks, %d ran\n", PLAN, test_no);
        return 1;
    }
    return failures ? 1 : 0;
}
