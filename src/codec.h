/* codec.h — compression of inter-site payloads.
 *
 * Owns: the wire encodings of float32 vectors (none, bf16, int8, fp4) with a
 * float32 scale per block of `block` values, their sizes, their decoding,
 * and the 64-bit checksum that every payload carries.
 *   none  4 bytes/value, exact
 *   bf16  2 bytes/value, round to nearest even, relative error <= 2^-8
 *   int8  1 byte/value + 4 bytes/block, scale = max|x|/127,
 *         |error| <= scale/2
 *   fp4   4 bits/value (E2M1: 0, .5, 1, 1.5, 2, 3, 4, 6, signed) + 4
 *         bytes/block, scale = max|x|/6, |error| <= scale (half the widest
 *         gap, between 4 and 6)
 * Blocks start at the first value; the last block may be short. A block of
 * zeros has scale 0 and decodes to zeros. Encoding never produces NaN/Inf
 * from finite input.
 * Must not: know about fragments, peers or MPI.
 */
#ifndef ISTHMUS_CODEC_H
#define ISTHMUS_CODEC_H

#include <stddef.h>
#include <stdint.h>

typedef enum { CODEC_NONE, CODEC_BF16, CODEC_INT8, CODEC_FP4 } Codec;

/* "none" | "bf16" | "int8" | "fp4" -> Codec; -1 if unknown. */
int codec_from_name(const char *name);
const char *codec_name(Codec c);

/* Bytes needed to encode n values. */
size_t codec_encoded_size(Codec c, size_t n, int block);

/* out: codec_encoded_size bytes. */
void codec_encode(Codec c, const float *x, size_t n, int block, unsigned char *out);
void codec_decode(Codec c, const unsigned char *in, size_t n, int block, float *x);

/* Error feedback: send x + residual, keep what the codec dropped.
 * x (n) is the value to send; residual (n) is updated in place; out gets
 * the encoding and decoded (n) what every receiver will reconstruct.
 * Returns sum of squared codec error and sum of squares of x+residual. */
void codec_encode_ef(Codec c, const float *x, float *residual, size_t n, int block,
                     unsigned char *out, float *decoded, double *err2, double *norm2);

/* 64-bit FNV-1a over bytes. */
uint64_t checksum64(const void *data, size_t n);

#endif
