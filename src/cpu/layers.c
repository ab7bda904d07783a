/* layers.c — see layers.h. */
#include "layers.h"
#include "elementwise.h"
#include "alloc.h"
#include "status.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Rotary embedding: frequencies base^(-2i/Dh), the usual base. */
#define ROPE_BASE 10000.0
/* Attention rows per block: the (rows, T) score tile stays in L2. */
#define ATTN_ROW_BLOCK 64


void encoder_forward(float *out, const int *tokens, const float *embed, size_t N, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++)
        memcpy(out + t * D, embed + (size_t)tokens[t] * D, (size_t)D * sizeof(float));
}

void encoder_backward(float *dembed, const float *dout, const int *tokens, size_t N, int D)
{
    /* Parallel over columns: each column's sum runs in token order, so the
     * result is the same for any thread count. */
    const int CB = 16;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < D; c0 += CB) {
        int c1 = c0 + CB < D ? c0 + CB : D;
        for (size_t t = 0; t < N; t++) {
            float *dst = dembed + (size_t)tokens[t] * D;
            const float *src = dout + t * D;
            for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, int D)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *x = inp + t * D;
        float *o = out + t * D;
        float ss = 0.0f;
        for (int i = 0; i < D; i++) ss += x[i] * x[i];
        float r = rmsnorm_rstd(ss, D);
        for (int i = 0; i < D; i++) o[i] = x[i] * r * weight[i];
        rstd[t] = r;
    }
}

int rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, const float *rstd, size_t N, int D)
{
    /* dweight partials over REDUCE_CHUNKS fixed token ranges, summed in order */
    float *partial = isth_calloc((size_t)REDUCE_CHUNKS * D, sizeof(float));
    CHECK_ALLOC(partial);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < REDUCE_CHUNKS; c++) {
        size_t t0 = N * (size_t)c / REDUCE_CHUNKS, t1 = N * (size_t)(c + 1) / REDUCE_CHUNKS;
        float *pw = partial + (size_t)c * D;
        for (size_t t = t0; t < t1; t++) {
            const float *x = inp + t * D, *dy = dout + t * D;
            float *dx = dinp + t * D;
            float r = rstd[t];
            float dot = 0.0f; /* sum_i dy_i * g_i * x_i */
            for (int i = 0; i < D; i++) {
                dot += dy[i] * weight[i] * x[i];
                pw[i] += dy[i] * x[i] * r;
            }
            float k = r * r * r * dot / (float)D;
            for (int i = 0; i < D; i++) dx[i] += r * weight[i] * dy[i] - k * x[i];
        }
    }
    for (int c = 0; c < REDUCE_CHUNKS; c++)
        for (int i = 0; i < D; i++) dweight[i] += partial[(size_t)c * D + i];
    isth_free(partial);
    return ISTH_OK;
}

void matmul_forward(float *out, const float *inp, const float *weight, size_t N, int C, int OC)
{
    matmul_forward_ldw(out, inp, weight, OC, N, C, OC);
}

void matmul_forward_ldw(float *out, const float *inp, const float *weight, int ldw, size_t N, int C, int OC)
{
    if (N == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, OC, C, 1.0f, inp, C, weight,
                ldw, 0.0f, out, OC);
}

void tied_head_forward(float *logits, const float *x, const float *embed, size_t N, int D, int V)
{
    if (N == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, V, D, 1.0f, x, D, embed, D, 0.0f, logits, V);
}

void tied_head_backward(float *dx, float *dembed, const float *dlogits, const float *x, const float *embed, size_t N,
                        int D, int V)
{
    if (N == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, V, 1.0f, dlogits, V, embed, D, 1.0f, dx, D);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, (int)N, 1.0f, dlogits, V, x, D, 1.0f, dembed, D);
}

void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, size_t N, int C, int OC)
{
    matmul_backward_ldw(dinp, dweight, dout, inp, weight, OC, N, C, OC);
}

void matmul_backward_ldw(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         int ldw, size_t N, int C, int OC)
{
    if (N == 0) return;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, C, OC, 1.0f, dout, OC, weight,
                    ldw, 1.0f, dinp, C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, (int)N, 1.0f, inp, C, dout, OC,
                    1.0f, dweight, ldw);
}

void rope_tables(float *cos_t, float *sin_t, int T, int Dh)
{
    const int half = Dh / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double freq = pow(ROPE_BASE, -2.0 * i / Dh);
            double angle = t * freq;
            cos_t[(size_t)t * half + i] = (float)cos(angle);
            sin_t[(size_t)t * half + i] = (float)sin(angle);
        }
}

static void rope_apply(float *x, const float *cos_t, const float *sin_t, int B, int T, int H,
                       int Dh, float direction)
{
    const int half = Dh / 2;
    const size_t D = (size_t)H * Dh;
#pragma omp parallel for schedule(static)
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const int t = (int)(bt % (size_t)T);
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < H; h++) {
            float *v = x + bt * D + (size_t)h * Dh;
            for (int i = 0; i < half; i++) rope_rotate(&v[i], &v[i + half], c[i], direction * s[i]);
        }
    }
}

void rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh)
{
    rope_apply(x, cos_t, sin_t, B, T, H, Dh, 1.0f);
}

void rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh)
{
    rope_apply(dx, cos_t, sin_t, B, T, H, Dh, -1.0f);
}

void attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                       int B, int T, int D, int H)
{
    const int Dh = D / H;
    const float scale = 1.0f / sqrtf((float)Dh);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        const size_t base = (size_t)b * T * D + (size_t)h * Dh;
        float *p = att + (size_t)bh * T * T;
        /* scores (T,T) = q_bh . k_bh^T * scale; only the causal lower
         * triangle is used, computed in row blocks to skip most of the rest */
        for (int r0 = 0; r0 < T; r0 += ATTN_ROW_BLOCK) {
            int rows = r0 + ATTN_ROW_BLOCK < T ? ATTN_ROW_BLOCK : T - r0;
            int cols = r0 + rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, Dh, scale,
                        q + base + (size_t)r0 * D, D, k + base, D, 0.0f, p + (size_t)r0 * T, T);
        }
        for (int t = 0; t < T; t++) {
            float *row = p + (size_t)t * T;
            float mx = row[0];
            for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j <= t; j++) {
                row[j] = expf(row[j] - mx);
                sum += row[j];
            }
            float inv = 1.0f / sum;
            for (int j = 0; j <= t; j++) row[j] *= inv;
            for (int j = t + 1; j < T; j++) row[j] = 0.0f;
        }
        /* out_bh (T,Dh) = p (T,T) . v_bh (T,Dh) */
        for (int r0 = 0; r0 < T; r0 += ATTN_ROW_BLOCK) {
            int rows = r0 + ATTN_ROW_BLOCK < T ? ATTN_ROW_BLOCK : T - r0;
            int cols = r0 + rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, Dh, cols, 1.0f,
                        p + (size_t)r0 * T, T, v + base, D, 0.0f, out + base + (size_t)r0 * D, D);
        }
    }
}

void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                        const float *att, const float *q, const float *k, const float *v, int B,
                        int T, int D, int H)
{
    const int Dh = D / H;
    const float scale = 1.0f / sqrtf((float)Dh);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        const size_t base = (size_t)b * T * D + (size_t)h * Dh;
        const float *p = att + (size_t)bh * T * T;
        float *dp = scratch + (size_t)omp_get_thread_num() * T * T;
        /* dp (T,T) = dout_bh . v_bh^T (lower triangle only) */
        for (int r0 = 0; r0 < T; r0 += ATTN_ROW_BLOCK) {
            int rows = r0 + ATTN_ROW_BLOCK < T ? ATTN_ROW_BLOCK : T - r0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r0 + rows, Dh, 1.0f,
                        dout + base + (size_t)r0 * D, D, v + base, D, 0.0f, dp + (size_t)r0 * T, T);
        }
        /* dv_bh += p^T . dout_bh */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, Dh, T, 1.0f, p, T, dout + base, D,
                    1.0f, dv + base, D);
        /* ds = p * (dp - rowsum(p*dp)) * scale, in place in dp */
        for (int t = 0; t < T; t++) {
            const float *pr = p + (size_t)t * T;
            float *dr = dp + (size_t)t * T;
            float dot = 0.0f;
            for (int j = 0; j <= t; j++) dot += pr[j] * dr[j];
            for (int j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - dot) * scale;
            for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
        }
        /* dq_bh += ds . k_bh ; dk_bh += ds^T . q_bh */
        for (int r0 = 0; r0 < T; r0 += ATTN_ROW_BLOCK) {
            int rows = r0 + ATTN_ROW_BLOCK < T ? ATTN_ROW_BLOCK : T - r0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, Dh, r0 + rows, 1.0f,
                        dp + (size_t)r0 * T, T, k + base, D, 1.0f, dq + base + (size_t)r0 * D, D);
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, Dh, T, 1.0f, dp, T, q + base, D,
                    1.0f, dk + base, D);
    }
}

void swiglu_forward(float *h, const float *a, const float *u, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) h[i] = swiglu_value(a[i], u[i]);
}

void swiglu_backward(float *da, float *du, const float *dh, const float *a, const float *u, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float dai, dui;
        swiglu_grads(dh[i], a[i], u[i], &dai, &dui);
        du[i] += dui;
        da[i] += dai;
    }
}

void crossentropy_forward(float *losses, float *probs_logits, const int *targets, size_t N, int V)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *row = probs_logits + t * V;
        float mx = row[0];
        for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j < V; j++) sum += expf(row[j] - mx);
        float lse = logf(sum) + mx;
        losses[t] = targets[t] >= 0 ? lse - row[targets[t]] : 0.0f;
        for (int j = 0; j < V; j++) row[j] = expf(row[j] - lse);
    }
}

void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float scale,
                           size_t N, int V)
{
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *d = dlogits + t * V;
        const float *p = probs + t * V;
        if (targets[t] < 0) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        for (int j = 0; j < V; j++) d[j] = p[j] * scale;
        d[targets[t]] -= scale;
    }
}

void residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
