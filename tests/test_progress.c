/* test_progress.c — the site summaries that ride on the verdicts (progress.c):
 *  - the summary is the mean of the last `window` steps (fewer at a start),
 *    its rate the site's tokens over their time; the ETA the steps left at
 *    that time, 0 at the end;
 *  - encoded, it comes back as float32 of the same numbers, in its own
 *    slot; the other slots are 0xFF, and a bytewise AND (between sites) or
 *    MIN (inside one) of such tables keeps every written slot: each site's
 *    summary arrives whole;
 *  - what arrives is untrusted: empty, implausible (step 0, beyond the
 *    run, more steps averaged than run, a negative or non-finite rate) or
 *    random slots are not taken; an older summary never replaces a newer;
 *    this site's own slot is never taken from others;
 *  - progress_news hands each new summary to the log once.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "progress.h"
#include "rng.h"

enum { S = 3 };

static void test_window_and_eta(void **state)
{
    (void)state;
    Progress p;
    assert_int_equal(progress_create(&p, 4, 10, S, 1, 1000.0), 0);
    assert_true(progress_mine(&p).step < 0);
    progress_step(&p, 1, 5.0, 0.5);
    SiteProgress m = progress_mine(&p);
    assert_int_equal(m.step, 1);
    assert_int_equal(m.steps, 1);
    assert_true(m.loss == 5.0);
    for (int t = 2; t <= 6; t++) progress_step(&p, t, (double)t, 0.1 * t);
    m = progress_mine(&p); /* steps 3..6 */
    assert_int_equal(m.step, 6);
    assert_int_equal(m.steps, 4);
    assert_true(fabs(m.loss - 4.5) < 1e-12);
    assert_true(fabs(m.ms_per_step - 450.0) < 1e-9);
    assert_true(fabs(m.tokens_per_s - 4000.0 / 1.8) < 1e-9);
    assert_true(fabs(progress_eta(&p) - 4 * 0.45) < 1e-12);
    for (int t = 7; t <= 10; t++) progress_step(&p, t, 1.0, 0.1);
    assert_true(progress_eta(&p) == 0.0);
    progress_destroy(&p);
}

/* Site s's progress after `steps` steps of loss 3 + s, 0.25 s each. */
static void site_at(Progress *p, int s, int steps)
{
    assert_int_equal(progress_create(p, 8, 100, S, s, 512.0 * (s + 1)), 0);
    for (int t = 1; t <= steps; t++) progress_step(p, t, 3.0 + s + 0.001 * t, 0.25);
}

static void test_slots_combine(void **state)
{
    (void)state;
    Progress site[S];
    for (int s = 0; s < S; s++) site_at(&site[s], s, 10 + s);
    unsigned char buf[S][S * PROGRESS_BYTES], and[S * PROGRESS_BYTES], min[S * PROGRESS_BYTES];
    for (int s = 0; s < S; s++) {
        progress_encode(&site[s], S, 1, buf[s]);
        for (int k = 0; k < S; k++)
            if (k != s)
                for (int i = 0; i < PROGRESS_BYTES; i++) assert_int_equal(buf[s][k * PROGRESS_BYTES + i], 0xFF);
    }
    memset(and, 0xFF, sizeof and);
    memset(min, 0xFF, sizeof min);
    for (int s = 0; s < S; s++)
        for (size_t i = 0; i < sizeof and; i++) {
            and[i] &= buf[s][i];
            if (buf[s][i] < min[i]) min[i] = buf[s][i];
        }
    assert_memory_equal(and, min, sizeof and);
    Progress host;
    site_at(&host, 0, 5);
    assert_int_equal(progress_learn(&host, and), S - 1); /* its own slot is not taken */
    assert_int_equal(host.sites[0].step, -1);
    for (int s = 1; s < S; s++) {
        const SiteProgress want = progress_mine(&site[s]), got = host.sites[s];
        assert_int_equal(got.step, want.step);
        assert_int_equal(got.steps, want.steps);
        assert_true(got.loss == (double)(float)want.loss);
        assert_true(got.tokens_per_s == (double)(float)want.tokens_per_s);
        assert_true(got.ms_per_step == (double)(float)want.ms_per_step);
    }
    assert_int_equal(progress_learn(&host, and), 0); /* nothing newer */
    /* the whole table (butterfly's pairs pass it on): a third learns both through one */
    unsigned char table[S * PROGRESS_BYTES];
    progress_encode(&host, S, 0, table);
    Progress third;
    site_at(&third, 2, 3);
    assert_int_equal(progress_learn(&third, table), 2);
    assert_int_equal(third.sites[1].step, 11);
    assert_int_equal(third.sites[0].step, 5);
    /* the log: each new summary once */
    SiteProgress news;
    int seen = 0;
    for (int s; (s = progress_news(&host, &news)) >= 0; seen++) assert_int_equal(news.step, host.sites[s].step);
    assert_int_equal(seen, S - 1);
    assert_int_equal(progress_news(&host, &news), -1);
    progress_encode(NULL, S, 0, table);
    for (size_t i = 0; i < sizeof table; i++) assert_int_equal(table[i], 0xFF);
    for (int s = 0; s < S; s++) progress_destroy(&site[s]);
    progress_destroy(&host);
    progress_destroy(&third);
}

static void put32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static void putf(unsigned char *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put32(b, u);
}

/* Slot 1 of a table: step, steps averaged, loss, tokens/s, ms. */
static int learns(uint32_t step, uint32_t steps, float loss, float tps, float ms)
{
    Progress p;
    assert_int_equal(progress_create(&p, 8, 100, S, 0, 1.0), 0);
    unsigned char t[S * PROGRESS_BYTES];
    memset(t, 0xFF, sizeof t);
    unsigned char *b = t + PROGRESS_BYTES;
    put32(b, step);
    put32(b + 4, steps);
    putf(b + 8, loss);
    putf(b + 12, tps);
    putf(b + 16, ms);
    const int n = progress_learn(&p, t);
    progress_destroy(&p);
    return n;
}

static void test_untrusted(void **state)
{
    (void)state;
    assert_int_equal(learns(50, 8, 3.0f, 100.0f, 20.0f), 1);
    assert_int_equal(learns(50, 8, NAN, 100.0f, 20.0f), 1); /* a diverging site: its loss is written as null */
    assert_int_equal(learns(0, 1, 3.0f, 100.0f, 20.0f), 0);
    assert_int_equal(learns(101, 8, 3.0f, 100.0f, 20.0f), 0);          /* beyond train.steps */
    assert_int_equal(learns(5, 8, 3.0f, 100.0f, 20.0f), 0);            /* more steps than run */
    assert_int_equal(learns(50, 0, 3.0f, 100.0f, 20.0f), 0);
    assert_int_equal(learns(50, PROGRESS_WINDOW_MAX + 1, 3.0f, 100.0f, 20.0f), 0);
    assert_int_equal(learns(50, 8, 3.0f, -1.0f, 20.0f), 0);
    assert_int_equal(learns(50, 8, 3.0f, INFINITY, 20.0f), 0);
    assert_int_equal(learns(50, 8, 3.0f, 100.0f, NAN), 0);
    assert_int_equal(learns(50, 8, 3.0f, 100.0f, 3e38f), 0);          /* an ETA beyond any clock */
    assert_int_equal(learns(50, 8, 3.0f, 3e38f, 20.0f), 0);
    /* random tables: whatever is taken is plausible */
    Progress p;
    assert_int_equal(progress_create(&p, 8, 100, S, 0, 1.0), 0);
    unsigned char t[S * PROGRESS_BYTES];
    for (uint64_t k = 0; k < 20000; k++) {
        for (size_t i = 0; i < sizeof t; i++) t[i] = (unsigned char)rng_bits(7, k, i);
        if (k & 1) put32(t + PROGRESS_BYTES, (uint32_t)(k % 120)); /* plausible steps too */
        if (k & 2) put32(t + PROGRESS_BYTES + 4, (uint32_t)(k % 9));
        progress_learn(&p, t);
        for (int s = 1; s < S; s++) {
            const SiteProgress *g = &p.sites[s];
            if (g->step < 0) continue;
            assert_true(g->step >= 1 && g->step <= 100 && g->steps >= 1 && g->steps <= g->step);
            assert_true(isfinite(g->tokens_per_s) && g->tokens_per_s >= 0 && isfinite(g->ms_per_step) &&
                        g->ms_per_step >= 0 && g->ms_per_step <= PROGRESS_MAX_MS_PER_STEP &&
                        g->tokens_per_s <= PROGRESS_MAX_TOKENS_PER_S);
        }
    }
    /* an older summary never replaces a newer */
    const long newest = p.sites[1].step;
    memset(t, 0xFF, sizeof t);
    put32(t + PROGRESS_BYTES, 1);
    put32(t + PROGRESS_BYTES + 4, 1);
    putf(t + PROGRESS_BYTES + 8, 1.0f);
    putf(t + PROGRESS_BYTES + 12, 1.0f);
    putf(t + PROGRESS_BYTES + 16, 1.0f);
    progress_learn(&p, t);
    assert_int_equal(p.sites[1].step, newest < 1 ? 1 : newest);
    progress_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_and_eta),
        cmocka_unit_test(test_slots_combine),
        cmocka_unit_test(test_untrusted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
