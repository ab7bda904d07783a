/* optim.cu — see optim.h. */
#include "optim.h"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "alloc.h"
#include "cpu/optim.h" /* adamw_constants, run_in_tensor: host arithmetic shared with the CPU */
#include "elementwise.h"
#include "status.h"
}

/* A grid-stride loop over one segment (a run's part inside one tensor). */
__global__ static void adamw_segment(float *p, const float *g, float *m, float *v, size_t n, AdamWStep k)
{
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        adamw_update(&p[j], &m[j], &v[j], g[j], &k);
}

static int cuda_status(cudaError_t e, const char *what)
{
    return e == cudaSuccess ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "cuda: %s: %s", what, cudaGetErrorString(e));
}

extern "C" int cuda_adamw_create(CudaAdamW *opt, const size_t *off, const size_t *len, int n_runs)
{
    memset(opt, 0, sizeof *opt);
    CHECK(param_runs_create(&opt->runs, off, len, n_runs));
    const size_t bytes = sizeof(float) * (opt->runs.total + 1);
    int rc = cuda_status(cudaMalloc((void **)&opt->m, bytes), "cudaMalloc of the first moments");
    if (rc == ISTH_OK) rc = cuda_status(cudaMalloc((void **)&opt->v, bytes), "cudaMalloc of the second moments");
    if (rc == ISTH_OK) rc = cuda_status(cudaMemset(opt->m, 0, bytes), "cudaMemset");
    if (rc == ISTH_OK) rc = cuda_status(cudaMemset(opt->v, 0, bytes), "cudaMemset");
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
            size_t j0, j1;
            if (!run_in_tensor(&opt->runs, r, t, &j0, &j1)) continue;
            const size_t at = opt->runs.packed[r] + (t->offset + j0 - opt->runs.off[r]), n = j1 - j0;
            const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
            adamw_segment<<<blocks, 256, 0, stream>>>(params + t->offset + j0, grads + t->offset + j0, opt->m + at,
                                                      opt->v + at, n, k);
        }
    }
    return cuda_status(cudaGetLastError(), "the AdamW kernel's launch");
}
