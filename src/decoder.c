/* decoder.c — see decoder.h. */
#include "decoder.h"

#include <math.h>
#include <string.h>

#include "alloc.h"
#include "cpu/layers.h"
#include "cpu/moe.h"
#include "status.h"

int decoder_create(Decoder *d, const Model *m)
{
    memset(d, 0, sizeof *d);
    const ModelConfig *c = &m->cfg;
    if (m->experts_local != c->experts)
        return isth_fail(ISTH_ERUNTIME, "decoder: the model holds %d of %d experts", m->experts_local, c->experts);
    d->m = m;
    d->T = c->context;
    d->dims = model_dims(c);
    const size_t T = (size_t)d->T, D = (size_t)d->dims.D, L = (size_t)d->dims.L, E = (size_t)d->dims.E,
                 F = (size_t)d->dims.F;
    const size_t half = D / (size_t)d->dims.H / 2;
    float **bufs[] = {&d->kcache, &d->vcache, &d->x, &d->xn, &d->q, &d->k, &d->v, &d->ao, &d->o, &d->h,
                      &d->scores, &d->router, &d->gates, &d->ea, &d->eu, &d->eh, &d->ey, &d->rope_cos,
                      &d->rope_sin};
    const size_t sizes[] = {L * T * D, L * T * D, D, D, D, D, D, D, D, D, T, E, E, F, F, F, D, T * half, T * half};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += (sizes[i] + 15) & ~(size_t)15;
    d->block = isth_aligned_alloc(64, total * sizeof(float));
    d->choice = isth_malloc((size_t)d->dims.K * sizeof(int));
    if (!d->block || !d->choice) {
        decoder_destroy(d);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the decoder's cache (%zu MiB)", total * sizeof(float) >> 20);
    }
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        *bufs[i] = d->block + off;
        off += (sizes[i] + 15) & ~(size_t)15;
    }
    rope_tables(d->rope_cos, d->rope_sin, d->T, d->dims.D / d->dims.H);
    return ISTH_OK;
}

void decoder_destroy(Decoder *d)
{
    isth_free(d->block);
    isth_free(d->choice);
    memset(d, 0, sizeof *d);
}

void decoder_reset(Decoder *d) { d->pos = 0; }

/* ao (D) = causal attention of the new query over positions 0..p of layer l's cache. */
static void attend(Decoder *d, int l)
{
    const int D = d->dims.D, H = d->dims.H, Dh = D / H, n = d->pos + 1;
    const float scale = 1.0f / sqrtf((float)Dh);
    const float *kc = d->kcache + (size_t)l * d->T * D, *vc = d->vcache + (size_t)l * d->T * D;
    for (int h = 0; h < H; h++) {
        const float *q = d->q + (size_t)h * Dh;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            const float *k = kc + (size_t)j * D + (size_t)h * Dh;
            float s = 0.0f;
            for (int i = 0; i < Dh; i++) s += q[i] * k[i];
            d->scores[j] = s * scale;
            mx = d->scores[j] > mx ? d->scores[j] : mx;
        }
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            d->scores[j] = expf(d->scores[j] - mx);
            sum += d->scores[j];
        }
        float *out = d->ao + (size_t)h * Dh;
        memset(out, 0, (size_t)Dh * sizeof(float));
        for (int j = 0; j < n; j++) {
            const float p = d->scores[j] / sum, *v = vc + (size_t)j * D + (size_t)h * Dh;
            for (int i = 0; i < Dh; i++) out[i] += p * v[i];
        }
    }
}

/* o (D) = the MoE layer l of xn: the top-k experts' outputs weighted by
 * their router probabilities, in choice order (as moe_combine_forward). */
static void mixture(Decoder *d, int l)
{
    const Model *m = d->m;
    const int D = d->dims.D, E = d->dims.E, K = d->dims.K, F = d->dims.F;
    matmul_forward(d->router, d->xn, model_param(m, T_ROUTER, l), 1, D, E);
    router_softmax_forward(d->gates, &d->lse, d->router, 1, E);
    router_topk(d->choice, d->gates, 1, E, K);
    memset(d->o, 0, (size_t)D * sizeof(float));
    for (int k = 0; k < K; k++) {
        const int e = d->choice[k];
        expert_forward(d->ey, d->ea, d->eu, d->eh, d->xn, model_expert_param(m, T_W_GATE, l, e),
                       model_expert_param(m, T_W_UP, l, e), model_expert_param(m, T_W_DOWN, l, e), 1, D, F);
        const float gate = d->gates[e];
        for (int i = 0; i < D; i++) d->o[i] += gate * d->ey[i];
    }
}

int decoder_step(Decoder *d, int token, float *logits)
{
    if (d->pos >= d->T) return isth_fail(ISTH_ERUNTIME, "decoder: the cache's %d positions are full", d->T);
    if (token < 0 || token >= d->dims.V)
        return isth_fail(ISTH_EINPUT, "decoder: token %d is outside the vocabulary of %d", token, d->dims.V);
    const Model *m = d->m;
    const int D = d->dims.D, H = d->dims.H, Dh = D / H, p = d->pos;
    const size_t half = (size_t)Dh / 2;
    float rstd;
    encoder_forward(d->x, &token, model_param(m, T_EMBED, 0), 1, D);
    for (int l = 0; l < d->dims.L; l++) {
        float *kslot = d->kcache + ((size_t)l * d->T + (size_t)p) * D;
        float *vslot = d->vcache + ((size_t)l * d->T + (size_t)p) * D;
        rmsnorm_forward(d->xn, &rstd, d->x, model_param(m, T_ATTN_NORM, l), 1, D);
        matmul_forward(d->q, d->xn, model_param(m, T_WQ, l), 1, D, D);
        matmul_forward(kslot, d->xn, model_param(m, T_WK, l), 1, D, D);
        matmul_forward(vslot, d->xn, model_param(m, T_WV, l), 1, D, D);
        /* one position: the tables' row p is row 0 of a one-row table */
        rope_forward(d->q, d->rope_cos + (size_t)p * half, d->rope_sin + (size_t)p * half, 1, 1, H, Dh);
        rope_forward(kslot, d->rope_cos + (size_t)p * half, d->rope_sin + (size_t)p * half, 1, 1, H, Dh);
        attend(d, l);
        matmul_forward(d->o, d->ao, model_param(m, T_WO, l), 1, D, D);
        residual_forward(d->h, d->x, d->o, (size_t)D);
        rmsnorm_forward(d->xn, &rstd, d->h, model_param(m, T_MOE_NORM, l), 1, D);
        mixture(d, l);
        residual_forward(d->x, d->h, d->o, (size_t)D);
    }
    rmsnorm_forward(d->xn, &rstd, d->x, model_param(m, T_FINAL_NORM, 0), 1, D);
    tied_head_forward(logits, d->xn, model_param(m, T_EMBED, 0), 1, D, d->dims.V);
    d->pos++;
    return ISTH_OK;
}
