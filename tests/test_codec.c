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
#include "coll.h"
#include "model.h"
#include "outer.h"
#include "reduce.h"
#include "rng.h"
#include "topology.h"

static double bound(Codec c, float x, float block_max)
{
    switch (c) {
    case CODEC_NONE: return 0.0;
    case CODEC_BF16: return fabs(x) / 256.0 + FLT_MIN;
    case CODEC_INT8: return block_max / 254.0 * (1 + 1e-6) + FLT_MIN;
    case CODEC_FP4: return block_max / 6.0 * (1 + 1e-6) + FLT_MIN;
    }
    return 0;
}

static void round_trip(Codec c, const float *x, size_t n, int block)
{
    unsigned char *enc = malloc(codec_encoded_size(c, n, block));
    float *y = malloc(sizeof(float) * n);
    codec_encode(c, x, n, block, enc);
    codec_decode(c, enc, n, block, y);
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
    codec_encode(CODEC_FP4, z, 8, 4, enc);
    codec_decode(CODEC_FP4, enc, 8, 4, d);
    for (int i = 0; i < 8; i++) assert_true(d[i] == 0.0f);
    assert_int_equal(codec_encoded_size(CODEC_FP4, 1000, 128), 500 + 8 * 4);
    assert_int_equal(codec_encoded_size(CODEC_INT8, 1000, 128), 1000 + 8 * 4);
    assert_int_equal(codec_encoded_size(CODEC_BF16, 1000, 128), 2000);
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
    assert_true(codec_encoded_size(CODEC_FP4, 17, 17) <= sizeof enc);
    codec_encode(CODEC_FP4, x, 17, 17, enc);
    codec_decode(CODEC_FP4, enc, 17, 17, y);
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
        unsigned char *enc = malloc(codec_encoded_size((Codec)c, N, 32));
        double max_step_err = 0;
        for (int r = 0; r < ROUNDS; r++) {
            for (int i = 0; i < N; i++) {
                /* a small persistent signal under noise: what error
                 * feedback must not lose */
                x[i] = (float)(0.01 * (i % 5) + rng_normal(3, (uint64_t)r, (uint64_t)i));
                sum_in[i] += x[i];
            }
            double e2, n2;
            codec_encode_ef((Codec)c, x, res, N, 32, enc, dec, &e2, &n2);
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
                codec_encode_ef((Codec)c, x, NULL, N, 32, enc, dec, &e2, &n2);
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
    Reducer r;
    assert_int_equal(reducer_create(&r, &topo, &m, 3, CODEC_NONE, 128, 0, 10, MPI_COMM_SELF), 0);
    unsigned char *seen = calloc(m.n_params, 1);
    size_t total = 0;
    for (int f = 0; f < 3; f++) {
        const size_t *off, *len;
        int n;
        reduce_fragment_runs(&r, f, &off, &len, &n);
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < len[i]; j++) {
                assert_int_equal(seen[off[i] + j], 0);
                seen[off[i] + j] = (unsigned char)(f + 1);
                total++;
            }
    }
    assert_int_equal(total, reduce_canonical_params(&r));
    /* every element of every tensor is covered (padding excluded) */
    for (int t = 0; t < N_TENSORS; t++)
        for (size_t j = 0; j < m.tensors[t].numel; j++) assert_true(seen[m.tensors[t].offset + j] != 0);
    /* layer l of wq is in fragment l mod 3 */
    const size_t per = m.tensors[T_WQ].numel / 5;
    for (int l = 0; l < 5; l++) assert_int_equal(seen[m.tensors[T_WQ].offset + l * per], l % 3 + 1);
    free(seen);
    reducer_destroy(&r);
    model_destroy(&m);
    topology_destroy(&topo);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_fp4_grid_is_e2m1),
        cmocka_unit_test(test_error_feedback_tracks_the_sum),
        cmocka_unit_test(test_checksum_detects_changes),
        cmocka_unit_test(test_streaming_schedule),
        cmocka_unit_test(test_fragments_partition_the_model),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
