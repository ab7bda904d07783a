/* test_data.c — the training files (data.h) against this file's own
 * reading of them:
 *   shards      two llm.c uint16 shards (this file's own header encoding):
 *               each window of 300 drawn is the run of tokens at the
 *               position found here from the same random value over the two
 *               files' window starts (never across the boundary), and both
 *               files are drawn from; a glob gives the same files in order;
 *               ${NAME} takes the environment's value
 *   bytes       one raw byte file: the windows of the formula before shards
 *               existed (random value modulo size - T), so old runs keep
 *               their data bit for bit
 *   uint32      a LLaMA-3 shard (magic 20240801, version 7) reads its tokens
 *   many files  more files than a dataset keeps open: every window still
 *               right, never more than the bound open at once
 *   bad input   a header whose count does not match the size, a wrong
 *               version, raw bytes mixed with shards, a shard shorter than a
 *               window, a token >= model.vocab, a glob that matches nothing,
 *               a file listed twice, a shard cut inside its header, a file
 *               without a shard's magic under a token model, a token >=
 *               vocab anywhere in a file checked whole: each ISTH_EINPUT
 *               with one line naming the file (and offset); a file rewritten while the dataset
 *               had it closed: ISTH_ERUNTIME when it is opened again
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "data.h"
#include "rng.h"
#include "status.h"

static char dir[64], errfile[96];

static uint32_t token_at(int file, size_t i) { return (uint32_t)((i * 7u + (size_t)file * 131u) % 1000u); }

/* a shard of n tokens of file number `file`, as llm.c writes it */
static void write_shard(const char *name, int file, size_t n, int width, int32_t magic, int32_t version,
                        int32_t count)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int32_t h[256] = {magic, version, count};
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    for (size_t i = 0; i < n; i++) {
        const uint32_t t = token_at(file, i);
        const unsigned char b[4] = {(unsigned char)t, (unsigned char)(t >> 8), (unsigned char)(t >> 16),
                                    (unsigned char)(t >> 24)};
        assert_int_equal(fwrite(b, (size_t)width, 1, f), 1);
    }
    assert_int_equal(fclose(f), 0);
}

static const char *path_in(const char *name)
{
    static char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static const char *last_error(void)
{
    static char line[512];
    fflush(stderr);
    FILE *f = fopen(errfile, "r");
    line[0] = '\0';
    if (f) {
        char l[512];
        while (fgets(l, sizeof l, f)) snprintf(line, sizeof line, "%s", l);
        fclose(f);
    }
    return line;
}

static void expect_input_error(int rc, const char *what)
{
    assert_int_equal(rc, ISTH_EINPUT);
    const char *e = last_error();
    if (!strstr(e, what)) fail_msg("error '%s' lacks '%s'", e, what);
}

enum { T = 16, N_A = 300, N_B = 500 };

static void test_windows_across_two_shards(void **state)
{
    (void)state;
    write_shard("a.bin", 0, N_A, 2, SHARD_MAGIC_U16, 1, N_A);
    write_shard("b.bin", 1, N_B, 2, SHARD_MAGIC_U16, 1, N_B);
    const char *lists[3] = {"a.bin b.bin", "*.bin", "${ISTHMUS_TEST_DATA}/a.bin,${ISTHMUS_TEST_DATA}/b.bin"};
    setenv("ISTHMUS_TEST_DATA", dir, 1);
    for (int l = 0; l < 3; l++) {
        Dataset d;
        assert_int_equal(dataset_open(&d, lists[l], dir, T), ISTH_OK);
        assert_int_equal(d.n_files, 2);
        assert_int_equal(d.width, 2);
        assert_int_equal(dataset_tokens(&d), N_A + N_B);
        const DataCursor cur = {42, 7};
        enum { W = 300 };
        int tokens[W * T], targets[W * T], hits[2] = {0, 0};
        assert_int_equal(data_fill(&cur, &d, 1000, tokens, targets, W, T, 1000), ISTH_OK);
        for (int w = 0; w < W; w++) {
            const uint64_t r = rng_bits(42, 0x5eed000000000000ull ^ 7, 1000 + (uint64_t)w) % ((N_A - T) + (N_B - T));
            const int file = r < N_A - T ? 0 : 1;
            const size_t off = file ? (size_t)(r - (N_A - T)) : (size_t)r;
            hits[file]++;
            for (int t = 0; t < T; t++) {
                assert_int_equal(tokens[w * T + t], (int)token_at(file, off + (size_t)t));
                assert_int_equal(targets[w * T + t], (int)token_at(file, off + (size_t)t + 1));
            }
        }
        assert_true(hits[0] > 0 && hits[1] > 0);
        dataset_close(&d);
    }
}

static void test_a_byte_file_keeps_the_old_windows(void **state)
{
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/raw.txt", dir);
    FILE *f = fopen(path, "wb");
    enum { SIZE = 5000 };
    unsigned char bytes[SIZE];
    for (int i = 0; i < SIZE; i++) bytes[i] = (unsigned char)(i * 37 + 11);
    assert_int_equal(fwrite(bytes, 1, SIZE, f), SIZE);
    fclose(f);
    Dataset d;
    assert_int_equal(dataset_open(&d, "raw.txt", dir, T), ISTH_OK);
    assert_int_equal(d.width, 1);
    const DataCursor cur = {3, 11};
    enum { W = 50 };
    int tokens[W * T], targets[W * T];
    assert_int_equal(data_fill(&cur, &d, 0, tokens, targets, W, T, 256), ISTH_OK);
    for (int w = 0; w < W; w++) {
        const size_t off = (size_t)(rng_bits(3, 0x5eed000000000000ull ^ 11, (uint64_t)w) % (SIZE - T));
        for (int t = 0; t < T; t++) {
            assert_int_equal(tokens[w * T + t], bytes[off + (size_t)t]);
            assert_int_equal(targets[w * T + t], bytes[off + (size_t)t + 1]);
        }
    }
    dataset_close(&d);
    /* "" is dir/train.txt */
    snprintf(path, sizeof path, "%s/train.txt", dir);
    f = fopen(path, "wb");
    assert_int_equal(fwrite(bytes, 1, SIZE, f), SIZE);
    fclose(f);
    assert_int_equal(dataset_open(&d, "", dir, T), ISTH_OK);
    assert_non_null(strstr(d.files[0].path, "train.txt"));
    dataset_close(&d);
}

static void test_uint32_and_many_files(void **state)
{
    (void)state;
    write_shard("big.u32", 5, 100, 4, SHARD_MAGIC_U32, 7, 100);
    Dataset d;
    assert_int_equal(dataset_open(&d, "big.u32", dir, T), ISTH_OK);
    assert_int_equal(d.width, 4);
    int tok[T], tgt[T];
    const DataCursor cur = {1, 1};
    assert_int_equal(data_fill(&cur, &d, 0, tok, tgt, 1, T, 1000), ISTH_OK);
    const size_t off = (size_t)(rng_bits(1, 0x5eed000000000000ull ^ 1, 0) % (100 - T));
    assert_int_equal(tok[0], (int)token_at(5, off));
    dataset_close(&d);

    enum { FILES = 150 }; /* above the files kept open */
    char list[FILES * 16] = "";
    for (int i = 0; i < FILES; i++) {
        char name[32];
        snprintf(name, sizeof name, "m%03d.shard", i);
        write_shard(name, 10 + i, T + 3, 2, SHARD_MAGIC_U16, 1, T + 3); /* 3 window starts each */
        strcat(list, name);
        strcat(list, " ");
    }
    assert_int_equal(dataset_open(&d, list, dir, T), ISTH_OK);
    assert_int_equal(d.n_files, FILES);
    enum { W = 600 };
    static int tokens[W * T], targets[W * T];
    const DataCursor c2 = {9, 2};
    assert_int_equal(data_fill(&c2, &d, 0, tokens, targets, W, T, 1000), ISTH_OK);
    for (int w = 0; w < W; w++) {
        const uint64_t r = rng_bits(9, 0x5eed000000000000ull ^ 2, (uint64_t)w) % (3 * FILES);
        assert_int_equal(tokens[w * T], (int)token_at(10 + (int)(r / 3), (size_t)(r % 3)));
    }
    int open = 0;
    for (int i = 0; i < FILES; i++) open += d.files[i].fd >= 0;
    assert_true(open <= 128);
    assert_int_equal(open, d.n_open);
    dataset_close(&d);
}

static void test_bad_input(void **state)
{
    (void)state;
    Dataset d;
    write_shard("count.bin", 0, 100, 2, SHARD_MAGIC_U16, 1, 101);
    expect_input_error(dataset_open(&d, "count.bin", dir, T), "says 101 tokens");
    write_shard("version.bin", 0, 100, 2, SHARD_MAGIC_U16, 3, 100);
    expect_input_error(dataset_open(&d, "version.bin", dir, T), "version 3 at byte 4, expected 1");
    write_shard("ok.bin", 0, 100, 2, SHARD_MAGIC_U16, 1, 100);
    expect_input_error(dataset_open(&d, "ok.bin raw.txt", dir, T), "one kind per run");
    write_shard("short.bin", 0, T, 2, SHARD_MAGIC_U16, 1, T);
    expect_input_error(dataset_open(&d, "short.bin", dir, T), "less than one window of context+1 = 17");
    expect_input_error(dataset_open(&d, "nothing-*.bin", dir, T), "matches no file");
    expect_input_error(dataset_open(&d, "ok.bin a.bin ok.bin", dir, T), "are the same file (listed twice)");
    expect_input_error(dataset_open(&d, "missing.bin", dir, T), "missing.bin: cannot open");
    /* a shard cut inside its header is never raw bytes; a wrong magic is raw bytes, which only a byte model reads */
    write_shard("whole.bin", 0, 100, 2, SHARD_MAGIC_U16, 1, 100);
    assert_int_equal(truncate(path_in("whole.bin"), 700), 0);
    expect_input_error(dataset_open(&d, "whole.bin", dir, T), "magic 20240520 but has 700 bytes, less than the 1024-byte");
    write_shard("magic.bin", 0, 100, 2, SHARD_MAGIC_U16 - 1, 1, 100);
    assert_int_equal(dataset_open(&d, "magic.bin", dir, T), ISTH_OK);
    assert_int_equal(d.width, 1);
    assert_int_equal(dataset_check_kind(&d, 256), ISTH_OK);
    expect_input_error(dataset_check_kind(&d, 512), "are 20240519, not the magic 20240520 or 20240801), and model.vocab = 512");
    dataset_close(&d);
    /* every token of a file at once (an eval set): ok.bin's largest is 99 x 7 = 693 */
    Corpus c;
    assert_int_equal(corpus_open(&c, dir, "ok.bin"), ISTH_OK);
    assert_int_equal(corpus_check_tokens(&c, 694), ISTH_OK);
    expect_input_error(corpus_check_tokens(&c, 693), "token 693 at token 99 (byte 1222) is not below model.vocab = 693");
    assert_int_equal(corpus_check_kind(&c, 693), ISTH_OK);
    corpus_close(&c);
    unsetenv("ISTHMUS_UNSET_VAR");
    expect_input_error(dataset_open(&d, "${ISTHMUS_UNSET_VAR}/a.bin", dir, T), "${ISTHMUS_UNSET_VAR} is not set");
    /* tokens up to 999 against a vocabulary of 500 */
    assert_int_equal(dataset_open(&d, "ok.bin", dir, T), ISTH_OK);
    int tok[50 * T], tgt[50 * T];
    const DataCursor cur = {5, 0};
    expect_input_error(data_fill(&cur, &d, 0, tok, tgt, 50, T, 500), "is not below model.vocab = 500");
    assert_non_null(strstr(last_error(), "ok.bin: token "));
    /* a file the dataset had closed (too many open) and that was rewritten meanwhile */
    corpus_close(&d.files[0]);
    d.n_open--;
    usleep(20000); /* a later modification time */
    write_shard("ok.bin", 0, 100, 2, SHARD_MAGIC_U16, 1, 100);
    assert_int_equal(data_fill(&cur, &d, 0, tok, tgt, 1, T, 1000), ISTH_ERUNTIME);
    assert_non_null(strstr(last_error(), "ok.bin: replaced or modified since the run opened it"));
    dataset_close(&d);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/isthmus-test-data-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(errfile, sizeof errfile, "%s/stderr", dir);
    if (!freopen(errfile, "w", stderr)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows_across_two_shards),
        cmocka_unit_test(test_a_byte_file_keeps_the_old_windows),
        cmocka_unit_test(test_uint32_and_many_files),
        cmocka_unit_test(test_bad_input),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc) { /* cmocka's messages went to the captured stderr too */
        char cmd[192];
        snprintf(cmd, sizeof cmd, "cat %s", errfile);
        if (system(cmd) != 0) return 1;
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return rc;
}
