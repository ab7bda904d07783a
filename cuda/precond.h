/* precond.h (cuda/) — the matrix optimisers on the GPU, mirroring
 * src/cpu/precond.h function for function with a trailing cudaStream_t:
 * blocked Shampoo and Muon on the chunks flagged PARAM_MATRIX of the runs
 * this rank updates, AdamW on every other tensor. The specification is
 * src/cpu/precond.h; the shared arithmetic (schedule, block layout, root
 * weights, grafting, Muon's constants) is src/precond_math.h, the
 * per-weight Adam arithmetic src/elementwise.h.
 *
 * How each matrix is done on the device, all of it queued on the caller's
 * stream (cuBLAS and cuSOLVER handles of this module, set to that stream):
 *  - Shampoo: every b x b block of the matrix at once. Adam's moments and
 *    direction and each block's sum of squares in one kernel; the
 *    statistics' products G G^T and G^T G of all blocks by one batched GEMM
 *    each (the blocks read in place through arrays of their addresses,
 *    row stride = the matrix's columns), folded into the upper triangles
 *    of L and R by a kernel that also resets a statistic that is not
 *    finite; the roots of all blocks by cusolverDnXsyevBatched (float32,
 *    like the CPU's ssyevd; per-block cusolverDnXsyevd where the batched
 *    solver refuses the block size), the eps * lmax floor and the weights
 *    by a kernel, Q diag(w) Q^T by a strided batched GEMM, stored over the
 *    previous root only where every value is finite; the direction
 *    Lr (c1 m) Rr by two batched GEMMs; the grafting's norms summed in a
 *    fixed tree on the device, which also decides the fallback. No host
 *    round trip inside a matrix.
 *  - Muon: the momentum in one kernel, the norms by a fixed partition in
 *    fixed trees, the five Newton-Schulz steps by cuBLAS GEMMs (the Gram
 *    matrix of the shorter side, as on the CPU).
 * Products are plain float32 (CUBLAS_COMPUTE_32F_PEDANTIC, no TF32, even
 * when the model trains in bf16), like the CPU's OpenBLAS. The counters
 * are kept on the device (per-block flags summed in a fixed order, no
 * atomics) and read back once per step: the step ends with one stream
 * synchronisation. Designed so that the same inputs give the same bits on
 * a given GPU (test_optim_gpu checks it; not yet run on a GPU).
 *
 * Owns: Shampoo's statistics and roots in device memory, packed by runs
 * exactly like the CPU backend's (cpu/precond.h: the b x b factor of block
 * (i, j) in that block's region of a params-shaped buffer; only the upper
 * triangle of a statistic is formed and kept), so get/put, checkpoints and
 * resharding treat them like the moments and a checkpoint resumes on either
 * backend; the scratch, sized when the state is created for the largest
 * matrix (cuda/precond_plan.h), never allocated per step; the two library
 * handles; the counters.
 * Must not: reduce anything across ranks, print, or touch host copies of
 * the state.
 */
#ifndef ISTHMUS_CUDA_PRECOND_H
#define ISTHMUS_CUDA_PRECOND_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include "gemm.h" /* CudaBlas */
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "config.h"
#include "model.h"
#include "precond_math.h"

typedef struct {
    int shampoo;                  /* 1 shampoo, 0 muon */
    int block, every, stats_every;
    double eps, beta2;
    void *base;                   /* the one device block the buffers below are carved from */
    float *l, *r, *lroot, *rroot; /* shampoo: (runs.total, device) packed like the moments */
    float *dir, *sdir;            /* (largest matrix) Adam's direction; Shampoo's (laid out like the matrix)
                                   * or Muon's iterate; sdir during the roots: Q diag(w) Q^T of every block
                                   * (tmp holds Q diag(w)) */
    float *tmp;                   /* shampoo: (largest) a b x b product per block; muon: X X^T and its square */
    float *vec, *val;             /* shampoo: (largest), (largest / b) every block's eigenvectors and values */
    int *info;                    /* shampoo: (blocks) the solver's verdict per block */
    int *flags;                   /* shampoo: (3 x blocks) per block: statistics reset, roots kept, root usable */
    double *sums;                 /* the grafting's per-block norms (2 x blocks); Muon's partial sums */
    double *scalars;              /* (CUDA_PRECOND_SCALARS) the matrix in hand's scale and decisions */
    long long *counters;          /* (CUDA_PRECOND_COUNTERS) roots kept, statistics reset, fallbacks */
    void **ptrs;                  /* shampoo: (CUDA_PRECOND_POINTER_ARRAYS x blocks) blocks' addresses */
    size_t blocks;                /* shampoo: blocks of the largest matrix */
    CudaBlas blas;                /* float32 products, this module's own handle */
    cusolverDnHandle_t solver;
    cusolverDnParams_t params;
    int batched;                  /* 1: cusolverDnXsyevBatched, `batch` blocks a call; 0: syevd per block */
    int64_t batch;
    void *work, *host_work;       /* the solver's workspaces (device, host), sized at creation */
    size_t work_bytes, host_work_bytes;
    long roots, root_failures, stat_resets, fallbacks;
} CudaPrecond;

/* The state of `optimizer` ("shampoo" or "muon") for the runs of opt
 * (zeroed on `stream`, which the handles are bound to; returns once it
 * is), sized for the model's largest matrix (m: the table; its buffers are
 * not used). Free with cuda_precond_destroy. */
int cuda_precond_create(CudaPrecond *p, const char *optimizer, const CudaAdamW *opt, const Model *m,
                        const TrainConfig *tc, cudaStream_t stream);
void cuda_precond_destroy(CudaPrecond *p);

/* One update (t = opt->t + 1) of opt's runs of the device weights `params`
 * (laid out like the table m) from the device `grads` (read, not
 * modified), queued on `stream` (the handles are bound to it); returns
 * once the counters are read (the stream synchronised). */
int cuda_precond_step(CudaPrecond *p, CudaAdamW *opt, const Model *m, float *params, const float *grads, double lr,
                      double weight_decay, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
