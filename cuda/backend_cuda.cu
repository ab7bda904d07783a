/* backend_cuda.cu — the CUDA backend (backend.h), mirroring
 * src/cpu/backend_cpu.c: the model's state in device memory, layers through
 * cuda/layers, cuda/moe and cuda/transformer, the learner's collectives
 * over NCCL (cuda/coll_nccl). One rank drives one GPU (src/devices.h).
 * Owns: the rank's device, its compute stream and copy stream, cuBLAS
 * handle, NCCL communicator, the inner optimiser's state (cuda/optim: the
 * moments; cuda/precond: Shampoo's statistics and roots, Muon's scratch),
 * and the pinned host staging through which
 * state runs reach the host (get/put) and payloads are encoded (cuda/codec),
 * both on the copy stream: the compute stream waits for a copy only through
 * an event, never the whole device.
 * Must not: know about sites, other learners or the link. */
#include "backend_cuda.h"
#include "check.h"
#include "codec.h"
#include "coll_nccl.h"
#include "optim.h"
#include "phases.h"
#include "precond.h"
#include "transformer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "alloc.h"
#include "backend.h"
#include "backend_state.h"
#include "devices.h"
#include "status.h"
}

typedef struct {
    Backend base;
    Model model;          /* the table with device params and grads */
    CudaAdamW opt;
    CudaPrecond pre;      /* shampoo, muon: their state for opt's runs */
    StateBook book;       /* the views of the state, the optimiser's runs (backend_state.h) */
    const TrainConfig *train; /* the optimiser's settings */
    CudaActivations acts;
    CudaColl coll;
    CudaBlas blas;
    cudaStream_t stream;  /* compute: layers, optimiser, NCCL */
    cudaStream_t copy;    /* host staging and the codec */
    cudaEvent_t ready;    /* orders the two streams */
    unsigned char *pinned; /* (STAGE_BYTES, pinned host) get/put staging: two halves */
    cudaEvent_t staged[2]; /* each half's last copy on the copy stream */
    CudaCodec codec;
    float *scratch;       /* (scratch_cap, device) batches of learner sums */
    size_t scratch_cap;
    const char *optimizer;
    double weight_decay;
    int device;
    PhaseClock *clock;    /* bench's phase timing (NULL: off) */
} CudaBackend;

static CudaBackend *cb(Backend *b) { return (CudaBackend *)b; }

static void cuda_destroy(Backend *b)
{
    CudaBackend *c = cb(b);
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->copy) cudaStreamSynchronize(c->copy);
    cuda_codec_destroy(&c->codec);
    if (c->pinned) cudaFreeHost(c->pinned);
    if (c->ready) cudaEventDestroy(c->ready);
    for (int h = 0; h < 2; h++)
        if (c->staged[h]) cudaEventDestroy(c->staged[h]);
    if (c->copy) cudaStreamDestroy(c->copy);
    cuda_acts_destroy(&c->acts);
    if (c->clock) phase_stop(c->clock);
    isth_free(c->clock);
    cuda_precond_destroy(&c->pre);
    cuda_adamw_destroy(&c->opt);
    cuda_coll_destroy(&c->coll);
    cuda_blas_destroy(&c->blas);
    if (c->scratch) cudaFree(c->scratch);
    if (c->model.params) cudaFree(c->model.params);
    if (c->model.grads) cudaFree(c->model.grads);
    if (c->stream) cudaStreamDestroy(c->stream);
    isth_free(c);
}

static int cuda_train_micro(Backend *b, const int *tokens, const int *targets, int B, int T, float loss_scale,
                            ForwardStats *st)
{
    CudaBackend *c = cb(b);
    CHECK(cuda_transformer_forward(&c->model, &c->acts, tokens, targets, B, T, 1, st));
    return cuda_transformer_backward(&c->model, &c->acts, st->n_targets, loss_scale);
}

static int cuda_score(Backend *b, const int *tokens, const int *targets, int B, int T, float *losses)
{
    CudaBackend *c = cb(b);
    ForwardStats st;
    CHECK(cuda_transformer_forward(&c->model, &c->acts, tokens, targets, B, T, 0, &st));
    memcpy(losses, c->acts.h_losses, sizeof(float) * (size_t)B * T);
    return ISTH_OK;
}

static int cuda_predict(Backend *b, const int *tokens, int T, float *probs)
{
    CudaBackend *c = cb(b);
    int *targets = (int *)isth_malloc((size_t)T * sizeof(int));
    if (!targets) return isth_fail(ISTH_ERUNTIME, "out of memory for a prediction");
    for (int t = 0; t < T; t++) targets[t] = -1;
    ForwardStats st;
    const int rc = cuda_transformer_forward(&c->model, &c->acts, tokens, targets, 1, T, 0, &st);
    isth_free(targets);
    CHECK(rc);
    /* the forward leaves every position's softmax in probs (device) */
    const size_t V = (size_t)c->model.cfg.vocab;
    CHECK_CUDA(cudaMemcpyAsync(probs, c->acts.probs + (size_t)(T - 1) * V, V * sizeof(float), cudaMemcpyDeviceToHost,
                               c->stream));
    CHECK_CUDA(cudaStreamSynchronize(c->stream));
    return ISTH_OK;
}

static int cuda_zero_grads(Backend *b)
{
    CudaBackend *c = cb(b);
    c->acts.w16_step = 0; /* a step starts: its first forward rounds the weights' bf16 copy again */
    CHECK_CUDA(cudaMemsetAsync(c->model.grads, 0, c->model.n_params * sizeof(float), c->stream));
    return ISTH_OK;
}

/* The book's create: the optimiser's state for n runs, the moments and a
 * matrix optimiser's own (the CPU backend's create_optimizer). */
static int create_optimizer(void *backend, const size_t *off, const size_t *len, int n, float *view[STATE_KINDS])
{
    CudaBackend *c = (CudaBackend *)backend;
    cuda_precond_destroy(&c->pre);
    cuda_adamw_destroy(&c->opt);
    int rc = cuda_adamw_create(&c->opt, off, len, n);
    if (rc == ISTH_OK && (!strcmp(c->optimizer, "shampoo") || !strcmp(c->optimizer, "muon")))
        rc = cuda_precond_create(&c->pre, c->optimizer, &c->opt, &c->model, c->train, c->stream);
    view[STATE_ADAM_M] = c->opt.m;
    view[STATE_ADAM_V] = c->opt.v;
    view[STATE_SHAMPOO_L] = c->pre.l; /* NULL unless the optimiser is shampoo */
    view[STATE_SHAMPOO_R] = c->pre.r;
    view[STATE_SHAMPOO_LROOT] = c->pre.lroot;
    view[STATE_SHAMPOO_RROOT] = c->pre.rroot;
    return rc;
}

static int cuda_optimizer_shard(Backend *b, const size_t *off, const size_t *len, int n)
{
    return state_book_shard(&cb(b)->book, off, len, n);
}

static float *state(CudaBackend *c, StateKind which) { return state_book_view(&c->book, which); }

static int check_runs(CudaBackend *c, StateKind which, const size_t *off, const size_t *len, int n, const char *verb)
{
    return state_book_check_runs(&c->book, which, off, len, n, verb);
}

/* Host staging through pinned memory on the copy stream (pageable copies
 * go at half the rate and hold the device's copy engine synchronously), in
 * pieces of half of it: the device copies one piece while the host copies
 * the other (double buffering). */
#define STAGE_BYTES ((size_t)64 << 20)
#define STAGE_PIECE (STAGE_BYTES / 2 / sizeof(float))

/* The runs as a sequence of pieces of at most STAGE_PIECE floats. */
typedef struct {
    const size_t *off, *len;
    int n, run;
    size_t done;
} Pieces;

/* The next piece: *at (the state's offset), *k floats; 0 when none is left. */
static int next_piece(Pieces *p, size_t *at, size_t *k)
{
    while (p->run < p->n && p->done == p->len[p->run]) {
        p->run++;
        p->done = 0;
    }
    if (p->run == p->n) return 0;
    const size_t left = p->len[p->run] - p->done;
    *at = p->off[p->run] + p->done;
    *k = left < STAGE_PIECE ? left : STAGE_PIECE;
    p->done += *k;
    return 1;
}

/* `after` -> `before`: work queued on `before` from now on waits for what is
 * queued on `after` so far. */
static int order_streams(CudaBackend *c, cudaStream_t after, cudaStream_t before)
{
    CHECK_CUDA(cudaEventRecord(c->ready, after));
    CHECK_CUDA(cudaStreamWaitEvent(before, c->ready, 0));
    return ISTH_OK;
}

static int cuda_get(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, float *host)
{
    CudaBackend *c = cb(b);
    CHECK(check_runs(c, which, off, len, n, "get"));
    const float *v = state(c, which);
    CHECK(order_streams(c, c->stream, c->copy)); /* the state as the compute stream leaves it */
    Pieces p = {off, len, n, 0, 0};
    size_t at, k, k_next;
    if (!next_piece(&p, &at, &k)) return ISTH_OK;
    int half = 0;
    float *stage[2] = {(float *)c->pinned, (float *)c->pinned + STAGE_PIECE};
    CHECK_CUDA(cudaMemcpyAsync(stage[0], v + at, k * sizeof(float), cudaMemcpyDeviceToHost, c->copy));
    CHECK_CUDA(cudaEventRecord(c->staged[0], c->copy));
    for (;;) {
        /* the next piece into the other half while this one is copied out */
        const int more = next_piece(&p, &at, &k_next);
        if (more) {
            CHECK_CUDA(cudaMemcpyAsync(stage[1 - half], v + at, k_next * sizeof(float), cudaMemcpyDeviceToHost,
                                       c->copy));
            CHECK_CUDA(cudaEventRecord(c->staged[1 - half], c->copy));
        }
        CHECK_CUDA(cudaEventSynchronize(c->staged[half]));
        memcpy(host, stage[half], k * sizeof(float));
        host += k;
        if (!more) return ISTH_OK;
        k = k_next;
        half = 1 - half;
    }
}

/* The parameters changed: the next forward rounds the bf16 copy again
 * (zero_grads does so for every step anyway; this keeps the copy right
 * whatever order the verbs come in). */
static void params_written(CudaBackend *c, StateKind which)
{
    if (which == STATE_PARAMS) c->acts.w16_step = 0;
}

static int cuda_put(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, const float *host)
{
    CudaBackend *c = cb(b);
    CHECK(check_runs(c, which, off, len, n, "put"));
    params_written(c, which);
    float *v = state(c, which);
    CHECK(order_streams(c, c->stream, c->copy)); /* no kernel still reading what is overwritten */
    Pieces p = {off, len, n, 0, 0};
    size_t at, k;
    float *stage[2] = {(float *)c->pinned, (float *)c->pinned + STAGE_PIECE};
    int used[2] = {0, 0}, half = 0;
    while (next_piece(&p, &at, &k)) {
        /* this half's last copy has left it; the other half's goes on meanwhile */
        if (used[half]) CHECK_CUDA(cudaEventSynchronize(c->staged[half]));
        memcpy(stage[half], host, k * sizeof(float));
        CHECK_CUDA(cudaMemcpyAsync(v + at, stage[half], k * sizeof(float), cudaMemcpyHostToDevice, c->copy));
        CHECK_CUDA(cudaEventRecord(c->staged[half], c->copy));
        used[half] = 1;
        host += k;
        half = 1 - half;
    }
    CHECK_CUDA(cudaStreamSynchronize(c->copy)); /* the caller may reuse host at once */
    return order_streams(c, c->copy, c->stream);
}

/* Payloads encoded on the GPU (cuda/codec), bit for bit the host's. */
static int cuda_encode_ef(Backend *b, Codec codec, const float *x, float *residual, size_t n, int block,
                          unsigned char *out, float *decoded, double *err2, double *norm2)
{
    return cuda_codec_encode_ef(&cb(b)->codec, codec, x, residual, n, block, out, decoded, err2, norm2);
}

/* Runs in batches of whole runs through device scratch, summed with one
 * ncclAllReduce per batch (a run larger than the batch alone, in place):
 * the CPU backend's batching, so the sums are the same on every rank. */
static int cuda_sum_runs(Backend *b, StateKind which, const size_t *off, const size_t *len, int n)
{
    CudaBackend *c = cb(b);
    if (c->coll.mpi->size == 1 || !n) return ISTH_OK;
    CHECK(check_runs(c, which, off, len, n, "sum_runs"));
    float *buf = state(c, which);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += len[i];
    const size_t want = total < BACKEND_SUM_BATCH ? total : BACKEND_SUM_BATCH;
    if (want > c->scratch_cap) {
        if (c->scratch) CHECK_CUDA(cudaFree(c->scratch));
        c->scratch = NULL;
        c->scratch_cap = 0;
        CHECK_CUDA(cudaMalloc((void **)&c->scratch, want * sizeof(float)));
        c->scratch_cap = want;
    }
    const size_t cap = c->scratch_cap;
    const cudaStream_t s = c->stream;
    int i = 0;
    while (i < n) {
        if (len[i] > cap) {
            CHECK(cuda_coll_allreduce_sum(&c->coll, buf + off[i], len[i], s));
            i++;
            continue;
        }
        int end = i;
        size_t k = 0;
        for (; end < n && len[end] <= cap - k; k += len[end], end++)
            CHECK_CUDA(cudaMemcpyAsync(c->scratch + k, buf + off[end], len[end] * sizeof(float),
                                       cudaMemcpyDeviceToDevice, s));
        CHECK(cuda_coll_allreduce_sum(&c->coll, c->scratch, k, s));
        for (k = 0; i < end; k += len[i], i++)
            CHECK_CUDA(cudaMemcpyAsync(buf + off[i], c->scratch + k, len[i] * sizeof(float), cudaMemcpyDeviceToDevice,
                                       s));
    }
    return ISTH_OK;
}

static int cuda_share_runs(Backend *b, StateKind which, const size_t *off, const size_t *len, const int *owner, int n)
{
    CudaBackend *c = cb(b);
    CHECK(check_runs(c, which, off, len, n, "share_runs"));
    params_written(c, which);
    return cuda_coll_share(&c->coll, state(c, which), off, len, owner, n, c->stream);
}

static int cuda_copy_state(Backend *b, StateKind dst, StateKind src)
{
    CudaBackend *c = cb(b);
    if ((dst != STATE_PARAMS && dst != STATE_GRADS) || (src != STATE_PARAMS && src != STATE_GRADS))
        return isth_fail(ISTH_ERUNTIME, "backend: copy_state handles params and grads only");
    params_written(c, dst);
    if (dst != src)
        CHECK_CUDA(cudaMemcpyAsync(state(c, dst), state(c, src), c->model.n_params * sizeof(float),
                                   cudaMemcpyDeviceToDevice, c->stream));
    return ISTH_OK;
}

static int cuda_sumsq(Backend *b, StateKind which, unsigned mask, unsigned want, double *out)
{
    CudaBackend *c = cb(b);
    return cuda_state_sumsq(&c->model, state(c, which), mask, want, c->stream, out);
}

static int cuda_run_sumsq_verb(Backend *b, StateKind which, const size_t *off, const size_t *len, int n, double *out)
{
    CudaBackend *c = cb(b);
    CHECK(check_runs(c, which, off, len, n, "run_sumsq"));
    return cuda_run_sumsq(state(c, which), off, len, n, c->stream, out);
}

static int cuda_scale_grads(Backend *b, float factor)
{
    CudaBackend *c = cb(b);
    return cuda_scale(c->model.grads, factor, c->model.n_params, c->stream);
}

static int cuda_optimizer_step(Backend *b, double lr)
{
    CudaBackend *c = cb(b);
    CHECK(state_book_ensure(&c->book));
    params_written(c, STATE_PARAMS);
    phase_mark(c->clock, PHASE_OPTIMISER);
    if (!strcmp(c->optimizer, "sgd")) {
        CHECK(cuda_sgd_step(&c->opt.runs, &c->model, c->model.params, c->model.grads, lr, c->weight_decay, c->stream));
    } else {
        c->opt.t = b->optimizer_t;
        if (c->pre.dir)
            CHECK(cuda_precond_step(&c->pre, &c->opt, &c->model, c->model.params, c->model.grads, lr, c->weight_decay,
                                    c->stream));
        else CHECK(cuda_adamw_step(&c->opt, &c->model, c->model.params, c->model.grads, lr, c->weight_decay, c->stream));
        b->optimizer_t = c->opt.t;
        b->precond_roots = c->pre.roots;
        b->precond_failures = c->pre.root_failures + c->pre.stat_resets + c->pre.fallbacks;
    }
    phase_mark(c->clock, PHASE_OTHER); /* until the next step's first kernel: the host's time */
    if (c->clock) CHECK(phase_collect(c->clock));
    return ISTH_OK;
}

static int cuda_phases(Backend *b, int start, const char **names, double *ms, int max, int *n)
{
    CudaBackend *c = cb(b);
    if (n) *n = 0;
    if (start) {
        if (!c->clock && !(c->clock = (PhaseClock *)isth_calloc(1, sizeof(PhaseClock))))
            return isth_fail(ISTH_ERUNTIME, "cuda: out of memory for the phase clock");
        c->acts.clock = c->clock;
        return phase_start(c->clock, c->stream);
    }
    if (!n || !names || !ms) return isth_fail(ISTH_ERUNTIME, "cuda: phases: nowhere to put the totals");
    if (!c->clock) return ISTH_OK;
    CHECK(phase_collect(c->clock));
    for (int p = 0; p < PHASE_COUNT && p < max; p++, (*n)++) {
        names[p] = phase_name((Phase)p);
        ms[p] = c->clock->ms[p];
    }
    return ISTH_OK;
}

static void cuda_set_progress(Backend *b, void (*fn)(void *ctx), void *ctx)
{
    cb(b)->acts.progress = fn;
    cb(b)->acts.progress_ctx = ctx;
}

static int cuda_set_route(Backend *b, RoutePolicy policy, int learner_begin)
{
    CudaBackend *c = cb(b);
    Model m = c->model; /* checked on a copy: a misfit leaves the routing as it was */
    CHECK(model_set_route(&m, policy, learner_begin));
    CHECK(model_route_check(&m, c->acts.G, c->coll.mpi->rank));
    c->model.route = b->table.route = policy;
    c->model.route_begin = b->table.route_begin = learner_begin;
    return ISTH_OK;
}

static const BackendOps cuda_ops = {
    "cuda",
    cuda_destroy,
    cuda_train_micro,
    cuda_score,
    cuda_zero_grads,
    cuda_sumsq,
    cuda_run_sumsq_verb,
    cuda_scale_grads,
    cuda_optimizer_shard,
    cuda_optimizer_step,
    cuda_get,
    cuda_put,
    cuda_sum_runs,
    cuda_share_runs,
    cuda_copy_state,
    cuda_encode_ef,
    cuda_set_progress,
    cuda_predict,
    cuda_phases,
    cuda_set_route,
};

extern "C" int cuda_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" void cuda_visible_devices(VisibleDevices *v)
{
    memset(v, 0, sizeof *v);
    int n = cuda_device_count();
    if (n > DEVICE_MAX_VISIBLE) n = DEVICE_MAX_VISIBLE;
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) break; /* the order must stay CUDA's */
        char *o = v->id[v->n++];
        o += snprintf(o, DEVICE_ID_BYTES, "GPU-");
        for (int b = 0; b < 16; b++) o += snprintf(o, 3, "%02x", (unsigned char)p.uuid.bytes[b]);
    }
}

/* This rank's GPU: the first it sees that no lower local rank of its host
 * drives (devices.h). Collective over the world. */
static int select_device(const Config *cfg, int *device);

extern "C" int cuda_select_device(const Config *cfg, int *device) { return select_device(cfg, device); }

extern "C" void cuda_describe_device(char *out, size_t size)
{
    int d = -1, n = cuda_device_count();
    char bus[32] = "?";
    cudaDeviceProp p;
    if (cudaGetDevice(&d) != cudaSuccess || cudaGetDeviceProperties(&p, d) != cudaSuccess) {
        snprintf(out, size, "GPU unknown (%s)", cudaGetErrorString(cudaGetLastError()));
        return;
    }
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, d) != cudaSuccess) snprintf(bus, sizeof bus, "?");
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(out, size, "GPU %d of %d visible (PCI %s, %s; CUDA_VISIBLE_DEVICES=%s)", d, n, bus, p.name,
             visible ? visible : "unset");
}

static int select_device(const Config *cfg, int *device)
{
    VisibleDevices mine, *all = NULL;
    cuda_visible_devices(&mine);
    int local, local_size;
    CHECK(device_gather(MPI_COMM_WORLD, &mine, &all, &local, &local_size));
    int *device_of = (int *)isth_malloc(sizeof(int) * (size_t)local_size);
    char why[512];
    int rc = !device_of ? isth_fail(ISTH_ERUNTIME, "devices: out of memory")
             : device_assign(all, local_size, cfg->train.gpu_share, device_of, why, sizeof why) ? isth_fail(ISTH_EINPUT, "%s", why)
                                                                                             : ISTH_OK;
    if (rc == ISTH_OK) *device = device_of[local];
    isth_free(device_of);
    isth_free(all);
    CHECK(rc);
    CHECK_CUDA(cudaSetDevice(*device));
    /* the step's scratch (cudaMallocAsync/cudaFreeAsync) stays in the
     * stream-ordered pool between steps instead of going back to the
     * driver at every synchronisation (the default threshold, 0) */
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, *device));
    CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return ISTH_OK;
}

/* The weights as the CPU backend initialises them (model.h: a function of
 * the seed), copied to the device; the host copy is dropped. */
static int create_state(CudaBackend *c, const Config *cfg, int expert_begin, int experts_local)
{
    Model host;
    CHECK(model_create(&host, &cfg->model, expert_begin, experts_local));
    model_init(&host);
    c->model = host;
    c->model.params = c->model.grads = NULL;
    const size_t bytes = host.n_params * sizeof(float);
    cudaError_t e = cudaMalloc((void **)&c->model.params, bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->model.grads, bytes);
    if (e == cudaSuccess) e = cudaMemcpy(c->model.params, host.params, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(c->model.grads, 0, bytes);
    /* legacy-stream copies and memsets: complete before the backend's
     * non-blocking streams (which never wait for them) touch the state */
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    model_destroy(&host);
    if (e != cudaSuccess)
        return isth_fail(ISTH_ERUNTIME, "cuda: the model's %zu MiB of weights and gradients: %s (%s)",
                         2 * bytes >> 20, cudaGetErrorName(e), cudaGetErrorString(e));
    return ISTH_OK;
}

static int create(CudaBackend *c, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep)
{
    int rc = select_device(cfg, &c->device);
    if (rc == ISTH_OK && cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess)
        rc = isth_fail(ISTH_ERUNTIME, "cuda: cannot create a stream on device %d", c->device);
    if (rc == ISTH_OK && (cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking) != cudaSuccess ||
                          cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming) != cudaSuccess ||
                          cudaEventCreateWithFlags(&c->staged[0], cudaEventDisableTiming) != cudaSuccess ||
                          cudaEventCreateWithFlags(&c->staged[1], cudaEventDisableTiming) != cudaSuccess ||
                          cudaHostAlloc((void **)&c->pinned, STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess))
        rc = isth_fail(ISTH_ERUNTIME, "cuda: cannot create the copy stream and %zu MiB of pinned staging on device %d",
                       STAGE_BYTES >> 20, c->device);
    if (rc == ISTH_OK) cuda_codec_init(&c->codec, c->copy);
    if (rc == ISTH_OK) rc = cuda_blas_create(&c->blas, c->stream, !strcmp(cfg->train.precision, "bf16"));
    /* NCCL's setup waits for every rank: agree first that all have a GPU */
    if (!coll_all_ok(ep->comm, rc == ISTH_OK))
        return rc != ISTH_OK ? rc : isth_fail(ISTH_ERUNTIME, "cuda: another rank of this learner has no usable GPU");
    CHECK(cuda_coll_init(&c->coll, ep));
    CHECK(create_state(c, cfg, expert_begin, experts_local));
    return cuda_acts_create(&c->acts, &cfg->model, B, cfg->model.context, &c->coll, &c->blas,
                            config_recompute(&cfg->train));
}

extern "C" int cuda_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local,
                                   Coll *ep)
{
    CudaBackend *c = (CudaBackend *)isth_calloc(1, sizeof *c);
    CHECK_ALLOC(c);
    c->base.ops = &cuda_ops;
    c->optimizer = cfg->train.optimizer;
    c->train = &cfg->train;
    c->weight_decay = cfg->train.weight_decay;
    const int rc = create(c, cfg, B, expert_begin, experts_local, ep);
    if (rc != ISTH_OK) {
        cuda_destroy(&c->base);
        return rc;
    }
    state_book_init(&c->book, c->model.n_params, c->model.params, c->model.grads, create_optimizer, c);
    c->base.threads = 1;
    c->base.table = c->model;
    c->base.table.params = c->base.table.grads = NULL;
    *out = &c->base;
    return ISTH_OK;
}
