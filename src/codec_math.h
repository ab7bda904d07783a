/* codec_math.h — the per-value arithmetic of the codecs, written once for
 * the host (codec.c) and the GPU (cuda/codec.cu): __host__ __device__
 * under nvcc. Every step is one IEEE operation (a division, a product, a
 * comparison) that both compile alike, so a payload encoded on a GPU is
 * byte for byte the one the host would encode, and a receiver cannot tell
 * which encoded it.
 *
 * Owns: bf16 rounding, the int8 and fp4 (E2M1) codes of one value already
 * divided by its block's scale, and their decoded values.
 * Must not: loop over blocks or know the wire layout (codec.c and
 * cuda/codec.cu do).
 */
#ifndef ISTHMUS_CODEC_MATH_H
#define ISTHMUS_CODEC_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define CODEC_HD __host__ __device__
#else
#define CODEC_HD
#include <math.h>
#include <string.h>
#endif

static inline CODEC_HD uint32_t codec_float_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

static inline CODEC_HD float codec_bits_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* A product, a quotient, a sum and a difference rounded on their own: on
 * the device never fused into a multiply-add, so the decoded values and the
 * residuals are the host's. */
#ifdef __CUDA_ARCH__
#define CODEC_ROUNDED(name, op, intrinsic) \
    static inline CODEC_HD float name(float a, float b) { return intrinsic(a, b); }
#else
#define CODEC_ROUNDED(name, op, intrinsic) \
    static inline CODEC_HD float name(float a, float b) { return a op b; }
#endif
CODEC_ROUNDED(codec_mul, *, __fmul_rn)
CODEC_ROUNDED(codec_div, /, __fdiv_rn)
CODEC_ROUNDED(codec_add, +, __fadd_rn)
CODEC_ROUNDED(codec_sub, -, __fsub_rn)
#undef CODEC_ROUNDED

/* bf16 of a float, rounded to nearest even on the dropped 16 bits (a
 * finite value past bf16's largest rounds to infinity). A NaN stays a NaN
 * (quieted): adding the rounding bias to its bits would wrap it into a
 * zero or an infinity, and a diverged value must not turn into a finite
 * one on its way into a payload or a product. */
static inline CODEC_HD uint16_t codec_to_bf16(float f)
{
    uint32_t u = codec_float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline CODEC_HD float codec_from_bf16(uint16_t h) { return codec_bits_float((uint32_t)h << 16); }

/* Scales: the block's largest magnitude over the largest code. */
#define CODEC_INT8_MAX 127.0f
#define CODEC_FP4_MAX 6.0f

/* int8 code of v = x/scale (|v| <= 127 up to rounding): nearest, ties to even. */
static inline CODEC_HD int8_t codec_int8_code(float v)
{
    long r = lrintf(v);
    if (r > 127) r = 127;
    if (r < -127) r = -127;
    return (int8_t)r;
}

/* E2M1 magnitude of a 3-bit code. */
static inline CODEC_HD float codec_fp4_magnitude(unsigned k)
{
    /* 0, .5, 1, 1.5 then 2, 3, 4, 6: exact in binary, computed rather than
     * tabled so the device needs no constant memory */
    return k < 4 ? 0.5f * (float)k : (float)(2u << ((k - 4) >> 1)) * ((k & 1u) ? 1.5f : 1.0f);
}

/* 4-bit code of v = x/scale in [-6, 6]: the nearest magnitude (ties to the
 * lower), sign in bit 3 (never on zero). Up to |v| = 8 — every value
 * codec_encode divides by its block's scale — the midpoints between
 * neighbouring magnitudes decide: |v| above k of them is code k. That is
 * the comparison of distances below it, value for value (checked over all
 * 2^32 floats: they first differ at 3.4e7, where a - 4 and a - 6 round to
 * the same float); beyond 8 (and for NaN) the distances are compared. */
static inline CODEC_HD unsigned codec_fp4_code(float v)
{
    const float a = fabsf(v);
    unsigned best = 0;
    if (a <= 8.0f) {
        best = (unsigned)(a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f);
    } else {
        for (unsigned k = 1; k < 8; k++)
            if (fabsf(a - codec_fp4_magnitude(k)) < fabsf(a - codec_fp4_magnitude(best))) best = k;
    }
    return best | (v < 0 && best ? 8u : 0u);
}

static inline CODEC_HD float codec_int8_value(int8_t q, float scale) { return codec_mul(scale, (float)q); }

static inline CODEC_HD float codec_fp4_value(unsigned code, float scale)
{
    const float v = codec_fp4_magnitude(code & 7u);
    return codec_mul(scale, (code & 8u) ? -v : v);
}

#endif
