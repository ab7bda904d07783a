/* backend_cpu.c — the CPU backend (backend.h): the model's state in host
 * memory, layers through OpenBLAS and OpenMP, expert parallelism over MPI
 * (coll.h). Owns the thread setup (OpenMP and OpenBLAS) of the process. */
#include "backend.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "alloc.h"
#include "optim.h"
#include "status.h"
#include "transformer.h"

typedef struct {
    Backend base;
    Model model;       /* the table with the buffers */
    AdamW opt;
    Activations acts;
    const char *optimizer; /* "adamw" or "sgd" */
    double weight_decay;
} CpuBackend;

static CpuBackend *cpu(Backend *b) { return (CpuBackend *)b; }

static void cpu_destroy(Backend *b)
{
    CpuBackend *c = cpu(b);
    acts_destroy(&c->acts);
    adamw_destroy(&c->opt);
    model_destroy(&c->model);
    isth_free(c);
}

static int cpu_train_micro(Backend *b, const int *tokens, const int *targets, int B, int T, float loss_scale,
                           ForwardStats *st)
{
    CpuBackend *c = cpu(b);
    CHECK(transformer_forward(&c->model, &c->acts, tokens, targets, B, T, 1, st));
    return transformer_backward(&c->model, &c->acts, tokens, targets, loss_scale);
}

static int cpu_score(Backend *b, const int *tokens, const int *targets, int B, int T, float *losses)
{
    CpuBackend *c = cpu(b);
    ForwardStats st;
    CHECK(transformer_forward(&c->model, &c->acts, tokens, targets, B, T, 0, &st));
    memcpy(losses, c->acts.losses, sizeof(float) * (size_t)B * T);
    return ISTH_OK;
}

static void cpu_zero_grads(Backend *b) { memset(cpu(b)->model.grads, 0, cpu(b)->model.n_params * sizeof(float)); }

/* Until the trainer says which runs this rank updates: all of them. */
static int ensure_optimizer(CpuBackend *c)
{
    if (c->opt.n_runs) return ISTH_OK;
    const size_t off = 0, len = c->model.n_params;
    const AllocCategory was = alloc_category(ALLOC_OPTIMIZER);
    const int rc = adamw_create(&c->opt, &off, &len, 1);
    alloc_category(was);
    return rc;
}

static int cpu_optimizer_shard(Backend *b, const size_t *off, const size_t *len, int n)
{
    CpuBackend *c = cpu(b);
    for (int r = 0; r < n; r++)
        if (off[r] + len[r] > c->model.n_params)
            return isth_fail(ISTH_ERUNTIME, "optimizer: run %d [%zu, +%zu) is outside the %zu parameters", r, off[r],
                             len[r], c->model.n_params);
    adamw_destroy(&c->opt);
    const AllocCategory was = alloc_category(ALLOC_OPTIMIZER);
    const int rc = adamw_create(&c->opt, off, len, n);
    alloc_category(was);
    return rc;
}

static float *cpu_state(Backend *b, StateKind which)
{
    CpuBackend *c = cpu(b);
    if ((which == STATE_ADAM_M || which == STATE_ADAM_V) && ensure_optimizer(c) != ISTH_OK) return NULL;
    switch (which) {
    case STATE_PARAMS: return c->model.params;
    case STATE_GRADS: return c->model.grads;
    case STATE_ADAM_M: return c->opt.m;
    case STATE_ADAM_V: return c->opt.v;
    default: return NULL;
    }
}

static double cpu_sumsq(Backend *b, StateKind which, unsigned mask, unsigned want)
{
    return state_sumsq(&cpu(b)->model, cpu_state(b, which), mask, want);
}

static void cpu_run_sumsq(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, double *out)
{
    const float *v = cpu_state(b, which);
    for (int i = 0; i < n; i++) {
        const float *g = v + off[i];
        double s = 0.0;
        for (size_t j = 0; j < len[i]; j++) s += (double)g[j] * g[j];
        out[i] = s;
    }
}

static void cpu_scale_grads(Backend *b, float factor) { grad_scale(&cpu(b)->model, factor); }

static int cpu_optimizer_step(Backend *b, double lr)
{
    CpuBackend *c = cpu(b);
    CHECK(ensure_optimizer(c));
    c->opt.t = b->optimizer_t;
    if (!strcmp(c->optimizer, "sgd")) sgd_step(&c->opt, &c->model, lr, c->weight_decay); /* t stays 0 */
    else adamw_step(&c->opt, &c->model, lr, c->weight_decay);
    b->optimizer_t = c->opt.t;
    return ISTH_OK;
}

static void cpu_nothing(Backend *b) { (void)b; } /* the host view is the memory */

static const BackendOps cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .train_micro = cpu_train_micro,
    .score = cpu_score,
    .zero_grads = cpu_zero_grads,
    .sumsq = cpu_sumsq,
    .run_sumsq = cpu_run_sumsq,
    .scale_grads = cpu_scale_grads,
    .optimizer_shard = cpu_optimizer_shard,
    .optimizer_step = cpu_optimizer_step,
    .state = cpu_state,
    .to_host = cpu_nothing,
    .from_host = cpu_nothing,
};

/* OpenMP and OpenBLAS thread counts (0 = leave the defaults). */
static void set_threads(int threads)
{
    if (threads <= 0) return;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int cpu_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep)
{
    set_threads(cfg->train.threads);
    CpuBackend *c = isth_calloc(1, sizeof *c);
    CHECK_ALLOC(c);
    c->base.ops = &cpu_ops;
    c->optimizer = cfg->train.optimizer;
    c->weight_decay = cfg->train.weight_decay;
    int rc = model_create(&c->model, &cfg->model, expert_begin, experts_local);
    if (rc == ISTH_OK) model_init(&c->model);
    /* the optimiser's state waits for optimizer_shard (or its first use) */
    AllocCategory was = alloc_category(ALLOC_ACTIVATIONS);
    if (rc == ISTH_OK) rc = acts_create(&c->acts, &cfg->model, B, cfg->model.context, ep);
    alloc_category(was);
    if (rc != ISTH_OK) {
        cpu_destroy(&c->base);
        return rc;
    }
    c->base.threads = omp_get_max_threads();
    c->base.table = c->model;
    c->base.table.params = c->base.table.grads = NULL; /* the table alone: memory stays here */
    *out = &c->base;
    return ISTH_OK;
}
