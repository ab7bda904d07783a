/* test_generate.c — the KV-cache decoder against the full forward, and the
 * sampling rule against its definition. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <mpi.h>

#include "coll.h"
#include "cpu/blas_select.h"
#include "cpu/transformer.h"
#include "decoder.h"
#include "model.h"
#include "sample.h"
#include "testmodel.h"
#include "tokenizer.h"

static Coll self;

/* A window of T tokens of a fixed pseudo-random text. */
static void window(int *tokens, int T, int V, unsigned salt)
{
    for (int t = 0; t < T; t++) tokens[t] = (int)((t * 2654435761u + salt * 40503u) % (unsigned)V);
}

/* Every position: the decoder's next-token distribution equals the full
 * forward's (dropless, as evaluation runs it). Float32 sums in another
 * order: probabilities (of ~1/256 each, up to ~1) agree to 2e-6. */
static void test_decoder_matches_full_forward(void **state)
{
    const int T = 12;
    ModelConfig c = test_model_config(T, 7);
    Model m;
    Activations a;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    assert_int_equal(acts_create(&a, &c, 1, T, &self, RECOMPUTE_NONE), 0);
    test_randomize(&m, 31, 0);
    int tokens[12], targets[12];
    window(tokens, T, c.vocab, 5);
    for (int t = 0; t < T; t++) targets[t] = -1;
    ForwardStats st;
    assert_int_equal(transformer_forward(&m, &a, tokens, targets, 1, T, 0, &st), 0);
    Decoder d;
    assert_int_equal(decoder_create(&d, &m), 0);
    float logits[256];
    double worst = 0.0;
    for (int t = 0; t < T; t++) {
        assert_int_equal(decoder_step(&d, tokens[t], logits), 0);
        double mx = logits[0], sum = 0.0;
        for (int v = 1; v < c.vocab; v++) mx = logits[v] > mx ? logits[v] : mx;
        for (int v = 0; v < c.vocab; v++) sum += exp(logits[v] - mx);
        for (int v = 0; v < c.vocab; v++) {
            const double p = exp(logits[v] - mx) / sum, ref = a.probs[(size_t)t * c.vocab + v];
            worst = fabs(p - ref) > worst ? fabs(p - ref) : worst;
        }
    }
    assert_true(worst < 2e-6);
    /* the cache is full: one more is an error, not a write past it */
    assert_int_not_equal(decoder_step(&d, 1, logits), 0);
    decoder_reset(&d);
    assert_int_equal(decoder_step(&d, tokens[0], logits), 0);
    decoder_destroy(&d);
    acts_destroy(&a);
    model_destroy(&m);
}

/* Greedy generation equals argmax of the full forward over the growing
 * window, token for token (no cache involved in the reference). */
static void test_greedy_matches_full_forward(void **state)
{
    const int T = 16, n_prompt = 3, count = 10;
    ModelConfig c = test_model_config(T, 7);
    Model m;
    Activations a;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    assert_int_equal(acts_create(&a, &c, 1, T, &self, RECOMPUTE_NONE), 0);
    test_randomize(&m, 47, 0);
    int seq[16], targets[16];
    window(seq, n_prompt, c.vocab, 9);
    Decoder d;
    assert_int_equal(decoder_create(&d, &m), 0);
    const SampleRule greedy = {0.0, 0, 1};
    int out[10];
    assert_int_equal(sample_generate(&d, seq, n_prompt, count, &greedy, out, NULL, NULL), 0);
    for (int g = 0; g < count; g++) {
        const int n = n_prompt + g;
        for (int t = 0; t < n; t++) targets[t] = -1;
        ForwardStats st;
        assert_int_equal(transformer_forward(&m, &a, seq, targets, 1, n, 0, &st), 0);
        const float *p = a.probs + (size_t)(n - 1) * c.vocab;
        int best = 0;
        for (int v = 1; v < c.vocab; v++)
            if (p[v] > p[best]) best = v;
        assert_int_equal(out[g], best);
        seq[n] = best;
    }
    decoder_destroy(&d);
    acts_destroy(&a);
    model_destroy(&m);
}

/* Past the context: greedy generation equals argmax of the full forward
 * over the window the rule keeps (the last T/2 tokens when it is full),
 * token for token across two restarts; and a context of one runs. */
static void test_greedy_past_context_matches_full_forward(void **state)
{
    const int T = 8, n_prompt = 3, count = 20;
    ModelConfig c = test_model_config(T, 7);
    Model m;
    Activations a;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    assert_int_equal(acts_create(&a, &c, 1, T, &self, RECOMPUTE_NONE), 0);
    test_randomize(&m, 59, 0);
    int win[8], targets[8], prompt[3], out[20];
    window(prompt, n_prompt, c.vocab, 4);
    Decoder d;
    assert_int_equal(decoder_create(&d, &m), 0);
    const SampleRule greedy = {0.0, 0, 1};
    assert_int_equal(sample_generate(&d, prompt, n_prompt, count, &greedy, out, NULL, NULL), 0);
    int n = n_prompt;
    memcpy(win, prompt, sizeof prompt);
    for (int g = 0; g < count; g++) {
        for (int t = 0; t < n; t++) targets[t] = -1;
        ForwardStats st;
        assert_int_equal(transformer_forward(&m, &a, win, targets, 1, n, 0, &st), 0);
        const float *p = a.probs + (size_t)(n - 1) * c.vocab;
        int best = 0;
        for (int v = 1; v < c.vocab; v++)
            if (p[v] > p[best]) best = v;
        assert_int_equal(out[g], best);
        if (n == T) { /* full: its last half, then the new token */
            memmove(win, win + T - T / 2, (size_t)(T / 2) * sizeof(int));
            n = T / 2;
        }
        win[n++] = best;
    }
    decoder_destroy(&d);
    acts_destroy(&a);
    model_destroy(&m);
    /* context 1: every token starts afresh (nothing kept), no write past the window */
    ModelConfig one = test_model_config(1, 7);
    assert_int_equal(model_create(&m, &one, 0, one.experts), 0);
    test_randomize(&m, 5, 0);
    assert_int_equal(decoder_create(&d, &m), 0);
    const int two[2] = {3, 4};
    assert_int_equal(sample_generate(&d, two, 2, 5, &greedy, out, NULL, NULL), 0);
    decoder_destroy(&d);
    model_destroy(&m);
}

/* Past the context the decoder restarts on the last half: generation goes
 * on, and the same seed gives the same tokens. */
static void test_generation_past_context_is_deterministic(void **state)
{
    ModelConfig c = test_model_config(8, 7);
    Model m;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    test_randomize(&m, 3, 0);
    Decoder d;
    assert_int_equal(decoder_create(&d, &m), 0);
    const int prompt[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    const SampleRule r = {0.8, 20, 99};
    int x[40], y[40], z[40];
    assert_int_equal(sample_generate(&d, prompt, 20, 40, &r, x, NULL, NULL), 0);
    assert_int_equal(sample_generate(&d, prompt, 20, 40, &r, y, NULL, NULL), 0);
    assert_memory_equal(x, y, sizeof x);
    const SampleRule other = {0.8, 20, 100};
    assert_int_equal(sample_generate(&d, prompt, 20, 40, &other, z, NULL, NULL), 0);
    assert_memory_not_equal(x, z, sizeof x);
    assert_int_not_equal(sample_generate(&d, prompt, 0, 4, &r, x, NULL, NULL), 0); /* no prompt */
    decoder_destroy(&d);
    model_destroy(&m);
}

/* The rule: frequencies follow softmax(logits / T); top-k never leaves the
 * k largest; ties at the cut go to the lower index; temperature 0 and
 * top-k 1 are the argmax. */
static void test_sample_rule(void **state)
{
    const float logits[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
    double scratch[6];
    const SampleRule greedy = {0.0, 0, 7}, top1 = {5.0, 1, 7};
    for (uint64_t i = 0; i < 50; i++) {
        assert_int_equal(sample_draw(logits, 6, &greedy, i, scratch), 1); /* tie 1 and 3: the lower */
        assert_int_equal(sample_draw(logits, 6, &top1, i, scratch), 1);
    }
    /* top-2 with the tie at the cut: {1, 3}; top-3: {1, 3, 2} */
    const SampleRule top2 = {1.0, 2, 7}, top3 = {1.0, 3, 7};
    for (uint64_t i = 0; i < 2000; i++) {
        const int t2 = sample_draw(logits, 6, &top2, i, scratch), t3 = sample_draw(logits, 6, &top3, i, scratch);
        assert_true(t2 == 1 || t2 == 3);
        assert_true(t3 == 1 || t3 == 3 || t3 == 2);
    }
    /* frequencies at T = 2 over 40,000 draws: each within 5 standard deviations */
    const SampleRule warm = {2.0, 0, 11};
    const int n = 40000;
    int counts[6] = {0};
    for (int i = 0; i < n; i++) counts[sample_draw(logits, 6, &warm, (uint64_t)i, scratch)]++;
    double z = 0.0, w[6];
    for (int v = 0; v < 6; v++) z += w[v] = exp(logits[v] / 2.0);
    for (int v = 0; v < 6; v++) {
        const double p = w[v] / z, sd = sqrt(n * p * (1 - p));
        assert_true(fabs(counts[v] - n * p) < 5 * sd);
    }
}

/* Without its tokenizer a token model's text is ids, checked against the
 * vocabulary; a byte model's is bytes. */
static void test_tokenizer_ids_and_bytes(void **state)
{
    Tokenizer t;
    assert_int_equal(tokenizer_open(&t, "", 4096), 0);
    int *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(&t, "12 7, 4095", &ids, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 12);
    assert_int_equal(ids[2], 4095);
    char *text;
    size_t len;
    assert_int_equal(tokenizer_decode(&t, ids, n, &text, &len), 0);
    assert_string_equal(text, "12 7 4095");
    free(ids);
    free(text);
    assert_int_not_equal(tokenizer_encode(&t, "12 4096", &ids, &n), 0);
    assert_int_not_equal(tokenizer_encode(&t, "12 x", &ids, &n), 0);
    assert_int_equal(tokenizer_open(&t, "", 256), 0);
    assert_int_equal(tokenizer_encode(&t, "ab\n", &ids, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 10);
    free(ids);
    /* a file that is no sentencepiece model */
    assert_int_not_equal(tokenizer_open(&t, "/dev/null", 256), 0);
}

int main(int argc, char **argv)
{
    blas_select_reexec(argv);
    MPI_Init(&argc, &argv);
    coll_init(&self, MPI_COMM_SELF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoder_matches_full_forward),
        cmocka_unit_test(test_greedy_matches_full_forward),
        cmocka_unit_test(test_greedy_past_context_matches_full_forward),
        cmocka_unit_test(test_generation_past_context_is_deterministic),
        cmocka_unit_test(test_sample_rule),
        cmocka_unit_test(test_tokenizer_ids_and_bytes),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
