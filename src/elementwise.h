/* elementwise.h — the per-element math both backends run, written once:
 * inline functions the CPU backend calls in its loops and the CUDA backend
 * in its kernels (__host__ __device__ under nvcc), so the host's tests
 * cover the GPU's arithmetic too (up to nvcc's fused multiply-adds and its
 * expf, within a few ulp).
 *
 * Owns: the AdamW update of one weight (its moments, Adam's direction), SwiGLU of one element and its
 * gradient, the rotary rotation of one pair, RMSNorm's scale of a row from
 * its sum of squares.
 * Must not: loop, allocate or know about tensors (callers do).
 */
#ifndef ISTHMUS_ELEMENTWISE_H
#define ISTHMUS_ELEMENTWISE_H

#ifdef __CUDACC__
#define ISTH_HD __host__ __device__
#else
#define ISTH_HD
#include <math.h>
#endif

/* One AdamW step's constants: betas, bias corrections 1/(1 - beta^t),
 * learning rate, decay factor (1 - lr*wd, or 1 without decay), epsilon. */
typedef struct {
    float b1, b2, c1, c2, lr, decay, eps;
} AdamWStep;

/* Adam's moments m, v of one weight after a gradient g. */
static inline ISTH_HD void adam_moments(float *m, float *v, float g, const AdamWStep *k)
{
    *m = k->b1 * *m + (1.0f - k->b1) * g;
    *v = k->b2 * *v + (1.0f - k->b2) * g * g;
}

/* Adam's direction m^ / (sqrt(v^) + eps) of one weight (the matrix
 * optimisers graft to its length). */
static inline ISTH_HD float adam_direction_of(float m, float v, const AdamWStep *k)
{
    return m * k->c1 / (sqrtf(v * k->c2) + k->eps);
}

/* p, m, v of one weight after a step with gradient g. (lr * m^ is divided,
 * not lr times the direction above: another rounding, and AdamW's numbers
 * are kept bit for bit.) */
static inline ISTH_HD void adamw_update(float *p, float *m, float *v, float g, const AdamWStep *k)
{
    adam_moments(m, v, g, k);
    const float mh = *m * k->c1, vh = *v * k->c2;
    *p = *p * k->decay - k->lr * mh / (sqrtf(vh) + k->eps);
}

/* RMSNorm: 1 / sqrt(mean(x^2) + eps) of a row of D values whose squares sum to ss. */
#define RMS_EPS 1e-5f
static inline ISTH_HD float rmsnorm_rstd(float ss, int D) { return 1.0f / sqrtf(ss / (float)D + RMS_EPS); }

/* The logistic function. */
static inline ISTH_HD float isth_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* SwiGLU of gate a and up u: silu(a) * u. */
static inline ISTH_HD float swiglu_value(float a, float u) { return a * isth_sigmoid(a) * u; }

/* What one element adds to the gradients of a and u, given dh. */
static inline ISTH_HD void swiglu_grads(float dh, float a, float u, float *da, float *du)
{
    const float s = isth_sigmoid(a), silu = a * s;
    *du = dh * silu;
    *da = dh * u * s * (1.0f + a * (1.0f - s));
}

/* Rotate the pair (x1, x2) (elements i and i + Dh/2 of a head) by the
 * angle whose cosine is c and sine sn (the sine negated going backward). */
static inline ISTH_HD void rope_rotate(float *x1, float *x2, float c, float sn)
{
    const float a = *x1, b = *x2;
    *x1 = a * c - b * sn;
    *x2 = a * sn + b * c;
}

#endif
