/* backend_cpu.c — the CPU backend (backend.h): the model's state in host
 * memory, layers through OpenBLAS and OpenMP, expert parallelism over MPI
 * (coll.h). Owns the thread setup (OpenMP and OpenBLAS) of the process. */
#include "backend_cpu.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "alloc.h"
#include "backend_state.h"
#include "optim.h"
#include "precond.h"
#include "status.h"
#include "transformer.h"

typedef struct {
    Backend base;
    Model model;       /* the table with the buffers */
    AdamW opt;
    Precond pre;       /* shampoo, muon: their state for opt's runs */
    StateBook book;    /* the views of the state, the optimiser's runs (backend_state.h) */
    const TrainConfig *train; /* the optimiser's settings */
    Activations acts;
    Coll *learner;     /* the learner's ranks (expert parallelism and state sums) */
    float *scratch;    /* (scratch_cap) batches of learner sums */
    size_t scratch_cap;
    const char *optimizer; /* "adamw", "sgd", "shampoo" or "muon" */
    double weight_decay;
} CpuBackend;

static CpuBackend *cpu(Backend *b) { return (CpuBackend *)b; }

static void cpu_destroy(Backend *b)
{
    CpuBackend *c = cpu(b);
    acts_destroy(&c->acts);
    precond_destroy(&c->pre);
    adamw_destroy(&c->opt);
    isth_free(c->scratch);
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

static int cpu_predict(Backend *b, const int *tokens, int T, float *probs)
{
    CpuBackend *c = cpu(b);
    int *targets = isth_malloc((size_t)T * sizeof(int));
    if (!targets) return isth_fail(ISTH_ERUNTIME, "out of memory for a prediction");
    for (int t = 0; t < T; t++) targets[t] = -1;
    ForwardStats st;
    const int rc = transformer_forward(&c->model, &c->acts, tokens, targets, 1, T, 0, &st);
    isth_free(targets);
    CHECK(rc);
    /* the forward leaves every position's softmax in probs */
    memcpy(probs, c->acts.probs + (size_t)(T - 1) * c->model.cfg.vocab, sizeof(float) * (size_t)c->model.cfg.vocab);
    return ISTH_OK;
}

static int cpu_zero_grads(Backend *b)
{
    memset(cpu(b)->model.grads, 0, cpu(b)->model.n_params * sizeof(float));
    return ISTH_OK;
}

/* The book's create: the optimiser's state for n runs, the moments and a
 * matrix optimiser's own. */
static int create_optimizer(void *backend, const size_t *off, const size_t *len, int n, float *view[STATE_KINDS])
{
    CpuBackend *c = backend;
    precond_destroy(&c->pre);
    adamw_destroy(&c->opt);
    const AllocCategory was = alloc_category(ALLOC_OPTIMIZER);
    int rc = adamw_create(&c->opt, off, len, n);
    alloc_category(was);
    if (rc == ISTH_OK && (!strcmp(c->optimizer, "shampoo") || !strcmp(c->optimizer, "muon")))
        rc = precond_create(&c->pre, c->optimizer, &c->opt, &c->model, c->train);
    view[STATE_ADAM_M] = c->opt.m;
    view[STATE_ADAM_V] = c->opt.v;
    view[STATE_SHAMPOO_L] = c->pre.l; /* NULL unless the optimiser is shampoo */
    view[STATE_SHAMPOO_R] = c->pre.r;
    view[STATE_SHAMPOO_LROOT] = c->pre.lroot;
    view[STATE_SHAMPOO_RROOT] = c->pre.rroot;
    return rc;
}

static int cpu_optimizer_shard(Backend *b, const size_t *off, const size_t *len, int n)
{
    return state_book_shard(&cpu(b)->book, off, len, n);
}

static float *cpu_state(CpuBackend *c, StateKind which) { return state_book_view(&c->book, which); }

static int check_runs(CpuBackend *c, StateKind which, const size_t *off, const size_t *len, int n, const char *verb)
{
    return state_book_check_runs(&c->book, which, off, len, n, verb);
}

static int cpu_get(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, float *host)
{
    CpuBackend *c = cpu(b);
    CHECK(check_runs(c, which, off, len, n, "get"));
    const float *v = cpu_state(c, which);
    for (int i = 0; i < n; i++) {
        memcpy(host, v + off[i], len[i] * sizeof(float));
        host += len[i];
    }
    return ISTH_OK;
}

static int cpu_put(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, const float *host)
{
    CpuBackend *c = cpu(b);
    CHECK(check_runs(c, which, off, len, n, "put"));
    float *v = cpu_state(c, which);
    for (int i = 0; i < n; i++) {
        memcpy(v + off[i], host, len[i] * sizeof(float));
        host += len[i];
    }
    return ISTH_OK;
}

/* Runs [i, n) in batches of whole runs through the scratch; share: only
 * run i's owner contributes (the others add zeros, so the sum is a copy). */
static int learner_sum(CpuBackend *c, StateKind which, const size_t *off, const size_t *len, const int *owner, int n)
{
    if (c->learner->size == 1 || !n) return ISTH_OK;
    CHECK(check_runs(c, which, off, len, n, owner ? "share_runs" : "sum_runs"));
    float *buf = cpu_state(c, which);
    const MPI_Comm comm = c->learner->comm;
    const int me = c->learner->rank;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += len[i];
    const size_t want = total < BACKEND_SUM_BATCH ? total : BACKEND_SUM_BATCH;
    if (want > c->scratch_cap) { /* grows to the largest call's batch */
        const AllocCategory was = alloc_category(ALLOC_STAGING);
        float *grown = isth_realloc(c->scratch, want * sizeof(float));
        alloc_category(was);
        CHECK_ALLOC(grown);
        c->scratch = grown;
        c->scratch_cap = want;
    }
    const size_t cap = c->scratch_cap;
    int i = 0;
    while (i < n) {
        if (len[i] > cap) { /* alone and in place */
            float *v = buf + off[i];
            if (owner && owner[i] != me) memset(v, 0, len[i] * sizeof(float));
            CHECK(coll_allreduce_comm(comm, v, len[i], MPI_FLOAT, sizeof(float), MPI_SUM));
            i++;
            continue;
        }
        int end = i;
        size_t k = 0;
        for (; end < n && len[end] <= cap - k; k += len[end], end++) {
            if (!owner || owner[end] == me) memcpy(c->scratch + k, buf + off[end], len[end] * sizeof(float));
            else memset(c->scratch + k, 0, len[end] * sizeof(float));
        }
        CHECK(coll_allreduce_comm(comm, c->scratch, k, MPI_FLOAT, sizeof(float), MPI_SUM));
        for (k = 0; i < end; k += len[i], i++) memcpy(buf + off[i], c->scratch + k, len[i] * sizeof(float));
    }
    return ISTH_OK;
}

static int cpu_sum_runs(Backend *b, StateKind which, const size_t *off, const size_t *len, int n)
{
    return learner_sum(cpu(b), which, off, len, NULL, n);
}

static int cpu_share_runs(Backend *b, StateKind which, const size_t *off, const size_t *len, const int *owner, int n)
{
    return learner_sum(cpu(b), which, off, len, owner, n);
}

static int cpu_copy_state(Backend *b, StateKind dst, StateKind src)
{
    CpuBackend *c = cpu(b);
    if ((dst != STATE_PARAMS && dst != STATE_GRADS) || (src != STATE_PARAMS && src != STATE_GRADS))
        return isth_fail(ISTH_ERUNTIME, "backend: copy_state handles params and grads only");
    if (dst != src) memcpy(cpu_state(c, dst), cpu_state(c, src), c->model.n_params * sizeof(float));
    return ISTH_OK;
}

static int cpu_sumsq(Backend *b, StateKind which, unsigned mask, unsigned want, double *out)
{
    *out = state_sumsq(&cpu(b)->model, cpu_state(cpu(b), which), mask, want);
    return ISTH_OK;
}

static int cpu_run_sumsq(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, double *out)
{
    const float *v = cpu_state(cpu(b), which);
    for (int i = 0; i < n; i++) {
        const float *g = v + off[i];
        double s = 0.0;
        for (size_t j = 0; j < len[i]; j++) s += (double)g[j] * g[j];
        out[i] = s;
    }
    return ISTH_OK;
}

static int cpu_scale_grads(Backend *b, float factor)
{
    grad_scale(&cpu(b)->model, factor);
    return ISTH_OK;
}

static int cpu_optimizer_step(Backend *b, double lr)
{
    CpuBackend *c = cpu(b);
    CHECK(state_book_ensure(&c->book));
    c->opt.t = b->optimizer_t;
    if (!strcmp(c->optimizer, "sgd")) sgd_step(&c->opt.runs, &c->model, lr, c->weight_decay); /* t stays 0 */
    else if (c->pre.dir) precond_step(&c->pre, &c->opt, &c->model, lr, c->weight_decay);
    else adamw_step(&c->opt, &c->model, lr, c->weight_decay);
    b->optimizer_t = c->opt.t;
    b->precond_roots = c->pre.roots;
    b->precond_failures = c->pre.root_failures + c->pre.stat_resets + c->pre.fallbacks;
    return ISTH_OK;
}

static void cpu_set_progress(Backend *b, void (*fn)(void *ctx), void *ctx)
{
    cpu(b)->acts.progress = fn;
    cpu(b)->acts.progress_ctx = ctx;
}

static int cpu_set_route(Backend *b, RoutePolicy policy, int learner_begin)
{
    CpuBackend *c = cpu(b);
    Model m = c->model; /* checked on a copy: a misfit leaves the routing as it was */
    CHECK(model_set_route(&m, policy, learner_begin));
    CHECK(model_route_check(&m, c->acts.G, c->learner->rank));
    c->model.route = b->table.route = policy;
    c->model.route_begin = b->table.route_begin = learner_begin;
    return ISTH_OK;
}

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
    .get = cpu_get,
    .put = cpu_put,
    .sum_runs = cpu_sum_runs,
    .share_runs = cpu_share_runs,
    .copy_state = cpu_copy_state,
    .encode_ef = NULL, /* payload.c's host codec is this backend's */
    .set_progress = cpu_set_progress,
    .predict = cpu_predict,
    .set_route = cpu_set_route,
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
    c->learner = ep;
    c->optimizer = cfg->train.optimizer;
    c->train = &cfg->train;
    c->weight_decay = cfg->train.weight_decay;
    int rc = model_create(&c->model, &cfg->model, expert_begin, experts_local);
    if (rc == ISTH_OK) model_init(&c->model);
    /* the optimiser's state waits for optimizer_shard (or its first use) */
    AllocCategory was = alloc_category(ALLOC_ACTIVATIONS);
    if (rc == ISTH_OK) rc = acts_create(&c->acts, &cfg->model, B, cfg->model.context, ep, config_recompute(&cfg->train));
    alloc_category(was);
    if (rc != ISTH_OK) {
        cpu_destroy(&c->base);
        return rc;
    }
    state_book_init(&c->book, c->model.n_params, c->model.params, c->model.grads, create_optimizer, c);
    c->base.threads = omp_get_max_threads();
    c->base.table = c->model;
    c->base.table.params = c->base.table.grads = NULL; /* the table alone: memory stays here */
    *out = &c->base;
    return ISTH_OK;
}
