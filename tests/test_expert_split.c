/* test_expert_split.c — which site trains which experts ([outer] experts =
 * split, expert_split.h): ranges by compute share (worked out by hand
 * below), ranges given per site, every refused layout with the key it
 * names, the copies' sites, and the byte counts against the model's own
 * parameter count. cli_config.sh checks the same through the executable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "config_keys.h"
#include "expert_split_report.h"
#include "model.h"
#include "status.h"

static int top_k = 1; /* [model] top_k of the configs load() writes */

/* A config of the sites given as "name:ranks:learner_ranks:micro_batch[:experts]" lines. */
static int load(Config *c, int experts, const char *mode, const char *const *sites, int n, const char *extra)
{
    char text[4096];
    int len = snprintf(text, sizeof text, "[model]\nexperts = %d\ntop_k = %d\n[outer]\nmode = %s\nexperts = split\n%s",
                       experts, top_k, mode, extra ? extra : "");
    for (int i = 0; i < n; i++) {
        char name[32], given[32] = "";
        int ranks, g, mb;
        assert_true(sscanf(sites[i], "%31[^:]:%d:%d:%d:%31s", name, &ranks, &g, &mb, given) >= 4);
        len += snprintf(text + len, sizeof text - (size_t)len, "[site.%s]\nranks = %d\nlearner_ranks = %d\n"
                        "micro_batch = %d\n%s%s%s", name, ranks, g, mb, given[0] ? "experts = " : "", given,
                        given[0] ? "\n" : "");
    }
    return config_load_text(c, text, "t.ini", NULL, 0);
}

static void expect_ranges(const Config *c, const int *begin, const int *count)
{
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[512];
    assert_int_equal(expert_split_assign(c, &x, why, sizeof why, &bad), 0);
    for (int s = 0; s < c->n_sites; s++) {
        assert_int_equal(x.begin[s], begin[s]);
        assert_int_equal(x.count[s], count[s]);
    }
    /* every expert has exactly one owner, the one whose range holds it */
    for (int e = 0; e < c->model.experts; e++) {
        int owners = 0;
        for (int s = 0; s < c->n_sites; s++) owners += e >= x.begin[s] && e < x.begin[s] + x.count[s];
        assert_int_equal(owners, 1);
        const int o = expert_split_owner(&x, e);
        assert_true(e >= x.begin[o] && e < x.begin[o] + x.count[o]);
    }
}

static void test_ranges_by_share(void **state)
{
    (void)state;
    Config c;
    const char *equal[] = {"a:1:1:8", "b:1:1:8"};
    assert_int_equal(load(&c, 8, "diloco", equal, 2, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){0, 4}, (int[]){4, 4});
    /* 3:1 in ranks: targets 6 and 2 */
    const char *three[] = {"a:3:1:8", "b:1:1:8"};
    assert_int_equal(load(&c, 8, "diloco", three, 2, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){0, 6}, (int[]){6, 2});
    /* tokens per step 40, 24, 16 of 80 (shares .5, .3, .2): targets 6, 3.6, 2.4;
     * whole multiples of learner_ranks (2, 1, 1) floor to 6, 3, 2 = 11; the
     * twelfth to b, the furthest below its share (0.6 against c's 0.4) */
    const char *mixed[] = {"a:2:2:20", "b:3:1:8", "c:2:1:8"};
    assert_int_equal(load(&c, 12, "streaming", mixed, 3, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){0, 6, 10}, (int[]){6, 4, 2});
    /* a small site gets at least one multiple of its learner_ranks: tokens
     * 256 and 2, targets 7.94 and 0.06 of 8, learner_ranks 2 and 2: 6 and 2 */
    const char *small[] = {"a:32:2:8", "b:2:2:1"};
    assert_int_equal(load(&c, 8, "diloco", small, 2, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){0, 6}, (int[]){6, 2});
}

/* expert_routing = local chooses top_k among a site's own experts: every
 * site gets at least top_k (drop routes over all E: one is enough) */
static void test_at_least_top_k(void **state)
{
    (void)state;
    Config c;
    top_k = 2;
    const char *uneven[] = {"a:1:1:8", "b:2:1:8"}; /* shares 1/3, 2/3 of 4: targets 1.33, 2.67 */
    assert_int_equal(load(&c, 4, "diloco", uneven, 2, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){0, 2}, (int[]){2, 2});
    assert_int_equal(load(&c, 4, "diloco", uneven, 2, "expert_routing = drop\n"), ISTH_OK);
    expect_ranges(&c, (int[]){0, 1}, (int[]){1, 3});
    const char *one[] = {"a:1:1:8:0", "b:1:1:8:1-3"};
    status_set_quiet(1);
    assert_int_equal(load(&c, 4, "diloco", one, 2, NULL), ISTH_EINPUT);
    status_set_quiet(0);
    assert_int_equal(load(&c, 4, "diloco", one, 2, "expert_routing = drop\n"), ISTH_OK);
    expect_ranges(&c, (int[]){0, 1}, (int[]){1, 3});
    top_k = 1;
}

static void test_ranges_given(void **state)
{
    (void)state;
    Config c;
    const char *given[] = {"a:1:1:8:2-7", "b:1:1:8:0-1"};
    assert_int_equal(load(&c, 8, "diloco", given, 2, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){2, 0}, (int[]){6, 2});
    const char *one[] = {"a:1:1:8:0-2", "b:1:1:8:3"};
    assert_int_equal(load(&c, 4, "diloco", one, 2, NULL), ISTH_OK);
    expect_ranges(&c, (int[]){0, 3}, (int[]){3, 1});
    /* the resolved text carries the ranges and reads back the same */
    char *text = config_to_text(&c);
    Config d;
    assert_int_equal(config_load_text(&d, text, "resolved", NULL, 0), ISTH_OK);
    assert_string_equal(d.sites[1].experts, "3");
    assert_memory_equal(&c.outer, &d.outer, sizeof c.outer);
    free(text);
}

/* refused, naming site `site` (-1: an [outer] key) and `key` */
static void expect_refused(int experts, const char *mode, const char *const *sites, int n, const char *extra,
                           int site, const char *key)
{
    Config c;
    assert_int_equal(load(&c, experts, mode, sites, n, extra), ISTH_EINPUT);
    /* the same assignment asked directly of the raw fields names the key
     * at fault (loaded replicated, one rank per learner, then set) */
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[512];
    Config raw;
    char t2[4096];
    int len = snprintf(t2, sizeof t2, "[model]\nexperts = %d\ntop_k = 1\n[outer]\nmode = %s\n%s", experts, mode,
                       extra ? extra : "");
    for (int i = 0; i < n; i++) {
        char name[32], given[32] = "";
        int ranks, g, mb;
        assert_true(sscanf(sites[i], "%31[^:]:%d:%d:%d:%31s", name, &ranks, &g, &mb, given) >= 4);
        len += snprintf(t2 + len, sizeof t2 - (size_t)len, "[site.%s]\nranks = %d\nlearner_ranks = 1\nmicro_batch = %d\n", name, ranks,
                        mb);
    }
    assert_int_equal(config_load_text(&raw, t2, "raw", NULL, 0), ISTH_OK);
    snprintf(raw.outer.experts, sizeof raw.outer.experts, "split");
    for (int i = 0; i < n; i++) {
        char name[32], given[32] = "";
        int ranks, g, mb;
        sscanf(sites[i], "%31[^:]:%d:%d:%d:%31s", name, &ranks, &g, &mb, given);
        raw.sites[i].learner_ranks = g;
        snprintf(raw.sites[i].experts, sizeof raw.sites[i].experts, "%s", given);
    }
    assert_int_not_equal(expert_split_assign(&raw, &x, why, sizeof why, &bad), 0);
    assert_true(strlen(why) > 0);
    assert_int_equal(bad.site, site);
    assert_string_equal(bad.key, key);
}

static void test_refused(void **state)
{
    (void)state;
    status_set_quiet(1);
    const char *two[] = {"a:1:1:8", "b:1:1:8"};
    expect_refused(8, "sync", two, 2, NULL, -1, "mode");
    expect_refused(8, "butterfly", two, 2, NULL, -1, "mode");
    const char *lone[] = {"a:1:1:8"};
    expect_refused(8, "diloco", lone, 1, NULL, -1, "experts");
    const char *three[] = {"a:1:1:8", "b:1:1:8", "c:1:1:8"};
    expect_refused(2, "diloco", three, 3, NULL, -1, "experts"); /* more sites than experts */
    const char *fours[] = {"a:4:4:8", "b:4:4:8"};
    expect_refused(10, "diloco", fours, 2, NULL, -1, "experts"); /* 10 not a sum of multiples of 4 */
    expect_refused(8, "diloco", two, 2, "expert_replicas = 3\n", -1, "expert_replicas");
    const char *part[] = {"a:1:1:8:0-3", "b:1:1:8"};
    expect_refused(8, "diloco", part, 2, NULL, 1, "experts"); /* b's range missing */
    const char *overlap[] = {"a:1:1:8:0-4", "b:1:1:8:4-7"};
    expect_refused(8, "diloco", overlap, 2, NULL, 1, "experts");
    const char *gap[] = {"a:1:1:8:0-2", "b:1:1:8:4-7"};
    expect_refused(8, "diloco", gap, 2, NULL, -1, "experts"); /* expert 3 is no site's */
    const char *whole[] = {"a:2:2:8:0-2", "b:1:1:8:3-7"};
    expect_refused(8, "diloco", whole, 2, NULL, 0, "experts"); /* 3 experts over 2 ranks */
    const char *beyond[] = {"a:1:1:8:0-3", "b:1:1:8:4-8"};
    expect_refused(8, "diloco", beyond, 2, NULL, 1, "experts");
    const char *syntax[] = {"a:1:1:8:0-3", "b:1:1:8:4to7"};
    expect_refused(8, "diloco", syntax, 2, NULL, 1, "experts");
    const char *backwards[] = {"a:1:1:8:3-0", "b:1:1:8:4-7"};
    expect_refused(8, "diloco", backwards, 2, NULL, 0, "experts");
    /* a range without split is refused by the config's own rules */
    Config c;
    assert_int_equal(config_load_text(&c, "[site.a]\nranks = 1\nexperts = 0-1\n[site.b]\nranks = 1\n", "t", NULL, 0),
                     ISTH_EINPUT);
    status_set_quiet(0);
}

static void test_replicas(void **state)
{
    (void)state;
    Config c;
    const char *three[] = {"a:1:1:8", "b:1:1:8", "c:1:1:8"};
    assert_int_equal(load(&c, 6, "diloco", three, 3, NULL), ISTH_OK);
    assert_int_equal(c.outer.expert_replicas, 2); /* the default, resolved */
    assert_int_equal(load(&c, 6, "diloco", three, 3, "expert_replicas = 3\n"), ISTH_OK);
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[256];
    assert_int_equal(expert_split_assign(&c, &x, why, sizeof why, &bad), 0);
    assert_int_equal(x.replicas, 3);
    for (int s = 0; s < 3; s++) { /* the sites after s, wrapping: every other site once */
        assert_int_equal(expert_split_replica_site(&x, s, 1), (s + 1) % 3);
        assert_int_equal(expert_split_replica_site(&x, s, 2), (s + 2) % 3);
    }
    Config one;
    assert_int_equal(config_load_text(&one, "", "t", NULL, 0), ISTH_OK);
    assert_int_equal(one.outer.expert_replicas, 1); /* one site: nothing to copy to */
}

static void test_sizes(void **state)
{
    (void)state;
    Config c;
    const char *two[] = {"a:1:1:8", "b:1:1:8"};
    assert_int_equal(load(&c, 8, "diloco", two, 2, "codec = none\nexpert_refresh = 4\n"), ISTH_OK);
    ExpertSplitSizes z;
    assert_int_equal(expert_split_sizes(&c, &z), ISTH_OK);
    const ModelConfig *m = &c.model;
    /* one expert: three matrices of D x F in every layer */
    const double expert = 3.0 * m->dim * m->ffn * m->layers;
    assert_true(z.expert_values == expert);
    assert_true(z.all_values == model_total_params(m));
    assert_true(z.dense_values == model_total_params(m) - m->experts * expert);
    assert_true(z.all_bytes == 4 * z.all_values); /* codec none: float32 */
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[256];
    assert_int_equal(expert_split_assign(&c, &x, why, sizeof why, &bad), 0);
    /* 4 experts, one copy, every 4 outer periods: one expert's bytes per period */
    assert_true(expert_split_refresh_bytes(&c, &x, &z, 0) == z.expert_bytes * 4 * 1 / 4.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_by_share),
        cmocka_unit_test(test_at_least_top_k),
        cmocka_unit_test(test_ranges_given),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_replicas),
        cmocka_unit_test(test_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
