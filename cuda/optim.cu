/* optim.cu — see optim.h. */
#include "optim.h"
#include "check.h"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "alloc.h"
#include "cpu/optim.h" /* adamw_constants, run_segment: host arithmetic shared with the CPU */
#include "elementwise.h"
#include "status.h"
}

/* A grid-stride loop over one segment (a run's part inside one tensor). */
__global__ static void adamw_segment(float *p, const float *g, float *m, float *v, size_t n, AdamWStep k)
{
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        adamw_update(&p[j], &m[j], &v[j], g[j], &k);
}

static int alloc_moments(CudaAdamW *opt, size_t bytes)
{
    CHECK_CUDA(cudaMalloc((void **)&opt->m, bytes));
    CHECK_CUDA(cudaMalloc((void **)&opt->v, bytes));
    CHECK_CUDA(cudaMemset(opt->m, 0, bytes));
    CHECK_CUDA(cudaMemset(opt->v, 0, bytes));
    /* the memsets ran on the legacy stream, which the backend's non-blocking
     * streams do not wait for: done before anything (a resume's put of the
     * moments, the first update) can be queued behind them */
    CHECK_CUDA(cudaDeviceSynchronize());
    return ISTH_OK;
}

extern "C" int cuda_adamw_create(CudaAdamW *opt, const size_t *off, const size_t *len, int n_runs)
{
    memset(opt, 0, sizeof *opt);
    CHECK(param_runs_create(&opt->runs, off, len, n_runs));
    const int rc = alloc_moments(opt, sizeof(float) * (opt->runs.total + 1));
    if (rc != ISTH_OK) cuda_adamw_destroy(opt);
    return rc;
}

extern "C" void cuda_adamw_destroy(CudaAdamW *opt)
{
    if (opt->m) cudaFree(opt->m);
    if (opt->v) cudaFree(opt->v);
    param_runs_destroy(&opt->runs);
    memset(opt, 0, sizeof *opt);
}

extern "C" int cuda_adamw_update(float *p, const float *g, float *m, float *v, size_t n, const AdamWStep *k,
                                 cudaStream_t stream)
{
    if (!n) return ISTH_OK;
    const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    adamw_segment<<<blocks, 256, 0, stream>>>(p, g, m, v, n, *k);
    CHECK_CUDA(cudaGetLastError()); /* the launch */
    return ISTH_OK;
}

extern "C" int cuda_adamw_step(CudaAdamW *opt, const Model *model, float *params, const float *grads, double lr,
                               double weight_decay, cudaStream_t stream)
{
    opt->t++;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const AdamWStep k = adamw_constants(opt->t, lr, weight_decay, t->flags & PARAM_DECAY);
        for (int r = 0; r < opt->runs.n; r++) {
            size_t at, packed, n;
            if (!run_segment(&opt->runs, r, t, &at, &packed, &n)) continue;
            CHECK(cuda_adamw_update(params + at, grads + at, opt->m + packed, opt->v + packed, n, &k, stream));
        }
    }
    return ISTH_OK;
}

__global__ static void sgd_segment(float *p, const float *g, size_t n, float decay, float lr)
{
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        p[j] = p[j] * decay - lr * g[j];
}

extern "C" int cuda_sgd_step(const ParamRuns *runs, const Model *model, float *params, const float *grads, double lr,
                             double weight_decay, cudaStream_t stream)
{
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &model->tensors[i];
        const float decay = (t->flags & PARAM_DECAY) ? (float)(1.0 - lr * weight_decay) : 1.0f;
        for (int r = 0; r < runs->n; r++) {
            size_t at, packed, n;
            if (!run_segment(runs, r, t, &at, &packed, &n)) continue;
            const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
            sgd_segment<<<blocks, 256, 0, stream>>>(params + at, grads + at, n, decay, (float)lr);
        }
    }
    CHECK_CUDA(cudaGetLastError());
    return ISTH_OK;
}

#define SUMSQ_THREADS 256
#define SUMSQ_CHUNKS 64

/* Block b: the sum of squares of [begin[b], end[b]) of v, a fixed tree. */
__global__ static void sumsq_ranges(double *out, const float *v, const size_t *begin, const size_t *end)
{
    __shared__ double shared[SUMSQ_THREADS];
    const size_t j0 = begin[blockIdx.x], j1 = end[blockIdx.x];
    double s = 0.0;
    for (size_t j = j0 + threadIdx.x; j < j1; j += SUMSQ_THREADS) s += (double)v[j] * v[j];
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int k = SUMSQ_THREADS / 2; k > 0; k /= 2) {
        if ((int)threadIdx.x < k) shared[threadIdx.x] += shared[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

/* out[i] = sum of squares of v over the n ranges [begin[i], end[i]) (host arrays). */
static int sumsq_of_ranges(const float *v, const size_t *begin, const size_t *end, int n, cudaStream_t stream,
                           double *out)
{
    if (n <= 0) return ISTH_OK;
    size_t *d_ranges;
    double *d_out;
    CHECK_CUDA(cudaMallocAsync((void **)&d_ranges, sizeof(size_t) * 2 * (size_t)n, stream));
    CHECK_CUDA(cudaMallocAsync((void **)&d_out, sizeof(double) * (size_t)n, stream));
    CHECK_CUDA(cudaMemcpyAsync(d_ranges, begin, sizeof(size_t) * (size_t)n, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemcpyAsync(d_ranges + n, end, sizeof(size_t) * (size_t)n, cudaMemcpyHostToDevice, stream));
    sumsq_ranges<<<(unsigned)n, SUMSQ_THREADS, 0, stream>>>(d_out, v, d_ranges, d_ranges + n);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpyAsync(out, d_out, sizeof(double) * (size_t)n, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaFreeAsync(d_ranges, stream));
    CHECK_CUDA(cudaFreeAsync(d_out, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return ISTH_OK;
}

extern "C" int cuda_state_sumsq(const Model *m, const float *buf, unsigned mask, unsigned want, cudaStream_t stream,
                                double *out)
{
    size_t begin[N_TENSORS * SUMSQ_CHUNKS], end[N_TENSORS * SUMSQ_CHUNKS];
    double part[N_TENSORS * SUMSQ_CHUNKS];
    int n = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        if ((t->flags & mask) != want) continue;
        for (int c = 0; c < SUMSQ_CHUNKS; c++, n++) { /* the CPU's chunks */
            begin[n] = t->offset + t->numel * (size_t)c / SUMSQ_CHUNKS;
            end[n] = t->offset + t->numel * (size_t)(c + 1) / SUMSQ_CHUNKS;
        }
    }
    CHECK(sumsq_of_ranges(buf, begin, end, n, stream, part));
    double total = 0.0;
    for (int c = 0; c < n; c++) total += part[c];
    *out = total;
    return ISTH_OK;
}

extern "C" int cuda_run_sumsq(const float *buf, const size_t *off, const size_t *len, int n, cudaStream_t stream,
                              double *out)
{
    size_t *end = (size_t *)isth_malloc(sizeof(size_t) * ((size_t)n + 1));
    CHECK_ALLOC(end);
    for (int i = 0; i < n; i++) end[i] = off[i] + len[i];
    const int rc = sumsq_of_ranges(buf, off, end, n, stream, out);
    isth_free(end);
    return rc;
}
