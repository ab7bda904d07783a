/* moe.c — see moe.h. */
#include "moe.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"

int moe_capacity(double capacity_factor, size_t tokens, int K, int E)
{
    if (capacity_factor <= 0) return -1;
    double c = ceil(capacity_factor * (double)tokens * K / E);
    return c > 2e9 ? 2000000000 : (int)c;
}

void router_softmax_forward(float *probs, float *lse, const float *logits, size_t N, int E)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *z = logits + t * E;
        float *p = probs + t * E;
        float mx = z[0];
        for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += expf(z[e] - mx);
        float l = logf(sum) + mx;
        for (int e = 0; e < E; e++) p[e] = expf(z[e] - l);
        lse[t] = l;
    }
}

void router_topk(int *choice, const float *probs, size_t N, int E, int K)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *p = probs + t * E;
        int *c = choice + t * K;
        /* selection by repeated argmax; strict '>' keeps the lower index on ties */
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= c[j] == e;
                if (taken) continue;
                if (best < 0 || p[e] > p[best]) best = e;
            }
            c[k] = best;
        }
    }
}

void router_stats(double *frac, double *mean_prob, const int *choice, const float *probs, size_t N,
                  int E, int K)
{
    for (int e = 0; e < E; e++) frac[e] = mean_prob[e] = 0.0;
    for (size_t t = 0; t < N; t++) {
        for (int k = 0; k < K; k++) frac[choice[t * K + k]] += 1.0;
        for (int e = 0; e < E; e++) mean_prob[e] += probs[t * E + e];
    }
    for (int e = 0; e < E; e++) {
        frac[e] = N ? frac[e] / ((double)N * K) : 0.0;
        mean_prob[e] = N ? mean_prob[e] / (double)N : 0.0;
    }
}

void moe_plan(MoeRouting *r, size_t N, int E, int K, int capacity)
{
    int *count = calloc((size_t)E, sizeof(int));
    r->dropped = 0;
    /* first pass: which copies are kept, in (token, choice) order */
    for (size_t i = 0; i < N * (size_t)K; i++) {
        int e = r->choice[i];
        if (capacity >= 0 && count[e] >= capacity) {
            r->row[i] = -1;
            r->dropped++;
        } else {
            r->row[i] = count[e]++; /* provisional: index within the expert */
        }
    }
    r->expert_start[0] = 0;
    for (int e = 0; e < E; e++) r->expert_start[e + 1] = r->expert_start[e] + count[e];
    r->rows = r->expert_start[E];
    for (size_t i = 0; i < N * (size_t)K; i++) {
        if (r->row[i] < 0) continue;
        r->row[i] += r->expert_start[r->choice[i]];
        r->row_token[r->row[i]] = (int)(i / (size_t)K);
    }
    free(count);
}

double moe_balance_loss(const double *frac, const double *mean_prob, int E, double coef)
{
    double s = 0.0;
    for (int e = 0; e < E; e++) s += frac[e] * mean_prob[e];
    return coef * E * s;
}

double moe_z_loss(const float *lse, size_t N, double coef)
{
    double s = 0.0;
    for (size_t t = 0; t < N; t++) s += (double)lse[t] * lse[t];
    return N ? coef * s / (double)N : 0.0;
}

void moe_balance_backward(float *dprobs, const double *frac, size_t N, int E, double coef, float scale)
{
    /* d/dp_{t,e} [coef E sum_e f_e (1/N) sum_t p_{t,e}] = coef E f_e / N */
    float *g = malloc((size_t)E * sizeof(float));
    for (int e = 0; e < E; e++) g[e] = (float)(scale * coef * E * frac[e] / (double)N);
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++)
        for (int e = 0; e < E; e++) dprobs[t * E + e] += g[e];
    free(g);
}

void router_softmax_backward(float *dlogits, const float *dprobs, const float *probs,
                             const float *lse, size_t N, int E, double z_coef, float scale)
{
    const float zc = N ? (float)(scale * z_coef * 2.0 / (double)N) : 0.0f;
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *p = probs + t * E, *dp = dprobs + t * E;
        float *dz = dlogits + t * E;
        float dot = 0.0f;
        for (int e = 0; e < E; e++) dot += p[e] * dp[e];
        /* d lse / d z_e = p_e, so d(lse^2) = 2 lse p_e */
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dp[e] - dot) + zc * lse[t] * p[e];
    }
}

void expert_forward(float *y, float *a, float *u, float *h, const float *x, const float *wg,
                    const float *wu, const float *wd, size_t n, int D, int F)
{
    if (n == 0) return;
    matmul_forward(a, x, wg, n, D, F);
    matmul_forward(u, x, wu, n, D, F);
    swiglu_forward(h, a, u, n * (size_t)F);
    matmul_forward(y, h, wd, n, F, D);
}

void expert_backward(float *dx, float *dwg, float *dwu, float *dwd, float *scratch,
                     const float *dy, const float *x, const float *a, const float *u,
                     const float *h, const float *wg, const float *wu, const float *wd, size_t n,
                     int D, int F)
{
    if (n == 0) return;
    const size_t nF = n * (size_t)F;
    float *dh = scratch, *da = scratch + nF, *du = scratch + 2 * nF;
    memset(scratch, 0, 3 * nF * sizeof(float));
    matmul_backward(dh, dwd, dy, h, wd, n, F, D);
    swiglu_backward(da, du, dh, a, u, nF);
    matmul_backward(dx, dwg, da, x, wg, n, D, F);
    matmul_backward(dx, dwu, du, x, wu, n, D, F);
}

void moe_gather(float *xrows, const float *inp, const MoeRouting *r, int D)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < r->rows; i++)
        memcpy(xrows + (size_t)i * D, inp + (size_t)r->row_token[i] * D, (size_t)D * sizeof(float));
}

void moe_combine_forward(float *out, const float *y, const MoeRouting *r, size_t N, int E, int K,
                         int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *o = out + t * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int k = 0; k < K; k++) {
            int row = r->row[t * K + k];
            if (row < 0) continue;
            float gate = r->probs[t * E + r->choice[t * K + k]];
            const float *yr = y + (size_t)row * D;
            for (int i = 0; i < D; i++) o[i] += gate * yr[i];
        }
    }
}

void moe_combine_backward(float *dy, float *dprobs, const float *dout, const float *y,
                          const MoeRouting *r, size_t N, int E, int K, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *d = dout + t * D;
        for (int k = 0; k < K; k++) {
            int row = r->row[t * K + k];
            if (row < 0) continue;
            int e = r->choice[t * K + k];
            float gate = r->probs[t * E + e];
            const float *yr = y + (size_t)row * D;
            float *dyr = dy + (size_t)row * D;
            float dot = 0.0f;
            for (int i = 0; i < D; i++) {
                dot += d[i] * yr[i];
                dyr[i] = gate * d[i];
            }
            dprobs[t * E + e] += dot;
        }
    }
}

void moe_scatter_add(float *dinp, const float *dxrows, const MoeRouting *r, size_t N, int K, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *d = dinp + t * D;
        for (int k = 0; k < K; k++) {
            int row = r->row[t * K + k];
            if (row < 0) continue;
            const float *s = dxrows + (size_t)row * D;
            for (int i = 0; i < D; i++) d[i] += s[i];
        }
    }
}
