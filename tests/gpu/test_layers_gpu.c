/* test_layers_gpu.c — the CUDA layers (cuda/layers.cu) against the CPU
 * backend's (src/cpu/layers.c) on random inputs: the embedding forward and
 * backward (bit-identical: the same additions in the same order), RMSNorm forward (output
 * and rstd) and backward (input and weight gradients, accumulated into
 * non-zero buffers; N=301 rows of D=600, neither a multiple of the block),
 * the residual fused with RMSNorm (bit-identical to the two kernels),
 * SwiGLU forward and backward (accumulating into non-zero gradients),
 * rotary embedding forward and backward (tables from rope_tables, T=33 so that rows and heads do not
 * line up with the grid).
 * Tolerance: the same float32 formulas (src/elementwise.h); the GPU's expf
 * (2 ulp) and nvcc's contraction of a*b+c into one fused multiply-add (the
 * host build does not contract) differ from the host's by a few ulp of the
 * *terms*, so |gpu - cpu| <= 1e-5 * max(|cpu|, floor) (fp32, the issue's
 * bound) with floor = the vector's RMS wherever a result is a sum or
 * difference of products that can nearly cancel (SwiGLU's gradients, the
 * rotations, RMSNorm's gradients: a value near zero there carries the
 * rounding of terms of the vector's size). Decided over making the shared
 * math round like the host (__fmul_rn/__fadd_rn everywhere): that would
 * give up the FMAs in the hot element-wise kernels to make a test tighter
 * than any indexing or logic error needs (those miss by the RMS, not by
 * 1e-5 of it). Only the embedding, with no products, is bit-identical to the CPU.
 * TAP output; without a CUDA device the plan is "1..0 # SKIP" with the
 * reason, never a pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codec_math.h"
#include "cpu/layers.h"
#include "embed_buckets.h"
#include "gpu_tap.h"
#include "layers.h"
#include "plans.h"
#include "rng.h"

static int test_no, failures;

/* A kernel's bf16 output (the bf16 path's stored operands) against its fp32
 * kernel's output rounded on the host (codec_to_bf16, nearest even): the
 * same bits, as both round the same float once. */
static void check_rounded(const char *what, const float *d_fp32, const uint16_t *d_bf16, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof(float));
    uint16_t *b = malloc((n ? n : 1) * sizeof(uint16_t));
    size_t bad = n + 1;
    GPU_CHECK(cudaDeviceSynchronize());
    if (f && b) {
        GPU_CHECK(cudaMemcpy(f, d_fp32, n * sizeof(float), cudaMemcpyDeviceToHost));
        GPU_CHECK(cudaMemcpy(b, d_bf16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        for (size_t j = bad = 0; j < n; j++)
            if (b[j] != codec_to_bf16(f[j])) {
                if (bad < 3) fprintf(stderr, "%s[%zu]: bf16 %#06x, the fp32 value %.9g rounds to %#06x\n", what, j,
                                     b[j], f[j], codec_to_bf16(f[j]));
                bad++;
            }
    }
    const int planned = plan_matches(plan_layer_checks, test_no, what);
    if (!planned) fprintf(stderr, "check %d ('%s') is not the plan's (tests/gpu/plans.h)\n", test_no + 1, what);
    printf("%s %d - %s: %zu values, %zu not the fp32 kernel's rounded\n", bad || !planned ? "not ok" : "ok",
           ++test_no, what, n, bad);
    failures += bad != 0 || !planned;
    free(f);
    free(b);
}

/* sums: scale by the vector's RMS where an element is smaller (see the header) */
static void check_scaled(const char *what, const float *gpu, const float *cpu, size_t n, int sums)
{
    double floor = 1e-3;
    if (sums) {
        double ss = 0.0;
        for (size_t j = 0; j < n; j++) ss += (double)cpu[j] * cpu[j];
        floor = fmax(floor, sqrt(ss / (double)n));
    }
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
        if (!(fabs((double)gpu[j] - cpu[j]) <= 1e-5 * fmax(fabs(cpu[j]), floor))) {
            if (bad < 3) fprintf(stderr, "%s[%zu]: gpu %.9g cpu %.9g\n", what, j, gpu[j], cpu[j]);
            bad++;
        }
    const int planned = plan_matches(plan_layer_checks, test_no, what); /* its place in plans.h */
    if (!planned) fprintf(stderr, "check %d ('%s') is not the plan's (tests/gpu/plans.h)\n", test_no + 1, what);
    printf("%s %d - %s: %zu values, %zu outside 1e-5 relative\n", bad || !planned ? "not ok" : "ok", ++test_no, what,
           n, bad);
    failures += bad != 0 || !planned;
}

static void check(const char *what, const float *gpu, const float *cpu, size_t n) { check_scaled(what, gpu, cpu, n, 0); }

static float *random_floats(size_t n, uint64_t stream, double scale)
{
    float *v = malloc(n * sizeof(float));
    for (size_t j = 0; v && j < n; j++) v[j] = (float)(scale * rng_normal(11, stream, j));
    return v;
}

static float *to_device(const float *h, size_t n)
{
    float *d = NULL;
    GPU_CHECK(cudaMalloc((void **)&d, n * sizeof(float)));
    GPU_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static void from_device(float *h, const float *d, size_t n)
{
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
}

int main(void)
{
    char unused[8];
    /* embedding 2, rmsnorm 4 and the fused residual + norm, swiglu 3, rope 2, and 4 outputs stored as bf16 */
    const int PLAN = plan_layer_checks(-1, unused, sizeof unused);
    if (!gpu_present_or_skip()) return 0;
    printf("1..%d\n", PLAN);
    { /* embedding: repeated tokens so the scatter accumulates */
        const size_t N = 777;
        const int V = 256, D = 300; /* two blocks of columns */
        int *tok = malloc(N * sizeof(int)), *d_tok = NULL;
        float *emb = random_floats((size_t)V * D, 13, 1.0), *dout = random_floats(N * (size_t)D, 14, 1.0);
        float *dE = random_floats((size_t)V * D, 15, 0.1), *out = malloc(N * (size_t)D * sizeof(float));
        float *got = malloc((size_t)V * D * sizeof(float) + N * (size_t)D * sizeof(float));
        if (!tok || !emb || !dout || !dE || !out || !got) return 1;
        for (size_t t = 0; t < N; t++) tok[t] = (int)(rng_bits(11, 16, t) % 37); /* few distinct tokens */
        GPU_CHECK(cudaMalloc((void **)&d_tok, N * sizeof(int)));
        GPU_CHECK(cudaMemcpy(d_tok, tok, N * sizeof(int), cudaMemcpyHostToDevice));
        float *d_emb = to_device(emb, (size_t)V * D), *d_dout = to_device(dout, N * (size_t)D),
              *d_dE = to_device(dE, (size_t)V * D), *d_out = to_device(out, N * (size_t)D);
        if (!d_emb || !d_dout || !d_dE || !d_out) return 1;
        encoder_forward(out, tok, emb, N, D);
        if (cuda_encoder_forward(d_out, d_tok, d_emb, N, D, 0)) return 1;
        from_device(got, d_out, N * (size_t)D);
        check("encoder_forward", got, out, N * (size_t)D);
        encoder_backward(dE, dout, tok, N, D);
        int *plan = malloc((3 * N + 1) * sizeof(int)), *count = malloc(V * sizeof(int)), *d_plan = NULL;
        if (!plan || !count) return 1;
        GPU_CHECK(cudaMalloc((void **)&d_plan, (3 * N + 1) * sizeof(int)));
        const int n_ids = embed_buckets(tok, N, V, count, plan, plan + N, plan + 2 * N + 1);
        GPU_CHECK(cudaMemcpy(d_plan, plan, (3 * N + 1) * sizeof(int), cudaMemcpyHostToDevice));
        if (cuda_encoder_backward(d_dE, d_dout, d_plan, d_plan + N, d_plan + 2 * N + 1, n_ids, D, 0)) return 1;
        from_device(got, d_dE, (size_t)V * D);
        const int same = !memcmp(got, dE, (size_t)V * D * sizeof(float));
        const int planned = plan_matches(plan_layer_checks, test_no, "encoder_backward (+=)");
        printf("%s %d - encoder_backward (+=): bit-identical to the CPU\n", same && planned ? "ok" : "not ok",
               ++test_no);
        failures += !planned;
        failures += !same;
    }
    { /* RMSNorm */
        const size_t N = 301;
        const int D = 600; /* over ROW_THREADS: each thread sums several elements of a row */
        const size_t nd = N * (size_t)D;
        float *x = random_floats(nd, 7, 1.5), *w = random_floats(D, 8, 1.0), *dy = random_floats(nd, 9, 1.0);
        float *dx = random_floats(nd, 10, 0.1), *dw = random_floats(D, 12, 0.1);
        float *out = malloc(nd * sizeof(float)), *rs = malloc(N * sizeof(float)), *got = malloc(nd * sizeof(float));
        if (!x || !w || !dy || !dx || !dw || !out || !rs || !got) return 1;
        float *d_x = to_device(x, nd), *d_w = to_device(w, D), *d_dy = to_device(dy, nd), *d_dx = to_device(dx, nd),
              *d_dw = to_device(dw, D), *d_out = to_device(out, nd), *d_rs = to_device(rs, N);
        if (!d_x || !d_w || !d_dy || !d_dx || !d_dw || !d_out || !d_rs) return 1;
        rmsnorm_forward(out, rs, x, w, N, D);
        if (cuda_rmsnorm_forward(d_out, d_rs, d_x, d_w, N, D, 0)) return 1;
        from_device(got, d_out, nd);
        check("rmsnorm_forward out", got, out, nd);
        from_device(got, d_rs, N);
        check("rmsnorm_forward rstd", got, rs, N);
        if (rmsnorm_backward(dx, dw, dy, x, w, rs, N, D)) return 1;
        if (cuda_rmsnorm_backward(d_dx, d_dw, d_dy, d_x, d_w, d_rs, N, D, 0)) return 1;
        from_device(got, d_dx, nd);
        check_scaled("rmsnorm_backward dinp (+=)", got, dx, nd, 1);
        from_device(got, d_dw, D);
        check_scaled("rmsnorm_backward dweight (+=)", got, dw, D, 1);
        /* the fused residual + norm against the two GPU kernels: h, out and rstd, bit for bit */
        float *b = random_floats(nd, 11, 0.7), *d_b = to_device(b, nd), *d_h1 = to_device(out, nd),
              *d_h2 = to_device(out, nd), *d_o1 = to_device(out, nd), *d_r1 = to_device(rs, N);
        float *want = malloc((2 * nd + N) * sizeof(float)), *fused = malloc((2 * nd + N) * sizeof(float));
        if (!b || !d_b || !d_h1 || !d_h2 || !d_o1 || !d_r1 || !want || !fused) return 1;
        if (cuda_residual_forward(d_h1, d_x, d_b, nd, 0) || cuda_rmsnorm_forward(d_out, d_rs, d_h1, d_w, N, D, 0) ||
            cuda_residual_rmsnorm_forward(d_h2, d_o1, d_r1, d_x, d_b, d_w, N, D, 0))
            return 1;
        from_device(want, d_h1, nd), from_device(want + nd, d_out, nd), from_device(want + 2 * nd, d_rs, N);
        from_device(fused, d_h2, nd), from_device(fused + nd, d_o1, nd), from_device(fused + 2 * nd, d_r1, N);
        const int same = !memcmp(want, fused, (2 * nd + N) * sizeof(float));
        const int planned = plan_matches(plan_layer_checks, test_no, "residual_rmsnorm_forward (h, out, rstd)");
        printf("%s %d - residual_rmsnorm_forward (h, out, rstd): the bits of residual then rmsnorm\n",
               same && planned ? "ok" : "not ok", ++test_no);
        failures += !same || !planned;
        /* the same two writing bf16 out */
        uint16_t *d16 = NULL;
        GPU_CHECK(cudaMalloc((void **)&d16, nd * sizeof(uint16_t)));
        if (cuda_rmsnorm_forward(d_out, d_rs, d_x, d_w, N, D, 0) ||
            cuda_rmsnorm_forward_bf16(d16, d_r1, d_x, d_w, N, D, 0))
            return 1;
        check_rounded("rmsnorm_forward out (bf16 stored)", d_out, d16, nd);
        if (cuda_residual_rmsnorm_forward(d_h1, d_o1, d_rs, d_x, d_b, d_w, N, D, 0) ||
            cuda_residual_rmsnorm_forward_bf16(d_h2, d16, d_r1, d_x, d_b, d_w, N, D, 0))
            return 1;
        from_device(want, d_h1, nd), from_device(fused, d_h2, nd);
        if (memcmp(want, fused, nd * sizeof(float))) /* h stays fp32: the same bits */
            fprintf(stderr, "residual_rmsnorm_forward_bf16: h differs from the fp32 kernel's\n"), failures++;
        check_rounded("residual_rmsnorm_forward (h, out) (bf16 stored)", d_o1, d16, nd);
        GPU_CHECK(cudaFree(d16));
    }
    /* SwiGLU */
    const size_t n = 100003;
    float *a = random_floats(n, 1, 3.0), *u = random_floats(n, 2, 1.0), *dh = random_floats(n, 3, 1.0);
    float *da = random_floats(n, 4, 0.1), *du = random_floats(n, 5, 0.1), *h = malloc(n * sizeof(float));
    float *g = malloc(n * sizeof(float));
    if (!a || !u || !dh || !da || !du || !h || !g) return 1;
    float *d_a = to_device(a, n), *d_u = to_device(u, n), *d_dh = to_device(dh, n), *d_da = to_device(da, n),
          *d_du = to_device(du, n), *d_h = to_device(h, n);
    if (!d_a || !d_u || !d_dh || !d_da || !d_du || !d_h) return 1;
    swiglu_forward(h, a, u, n);
    if (cuda_swiglu_forward(d_h, d_a, d_u, n, 0)) return 1;
    from_device(g, d_h, n);
    check("swiglu_forward", g, h, n);
    {
        uint16_t *d16 = NULL;
        GPU_CHECK(cudaMalloc((void **)&d16, n * sizeof(uint16_t)));
        if (cuda_swiglu_forward_bf16(d16, d_a, d_u, n, 0)) return 1;
        check_rounded("swiglu_forward (bf16 stored)", d_h, d16, n);
        GPU_CHECK(cudaFree(d16));
    }
    swiglu_backward(da, du, dh, a, u, n);
    if (cuda_swiglu_backward(d_da, d_du, d_dh, d_a, d_u, n, 0)) return 1;
    from_device(g, d_da, n);
    check_scaled("swiglu_backward da (+=)", g, da, n, 1);
    from_device(g, d_du, n);
    check_scaled("swiglu_backward du (+=)", g, du, n, 1);
    /* rotary, forward then backward of another tensor */
    const int B = 2, T = 33, H = 3, Dh = 16;
    const size_t nx = (size_t)B * T * H * Dh, nt = (size_t)T * (Dh / 2);
    float *cos_t = malloc(nt * sizeof(float)), *sin_t = malloc(nt * sizeof(float));
    float *x = random_floats(nx, 6, 1.0), *gx = malloc(nx * sizeof(float));
    if (!cos_t || !sin_t || !x || !gx) return 1;
    rope_tables(cos_t, sin_t, T, Dh);
    float *d_cos = to_device(cos_t, nt), *d_sin = to_device(sin_t, nt), *d_x = to_device(x, nx);
    if (!d_cos || !d_sin || !d_x) return 1;
    rope_forward(x, cos_t, sin_t, B, T, H, Dh);
    if (cuda_rope_forward(d_x, d_cos, d_sin, B, T, H, Dh, 0)) return 1;
    from_device(gx, d_x, nx);
    check_scaled("rope_forward", gx, x, nx, 1);
    rope_backward(x, cos_t, sin_t, B, T, H, Dh);
    if (cuda_rope_backward(d_x, d_cos, d_sin, B, T, H, Dh, 0)) return 1;
    from_device(gx, d_x, nx);
    check_scaled("rope_backward", gx, x, nx, 1);
    { /* the bf16 path's q, k, v in one launch: q and k rotated as
       * cuda_rope_forward rotates them, v as it is, each rounded once.
       * Against the fp32 kernel's rotation: v bit for bit (the same float
       * rounded); q and k within 2^-8 of the value (the rounding: half of
       * bf16's step, 2^-7 of the leading power of two) plus 1e-5 of the
       * RMS (room for nvcc contracting the rotation into FMAs differently
       * in the two kernels, which moves a nearly cancelling value by ulps
       * of its terms) */
        float *qf = random_floats(nx, 13, 1.0), *kf = random_floats(nx, 14, 1.0), *vf = random_floats(nx, 15, 1.0);
        uint16_t *q16 = malloc(nx * sizeof(uint16_t)), *k16 = malloc(nx * sizeof(uint16_t)),
                 *v16 = malloc(nx * sizeof(uint16_t)), *dq16 = NULL, *dk16 = NULL, *dv16 = NULL;
        float *d_qf = to_device(qf, nx), *d_kf = to_device(kf, nx), *d_vf = to_device(vf, nx);
        if (!qf || !kf || !vf || !q16 || !k16 || !v16 || !d_qf || !d_kf || !d_vf) return 1;
        GPU_CHECK(cudaMalloc((void **)&dq16, nx * 2));
        GPU_CHECK(cudaMalloc((void **)&dk16, nx * 2));
        GPU_CHECK(cudaMalloc((void **)&dv16, nx * 2));
        if (cuda_rope_qkv_bf16(dq16, dk16, dv16, d_qf, d_kf, d_vf, d_cos, d_sin, B, T, H, Dh, 0) ||
            cuda_rope_forward(d_qf, d_cos, d_sin, B, T, H, Dh, 0) ||
            cuda_rope_forward(d_kf, d_cos, d_sin, B, T, H, Dh, 0))
            return 1;
        GPU_CHECK(cudaDeviceSynchronize());
        GPU_CHECK(cudaMemcpy(q16, dq16, nx * 2, cudaMemcpyDeviceToHost));
        GPU_CHECK(cudaMemcpy(k16, dk16, nx * 2, cudaMemcpyDeviceToHost));
        GPU_CHECK(cudaMemcpy(v16, dv16, nx * 2, cudaMemcpyDeviceToHost));
        from_device(qf, d_qf, nx);
        from_device(kf, d_kf, nx);
        double ss = 0.0;
        for (size_t j = 0; j < nx; j++) ss += (double)qf[j] * qf[j] + (double)kf[j] * kf[j];
        const double slack = 1e-5 * sqrt(ss / (2.0 * (double)nx));
        size_t bad = 0;
        for (size_t j = 0; j < nx; j++) {
            bad += v16[j] != codec_to_bf16(vf[j]);
            const double gq = codec_from_bf16(q16[j]), gk = codec_from_bf16(k16[j]);
            bad += !(fabs(gq - qf[j]) <= 0x1p-8 * fabs(qf[j]) + slack) +
                   !(fabs(gk - kf[j]) <= 0x1p-8 * fabs(kf[j]) + slack);
        }
        const int planned = plan_matches(plan_layer_checks, test_no, "rope_qkv forward (bf16 stored)");
        printf("%s %d - rope_qkv forward (bf16 stored): %zu of %zu values off\n", bad || !planned ? "not ok" : "ok",
               ++test_no, bad, 3 * nx);
        failures += bad != 0 || !planned;
        GPU_CHECK(cudaFree(dq16)), GPU_CHECK(cudaFree(dk16)), GPU_CHECK(cudaFree(dv16)), GPU_CHECK(cudaFree(d_qf)), GPU_CHECK(cudaFree(d_kf)), GPU_CHECK(cudaFree(d_vf));
        free(qf), free(kf), free(vf), free(q16), free(k16), free(v16);
    }
    if (test_no != PLAN) {
        fprintf(stderr, "the plan counted %d checks, %d ran\n", PLAN, test_no);
        return 1;
    }
    return failures ? 1 : 0;
}
