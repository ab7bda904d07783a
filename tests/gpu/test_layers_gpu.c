/* test_layers_gpu.c — the CUDA layers (cuda/layers.cu) against the CPU
 * backend's (src/cpu/layers.c) on random inputs: SwiGLU forward and
 * backward (accumulating into non-zero gradients), rotary embedding forward
 * and backward (tables from rope_tables, T=33 so that rows and heads do not
 * line up with the grid).
 * Tolerance: the same float32 formulas (src/elementwise.h); the GPU's expf
 * and fused multiply-adds differ from the host's by a few ulp, so
 * |gpu - cpu| <= 1e-5 * max(|cpu|, 1e-3) (fp32, the bound).
 * TAP output; without a CUDA device the plan is "1..0 # SKIP" with the
 * reason, never a pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cpu/layers.h"
#include "layers.h"
#include "rng.h"

static int test_no, failures;

static void check(const char *what, const float *gpu, const float *cpu, size_t n)
{
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
        if (!(fabs((double)gpu[j] - cpu[j]) <= 1e-5 * fmax(fabs(cpu[j]), 1e-3))) {
            if (bad < 3) fprintf(stderr, "%s[%zu]: gpu %.9g cpu %.9g\n", what, j, gpu[j], cpu[j]);
            bad++;
        }
    printf("%s %d - %s: %zu values, %zu outside 1e-5 relative\n", bad ? "not ok" : "ok", ++test_no, what, n, bad);
    failures += bad != 0;
}

static float *random_floats(size_t n, uint64_t stream, double scale)
{
    float *v = malloc(n * sizeof(float));
    for (size_t j = 0; v && j < n; j++) v[j] = (float)(scale * rng_normal(11, stream, j));
    return v;
}

static float *to_device(const float *h, size_t n)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * sizeof(float)) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}

static void from_device(float *h, const float *d, size_t n)
{
    cudaDeviceSynchronize();
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
}

int main(void)
{
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
        printf("1..0 # SKIP no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 0;
    }
    printf("1..4\n");
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
    swiglu_backward(da, du, dh, a, u, n);
    if (cuda_swiglu_backward(d_da, d_du, d_dh, d_a, d_u, n, 0)) return 1;
    from_device(g, d_da, n);
    check("swiglu_backward da (+=)", g, da, n);
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
    check("rope_forward", gx, x, nx);
    rope_backward(x, cos_t, sin_t, B, T, H, Dh);
    if (cuda_rope_backward(d_x, d_cos, d_sin, B, T, H, Dh, 0)) return 1;
    from_device(gx, d_x, nx);
    check("rope_backward", gx, x, nx);
    return failures ? 1 : 0;
}
