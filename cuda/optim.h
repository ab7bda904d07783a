/* optim.h (cuda/) — the inner optimiser on the GPU, mirroring src/cpu/optim.h
 * function for function, with a trailing cudaStream_t.
 *
 * Owns: the AdamW moments of the runs this rank updates, in device memory,
 * packed run after run (the same layout as the CPU backend's, so
 * checkpoints are the same), and the kernels of the update. The per-weight
 * arithmetic is src/elementwise.h's adamw_update, shared with the CPU.
 * Must not: reduce gradients across ranks, or touch host copies of the state.
 */
#ifndef ISTHMUS_CUDA_OPTIM_H
#define ISTHMUS_CUDA_OPTIM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "cpu/optim.h" /* ParamRuns: the packed layout both backends share */
#include "model.h"

typedef struct {
    ParamRuns runs;             /* (host) the params updated here */
    float *m, *v;               /* (runs.total, device) first and second moments, packed */
    long t;                     /* updates applied so far (bias correction) */
} CudaAdamW;

/* Zeroed moments of n_runs runs (off, len) in device memory. */
int cuda_adamw_create(CudaAdamW *opt, const size_t *off, const size_t *len, int n_runs);
void cuda_adamw_destroy(CudaAdamW *opt);
/* One update of the runs of the device weights `params` (laid out like the
 * table m) from the device `grads`, queued on `stream`. */
int cuda_adamw_step(CudaAdamW *opt, const Model *m, float *params, const float *grads, double lr, double weight_decay,
                    cudaStream_t stream);
/* The AdamW update of n weights p from gradients g with moments m, v (all
 * device), constants k, queued on `stream`: cuda_adamw_step's kernel, which
 * the matrix optimisers (precond.h) run on every tensor that is not a
 * matrix. */
int cuda_adamw_update(float *p, const float *g, float *m, float *v, size_t n, const AdamWStep *k, cudaStream_t stream);

/* Plain SGD with decoupled weight decay over the runs (cpu/optim.h's sgd_step). */
int cuda_sgd_step(const ParamRuns *runs, const Model *m, float *params, const float *grads, double lr,
                  double weight_decay, cudaStream_t stream);

/* Sum of squares of buf (device, laid out like m) over the tensors whose
 * flags & mask == want: per tensor 64 fixed chunks (a fixed tree in double
 * each), added in order on the host. Synchronises the stream. */
int cuda_state_sumsq(const Model *m, const float *buf, unsigned mask, unsigned want, cudaStream_t stream,
                     double *out);
/* out[i] = sum of squares of buf[off[i], off[i] + len[i]) (device), each a
 * fixed tree in double. Synchronises the stream. */
int cuda_run_sumsq(const float *buf, const size_t *off, const size_t *len, int n, cudaStream_t stream, double *out);

#ifdef __cplusplus
}
#endif

#endif
