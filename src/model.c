/* model.c — see model.h. */
#include "model.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "status.h"

static void set_shape(Tensor *t, const char *name, unsigned flags, double std, int ndim,
                      size_t a, size_t b, size_t c, size_t d)
{
    size_t dims[4] = {a, b, c, d};
    t->name = name;
    t->flags = flags;
    t->init_std = std;
    t->ndim = ndim;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t->shape[i] = t->local[i] = i < ndim ? dims[i] : 1;
}

void model_describe(Model *m, const ModelConfig *cfg, int expert_begin, int experts_local)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->expert_begin = expert_begin;
    m->experts_local = experts_local;
    m->route = ROUTE_ALL;
    m->route_begin = 0;
    const size_t L = (size_t)cfg->layers, D = (size_t)cfg->dim, E = (size_t)cfg->experts,
                 F = (size_t)cfg->ffn, V = (size_t)cfg->vocab;
    /* GPT-2's initialisation: N(0, 0.02), output projections scaled down
     * by sqrt(2L) so the residual stream's variance does not grow with depth */
    const double std = MODEL_INIT_STD, out_std = MODEL_INIT_STD / sqrt(2.0 * cfg->layers);
    const unsigned LY = PARAM_LAYERED, DEC = PARAM_DECAY, EX = PARAM_EXPERT, MX = PARAM_MATRIX;
    Tensor *t = m->tensors;
    set_shape(&t[T_EMBED], "embed", DEC, std, 2, V, D, 0, 0);
    set_shape(&t[T_ATTN_NORM], "attn_norm", LY, 0, 2, L, D, 0, 0);
    set_shape(&t[T_WQ], "wq", LY | DEC | MX, std, 3, L, D, D, 0);
    set_shape(&t[T_WK], "wk", LY | DEC | MX, std, 3, L, D, D, 0);
    set_shape(&t[T_WV], "wv", LY | DEC | MX, std, 3, L, D, D, 0);
    set_shape(&t[T_WO], "wo", LY | DEC | MX, out_std, 3, L, D, D, 0);
    set_shape(&t[T_MOE_NORM], "moe_norm", LY, 0, 2, L, D, 0, 0);
    set_shape(&t[T_ROUTER], "router", LY | DEC, std, 3, L, D, E, 0);
    set_shape(&t[T_W_GATE], "w_gate", LY | DEC | EX | MX, std, 4, L, E, D, F);
    set_shape(&t[T_W_UP], "w_up", LY | DEC | EX | MX, std, 4, L, E, D, F);
    set_shape(&t[T_W_DOWN], "w_down", LY | DEC | EX | MX, out_std, 4, L, E, F, D);
    set_shape(&t[T_FINAL_NORM], "final_norm", PARAM_AT_END, 0, 1, D, 0, 0, 0);

    size_t offset = 0;
    m->dense_end = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        if (i == T_W_GATE) m->dense_end = offset;
        if (t[i].flags & PARAM_EXPERT) t[i].local[1] = (size_t)experts_local;
        t[i].numel = 1;
        for (int d = 0; d < t[i].ndim; d++) t[i].numel *= t[i].local[d];
        t[i].chunk_numel = t[i].numel / ((t[i].flags & PARAM_LAYERED) ? t[i].local[0] : 1) /
                           ((t[i].flags & PARAM_EXPERT) ? (t[i].local[1] ? t[i].local[1] : 1) : 1);
        t[i].offset = offset;
        /* keep every tensor 64-byte aligned for vector loads */
        offset += (t[i].numel + 15) & ~(size_t)15;
    }
    m->n_params = offset;
}

int model_create(Model *m, const ModelConfig *cfg, int expert_begin, int experts_local)
{
    model_describe(m, cfg, expert_begin, experts_local);
    const AllocCategory was = alloc_category(ALLOC_WEIGHTS);
    m->params = isth_aligned_alloc(64, m->n_params * sizeof(float));
    alloc_category(ALLOC_GRADS);
    m->grads = isth_aligned_alloc(64, m->n_params * sizeof(float));
    alloc_category(was);
    if (!m->params || !m->grads) {
        model_destroy(m);
        return isth_fail(ISTH_ERUNTIME, "out of memory for %zu parameters", m->n_params);
    }
    memset(m->params, 0, m->n_params * sizeof(float));
    memset(m->grads, 0, m->n_params * sizeof(float));
    return ISTH_OK;
}

void model_destroy(Model *m)
{
    isth_free(m->params);
    isth_free(m->grads);
    m->params = m->grads = NULL;
}

static const char *const route_names[] = {"all", "local", "drop"};

int model_set_route(Model *m, RoutePolicy policy, int learner_begin)
{
    if ((int)policy < ROUTE_ALL || policy > ROUTE_DROP)
        return isth_fail(ISTH_EINPUT, "model: routing policy %d is none of all, local, drop", (int)policy);
    if (learner_begin < 0 || learner_begin > m->expert_begin || m->experts_local < 1 ||
        (m->expert_begin - learner_begin) % m->experts_local)
        return isth_fail(ISTH_EINPUT, "model: the learner's first expert %d does not begin this rank's experts "
                         "[%d, %d) a whole number of shards before", learner_begin, m->expert_begin,
                         m->expert_begin + m->experts_local);
    if (policy == ROUTE_ALL && learner_begin != 0)
        return isth_fail(ISTH_EINPUT, "model: routing 'all' holds every expert, from 0 (here from %d)", learner_begin);
    m->route = policy;
    m->route_begin = learner_begin;
    return ISTH_OK;
}

int model_route_check(const Model *m, int G, int rank)
{
    const int E = m->cfg.experts, El = m->experts_local, Es = G * El, b = m->route_begin;
    const char *name = route_names[m->route];
    if (El < 1 || b < 0 || b + Es > E)
        return isth_fail(ISTH_ERUNTIME, "model: a learner of %d ranks x %d experts from expert %d does not fit the "
                         "model's %d", G, El, b, E);
    if (m->expert_begin != b + rank * El)
        return isth_fail(ISTH_ERUNTIME, "model: rank %d holds experts from %d, not %d (the learner's from %d)", rank,
                         m->expert_begin, b + rank * El, b);
    if (m->route == ROUTE_ALL && Es != E)
        return isth_fail(ISTH_ERUNTIME, "model: routing '%s' needs every expert in the learner (%d of %d)", name, Es,
                         E);
    if (m->route == ROUTE_LOCAL && Es < m->cfg.top_k)
        return isth_fail(ISTH_ERUNTIME, "model: routing '%s' picks top_k = %d of the learner's %d experts", name,
                         m->cfg.top_k, Es);
    return ISTH_OK;
}

size_t tensor_canonical_numel(const Tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

void model_init(Model *m)
{
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->init_std == 0) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
            continue;
        }
        /* Local index -> canonical index: only expert tensors differ, by the
         * expert offset on axis 1. */
        size_t inner = 1; /* elements per expert */
        for (int d = 2; d < t->ndim; d++) inner *= t->shape[d];
        const size_t per_layer_local = t->numel / t->local[0];
        const size_t per_layer_canon = tensor_canonical_numel(t) / t->shape[0];
        const size_t shift = (t->flags & PARAM_EXPERT) ? (size_t)m->expert_begin * inner : 0;
        const uint64_t seed = m->cfg.init_seed;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < t->numel; j++) {
            size_t layer = j / per_layer_local, within = j % per_layer_local;
            size_t canon = layer * per_layer_canon + within + shift;
            p[j] = (float)(t->init_std * rng_normal(seed, (uint64_t)i, canon));
        }
    }
}

void model_init_expert_chunk(const Model *m, TensorId T, int layer, int e, float *out)
{
    const Tensor *t = &m->tensors[T];
    const size_t inner = t->chunk_numel, per_layer_canon = tensor_canonical_numel(t) / t->shape[0];
    const size_t first = (size_t)layer * per_layer_canon + (size_t)e * inner;
    for (size_t j = 0; j < inner; j++) out[j] = (float)(t->init_std * rng_normal(m->cfg.init_seed, (uint64_t)T, first + j));
}

float *model_param(const Model *m, TensorId t, int layer)
{
    const Tensor *x = &m->tensors[t];
    size_t per_layer = (x->flags & PARAM_LAYERED) ? x->numel / x->local[0] : 0;
    return m->params + x->offset + (size_t)layer * per_layer;
}

float *model_grad(const Model *m, TensorId t, int layer)
{
    const Tensor *x = &m->tensors[t];
    size_t per_layer = (x->flags & PARAM_LAYERED) ? x->numel / x->local[0] : 0;
    return m->grads + x->offset + (size_t)layer * per_layer;
}

float *model_expert_param(const Model *m, TensorId t, int layer, int e)
{
    return model_param(m, t, layer) + (size_t)e * m->tensors[t].chunk_numel;
}

float *model_expert_grad(const Model *m, TensorId t, int layer, int e)
{
    return model_grad(m, t, layer) + (size_t)e * m->tensors[t].chunk_numel;
}

double model_active_matrix_params(const ModelConfig *c)
{
    double D = c->dim, F = c->ffn;
    double per_layer = 4 * D * D + D * c->experts + (double)c->top_k * 3 * D * F;
    return c->layers * per_layer + (double)c->vocab * D; /* + tied output head */
}

double model_total_params(const ModelConfig *c)
{
    double D = c->dim, F = c->ffn, L = c->layers;
    return c->vocab * D + L * (2 * D + 4 * D * D + D * c->experts + 3.0 * c->experts * D * F) + D;
}
