/* testmodel.c — see testmodel.h. A helper, not a test: test_model.c and
 * test_expert_parallel.c assert on models built with it. */
#include "testmodel.h"

#include "rng.h"

ModelConfig test_model_config(int context, uint64_t init_seed)
{
    ModelConfig c = {0};
    c.layers = 2;
    c.dim = 8;
    c.heads = 2;
    c.experts = 4;
    c.top_k = 2;
    c.ffn = 6;
    c.context = context;
    c.vocab = 256;
    c.capacity_factor = 0.75;
    c.aux_loss = 0.05;
    c.z_loss = 0.01;
    c.init_seed = init_seed;
    return c;
}

void test_randomize(Model *m, uint64_t seed, int zero_router)
{
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        size_t inner = 1;
        for (int d = 2; d < t->ndim; d++) inner *= t->shape[d];
        const size_t per_local = t->numel / t->local[0], per_canon = tensor_canonical_numel(t) / t->shape[0];
        const size_t expert_shift = (t->flags & PARAM_EXPERT) ? (size_t)m->expert_begin * inner : 0;
        for (size_t j = 0; j < t->numel; j++) {
            const size_t canon = (j / per_local) * per_canon + j % per_local + expert_shift;
            const double r = rng_normal(seed, (uint64_t)i, canon);
            p[j] = t->init_std == 0 ? (float)(1.0 + 0.2 * r) : (float)(0.5 * r);
            if (zero_router && i == T_ROUTER) p[j] = 0.0f;
        }
    }
}
