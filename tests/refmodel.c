/* refmodel.c — see refmodel.h. Deliberately simple and slow. A helper, not a
 * test: test_layers.c and test_model.c assert against what it computes. */
#include "refmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_rmsnorm(double *out, const double *x, const double *g, int N, int D)
{
    for (int t = 0; t < N; t++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += x[t * D + i] * x[t * D + i];
        double r = 1.0 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++) out[t * D + i] = x[t * D + i] * r * g[i];
    }
}

void ref_matmul(double *out, const double *x, const double *w, int N, int C, int OC)
{
    for (int t = 0; t < N; t++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += x[t * C + c] * w[c * OC + o];
            out[t * OC + o] = s;
        }
}

void ref_rope(double *x, int B, int T, int H, int Dh)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                double *v = x + ((size_t)(b * T + t) * H + h) * Dh;
                for (int i = 0; i < Dh / 2; i++) {
                    double th = t * pow(10000.0, -2.0 * i / Dh);
                    double a = v[i], c = v[i + Dh / 2];
                    v[i] = a * cos(th) - c * sin(th);
                    v[i + Dh / 2] = a * sin(th) + c * cos(th);
                }
            }
}

void ref_attention(double *out, const double *q, const double *k, const double *v, int B, int T,
                   int D, int H)
{
    int Dh = D / H;
    double *s = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const double *qt = q + (size_t)(b * T + t) * D + h * Dh;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *kj = k + (size_t)(b * T + j) * D + h * Dh;
                    double d = 0;
                    for (int i = 0; i < Dh; i++) d += qt[i] * kj[i];
                    s[j] = d / sqrt((double)Dh);
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                double *o = out + (size_t)(b * T + t) * D + h * Dh;
                for (int i = 0; i < Dh; i++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) acc += s[j] / sum * v[(size_t)(b * T + j) * D + h * Dh + i];
                    o[i] = acc;
                }
            }
    free(s);
}

void ref_expert(double *y, const double *x, const double *wg, const double *wu, const double *wd,
                int D, int F)
{
    double *hid = malloc(sizeof(double) * F);
    for (int f = 0; f < F; f++) {
        double a = 0, u = 0;
        for (int i = 0; i < D; i++) {
            a += x[i] * wg[i * F + f];
            u += x[i] * wu[i * F + f];
        }
        hid[f] = a / (1.0 + exp(-a)) * u;
    }
    for (int i = 0; i < D; i++) {
        double s = 0;
        for (int f = 0; f < F; f++) s += hid[f] * wd[f * D + i];
        y[i] = s;
    }
    free(hid);
}

uint64_t ref_moe(double *out, double *aux, double *z, long *remote, const double *x, const double *wr,
                 const double *wg, const double *wu, const double *wd, int N, int D, int E, int K, int F,
                 double capacity_factor, double aux_coef, double z_coef, int training, int policy, int lo, int Es)
{
    /* the experts routed over: [r0, r0 + Er) of the router's columns */
    const int r0 = policy == ROUTE_LOCAL ? lo : 0, Er = policy == ROUTE_LOCAL ? Es : E;
    double *p = malloc(sizeof(double) * N * Er), *y = malloc(sizeof(double) * D);
    double *frac = calloc(Er, sizeof(double)), *mean_p = calloc(Er, sizeof(double));
    int *used = calloc(Er, sizeof(int)), *kept = calloc(Er, sizeof(int));
    long capacity = training ? (long)ceil(capacity_factor * N * K / Er) : -1;
    uint64_t sig = 1469598103934665603ull;
    double zsum = 0;
    memset(out, 0, sizeof(double) * N * D);
    for (int t = 0; t < N; t++) {
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < Er; e++) {
            double l = 0;
            for (int i = 0; i < D; i++) l += x[t * D + i] * wr[i * E + r0 + e];
            p[t * Er + e] = l;
            if (l > mx) mx = l;
        }
        for (int e = 0; e < Er; e++) sum += exp(p[t * Er + e] - mx);
        double lse = mx + log(sum);
        zsum += lse * lse;
        for (int e = 0; e < Er; e++) {
            p[t * Er + e] = exp(p[t * Er + e] - lse);
            mean_p[e] += p[t * Er + e] / N;
        }
    }
    for (int t = 0; t < N; t++) {
        memset(used, 0, sizeof(int) * Er);
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < Er; e++)
                if (!used[e] && (best < 0 || p[t * Er + e] > p[t * Er + best])) best = e;
            used[best] = 1;
            frac[best] += 1.0 / ((double)N * K);
            const int held = r0 + best - lo; /* the held expert, or outside [0, Es) */
            if (held < 0 || held >= Es) { /* ROUTE_DROP: held elsewhere, dropped before any capacity */
                sig = (sig ^ (uint64_t)(best * 2 + 1)) * 1099511628211ull;
                if (remote) ++*remote;
                continue;
            }
            int keep = capacity < 0 || kept[best] < capacity;
            sig = (sig ^ (uint64_t)(best * 2 + keep)) * 1099511628211ull;
            if (!keep) continue;
            kept[best]++;
            ref_expert(y, x + t * D, wg + (size_t)held * D * F, wu + (size_t)held * D * F,
                       wd + (size_t)held * F * D, D, F);
            for (int i = 0; i < D; i++) out[t * D + i] += p[t * Er + best] * y[i];
        }
    }
    if (aux) {
        double s = 0;
        for (int e = 0; e < Er; e++) s += frac[e] * mean_p[e];
        *aux = aux_coef * Er * s;
    }
    if (z) *z = z_coef * zsum / N;
    free(p);
    free(y);
    free(frac);
    free(mean_p);
    free(used);
    free(kept);
    return sig;
}

double ref_crossentropy(const double *logits, const int *targets, int N, int V)
{
    double total = 0;
    int n = 0;
    for (int t = 0; t < N; t++) {
        if (targets[t] < 0) continue;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++)
            if (logits[t * V + j] > mx) mx = logits[t * V + j];
        for (int j = 0; j < V; j++) sum += exp(logits[t * V + j] - mx);
        total += mx + log(sum) - logits[t * V + targets[t]];
        n++;
    }
    return total / n;
}

static const double *P(const Model *m, const double *params, TensorId id, int layer)
{
    const Tensor *t = &m->tensors[id];
    size_t per_layer = (t->flags & PARAM_LAYERED) ? t->numel / t->local[0] : 0;
    return params + t->offset + (size_t)layer * per_layer;
}

double ref_model_loss(const Model *m, const double *params, const int *tokens, const int *targets,
                      int B, int T, int training, uint64_t *route_sig, long *remote)
{
    const ModelConfig *c = &m->cfg;
    const int N = B * T, D = c->dim, V = c->vocab, H = c->heads;
    const size_t ND = (size_t)N * D;
    double *x = calloc(ND, sizeof(double)), *xn = malloc(sizeof(double) * ND),
           *q = malloc(sizeof(double) * ND), *k = malloc(sizeof(double) * ND),
           *v = malloc(sizeof(double) * ND), *ao = malloc(sizeof(double) * ND),
           *o = malloc(sizeof(double) * ND), *logits = malloc(sizeof(double) * N * V);
    double extra = 0;
    uint64_t sig = 0;
    for (int t = 0; t < N; t++)
        for (int i = 0; i < D; i++) x[t * D + i] = P(m, params, T_EMBED, 0)[tokens[t] * D + i];
    for (int l = 0; l < c->layers; l++) {
        ref_rmsnorm(xn, x, P(m, params, T_ATTN_NORM, l), N, D);
        ref_matmul(q, xn, P(m, params, T_WQ, l), N, D, D);
        ref_matmul(k, xn, P(m, params, T_WK, l), N, D, D);
        ref_matmul(v, xn, P(m, params, T_WV, l), N, D, D);
        ref_rope(q, B, T, H, D / H);
        ref_rope(k, B, T, H, D / H);
        ref_attention(ao, q, k, v, B, T, D, H);
        ref_matmul(o, ao, P(m, params, T_WO, l), N, D, D);
        for (size_t i = 0; i < ND; i++) x[i] += o[i];
        ref_rmsnorm(xn, x, P(m, params, T_MOE_NORM, l), N, D);
        double aux = 0, z = 0;
        sig = sig * 31 + ref_moe(o, &aux, &z, remote, xn, P(m, params, T_ROUTER, l), P(m, params, T_W_GATE, l),
                                 P(m, params, T_W_UP, l), P(m, params, T_W_DOWN, l), N, D, c->experts,
                                 c->top_k, c->ffn, c->capacity_factor, c->aux_loss, c->z_loss, training, m->route,
                                 m->route_begin, m->experts_local);
        if (training) extra += aux + z;
        for (size_t i = 0; i < ND; i++) x[i] += o[i];
    }
    ref_rmsnorm(xn, x, P(m, params, T_FINAL_NORM, 0), N, D);
    const double *emb = P(m, params, T_EMBED, 0);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < V; j++) {
            double s = 0;
            for (int i = 0; i < D; i++) s += xn[t * D + i] * emb[j * D + i];
            logits[t * V + j] = s;
        }
    double loss = ref_crossentropy(logits, targets, N, V) + extra;
    free(x);
    free(xn);
    free(q);
    free(k);
    free(v);
    free(ao);
    free(o);
    free(logits);
    if (route_sig) *route_sig = sig;
    return loss;
}
