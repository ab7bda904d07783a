/* codec.c — see codec.h. */
#include "codec.h"
#include "codec_math.h"
#include "codec_topk.h"

#include <math.h>
#include <string.h>

static const char *const codec_names[CODEC_COUNT] = {"none", "bf16", "int8", "fp4", "topk"};

CodecParams codec_params(int block)
{
    return (CodecParams){block, block / 64 > 1 ? block / 64 : 1, 2, 1.0f};
}

int codec_from_name(const char *name)
{
    for (int i = 0; i < CODEC_COUNT; i++)
        if (!strcmp(name, codec_names[i])) return i;
    return -1;
}

const char *codec_name(Codec c) { return codec_names[c]; }

static TopkShape topk_shape(CodecParams p) { return (TopkShape){p.block, p.topk_k, p.topk_bits}; }

size_t codec_encoded_size(Codec c, size_t n, CodecParams p)
{
    const size_t blocks = (n + (size_t)p.block - 1) / (size_t)p.block;
    switch (c) {
    case CODEC_NONE: return 4 * n;
    case CODEC_BF16: return 2 * n;
    case CODEC_INT8: return n + 4 * blocks;
    case CODEC_FP4: return (n + 1) / 2 + 4 * blocks;
    case CODEC_TOPK: return codec_topk_size(n, topk_shape(p));
    }
    return 0;
}

static float block_absmax(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

int codec_encode(Codec c, const float *x, size_t n, CodecParams p, unsigned char *out)
{
    const size_t B = (size_t)p.block;
    switch (c) {
    case CODEC_TOPK: return codec_topk_encode(x, n, topk_shape(p), out);
    case CODEC_NONE: memcpy(out, x, 4 * n); return 0;
    case CODEC_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = codec_to_bf16(x[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return 0;
    case CODEC_INT8: {
        unsigned char *q = out;
        unsigned char *scales = out + n;
        for (size_t b0 = 0, bi = 0; b0 < n; b0 += B, bi++) {
            size_t len = n - b0 < B ? n - b0 : B;
            float scale = codec_div(block_absmax(x + b0, len), CODEC_INT8_MAX);
            memcpy(scales + 4 * bi, &scale, 4);
            for (size_t i = 0; i < len; i++) {
                q[b0 + i] = (unsigned char)codec_int8_code(scale > 0 ? codec_div(x[b0 + i], scale) : 0.0f);
            }
        }
        return 0;
    }
    case CODEC_FP4: {
        const size_t codes = (n + 1) / 2;
        memset(out, 0, codes);
        unsigned char *scales = out + codes;
        for (size_t b0 = 0, bi = 0; b0 < n; b0 += B, bi++) {
            size_t len = n - b0 < B ? n - b0 : B;
            float scale = codec_div(block_absmax(x + b0, len), CODEC_FP4_MAX);
            memcpy(scales + 4 * bi, &scale, 4);
            for (size_t i = 0; i < len; i++) {
                size_t j = b0 + i;
                unsigned code = scale > 0 ? codec_fp4_code(codec_div(x[j], scale)) : 0u;
                out[j / 2] |= (unsigned char)(code << (4 * (j & 1)));
            }
        }
        return 0;
    }
    }
    return -1;
}

int codec_decode(Codec c, const unsigned char *in, size_t n, CodecParams p, float *x)
{
    const size_t B = (size_t)p.block;
    switch (c) {
    case CODEC_TOPK: return codec_topk_decode(in, n, topk_shape(p), x);
    case CODEC_NONE: memcpy(x, in, 4 * n); return 0;
    case CODEC_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, in + 2 * i, 2);
            x[i] = codec_from_bf16(h);
        }
        return 0;
    case CODEC_INT8: {
        const unsigned char *scales = in + n;
        for (size_t b0 = 0, bi = 0; b0 < n; b0 += B, bi++) {
            size_t len = n - b0 < B ? n - b0 : B;
            float scale;
            memcpy(&scale, scales + 4 * bi, 4);
            for (size_t i = 0; i < len; i++) x[b0 + i] = codec_int8_value((int8_t)in[b0 + i], scale);
        }
        return 0;
    }
    case CODEC_FP4: {
        const size_t codes = (n + 1) / 2;
        const unsigned char *scales = in + codes;
        for (size_t b0 = 0, bi = 0; b0 < n; b0 += B, bi++) {
            size_t len = n - b0 < B ? n - b0 : B;
            float scale;
            memcpy(&scale, scales + 4 * bi, 4);
            for (size_t i = 0; i < len; i++) {
                size_t j = b0 + i;
                unsigned code = (in[j / 2] >> (4 * (j & 1))) & 15u;
                x[j] = codec_fp4_value(code, scale);
            }
        }
        return 0;
    }
    }
    return -1;
}

int codec_encode_ef(Codec c, const float *x, float *residual, size_t n, CodecParams p,
                    unsigned char *out, float *decoded, double *err2, double *norm2)
{
    *err2 = *norm2 = 0.0;
    /* decoded doubles as the buffer for x + decay*residual (a decay of 1
     * multiplies exactly: plain feedback's bits are unchanged) */
    for (size_t i = 0; i < n; i++) decoded[i] = x[i] + (residual ? p.decay * residual[i] : 0.0f);
    double nn = 0.0;
    for (size_t i = 0; i < n; i++) nn += (double)decoded[i] * decoded[i];
    if (codec_encode(c, decoded, n, p, out)) return -1;
    double ee = 0.0;
    if (residual) {
        for (size_t i = 0; i < n; i++) residual[i] = decoded[i];
        (void)codec_decode(c, out, n, p, decoded); /* our own encoding: well formed */
        for (size_t i = 0; i < n; i++) {
            float r = residual[i] - decoded[i];
            residual[i] = r;
            ee += (double)r * r;
        }
    } else { /* without feedback the dropped part is only measured */
        (void)codec_decode(c, out, n, p, decoded);
        for (size_t i = 0; i < n; i++) {
            double r = (double)x[i] - decoded[i];
            ee += r * r;
        }
    }
    *err2 = ee;
    *norm2 = nn;
    return 0;
}

uint64_t checksum64(const void *data, size_t n)
{
    /* FNV-1a over 8-byte words, then the tail bytes */
    const unsigned char *p = data;
    uint64_t h = 14695981039346656037ull ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
