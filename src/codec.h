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
 *   topk  SparseLoCo's sparse encoding (codec_topk.c): the n values are
 *         cut into runs of `block` consecutive values (the last may be
 *         short); of each run the topk_k largest in magnitude (ties to
 *         the lower index; a short run sends ceil(k*len/block)) are sent
 *         as their index in the run (the bits len-1 needs) and a
 *         topk_bits code: 2^bits equal bins spanning mean +- 3 sigma of all
 *         values sent in this call, each decoded as the mean of the values
 *         that fell in it (2^bits float32 before the codes). A value not
 *         sent decodes to +0.0; a value sent whose bin value is zero to
 *         -0.0, so a receiver tells them apart (codec_topk_sent). k = 64 of
 *         4,096 at 2 bits: 0.22 bits per value, 146x below float32.
 * Blocks start at the first value; the last block may be short. A block of
 * zeros has scale 0 and decodes to zeros. Encoding never produces NaN/Inf
 * from finite input. Sizes depend on n and the parameters only, so a
 * receiver knows every payload's size before it arrives.
 * Must not: know about fragments, peers or MPI.
 */
#ifndef ISTHMUS_CODEC_H
#define ISTHMUS_CODEC_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { CODEC_NONE, CODEC_BF16, CODEC_INT8, CODEC_FP4, CODEC_TOPK } Codec;
#define CODEC_COUNT 5

/* The parameters of an encoding, the same at both ends of a payload. */
typedef struct {
    int block;     /* int8, fp4: values per scale; topk: values per chunk (>= 1) */
    int topk_k;    /* topk: values sent per full chunk, 1..block */
    int topk_bits; /* topk: bits per sent value, 1..8 (2^bits bins) */
    float decay;   /* error feedback: the residual is multiplied by this before
                    * it is added (SparseLoCo's beta; 1 = plain feedback) */
} CodecParams;

/* Parameters with the given block and the topk defaults (k = block/64,
 * at least 1; 2 bits; decay 1). */
CodecParams codec_params(int block);

/* "none" | "bf16" | "int8" | "fp4" | "topk" -> Codec; -1 if unknown. */
int codec_from_name(const char *name);
const char *codec_name(Codec c);

/* Bytes needed to encode n values. */
size_t codec_encoded_size(Codec c, size_t n, CodecParams p);

/* out: codec_encoded_size bytes. Returns 0, or -1 when out of memory
 * (topk's selection; out is then unspecified). */
int codec_encode(Codec c, const float *x, size_t n, CodecParams p, unsigned char *out);
/* Returns 0, or -1 when `in` is not an encoding of n values (topk: an index
 * outside its chunk or out of order); x is then unspecified. */
int codec_decode(Codec c, const unsigned char *in, size_t n, CodecParams p, float *x);

/* Error feedback: send x + decay*residual, keep what the codec dropped.
 * x (n) is the value to send; residual (n) is updated in place; out gets
 * the encoding and decoded (n) what every receiver will reconstruct.
 * Gives the sum of squared codec error and sum of squares of what was
 * encoded (x + decay*residual). Returns 0, or -1 as codec_encode (the
 * residual is then unchanged). */
int codec_encode_ef(Codec c, const float *x, float *residual, size_t n, CodecParams p,
                     unsigned char *out, float *decoded, double *err2, double *norm2);

/* 64-bit FNV-1a over bytes (a fingerprint, not a MAC: the link's frames
 * are authenticated by seal.h). */
uint64_t checksum64(const void *data, size_t n);

#endif
