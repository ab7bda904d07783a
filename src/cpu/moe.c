/* moe.c — see moe.h. */
#include "moe.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "route_plan.h"
#include "route_softmax.h"
#include "route_topk.h"

int moe_capacity(double capacity_factor, size_t tokens, int K, int E)
{
    if (capacity_factor <= 0) return -1;
    double c = ceil(capacity_factor * (double)tokens * K / E);
    return c > 2e9 ? 2000000000 : (int)c;
}

void router_softmax_forward(float *probs, float *lse, const float *logits, size_t N, int E)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) lse[t] = route_softmax_row(probs + t * E, logits + t * E, E);
}

void router_topk(int *choice, const float *probs, size_t N, int E, int K)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) route_topk_token(choice + t * K, probs + t * E, E, K);
}

void router_stats(int *counts, double *mean_prob, const int *choice, const float *probs, size_t N,
                  int E, int K)
{
    for (int e = 0; e < E; e++) {
        counts[e] = 0;
        mean_prob[e] = 0.0;
    }
    for (size_t t = 0; t < N; t++) {
        for (int k = 0; k < K; k++) counts[choice[t * K + k]]++;
        for (int e = 0; e < E; e++) mean_prob[e] += probs[t * E + e];
    }
    for (int e = 0; e < E; e++) mean_prob[e] = N ? mean_prob[e] / (double)N : 0.0;
}

int moe_send_plan(int *send_copy, int *copy_slot, int *send_counts, int *pos, const int *choice, const int *cnt,
                  size_t N, int K, int G, int El, int me, int cap, int off, int E, int *n_remote)
{
    const int Es = G * El, W = route_slot_groups(Es, E);
    const size_t copies = N * (size_t)K;
    for (int d = 0; d < G; d++) send_counts[d] = route_send_count(cnt, Es, El, me, d, cap);
    /* pos[g]: the next position among this rank's copies of group g */
    int *kept = pos + W, *base = pos + 2 * W, *dbase = pos + 3 * W;
    const int n_kept = route_source_bases_split(cnt, Es, W, me, cap, kept, base, dbase);
    for (int g = 0; g < W; g++) pos[g] = 0;
    for (size_t i = 0; i < copies; i++) {
        const int g = route_local_expert(choice[i], off, Es); /* Es: held elsewhere */
        const int slot = route_slot_from_bases(kept, base, dbase, g, pos[g]++);
        copy_slot[i] = slot;
        send_copy[slot] = (int)i;
    }
    *n_remote = W > Es ? pos[Es] : 0;
    return n_kept;
}

int moe_recv_count(int *recv_counts, const int *cnt, int G, int El, int me, int cap)
{
    int n = 0;
    for (int s = 0; s < G; s++) n += recv_counts[s] = route_send_count(cnt, G * El, El, s, me, cap);
    return n;
}

int moe_owner_plan(int *recv_row, int *row_src, int *expert_start, int *dropped, const int *cnt, int G, int El,
                   int me, int cap)
{
    const int E = G * El;
    route_owner_starts(cnt, G, El, me, cap, expert_start, dropped);
    for (int s = 0; s < G; s++) /* (source, expert) groups: their first arrival and row, then p */
        for (int el = 0; el < El; el++) {
            const int n = route_kept(cnt, E, s, me * El + el, cap);
            if (!n) continue;
            const int a0 = route_arrival(cnt, E, El, me, s, el, 0, cap), row0 = route_row(cnt, G, E, El, me, s, el, 0, cap);
            for (int p = 0; p < n; p++) {
                recv_row[a0 + p] = row0 + p;
                row_src[row0 + p] = a0 + p;
            }
        }
    return expert_start[El];
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
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++)
        for (int e = 0; e < E; e++) dprobs[t * E + e] += (float)(scale * coef * E * frac[e] / (double)N);
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

void rows_gather(float *dst, const float *src, const int *index, size_t n, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        if (index[i] >= 0)
            memcpy(dst + i * D, src + (size_t)index[i] * D, (size_t)D * sizeof(float));
        else
            memset(dst + i * D, 0, (size_t)D * sizeof(float));
    }
}

void moe_combine_forward(float *out, const MoeRouting *r, size_t N, int E, int K, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *o = out + t * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int k = 0; k < K; k++) {
            const size_t copy = t * K + k;
            const float gate = r->probs[t * E + r->choice[copy]];
            const float *y = r->y_back + (size_t)r->copy_slot[copy] * D;
            for (int i = 0; i < D; i++) o[i] += gate * y[i];
        }
    }
}

void moe_combine_backward(float *dy_send, float *dprobs, const float *dout, const MoeRouting *r,
                          size_t N, int E, int K, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *d = dout + t * D;
        for (int k = 0; k < K; k++) {
            const size_t copy = t * K + k;
            const int e = r->choice[copy];
            const size_t slot = (size_t)r->copy_slot[copy];
            const float gate = r->probs[t * E + e];
            const float *y = r->y_back + slot * D;
            float *dy = dy_send + slot * D;
            float dot = 0.0f;
            for (int i = 0; i < D; i++) {
                dot += d[i] * y[i];
                dy[i] = gate * d[i];
            }
            dprobs[t * E + e] += dot; /* 0 for a dropped copy: its y is 0 */
        }
    }
}

void moe_scatter_add(float *dinp, const float *dx_send, const MoeRouting *r, size_t N, int K, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *d = dinp + t * D;
        for (int k = 0; k < K; k++) {
            const float *s = dx_send + (size_t)r->copy_slot[t * K + k] * D;
            for (int i = 0; i < D; i++) d[i] += s[i];
        }
    }
}
