/* elementwise.h — the per-element math both backends run, written once:
 * inline functions the CPU backend calls in its loops and the CUDA backend
 * in its kernels (__host__ __device__ under nvcc), so the host's tests
 * cover the GPU's arithmetic too (up to nvcc's fused multiply-adds).
 *
 * Owns: the AdamW update of one weight.
 * Must not: loop, allocate or know about tensors (callers do).
 */
#ifndef ISTHMUS_ELEMENTWISE_H
#define ISTHMUS_ELEMENTWISE_H

#ifdef __CUDACC__
#define ISTH_HD __host__ __device__
#else
#define ISTH_HD
#endif

#ifndef __CUDACC__
#include <math.h>
#endif

/* One AdamW step's constants: betas, bias corrections 1/(1 - beta^t),
 * learning rate, decay factor (1 - lr*wd, or 1 without decay), epsilon. */
typedef struct {
    float b1, b2, c1, c2, lr, decay, eps;
} AdamWStep;

/* p, m, v of one weight after a step with gradient g. */
static inline ISTH_HD void adamw_update(float *p, float *m, float *v, float g, const AdamWStep *k)
{
    *m = k->b1 * *m + (1.0f - k->b1) * g;
    *v = k->b2 * *v + (1.0f - k->b2) * g * g;
    const float mh = *m * k->c1, vh = *v * k->c2;
    *p = *p * k->decay - k->lr * mh / (sqrtf(vh) + k->eps);
}

#endif
