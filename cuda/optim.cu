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
            const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
            adamw_segment<<<blocks, 256, 0, stream>>>(params + at, grads + at, opt->m + packed, opt->v + packed, n, k);
        }
    }
    CHECK_CUDA(cudaGetLastError()); /* the launches */
    return ISTH_OK;
}
