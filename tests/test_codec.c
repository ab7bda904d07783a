/* test_codec.c — payload codecs, error feedback, checksums and the
 * fragment schedule of Streaming DiLoCo.
 *
 * Error bounds (see codec.h): bf16 relative 2^-8; int8 absolute
 * max|block|/254; fp4 (E2M1) absolute max|block|/6 (half the widest grid
 * gap, 2 units of scale max/6). Error feedback: after R rounds the sum of
 * what was decoded differs from the sum of what was sent by exactly the
 * final residual, which stays within one round's quantisation error of the
 * values being encoded.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mpi.h>

#include "codec.h"
#include "codec_topk.h"
#include "codec_math.h"
#include "coll.h"
#include "model.h"
#include "outer.h"
#include "payload.h"
#include "shard.h"
#include "rng.h"
#include "topology.h"

static double bound(Codec c, float x, float block_max)
{
    switch (c) {
    case CODEC_NONE: return 0.0;
    case CODEC_BF16: return fabs(x) / 256.0 + FLT_MIN;
    case CODEC_INT8: return block_max / 254.0 * (1 + 1e-6) + FLT_MIN;
    case CODEC_FP4: return block_max / 6.0 * (1 + 1e-6) + FLT_MIN;
    case CODEC_TOPK: break; /* not a bounded-error codec: test_topk_* */
    }
    return 0;
}

static void round_trip(Codec c, const float *x, size_t n, int block)
{
    unsigned char *enc = malloc(codec_encoded_size(c, n, codec_params(block)));
    float *y = malloc(sizeof(float) * n);
    codec_encode(c, x, n, codec_params(block), enc);
    assert_int_equal(codec_decode(c, enc, n, codec_params(block), y), 0);
    for (size_t b0 = 0; b0 < n; b0 += (size_t)block) {
        size_t len = n - b0 < (size_t)block ? n - b0 : (size_t)block;
        float m = 0;
        for (size_t i = 0; i < len; i++) m = fmaxf(m, fabsf(x[b0 + i]));
        for (size_t i = 0; i < len; i++) {
            assert_true(isfinite(y[b0 + i]));
            double err = fabs((double)x[b0 + i] - y[b0 + i]);
            if (err > bound(c, x[b0 + i], m))
                print_error("%s: x=%g decoded %g err %g bound %g\n", codec_name(c), x[b0 + i], y[b0 + i], err,
                            bound(c, x[b0 + i], m));
            assert_true(err <= bound(c, x[b0 + i], m));
        }
    }
    free(enc);
    free(y);
}

static void test_round_trips(void **state)
{
    (void)state;
    enum { N = 1000 };
    float x[N];
    for (int c = CODEC_NONE; c <= CODEC_FP4; c++) {
        for (int i = 0; i < N; i++) x[i] = (float)rng_normal(1, (uint64_t)c, (uint64_t)i);
        round_trip((Codec)c, x, N, 128);
        round_trip((Codec)c, x, N, 7);    /* short last block */
        memset(x, 0, sizeof x);           /* all-zero blocks: scale 0, exact zeros */
        round_trip((Codec)c, x, N, 64);
        for (int i = 0; i < N; i++) x[i] = (float)rng_normal(2, (uint64_t)c, (uint64_t)i) * 1e-3f;
        x[17] = 3e38f;                    /* one huge value in a block */
        round_trip((Codec)c, x, N, 32);
        for (int i = 0; i < N; i++) x[i] = (i % 3 ? 1 : -1) * 1e-41f * (float)(i % 7); /* denormals */
        round_trip((Codec)c, x, N, 16);
    }
    /* none is exact, zeros stay zeros */
    unsigned char enc[4 * 8];
    float z[8] = {0}, d[8];
    codec_encode(CODEC_FP4, z, 8, codec_params(4), enc);
    codec_decode(CODEC_FP4, enc, 8, codec_params(4), d);
    for (int i = 0; i < 8; i++) assert_true(d[i] == 0.0f);
    assert_int_equal(codec_encoded_size(CODEC_FP4, 1000, codec_params(128)), 500 + 8 * 4);
    assert_int_equal(codec_encoded_size(CODEC_INT8, 1000, codec_params(128)), 1000 + 8 * 4);
    assert_int_equal(codec_encoded_size(CODEC_BF16, 1000, codec_params(128)), 2000);
}

/* bf16 rounding (codec_math.h, shared by the codec and the GPU's bf16
 * operands): nearest even, overflow to infinity, and a NaN of any sign or
 * payload stays a NaN (the bias added to its bits would wrap it). */
static void test_bf16_rounding_keeps_nan(void **state)
{
    (void)state;
    const uint32_t nans[] = {0x7fc00000u, 0x7fffffffu, 0xffffffffu, 0x7f800001u, 0xff800001u, 0x7fbfffffu};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        float f;
        memcpy(&f, &nans[i], 4);
        const float back = codec_from_bf16(codec_to_bf16(f));
        if (!isnan(back)) fail_msg("NaN %#010x became %g", nans[i], back);
    }
    assert_true(isinf(codec_from_bf16(codec_to_bf16(INFINITY))) && codec_from_bf16(codec_to_bf16(INFINITY)) > 0);
    assert_true(isinf(codec_from_bf16(codec_to_bf16(-FLT_MAX))) && codec_from_bf16(codec_to_bf16(-FLT_MAX)) < 0);
    assert_int_equal(codec_to_bf16(1.0f), 0x3f80);
    /* ties to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (bf16's step at 1) */
    assert_int_equal(codec_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(codec_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(codec_to_bf16(-0.0f), 0x8000);
}

/* The E2M1 grid itself: a block whose largest magnitude is 6 has scale 1,
 * so every grid value and its negative decodes exactly, and a value
 * halfway between two grid points goes to the lower magnitude. */
static void test_fp4_grid_is_e2m1(void **state)
{
    (void)state;
    const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float x[17], y[17];
    for (int k = 0; k < 8; k++) {
        x[k] = grid[k];
        x[8 + k] = -grid[k];
    }
    x[16] = 5.0f; /* halfway between 4 and 6 */
    unsigned char enc[64];
    assert_true(codec_encoded_size(CODEC_FP4, 17, codec_params(17)) <= sizeof enc);
    codec_encode(CODEC_FP4, x, 17, codec_params(17), enc);
    codec_decode(CODEC_FP4, enc, 17, codec_params(17), y);
    for (int i = 0; i < 16; i++) assert_true(y[i] == x[i]);
    assert_true(y[16] == 4.0f);
}

static void test_error_feedback_tracks_the_sum(void **state)
{
    (void)state;
    enum { N = 256, ROUNDS = 200 };
    for (int c = CODEC_BF16; c <= CODEC_FP4; c++) {
        float x[N], res[N] = {0}, dec[N];
        double sum_in[N] = {0}, sum_out[N] = {0};
        unsigned char *enc = malloc(codec_encoded_size((Codec)c, N, codec_params(32)));
        double max_step_err = 0;
        for (int r = 0; r < ROUNDS; r++) {
            for (int i = 0; i < N; i++) {
                /* a small persistent signal under noise: what error
                 * feedback must not lose */
                x[i] = (float)(0.01 * (i % 5) + rng_normal(3, (uint64_t)r, (uint64_t)i));
                sum_in[i] += x[i];
            }
            double e2, n2;
            codec_encode_ef((Codec)c, x, res, N, codec_params(32), enc, dec, &e2, &n2);
            for (int i = 0; i < N; i++) {
                sum_out[i] += dec[i];
                max_step_err = fmax(max_step_err, fabs(res[i]));
            }
        }
        /* exact identity: sum_in - sum_out = residual (up to float rounding
         * of the additions), and the residual stays within one round's
         * quantisation error of values of size ~5 (N(0,1) inputs, 32 per
         * block): bf16 5/256, int8 5/254, fp4 5/6 */
        const double res_bound[] = {0, 0.03, 0.03, 1.0};
        for (int i = 0; i < N; i++) {
            assert_true(fabs(sum_in[i] - sum_out[i] - res[i]) < 1e-3);
            assert_true(fabs(res[i]) <= res_bound[c]);
        }
        assert_true(max_step_err <= res_bound[c]); /* bounded over all rounds */
        /* without feedback, fp4 loses the small signal: the drift grows */
        if (c == CODEC_FP4) {
            double drift_ef = 0, drift_plain = 0, plain[N] = {0};
            for (int r = 0; r < ROUNDS; r++) {
                for (int i = 0; i < N; i++) x[i] = (float)(0.01 * (i % 5) + rng_normal(3, (uint64_t)r, (uint64_t)i));
                double e2, n2;
                codec_encode_ef((Codec)c, x, NULL, N, codec_params(32), enc, dec, &e2, &n2);
                for (int i = 0; i < N; i++) plain[i] += dec[i];
            }
            for (int i = 0; i < N; i++) {
                drift_ef = fmax(drift_ef, fabs(sum_in[i] - sum_out[i]));
                drift_plain = fmax(drift_plain, fabs(sum_in[i] - plain[i]));
            }
            assert_true(drift_ef < drift_plain);
        }
        free(enc);
    }
}

static void test_checksum_detects_changes(void **state)
{
    (void)state;
    unsigned char a[1000];
    for (int i = 0; i < 1000; i++) a[i] = (unsigned char)(i * 7);
    uint64_t h = checksum64(a, sizeof a);
    for (int i = 0; i < 1000; i += 37) {
        a[i] ^= 1;
        assert_true(checksum64(a, sizeof a) != h);
        a[i] ^= 1;
    }
    assert_true(checksum64(a, 999) != h);
}

/* Streaming schedule: each fragment exactly once per H steps, offsets
 * spread over H, and no two fragments share a start step. */
static void test_streaming_schedule(void **state)
{
    (void)state;
    const int cases[][2] = {{8, 2}, {100, 4}, {50, 3}, {10, 10}, {7, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const int H = cases[k][0], P = cases[k][1];
        int first[64];
        for (int p = 0; p < P; p++) {
            first[p] = -1;
            int count = 0;
            for (long t = 1; t <= 3L * H; t++)
                if (outer_fragment_due(t, p, H, P)) {
                    if (first[p] < 0) first[p] = (int)t;
                    count++;
                }
            assert_int_equal(count, 3); /* once per H steps */
        }
        for (long t = 1; t <= 3L * H; t++) {
            int due = 0;
            for (int p = 0; p < P; p++) due += outer_fragment_due(t, p, H, P);
            assert_true(due <= 1); /* staggered */
        }
        for (int p = 1; p < P; p++) assert_int_equal(first[p], p * H / P);
    }
}

/* Every parameter of the local buffer is in exactly one fragment, and
 * layers are strided over fragments. */
static void test_fragments_partition_the_model(void **state)
{
    (void)state;
    Config cfg;
    const char *over[] = {"model.layers=5", "outer.mode=streaming", "outer.fragments=3"};
    assert_int_equal(config_load_text(&cfg, "", "t", over, 3), 0);
    Topology topo;
    assert_int_equal(topology_create(&topo, &cfg, MPI_COMM_SELF), 0);
    Model m;
    assert_int_equal(model_create(&m, &cfg.model, 0, cfg.model.experts), 0);
    PayloadCodec pc;
    payload_codec_init(&pc, CODEC_NONE, codec_params(128), 0, 0);
    Shard s;
    assert_int_equal(shard_create(&s, &topo, &m, 3, &pc), 0);
    unsigned char *seen = calloc(m.n_params, 1);
    size_t total = 0;
    for (int f = 0; f < 3; f++) {
        const size_t *off, *len;
        int n;
        shard_fragment_runs(&s, f, &off, &len, &n);
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < len[i]; j++) {
                assert_int_equal(seen[off[i] + j], 0);
                seen[off[i] + j] = (unsigned char)(f + 1);
                total++;
            }
    }
    assert_int_equal(total, shard_canonical_params(&s));
    /* every element of every tensor is covered (padding excluded) */
    for (int t = 0; t < N_TENSORS; t++)
        for (size_t j = 0; j < m.tensors[t].numel; j++) assert_true(seen[m.tensors[t].offset + j] != 0);
    /* layer l of wq is in fragment l mod 3 */
    const size_t per = m.tensors[T_WQ].numel / 5;
    for (int l = 0; l < 5; l++) assert_int_equal(seen[m.tensors[T_WQ].offset + l * per], l % 3 + 1);
    free(seen);
    shard_destroy(&s, 0);
    model_destroy(&m);
    topology_destroy(&topo);
}

/* ---- topk (SparseLoCo) against a direct reference ----
 * The reference selects by sorting every index of a chunk by (magnitude
 * descending, index ascending) with qsort, bins with the formula of
 * codec.h in double, and packs the stream one bit per char: none of it is
 * the codec's heap, bit writer or code path. */

static const float *ref_x;
static int ref_by_magnitude(const void *a, const void *b)
{
    const size_t i = *(const size_t *)a, j = *(const size_t *)b;
    const float mi = fabsf(ref_x[i]), mj = fabsf(ref_x[j]);
    if (mi != mj) return mi > mj ? -1 : 1;
    return (i > j) - (i < j);
}
static int ref_ascending(const void *a, const void *b)
{
    const size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return (i > j) - (i < j);
}

/* Encodes x (n values) the reference way; returns the encoded size and
 * fills ref (bytes) and dec (decoded values). */
static size_t topk_reference(const float *x, size_t n, CodecParams p, unsigned char *ref, float *dec)
{
    const size_t B = (size_t)p.block, bins = (size_t)1 << p.topk_bits;
    size_t *idx = malloc(sizeof(size_t) * n), *sel = malloc(sizeof(size_t) * n);
    size_t m = 0;
    for (size_t c0 = 0; c0 < n; c0 += B) {
        const size_t len = n - c0 < B ? n - c0 : B;
        size_t k = len == B ? (size_t)p.topk_k : ((size_t)p.topk_k * len + B - 1) / B;
        if (k < 1) k = 1;
        if (k > len) k = len;
        for (size_t i = 0; i < len; i++) idx[i] = c0 + i;
        ref_x = x;
        qsort(idx, len, sizeof *idx, ref_by_magnitude);
        qsort(idx, k, sizeof *idx, ref_ascending);
        for (size_t i = 0; i < k; i++) sel[m++] = idx[i];
    }
    double mean = 0, var = 0;
    for (size_t i = 0; i < m; i++) mean += x[sel[i]];
    mean /= (double)m;
    for (size_t i = 0; i < m; i++) var += (x[sel[i]] - mean) * (x[sel[i]] - mean);
    const double sigma = sqrt(var / (double)m), lo = mean - 3 * sigma, width = 6 * sigma / (double)bins;
    unsigned *code = malloc(sizeof(unsigned) * (m + 1));
    double sum[256] = {0};
    size_t count[256] = {0};
    for (size_t i = 0; i < m; i++) {
        double b = width > 0 ? floor((x[sel[i]] - lo) / width) : 0;
        if (b < 0) b = 0;
        if (b > (double)(bins - 1)) b = (double)(bins - 1);
        code[i] = (unsigned)b;
        sum[code[i]] += x[sel[i]];
        count[code[i]]++;
    }
    float mean_of[256];
    for (size_t b = 0; b < bins; b++) {
        mean_of[b] = (float)(count[b] ? sum[b] / (double)count[b] : lo + (b + 0.5) * width);
        if (mean_of[b] == 0.0f) mean_of[b] = -0.0f; /* sent is never +0.0 (codec.h) */
    }
    memcpy(ref, mean_of, 4 * bins);
    /* the stream as one char per bit, then packed */
    char *bits = calloc(64 * n + 64, 1);
    size_t nb = 0;
    for (size_t i = 0; i < m; i++) {
        const size_t c0 = sel[i] / B * B, len = n - c0 < B ? n - c0 : B;
        unsigned ib = 0;
        while (((size_t)1 << ib) < len) ib++;
        for (unsigned j = 0; j < ib; j++) bits[nb++] = (char)(((sel[i] - c0) >> j) & 1);
        for (int j = 0; j < p.topk_bits; j++) bits[nb++] = (char)((code[i] >> j) & 1);
    }
    const size_t size = 4 * bins + (nb + 7) / 8;
    memset(ref + 4 * bins, 0, (nb + 7) / 8);
    for (size_t j = 0; j < nb; j++)
        if (bits[j]) ref[4 * bins + j / 8] |= (unsigned char)(1u << (j % 8));
    memset(dec, 0, sizeof(float) * n);
    for (size_t i = 0; i < m; i++) dec[sel[i]] = mean_of[code[i]];
    free(idx), free(sel), free(code), free(bits);
    return size;
}

static void topk_case(const float *x, size_t n, CodecParams p)
{
    const size_t size = codec_encoded_size(CODEC_TOPK, n, p);
    unsigned char *enc = malloc(size + 1), *ref = malloc(4 * 256 + 8 * n + 8);
    float *dec = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    assert_int_equal(topk_reference(x, n, p, ref, want), size);
    assert_int_equal(codec_encode(CODEC_TOPK, x, n, p, enc), 0);
    if (memcmp(enc, ref, size)) {
        size_t j = 0;
        while (enc[j] == ref[j]) j++;
        print_error("topk n=%zu block=%d k=%d bits=%d: byte %zu of %zu differs\n", n, p.block, p.topk_k, p.topk_bits,
                    j, size);
    }
    assert_memory_equal(enc, ref, size);
    assert_int_equal(codec_decode(CODEC_TOPK, enc, n, p, dec), 0);
    assert_memory_equal(dec, want, sizeof(float) * n);
    free(enc), free(ref), free(dec), free(want);
}

static void test_topk_matches_the_reference(void **state)
{
    (void)state;
    enum { N = 3 * 4096 + 1000 };
    float *x = malloc(sizeof(float) * N);
    for (size_t i = 0; i < N; i++) x[i] = (float)rng_normal(11, 0, i);
    const CodecParams cases[] = {
        {4096, 64, 2, 1.0f}, /* SparseLoCo's: 64 of 4,096 at 2 bits, a short last chunk */
        {4096, 64, 3, 1.0f}, {256, 4, 2, 1.0f}, {100, 7, 1, 1.0f}, {64, 64, 8, 1.0f}, /* every value sent */
        {5, 1, 2, 1.0f},
    };
    const size_t lengths[] = {N, 4096, 1, 2, 63, 4097};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) topk_case(x, lengths[l], cases[c]);
    /* ties: equal magnitudes go to the lower index, whatever the sign */
    for (size_t i = 0; i < N; i++) x[i] = (i % 3 ? 0.5f : -0.5f);
    topk_case(x, N, cases[0]);
    float dec[4096];
    unsigned char enc[4096];
    codec_encode(CODEC_TOPK, x, 4096, cases[0], enc);
    assert_int_equal(codec_decode(CODEC_TOPK, enc, 4096, cases[0], dec), 0);
    for (size_t i = 0; i < 4096; i++) assert_true(codec_topk_sent(dec[i]) == (i < 64));
    /* all zeros: sigma 0, zeros decoded, yet the values sent are told from
     * those not sent (-0.0 against +0.0); and a single spike among zeros */
    memset(x, 0, sizeof(float) * N);
    topk_case(x, N, cases[0]);
    codec_encode(CODEC_TOPK, x, 4096, cases[0], enc);
    assert_int_equal(codec_decode(CODEC_TOPK, enc, 4096, cases[0], dec), 0);
    for (size_t i = 0; i < 4096; i++) assert_true(dec[i] == 0.0f && codec_topk_sent(dec[i]) == (i < 64));
    x[4096 + 17] = 3.0f;
    topk_case(x, N, cases[0]);
    /* the size: 64 of 4,096 at 2 bits is 14 bits per value sent, 0.22 bits per value */
    assert_int_equal(codec_encoded_size(CODEC_TOPK, 16 * 4096, cases[0]), 16 + 16 * 64 * 14 / 8);
    assert_int_equal(codec_encoded_size(CODEC_TOPK, 0, cases[0]), 0);
    free(x);
}

/* Error feedback keeps exactly what was not sent: an index the payload
 * does not carry keeps x + decay*residual in the residual bit for bit, a
 * sent one the difference to its bin's value; with decay 1, what was sent
 * over many rounds plus the final residual is what went in. */
static void test_topk_error_feedback_conserves(void **state)
{
    (void)state;
    enum { N = 4096 + 300, ROUNDS = 60 };
    const float decays[] = {1.0f, 0.95f};
    for (int d = 0; d < 2; d++) {
        CodecParams p = {1024, 16, 2, decays[d]};
        float *x = malloc(sizeof(float) * N), *res = calloc(N, sizeof(float)), *dec = malloc(sizeof(float) * N);
        float *before = malloc(sizeof(float) * N);
        double *in = calloc(N, sizeof(double)), *out = calloc(N, sizeof(double));
        unsigned char *enc = malloc(codec_encoded_size(CODEC_TOPK, N, p));
        for (int r = 0; r < ROUNDS; r++) {
            for (size_t i = 0; i < N; i++) {
                x[i] = (float)(0.01 * (i % 5) + rng_normal(5, (uint64_t)r, i));
                in[i] += x[i];
                before[i] = x[i] + p.decay * res[i];
            }
            double e2, n2;
            assert_int_equal(codec_encode_ef(CODEC_TOPK, x, res, N, p, enc, dec, &e2, &n2), 0);
            size_t sent = 0;
            double ee = 0;
            for (size_t i = 0; i < N; i++) {
                out[i] += dec[i];
                if (!codec_topk_sent(dec[i])) assert_true(res[i] == before[i]); /* not sent: kept whole */
                else assert_true(res[i] == before[i] - dec[i]), sent++;
                ee += (double)res[i] * res[i];
            }
            assert_int_equal(sent, 4 * 16 + 5); /* 4 full chunks of 16, a short one of 300: ceil(16*300/1024) */
            assert_true(fabs(e2 - ee) <= 1e-9 * ee);
        }
        if (decays[d] == 1.0f)
            for (size_t i = 0; i < N; i++) assert_true(fabs(in[i] - out[i] - res[i]) < 1e-3 * (1 + fabs(in[i])));
        free(x), free(res), free(dec), free(before), free(in), free(out), free(enc);
    }
}

/* A payload whose indices leave their chunk or repeat is refused by the
 * decoder (the link's seal refuses any change on the way; this is what a
 * sender holding the key could still get wrong). */
static void test_topk_malformed_is_refused(void **state)
{
    (void)state;
    const CodecParams p = {100, 3, 2, 1.0f};
    float x[150], y[150];
    for (int i = 0; i < 150; i++) x[i] = (float)rng_normal(7, 0, (uint64_t)i);
    const size_t size = codec_encoded_size(CODEC_TOPK, 150, p);
    unsigned char enc[64], bad[64];
    assert_true(size <= sizeof enc);
    codec_encode(CODEC_TOPK, x, 150, p, enc);
    assert_int_equal(codec_decode(CODEC_TOPK, enc, 150, p, y), 0);
    /* the first entry's index (7 bits) set to 127: beyond a chunk of 100 */
    memcpy(bad, enc, size);
    bad[16] |= 0x7f;
    assert_int_equal(codec_decode(CODEC_TOPK, bad, 150, p, y), -1);
    /* the second entry's index equal to the first's: a repeat */
    memcpy(bad, enc, size);
    unsigned first = enc[16] & 0x7f;
    uint64_t bits = 0;
    memcpy(&bits, bad + 16, 4);
    bits = (bits & ~((uint64_t)0x7f << 9)) | ((uint64_t)first << 9);
    memcpy(bad + 16, &bits, 4);
    assert_int_equal(codec_decode(CODEC_TOPK, bad, 150, p, y), -1);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_fp4_grid_is_e2m1),
        cmocka_unit_test(test_bf16_rounding_keeps_nan),
        cmocka_unit_test(test_topk_matches_the_reference),
        cmocka_unit_test(test_topk_error_feedback_conserves),
        cmocka_unit_test(test_topk_malformed_is_refused),
        cmocka_unit_test(test_error_feedback_tracks_the_sum),
        cmocka_unit_test(test_checksum_detects_changes),
        cmocka_unit_test(test_streaming_schedule),
        cmocka_unit_test(test_fragments_partition_the_model),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
