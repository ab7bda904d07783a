/* codec_topk.h — the topk codec (SparseLoCo's sparse payloads, codec.h's
 * `topk`), which codec_encode and codec_decode dispatch to; its wire
 * layout is described in codec_topk.c.
 * Owns: the selection of each chunk's largest values, the bins and the
 * bit packing; telling a sent value from one not sent after decoding.
 * Must not: know fragments, peers or MPI (as codec.h), or codec.h itself
 * (codec.c dispatches here: its parameters arrive as a TopkShape).
 */
#ifndef ISTHMUS_CODEC_TOPK_H
#define ISTHMUS_CODEC_TOPK_H

#include <math.h>
#include <stddef.h>

/* codec.h's CodecParams as topk reads them. */
typedef struct {
    int chunk; /* values per chunk (>= 1): codec_block */
    int k;     /* values sent per full chunk, 1..chunk */
    int bits;  /* bits per sent value, 1..8 (2^bits bins) */
} TopkShape;

/* Values sent in a chunk of len values of shape p. */
size_t codec_topk_count(size_t len, TopkShape p);
/* Encoded bytes of n values. */
size_t codec_topk_size(size_t n, TopkShape p);
int codec_topk_encode(const float *x, size_t n, TopkShape p, unsigned char *out);
int codec_topk_decode(const unsigned char *in, size_t n, TopkShape p, float *x);
/* Did a topk payload carry this decoded value? A value sent decodes to its
 * bin's value (-0.0 when that is zero), one not sent to +0.0. */
static inline int codec_topk_sent(float v) { return v != 0.0f || signbit(v); }

#endif
