/* test_layers.c — each layer's float32 forward against the naive double
 * reference, and its backward against central finite differences of that
 * reference in double precision, on small shapes.
 *
 * For a layer y = f(x, w) the scalar checked is S = sum(c * y) with fixed
 * random c; the backward called with dout = c must return dS/dx and dS/dw.
 * Tolerance as in test_model.c: |g - fd| <= 1e-4 * max|fd| + 1e-6 per
 * element (float32 rounding on sums of a few dozen terms is ~1e-6 relative;
 * the double difference with step 1e-6 is accurate to ~1e-9).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/blas_select.h"
#include "cpu/layers.h"
#include "cpu/moe.h"
#include "embed_buckets.h"
#include "refmodel.h"
#include "rng.h"

#define EPS 1e-6

static uint64_t seed_counter = 1;

static void fill(double *d, float *f, size_t n, double scale)
{
    uint64_t s = seed_counter++;
    for (size_t i = 0; i < n; i++) {
        d[i] = scale * rng_normal(99, s, i);
        if (f) f[i] = (float)d[i];
    }
    /* the float copy is what the float code sees: make the double identical */
    if (f)
        for (size_t i = 0; i < n; i++) d[i] = f[i];
}

static double *dalloc(size_t n) { return calloc(n, sizeof(double)); }
static float *falloc(size_t n) { return calloc(n, sizeof(float)); }

/* S(var) = sum c * f(...) evaluated by `eval` with the current doubles */
typedef double (*ScalarFn)(void *ctx);

static void check_grad(const char *name, const float *analytic, double *var, size_t n,
                       ScalarFn eval, void *ctx)
{
    double *fd = dalloc(n), max_fd = 0;
    for (size_t i = 0; i < n; i++) {
        double keep = var[i];
        var[i] = keep + EPS;
        double sp = eval(ctx);
        var[i] = keep - EPS;
        double sm = eval(ctx);
        var[i] = keep;
        fd[i] = (sp - sm) / (2 * EPS);
        if (fabs(fd[i]) > max_fd) max_fd = fabs(fd[i]);
    }
    assert_true(max_fd > 0); /* the check must exercise something */
    for (size_t i = 0; i < n; i++) {
        double err = fabs(analytic[i] - fd[i]);
        if (err > 1e-4 * max_fd + 1e-6)
            print_error("%s[%zu]: analytic %.9g vs finite difference %.9g\n", name, i, analytic[i], fd[i]);
        assert_true(err <= 1e-4 * max_fd + 1e-6);
    }
    free(fd);
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void check_forward(const float *got, const double *want, size_t n, double rtol)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) assert_true(fabs(got[i] - want[i]) <= rtol * scale + 1e-7);
}

/* ---- rmsnorm ---- */
typedef struct { int N, D; double *x, *g, *c, *y; } NormCtx;
static double norm_S(void *p)
{
    NormCtx *k = p;
    ref_rmsnorm(k->y, k->x, k->g, k->N, k->D);
    return dot(k->y, k->c, (size_t)k->N * k->D);
}
static void test_rmsnorm(void **state)
{
    (void)state;
    const int N = 5, D = 7;
    const size_t ND = (size_t)N * D;
    NormCtx k = {N, D, dalloc(ND), dalloc(D), dalloc(ND), dalloc(ND)};
    float *x = falloc(ND), *g = falloc(D), *c = falloc(ND), *y = falloc(ND), *r = falloc(N),
          *dx = falloc(ND), *dg = falloc(D);
    fill(k.x, x, ND, 1.0);
    fill(k.g, g, D, 1.0);
    fill(k.c, c, ND, 1.0);
    rmsnorm_forward(y, r, x, g, N, D);
    norm_S(&k);
    check_forward(y, k.y, ND, 1e-5);
    rmsnorm_backward(dx, dg, c, x, g, r, N, D);
    check_grad("rmsnorm dx", dx, k.x, ND, norm_S, &k);
    check_grad("rmsnorm dweight", dg, k.g, D, norm_S, &k);
    free(x); free(g); free(c); free(y); free(r); free(dx); free(dg);
    free(k.x); free(k.g); free(k.c); free(k.y);
}

/* ---- matmul ---- */
typedef struct { int N, C, OC; double *x, *w, *c, *y; } MatCtx;
static double mat_S(void *p)
{
    MatCtx *k = p;
    ref_matmul(k->y, k->x, k->w, k->N, k->C, k->OC);
    return dot(k->y, k->c, (size_t)k->N * k->OC);
}
static void test_matmul(void **state)
{
    (void)state;
    const int N = 4, C = 5, OC = 3;
    MatCtx k = {N, C, OC, dalloc(N * C), dalloc(C * OC), dalloc(N * OC), dalloc(N * OC)};
    float *x = falloc(N * C), *w = falloc(C * OC), *c = falloc(N * OC), *y = falloc(N * OC),
          *dx = falloc(N * C), *dw = falloc(C * OC);
    fill(k.x, x, N * C, 1.0);
    fill(k.w, w, C * OC, 1.0);
    fill(k.c, c, N * OC, 1.0);
    matmul_forward(y, x, w, N, C, OC);
    mat_S(&k);
    check_forward(y, k.y, N * OC, 1e-6);
    matmul_backward(dx, dw, c, x, w, N, C, OC);
    check_grad("matmul dinp", dx, k.x, N * C, mat_S, &k);
    check_grad("matmul dweight", dw, k.w, C * OC, mat_S, &k);
    free(x); free(w); free(c); free(y); free(dx); free(dw);
    free(k.x); free(k.w); free(k.c); free(k.y);
}

/* ---- rotary ---- */
typedef struct { int B, T, H, Dh; double *x, *c, *y; } RopeCtx;
static double rope_S(void *p)
{
    RopeCtx *k = p;
    size_t n = (size_t)k->B * k->T * k->H * k->Dh;
    memcpy(k->y, k->x, n * sizeof(double));
    ref_rope(k->y, k->B, k->T, k->H, k->Dh);
    return dot(k->y, k->c, n);
}
static void test_rope(void **state)
{
    (void)state;
    const int B = 2, T = 5, H = 2, Dh = 6;
    const size_t n = (size_t)B * T * H * Dh;
    RopeCtx k = {B, T, H, Dh, dalloc(n), dalloc(n), dalloc(n)};
    float *x = falloc(n), *c = falloc(n), *cs = falloc(T * Dh / 2), *sn = falloc(T * Dh / 2);
    fill(k.x, x, n, 1.0);
    fill(k.c, c, n, 1.0);
    rope_tables(cs, sn, T, Dh);
    rope_forward(x, cs, sn, B, T, H, Dh);
    rope_S(&k);
    check_forward(x, k.y, n, 1e-6);
    rope_backward(c, cs, sn, B, T, H, Dh); /* c becomes dS/dx */
    check_grad("rope dx", c, k.x, n, rope_S, &k);
    free(x); free(c); free(cs); free(sn);
    free(k.x); free(k.c); free(k.y);
}

/* ---- attention ---- */
typedef struct { int B, T, D, H; double *q, *k, *v, *c, *y; } AttCtx;
static double att_S(void *p)
{
    AttCtx *a = p;
    ref_attention(a->y, a->q, a->k, a->v, a->B, a->T, a->D, a->H);
    return dot(a->y, a->c, (size_t)a->B * a->T * a->D);
}
static void attention_case(int B, int T, int D, int H)
{
    const size_t n = (size_t)B * T * D;
    AttCtx a = {B, T, D, H, dalloc(n), dalloc(n), dalloc(n), dalloc(n), dalloc(n)};
    float *q = falloc(n), *k = falloc(n), *v = falloc(n), *c = falloc(n), *y = falloc(n),
          *att = falloc((size_t)B * H * T * T), *dq = falloc(n), *dk = falloc(n), *dv = falloc(n),
          *scratch = falloc((size_t)64 * T * T);
    fill(a.q, q, n, 1.0);
    fill(a.k, k, n, 1.0);
    fill(a.v, v, n, 1.0);
    fill(a.c, c, n, 1.0);
    attention_forward(y, att, q, k, v, B, T, D, H);
    att_S(&a);
    check_forward(y, a.y, n, 1e-5);
    attention_backward(dq, dk, dv, scratch, c, att, q, k, v, B, T, D, H);
    check_grad("attention dq", dq, a.q, n, att_S, &a);
    check_grad("attention dk", dk, a.k, n, att_S, &a);
    check_grad("attention dv", dv, a.v, n, att_S, &a);
    free(q); free(k); free(v); free(c); free(y); free(att); free(dq); free(dk); free(dv); free(scratch);
    free(a.q); free(a.k); free(a.v); free(a.c); free(a.y);
}
static void test_attention(void **state)
{
    (void)state;
    attention_case(2, 7, 8, 2);
}
/* longer than one 64-row block of the blocked causal products */
static void test_attention_multiblock(void **state)
{
    (void)state;
    attention_case(1, 70, 4, 2);
}

/* ---- SwiGLU expert ---- */
typedef struct { int n, D, F; double *x, *wg, *wu, *wd, *c, *y; } ExpCtx;
static double exp_S(void *p)
{
    ExpCtx *e = p;
    for (int t = 0; t < e->n; t++) ref_expert(e->y + t * e->D, e->x + t * e->D, e->wg, e->wu, e->wd, e->D, e->F);
    return dot(e->y, e->c, (size_t)e->n * e->D);
}
static void test_expert(void **state)
{
    (void)state;
    const int n = 5, D = 4, F = 6;
    ExpCtx e = {n, D, F, dalloc(n * D), dalloc(D * F), dalloc(D * F), dalloc(F * D), dalloc(n * D), dalloc(n * D)};
    float *x = falloc(n * D), *wg = falloc(D * F), *wu = falloc(D * F), *wd = falloc(F * D),
          *c = falloc(n * D), *y = falloc(n * D), *a = falloc(n * F), *u = falloc(n * F),
          *h = falloc(n * F), *dx = falloc(n * D), *dwg = falloc(D * F), *dwu = falloc(D * F),
          *dwd = falloc(F * D), *scratch = falloc(3 * n * F);
    fill(e.x, x, n * D, 1.0);
    fill(e.wg, wg, D * F, 1.0);
    fill(e.wu, wu, D * F, 1.0);
    fill(e.wd, wd, F * D, 1.0);
    fill(e.c, c, n * D, 1.0);
    expert_forward(y, a, u, h, x, wg, wu, wd, n, D, F);
    exp_S(&e);
    check_forward(y, e.y, n * D, 1e-5);
    expert_backward(dx, dwg, dwu, dwd, scratch, c, x, a, u, h, wg, wu, wd, n, D, F);
    check_grad("expert dx", dx, e.x, n * D, exp_S, &e);
    check_grad("expert dw_gate", dwg, e.wg, D * F, exp_S, &e);
    check_grad("expert dw_up", dwu, e.wu, D * F, exp_S, &e);
    check_grad("expert dw_down", dwd, e.wd, F * D, exp_S, &e);
    free(x); free(wg); free(wu); free(wd); free(c); free(y); free(a); free(u); free(h);
    free(dx); free(dwg); free(dwu); free(dwd); free(scratch);
    free(e.x); free(e.wg); free(e.wu); free(e.wd); free(e.c); free(e.y);
}

/* ---- router softmax + z-loss ---- */
typedef struct { int N, E; double zc; double *z, *c; } RouterCtx;
static double router_S(void *p)
{
    RouterCtx *r = p;
    double s = 0, zsum = 0;
    for (int t = 0; t < r->N; t++) {
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < r->E; e++) mx = fmax(mx, r->z[t * r->E + e]);
        for (int e = 0; e < r->E; e++) sum += exp(r->z[t * r->E + e] - mx);
        double lse = mx + log(sum);
        zsum += lse * lse;
        for (int e = 0; e < r->E; e++) s += r->c[t * r->E + e] * exp(r->z[t * r->E + e] - lse);
    }
    return s + r->zc * zsum / r->N;
}
static void test_router_softmax_and_z_loss(void **state)
{
    (void)state;
    const int N = 6, E = 5;
    RouterCtx r = {N, E, 0.3, dalloc(N * E), dalloc(N * E)};
    float *z = falloc(N * E), *c = falloc(N * E), *p = falloc(N * E), *lse = falloc(N),
          *dz = falloc(N * E);
    fill(r.z, z, N * E, 2.0);
    fill(r.c, c, N * E, 1.0);
    router_softmax_forward(p, lse, z, N, E);
    router_softmax_backward(dz, c, p, lse, N, E, r.zc, 1.0f);
    check_grad("router dlogits", dz, r.z, N * E, router_S, &r);
    double zl = moe_z_loss(lse, N, r.zc), want = 0;
    for (int t = 0; t < N; t++) {
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, r.z[t * E + e]);
        for (int e = 0; e < E; e++) sum += exp(r.z[t * E + e] - mx);
        want += (mx + log(sum)) * (mx + log(sum));
    }
    assert_true(fabs(zl - r.zc * want / N) < 1e-5 * zl);
    free(z); free(c); free(p); free(lse); free(dz);
    free(r.z); free(r.c);
}

/* ---- cross-entropy ---- */
typedef struct { int N, V; double *z; const int *targets; } CeCtx;
static double ce_S(void *p)
{
    CeCtx *c = p;
    int n = 0;
    for (int t = 0; t < c->N; t++) n += c->targets[t] >= 0;
    return ref_crossentropy(c->z, c->targets, c->N, c->V) * n; /* sum */
}
static void test_crossentropy(void **state)
{
    (void)state;
    const int N = 4, V = 11;
    const int targets[4] = {3, -1, 0, 10};
    CeCtx c = {N, V, dalloc(N * V), targets};
    float *z = falloc(N * V), *losses = falloc(N), *dz = falloc(N * V);
    fill(c.z, z, N * V, 2.0);
    crossentropy_forward(losses, z, targets, N, V); /* z now holds probs */
    double sum = 0;
    for (int t = 0; t < N; t++) sum += losses[t];
    assert_true(fabs(sum - ce_S(&c)) < 1e-5 * sum);
    assert_true(losses[1] == 0.0f);
    crossentropy_backward(dz, z, targets, 1.0f, N, V);
    check_grad("crossentropy dlogits", dz, c.z, N * V, ce_S, &c);
    free(z); free(losses); free(dz); free(c.z);
}

/* ---- embedding ---- */
static void test_encoder(void **state)
{
    (void)state;
    const int V = 6, D = 3, N = 5;
    const int tokens[5] = {2, 0, 2, 5, 2};
    float emb[18], out[15], dout[15], demb[18] = {0};
    for (int i = 0; i < 18; i++) emb[i] = (float)i;
    for (int i = 0; i < 15; i++) dout[i] = (float)(i + 1);
    encoder_forward(out, tokens, emb, N, D);
    for (int t = 0; t < N; t++)
        for (int i = 0; i < D; i++) assert_true(out[t * D + i] == emb[tokens[t] * D + i]);
    encoder_backward(demb, dout, tokens, N, D);
    for (int v = 0; v < V; v++)
        for (int i = 0; i < D; i++) {
            float want = 0;
            for (int t = 0; t < N; t++)
                if (tokens[t] == v) want += dout[t * D + i];
            assert_true(demb[v * D + i] == want);
        }
}

/* The GPU's embedding backward (embed_buckets.h: a bucket of positions per
 * id, each summed from the old value in position order) against the CPU's
 * encoder_backward: bit-identical, on skewed tokens (a few ids hold most
 * positions, as spaces and common words do) with a non-zero dembed (the
 * tied head's gradient is already in it). */
static void test_embed_buckets(void **state)
{
    (void)state;
    const int V = 300, D = 37;
    for (int trial = 0; trial < 6; trial++) {
        const size_t N = 1 + rng_bits(41, trial, 0) % 2000;
        int *tok = malloc(N * sizeof(int)), *plan = malloc((3 * N + 1) * sizeof(int)), *count = malloc(V * sizeof(int));
        float *dout = malloc(N * D * sizeof(float)), *want = malloc((size_t)V * D * sizeof(float)),
              *got = malloc((size_t)V * D * sizeof(float));
        assert_non_null(tok); assert_non_null(plan); assert_non_null(count);
        assert_non_null(dout); assert_non_null(want); assert_non_null(got);
        for (size_t t = 0; t < N; t++) {
            const uint64_t r = rng_bits(42, trial, t);
            tok[t] = (int)(r % 4 ? r % 5 : (r >> 8) % V); /* 3/4 of them in 5 ids */
        }
        if (trial == 0) tok[0] = V - 1; /* the last id */
        for (size_t i = 0; i < N * D; i++) dout[i] = (float)rng_normal(43, trial, i);
        for (size_t i = 0; i < (size_t)V * D; i++) want[i] = got[i] = (float)rng_normal(44, trial, i);
        encoder_backward(want, dout, tok, N, D);
        int *ids = plan, *start = plan + N, *order = start + N + 1;
        const int n = embed_buckets(tok, N, V, count, ids, start, order);
        /* the plan: ids ascending and present, every position once, each
         * bucket's positions ascending and of its id */
        assert_true(n >= 1 && n <= V && start[0] == 0 && start[n] == (int)N);
        for (int b = 0; b < n; b++) {
            if (b) assert_true(ids[b] > ids[b - 1]);
            assert_true(start[b + 1] > start[b]);
            for (int i = start[b]; i < start[b + 1]; i++) {
                assert_true(tok[order[i]] == ids[b]);
                if (i > start[b]) assert_true(order[i] > order[i - 1]);
            }
        }
        for (int b = 0; b < n; b++)
            for (int c = D - 1; c >= 0; c--) /* any order of (bucket, column): each is independent */
                embed_bucket_column(got, dout, ids, start, order, b, c, D);
        assert_memory_equal(got, want, (size_t)V * D * sizeof(float));
        if (trial == 5) { /* a token outside [0, V): refused, nothing written past count */
            tok[N - 1] = V;
            assert_int_equal(embed_buckets(tok, N, V, count, ids, start, order), -1);
            tok[N - 1] = -1;
            assert_int_equal(embed_buckets(tok, N, V, count, ids, start, order), -1);
        }
        free(tok); free(plan); free(count); free(dout); free(want); free(got);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    blas_select_reexec(argv); /* test the kernels production uses */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_multiblock),
        cmocka_unit_test(test_expert),
        cmocka_unit_test(test_router_softmax_and_z_loss),
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_embed_buckets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
