/* test_codec_gpu.c — payloads encoded on the GPU (cuda/codec.cu) against
 * the host's codec_encode_ef (src/codec.c) on random values: every codec,
 * blocks that divide the length and blocks that do not (odd ones make fp4
 * bytes straddle two blocks), with and without error feedback, over three
 * rounds so the residual carries.
 * Tolerance: the bytes, the decoded values and the residual must be equal
 * bit for bit (both sides run src/codec_math.h's single rounded operations;
 * a receiver must not be able to tell which encoded). err2 and norm2 are
 * sums in double in a different order: within 1e-12 relative.
 * Output is TAP; without a CUDA device "1..0 # SKIP" with the reason. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codec.h"
#include "cuda/codec.h"
#include "gpu_tap.h"
#include "rng.h"

static int test_no;

static int close_rel(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(fabs(b), 1e-30); }

/* One case: 3 rounds of n values in blocks of `block`; returns mismatches. */
static int one_case(CudaCodec *cc, Codec c, size_t n, int block, int feedback, uint64_t seed)
{
    const size_t bytes = codec_encoded_size(c, n, codec_params(block));
    float *x = malloc(sizeof(float) * n), *res_h = calloc(n, sizeof(float)), *res_g = calloc(n, sizeof(float));
    float *dec_h = malloc(sizeof(float) * n), *dec_g = malloc(sizeof(float) * n);
    unsigned char *enc_h = malloc(bytes), *enc_g = malloc(bytes);
    int bad = 0;
    for (int round = 0; round < 3 && !bad; round++) {
        for (size_t i = 0; i < n; i++) /* magnitudes over six decades, some exact zeros */
            x[i] = i % 17 == 3 ? 0.0f : (float)(rng_normal(seed, (uint64_t)round, i) * pow(10.0, (double)(i % 6) - 3.0));
        double e2h, n2h, e2g, n2g;
        codec_encode_ef(c, x, feedback ? res_h : NULL, n, codec_params(block), enc_h, dec_h, &e2h, &n2h);
        if (cuda_codec_encode_ef(cc, c, x, feedback ? res_g : NULL, n, block, enc_g, dec_g, &e2g, &n2g) != 0) {
            bad = 1;
            break;
        }
        if (memcmp(enc_h, enc_g, bytes)) {
            size_t j = 0;
            while (enc_h[j] == enc_g[j]) j++;
            fprintf(stderr, "%s n=%zu block=%d round %d: byte %zu of %zu: host %02x gpu %02x\n", codec_name(c), n,
                    block, round, j, bytes, enc_h[j], enc_g[j]);
            bad++;
        }
        if (memcmp(dec_h, dec_g, sizeof(float) * n)) bad++;
        if (feedback && memcmp(res_h, res_g, sizeof(float) * n)) bad++;
        if (!close_rel(e2g, e2h) || !close_rel(n2g, n2h)) {
            fprintf(stderr, "%s n=%zu: err2 %.17g / %.17g, norm2 %.17g / %.17g\n", codec_name(c), n, e2g, e2h, n2g,
                    n2h);
            bad++;
        }
    }
    free(x);
    free(res_h);
    free(res_g);
    free(dec_h);
    free(dec_g);
    free(enc_h);
    free(enc_g);
    return bad;
}

int main(void)
{
    if (!gpu_present_or_skip()) return 0;
    const size_t lengths[] = {1, 13, 1000, 100003};
    const int blocks[] = {1, 7, 64, 256};
    printf("1..%d\n", 4 * 2);
    cudaStream_t s;
    GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CudaCodec cc;
    cuda_codec_init(&cc, s);
    int failed = 0;
    for (int c = CODEC_NONE; c <= CODEC_FP4; c++)
        for (int feedback = 0; feedback < 2; feedback++) {
            int bad = 0, cases = 0;
            for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++)
                for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++, cases++)
                    bad += one_case(&cc, (Codec)c, lengths[li], blocks[bi], feedback, 1000 + 17 * cases + c);
            printf("%s %d - %s %s error feedback on the GPU: %d cases, bytes, decoded%s bit-identical to the host: "
                   "%d mismatches\n",
                   bad ? "not ok" : "ok", ++test_no, codec_name((Codec)c), feedback ? "with" : "without", cases,
                   feedback ? " and residual" : "", bad);
            failed += bad != 0;
        }
    cuda_codec_destroy(&cc);
    GPU_CHECK(cudaStreamDestroy(s));
    return failed ? 1 : 0;
}
