/* transformer.c — see transformer.h. */
#include "transformer.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "status.h"

int acts_create(Activations *a, const ModelConfig *c, int B, int T)
{
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = T;
    a->L = c->layers;
    a->D = c->dim;
    a->H = c->heads;
    a->E = c->experts;
    a->K = c->top_k;
    a->F = c->ffn;
    a->V = c->vocab;
    const size_t L = (size_t)a->L, D = (size_t)a->D, E = (size_t)a->E, K = (size_t)a->K,
                 F = (size_t)a->F, V = (size_t)a->V, N = (size_t)B * T;
    const size_t Dh2 = D / (size_t)a->H / 2;
    const size_t threads = (size_t)omp_get_max_threads();
    size_t att_scratch = threads * (size_t)T * T, ffn_scratch = 3 * N * K * F;
    const size_t VE = V > E ? V : E;

    struct { float **p; size_t n; } plan[] = {
        {&a->x, (L + 1) * N * D}, {&a->xn1, L * N * D}, {&a->rstd1, L * N},
        {&a->q, L * N * D}, {&a->k, L * N * D}, {&a->v, L * N * D}, {&a->ao, L * N * D},
        {&a->att, L * (size_t)B * a->H * T * T},
        {&a->h, L * N * D}, {&a->xn2, L * N * D}, {&a->rstd2, L * N},
        {&a->rows_x, L * N * K * D}, {&a->rows_a, L * N * K * F}, {&a->rows_u, L * N * K * F},
        {&a->rows_h, L * N * K * F}, {&a->rows_y, L * N * K * D},
        {&a->xf, N * D}, {&a->rstdf, N}, {&a->probs, N * V}, {&a->losses, N},
        {&a->rope_cos, (size_t)T * Dh2}, {&a->rope_sin, (size_t)T * Dh2},
        {&a->dx, N * D}, {&a->dh, N * D}, {&a->dxn, N * D}, {&a->dq, N * D}, {&a->dk, N * D},
        {&a->dv, N * D}, {&a->dao, N * D}, {&a->dtmp, N * D}, {&a->dlogits, N * VE},
        {&a->dprobs, N * E}, {&a->drows_x, N * K * D}, {&a->drows_y, N * K * D},
        {&a->dscratch, att_scratch > ffn_scratch ? att_scratch : ffn_scratch},
        {&a->router_logits, N * E},
    };
    const int n_plan = (int)(sizeof plan / sizeof plan[0]);
    size_t total = 0;
    for (int i = 0; i < n_plan; i++) total += (plan[i].n + 15) & ~(size_t)15;
    a->block = aligned_alloc(64, total * sizeof(float));
    a->route = calloc(L, sizeof(MoeRouting));
    if (!a->block || !a->route) {
        acts_destroy(a);
        return isth_fail(ISTH_ERUNTIME, "out of memory for activations (%zu MiB)",
                         total * sizeof(float) >> 20);
    }
    size_t off = 0;
    for (int i = 0; i < n_plan; i++) {
        *plan[i].p = a->block + off;
        off += (plan[i].n + 15) & ~(size_t)15;
    }
    for (size_t l = 0; l < L; l++) {
        MoeRouting *r = &a->route[l];
        r->probs = malloc(N * E * sizeof(float));
        r->lse = malloc(N * sizeof(float));
        r->choice = malloc(N * K * sizeof(int));
        r->row = malloc(N * K * sizeof(int));
        r->row_token = malloc(N * K * sizeof(int));
        r->expert_start = malloc((E + 1) * sizeof(int));
        r->frac = malloc(E * sizeof(double));
        r->mean_prob = malloc(E * sizeof(double));
        if (!r->probs || !r->lse || !r->choice || !r->row || !r->row_token || !r->expert_start ||
            !r->frac || !r->mean_prob) {
            acts_destroy(a);
            return isth_fail(ISTH_ERUNTIME, "out of memory for routing buffers");
        }
    }
    rope_tables(a->rope_cos, a->rope_sin, T, a->D / a->H);
    return ISTH_OK;
}

void acts_destroy(Activations *a)
{
    if (a->route)
        for (int l = 0; l < a->L; l++) {
            MoeRouting *r = &a->route[l];
            free(r->probs);
            free(r->lse);
            free(r->choice);
            free(r->row);
            free(r->row_token);
            free(r->expert_start);
            free(r->frac);
            free(r->mean_prob);
        }
    free(a->route);
    free(a->block);
    memset(a, 0, sizeof *a);
}

/* Per-layer slices of the saved activations. The stride is the allocated
 * size, so slices stay fixed whatever N the current call uses. */
#define SLICE(buf, l, per) ((buf) + (size_t)(l) * (per))

static void moe_forward(float *out, const Model *m, Activations *a, int l, size_t N, int training,
                        ForwardStats *st)
{
    const int D = a->D, E = a->E, K = a->K, F = a->F;
    const size_t NmaxK = (size_t)a->B * a->T * K;
    MoeRouting *r = &a->route[l];
    const float *xn = SLICE(a->xn2, l, (size_t)a->B * a->T * D);
    float *rx = SLICE(a->rows_x, l, NmaxK * D), *ra = SLICE(a->rows_a, l, NmaxK * F),
          *ru = SLICE(a->rows_u, l, NmaxK * F), *rh = SLICE(a->rows_h, l, NmaxK * F),
          *ry = SLICE(a->rows_y, l, NmaxK * D);

    /* route: logits (N,E) = xn . router ; probs ; top-k */
    matmul_forward(a->router_logits, xn, model_param(m, T_ROUTER, l), N, D, E);
    router_softmax_forward(r->probs, r->lse, a->router_logits, N, E);
    router_topk(r->choice, r->probs, N, E, K);
    router_stats(r->frac, r->mean_prob, r->choice, r->probs, N, E, K);
    int capacity = training ? moe_capacity(m->cfg.capacity_factor, N, K, E) : -1;
    moe_plan(r, N, E, K, capacity);
    if (training) {
        st->aux_loss += moe_balance_loss(r->frac, r->mean_prob, E, m->cfg.aux_loss);
        st->z_loss += moe_z_loss(r->lse, N, m->cfg.z_loss);
        st->dropped += r->dropped;
    }

    /* dispatch: rows grouped by expert; compute; combine */
    moe_gather(rx, xn, r, D);
    const size_t wg_stride = (size_t)D * F; /* one expert's matrix */
    for (int e = 0; e < E; e++) {
        size_t r0 = (size_t)r->expert_start[e], n = (size_t)r->expert_start[e + 1] - r0;
        expert_forward(ry + r0 * D, ra + r0 * F, ru + r0 * F, rh + r0 * F, rx + r0 * D,
                       model_param(m, T_W_GATE, l) + e * wg_stride,
                       model_param(m, T_W_UP, l) + e * wg_stride,
                       model_param(m, T_W_DOWN, l) + e * wg_stride, n, D, F);
    }
    moe_combine_forward(out, ry, r, N, E, K, D);
}

int transformer_forward(const Model *m, Activations *a, const int *tokens, const int *targets,
                        int B, int T, int training, ForwardStats *st)
{
    if (B > a->B || T > a->T || m->experts_local != a->E)
        return isth_fail(ISTH_ERUNTIME, "transformer_forward: batch %dx%d exceeds buffers %dx%d",
                         B, T, a->B, a->T);
    const int L = a->L, D = a->D, H = a->H, V = a->V;
    const size_t N = (size_t)B * T, ND = (size_t)a->B * a->T * D; /* ND: per-layer stride */
    const size_t NmaxT = (size_t)a->B * a->T;
    const size_t att_stride = (size_t)a->B * H * a->T * a->T;
    memset(st, 0, sizeof *st);
    a->N = N;
    a->B_cur = B;
    a->T_cur = T;
    a->training = training;

    /* positions restart at 0 in each sequence: the tables are indexed by t < T
     * and the attention blocks of B, H, T are used with this call's T. */
    encoder_forward(SLICE(a->x, 0, ND), tokens, model_param(m, T_EMBED, 0), N, D);
    for (int l = 0; l < L; l++) {
        float *x = SLICE(a->x, l, ND), *xn1 = SLICE(a->xn1, l, ND), *q = SLICE(a->q, l, ND),
              *k = SLICE(a->k, l, ND), *v = SLICE(a->v, l, ND), *ao = SLICE(a->ao, l, ND),
              *h = SLICE(a->h, l, ND), *xn2 = SLICE(a->xn2, l, ND),
              *att = SLICE(a->att, l, att_stride), *xnext = SLICE(a->x, l + 1, ND);
        rmsnorm_forward(xn1, SLICE(a->rstd1, l, NmaxT), x, model_param(m, T_ATTN_NORM, l), N, D);
        matmul_forward(q, xn1, model_param(m, T_WQ, l), N, D, D);
        matmul_forward(k, xn1, model_param(m, T_WK, l), N, D, D);
        matmul_forward(v, xn1, model_param(m, T_WV, l), N, D, D);
        rope_forward(q, a->rope_cos, a->rope_sin, B, T, H, D / H);
        rope_forward(k, a->rope_cos, a->rope_sin, B, T, H, D / H);
        attention_forward(ao, att, q, k, v, B, T, D, H);
        matmul_forward(a->dtmp, ao, model_param(m, T_WO, l), N, D, D);
        residual_forward(h, x, a->dtmp, N * D);
        rmsnorm_forward(xn2, SLICE(a->rstd2, l, NmaxT), h, model_param(m, T_MOE_NORM, l), N, D);
        moe_forward(a->dtmp, m, a, l, N, training, st);
        residual_forward(xnext, h, a->dtmp, N * D);
    }
    rmsnorm_forward(a->xf, a->rstdf, SLICE(a->x, L, ND), model_param(m, T_FINAL_NORM, 0), N, D);
    /* logits (N,V) = xf . embed^T, softmaxed in place into probs */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, V, D, 1.0f, a->xf, D,
                model_param(m, T_EMBED, 0), D, 0.0f, a->probs, V);
    crossentropy_forward(a->losses, a->probs, targets, N, V);
    for (size_t t = 0; t < N; t++)
        if (targets[t] >= 0) {
            st->ce_sum += a->losses[t];
            st->n_targets++;
        }
    return ISTH_OK;
}

static void moe_backward(float *dxn, Model *m, Activations *a, int l, const float *dout,
                         float loss_scale)
{
    const int D = a->D, E = a->E, K = a->K, F = a->F;
    const size_t N = a->N, NmaxK = (size_t)a->B * a->T * K;
    MoeRouting *r = &a->route[l];
    const float *xn = SLICE(a->xn2, l, (size_t)a->B * a->T * D);
    const float *rx = SLICE(a->rows_x, l, NmaxK * D), *ra = SLICE(a->rows_a, l, NmaxK * F),
                *ru = SLICE(a->rows_u, l, NmaxK * F), *rh = SLICE(a->rows_h, l, NmaxK * F),
                *ry = SLICE(a->rows_y, l, NmaxK * D);

    memset(a->dprobs, 0, N * E * sizeof(float));
    moe_combine_backward(a->drows_y, a->dprobs, dout, ry, r, N, E, K, D);
    memset(a->drows_x, 0, (size_t)r->rows * D * sizeof(float));
    const size_t stride = (size_t)D * F;
    for (int e = 0; e < E; e++) {
        size_t r0 = (size_t)r->expert_start[e], n = (size_t)r->expert_start[e + 1] - r0;
        expert_backward(a->drows_x + r0 * D, model_grad(m, T_W_GATE, l) + e * stride,
                        model_grad(m, T_W_UP, l) + e * stride, model_grad(m, T_W_DOWN, l) + e * stride,
                        a->dscratch, a->drows_y + r0 * D, rx + r0 * D, ra + r0 * F, ru + r0 * F,
                        rh + r0 * F, model_param(m, T_W_GATE, l) + e * stride,
                        model_param(m, T_W_UP, l) + e * stride,
                        model_param(m, T_W_DOWN, l) + e * stride, n, D, F);
    }
    moe_scatter_add(dxn, a->drows_x, r, N, K, D);
    moe_balance_backward(a->dprobs, r->frac, N, E, m->cfg.aux_loss, loss_scale);
    router_softmax_backward(a->dlogits, a->dprobs, r->probs, r->lse, N, E, m->cfg.z_loss, loss_scale);
    matmul_backward(dxn, model_grad(m, T_ROUTER, l), a->dlogits, xn, model_param(m, T_ROUTER, l), N,
                    D, E);
}

void transformer_backward(Model *m, Activations *a, const int *tokens, const int *targets,
                          float loss_scale)
{
    const int L = a->L, D = a->D, H = a->H, V = a->V, B = a->B_cur;
    const size_t N = a->N, ND = (size_t)a->B * a->T * D, NmaxT = (size_t)a->B * a->T;
    const size_t att_stride = (size_t)a->B * H * a->T * a->T;
    const size_t nbytes = N * D * sizeof(float);
    size_t n_targets = 0;
    for (size_t t = 0; t < N; t++) n_targets += targets[t] >= 0;
    const int T = a->T_cur;

    /* head: dlogits = (probs - onehot) * scale / n_targets */
    crossentropy_backward(a->dlogits, a->probs, targets,
                          n_targets ? loss_scale / (float)n_targets : 0.0f, N, V);
    memset(a->dxn, 0, nbytes);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, V, 1.0f, a->dlogits, V,
                model_param(m, T_EMBED, 0), D, 0.0f, a->dxn, D);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, (int)N, 1.0f, a->dlogits, V, a->xf, D,
                1.0f, model_grad(m, T_EMBED, 0), D);
    memset(a->dx, 0, nbytes);
    rmsnorm_backward(a->dx, model_grad(m, T_FINAL_NORM, 0), a->dxn, SLICE(a->x, L, ND),
                     model_param(m, T_FINAL_NORM, 0), a->rstdf, N, D);

    for (int l = L - 1; l >= 0; l--) {
        const float *x = SLICE(a->x, l, ND), *xn1 = SLICE(a->xn1, l, ND), *q = SLICE(a->q, l, ND),
                    *k = SLICE(a->k, l, ND), *v = SLICE(a->v, l, ND), *ao = SLICE(a->ao, l, ND),
                    *h = SLICE(a->h, l, ND), *att = SLICE(a->att, l, att_stride);
        /* x_{l+1} = h + MoE(RMSNorm(h)) : dh = dx + norm-backward(moe-backward(dx)) */
        memcpy(a->dh, a->dx, nbytes);
        memset(a->dxn, 0, nbytes);
        moe_backward(a->dxn, m, a, l, a->dx, loss_scale);
        rmsnorm_backward(a->dh, model_grad(m, T_MOE_NORM, l), a->dxn, h,
                         model_param(m, T_MOE_NORM, l), SLICE(a->rstd2, l, NmaxT), N, D);
        /* h = x + Attn(RMSNorm(x)) */
        memcpy(a->dx, a->dh, nbytes);
        memset(a->dao, 0, nbytes);
        matmul_backward(a->dao, model_grad(m, T_WO, l), a->dh, ao, model_param(m, T_WO, l), N, D, D);
        memset(a->dq, 0, nbytes);
        memset(a->dk, 0, nbytes);
        memset(a->dv, 0, nbytes);
        attention_backward(a->dq, a->dk, a->dv, a->dscratch, a->dao, att, q, k, v, B, T, D, H);
        rope_backward(a->dq, a->rope_cos, a->rope_sin, B, T, H, D / H);
        rope_backward(a->dk, a->rope_cos, a->rope_sin, B, T, H, D / H);
        memset(a->dxn, 0, nbytes);
        matmul_backward(a->dxn, model_grad(m, T_WQ, l), a->dq, xn1, model_param(m, T_WQ, l), N, D, D);
        matmul_backward(a->dxn, model_grad(m, T_WK, l), a->dk, xn1, model_param(m, T_WK, l), N, D, D);
        matmul_backward(a->dxn, model_grad(m, T_WV, l), a->dv, xn1, model_param(m, T_WV, l), N, D, D);
        rmsnorm_backward(a->dx, model_grad(m, T_ATTN_NORM, l), a->dxn, x,
                         model_param(m, T_ATTN_NORM, l), SLICE(a->rstd1, l, NmaxT), N, D);
    }
    encoder_backward(model_grad(m, T_EMBED, 0), a->dx, tokens, N, D);
}
