/* codec_topk.c — see codec_topk.h: SparseLoCo's sparse payload encoding.
 *
 * Wire layout of n values under p (block B, k per chunk, b bits):
 *   2^b float32       the decoded value of each bin
 *   bit stream        for every chunk in order, its sent values in
 *                     ascending index order: the index in the chunk
 *                     (index_bits(len) bits) then the bin (b bits), packed
 *                     least significant bit first, the last byte padded
 *                     with zeros
 * The bins: 2^b equal bins over mean +- 3 sigma of every value sent in
 * the call (values beyond fall into the outer bins); each decodes as the
 * mean of its members (computed in double, in index order: deterministic),
 * an empty bin as its centre. With sigma 0 every value is in bin 0, whose
 * mean is then the common value.
 * Owns: the selection, the bins and the packing; nothing else.
 */
#include "codec_topk.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOPK_SPAN_SIGMAS 6.0 /* the bins span mean +- 3 sigma */

/* Bits to write an index in 0..len-1. */
static unsigned index_bits(size_t len)
{
    unsigned b = 0;
    while (len > 1 && ((size_t)1 << b) < len) b++;
    return b;
}

size_t codec_topk_count(size_t len, TopkShape p)
{
    const size_t B = (size_t)p.chunk, k = (size_t)p.k;
    if (len == 0) return 0;
    if (len >= B) return k < len ? k : len;
    const size_t c = (k * len + B - 1) / B; /* a short chunk keeps the density */
    return c < 1 ? 1 : c > len ? len : c;
}

static size_t header_bytes(TopkShape p) { return sizeof(float) * ((size_t)1 << p.bits); }

static uint64_t stream_bits(size_t n, TopkShape p)
{
    const size_t B = (size_t)p.chunk, full = n / B, tail = n % B;
    const unsigned vb = (unsigned)p.bits;
    uint64_t bits = (uint64_t)full * codec_topk_count(B, p) * (index_bits(B) + vb);
    if (tail) bits += (uint64_t)codec_topk_count(tail, p) * (index_bits(tail) + vb);
    return bits;
}

size_t codec_topk_size(size_t n, TopkShape p)
{
    return n ? header_bytes(p) + (size_t)((stream_bits(n, p) + 7) / 8) : 0;
}

/* The selection order: larger magnitude first, then the lower index; NaN
 * counts as the largest (it is sent, and the receiver rejects it). */
static float magnitude(float v) { return isnan(v) ? INFINITY : fabsf(v); }

static int worse(const float *x, uint32_t a, uint32_t b) /* is a selected after b? */
{
    const float ma = magnitude(x[a]), mb = magnitude(x[b]);
    return ma < mb || (ma == mb && a > b);
}

/* heap[0..k) is a heap with the worst selected index at the root */
static void sift_down(const float *x, uint32_t *heap, size_t k, size_t i)
{
    for (;;) {
        size_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < k && worse(x, heap[l], heap[w])) w = l;
        if (r < k && worse(x, heap[r], heap[w])) w = r;
        if (w == i) return;
        const uint32_t t = heap[i];
        heap[i] = heap[w];
        heap[w] = t;
        i = w;
    }
}

static int ascending(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The k best indices of x[0..len) in ascending order, into sel. */
static void select_top(const float *x, size_t len, size_t k, uint32_t *sel)
{
    for (size_t i = 0; i < k; i++) sel[i] = (uint32_t)i;
    for (size_t i = k / 2; i-- > 0;) sift_down(x, sel, k, i);
    for (size_t i = k; i < len; i++)
        if (worse(x, sel[0], (uint32_t)i)) {
            sel[0] = (uint32_t)i;
            sift_down(x, sel, k, 0);
        }
    qsort(sel, k, sizeof *sel, ascending);
}

typedef struct {
    unsigned char *p;
    uint64_t bit;
} BitWriter;

static void put_bits(BitWriter *w, uint32_t v, unsigned bits)
{
    for (unsigned i = 0; i < bits; i++, w->bit++)
        if ((v >> i) & 1u) w->p[w->bit >> 3] |= (unsigned char)(1u << (w->bit & 7));
}

static uint32_t get_bits(const unsigned char *p, uint64_t *bit, unsigned bits)
{
    uint32_t v = 0;
    for (unsigned i = 0; i < bits; i++, (*bit)++) v |= (uint32_t)((p[*bit >> 3] >> (*bit & 7)) & 1u) << i;
    return v;
}

/* The bin of v: 2^bits bins of `width` from `lo`. */
static unsigned bin_of(double v, double lo, double width, unsigned bins)
{
    if (!(width > 0)) return 0;
    const double b = floor((v - lo) / width);
    return b < 0 ? 0u : b >= (double)bins ? bins - 1 : (unsigned)b;
}

int codec_topk_encode(const float *x, size_t n, TopkShape p, unsigned char *out)
{
    if (!n) return 0;
    const size_t B = (size_t)p.chunk, total = codec_topk_size(n, p);
    const unsigned bins = 1u << p.bits;
    memset(out, 0, total);
    /* the indices sent, chunk by chunk (absolute), and their statistics */
    const size_t sent = n / B * codec_topk_count(B, p) + codec_topk_count(n % B, p);
    uint32_t *sel = malloc(sizeof(uint32_t) * (sent + 1));
    size_t *at = malloc(sizeof(size_t) * (sent + 1));
    unsigned char *code = malloc(sent + 1);
    if (!sel || !at || !code) {
        free(sel), free(at), free(code);
        return -1;
    }
    size_t m = 0;
    double sum = 0.0;
    for (size_t c0 = 0; c0 < n; c0 += B) {
        const size_t len = n - c0 < B ? n - c0 : B, k = codec_topk_count(len, p);
        select_top(x + c0, len, k, sel + m);
        for (size_t i = 0; i < k; i++) {
            at[m + i] = c0;
            sum += x[c0 + sel[m + i]];
        }
        m += k;
    }
    const double mean = sum / (double)sent;
    double var = 0.0;
    for (size_t i = 0; i < sent; i++) {
        const double d = x[at[i] + sel[i]] - mean;
        var += d * d;
    }
    const double sigma = sqrt(var / (double)sent), width = TOPK_SPAN_SIGMAS * sigma / bins,
                 lo = mean - 0.5 * TOPK_SPAN_SIGMAS * sigma;
    double bsum[256] = {0};
    size_t bcount[256] = {0};
    for (size_t i = 0; i < sent; i++) {
        const double v = x[at[i] + sel[i]];
        code[i] = (unsigned char)bin_of(v, lo, width, bins);
        bsum[code[i]] += v;
        bcount[code[i]]++;
    }
    for (unsigned b = 0; b < bins; b++) {
        float v = (float)(bcount[b] ? bsum[b] / (double)bcount[b] : lo + (b + 0.5) * width);
        if (v == 0.0f) v = -0.0f; /* a value sent is never +0.0: that is "not sent" (codec_topk.h) */
        memcpy(out + 4 * b, &v, 4);
    }
    BitWriter w = {out + header_bytes(p), 0};
    m = 0;
    for (size_t c0 = 0; c0 < n; c0 += B) {
        const size_t len = n - c0 < B ? n - c0 : B, k = codec_topk_count(len, p);
        const unsigned ib = index_bits(len);
        for (size_t i = 0; i < k; i++, m++) {
            put_bits(&w, sel[m], ib);
            put_bits(&w, code[m], (unsigned)p.bits);
        }
    }
    free(sel);
    free(at);
    free(code);
    return 0;
}

int codec_topk_decode(const unsigned char *in, size_t n, TopkShape p, float *x)
{
    if (!n) return 0;
    const size_t B = (size_t)p.chunk;
    float bin[256];
    memcpy(bin, in, header_bytes(p));
    const unsigned char *s = in + header_bytes(p);
    uint64_t bit = 0;
    memset(x, 0, sizeof(float) * n);
    for (size_t c0 = 0; c0 < n; c0 += B) {
        const size_t len = n - c0 < B ? n - c0 : B, k = codec_topk_count(len, p);
        const unsigned ib = index_bits(len);
        size_t next = 0; /* the lowest index the next entry may have */
        for (size_t i = 0; i < k; i++) {
            const size_t idx = get_bits(s, &bit, ib);
            const unsigned b = get_bits(s, &bit, (unsigned)p.bits);
            if (idx < next || idx >= len) return -1; /* out of its chunk, repeated or out of order */
            x[c0 + idx] = bin[b] == 0.0f ? -0.0f : bin[b]; /* whatever the wire says: sent is never +0.0 */
            next = idx + 1;
        }
    }
    return 0;
}
