/* test_config_unit.c — config parsing: defaults, file values, --set
 * precedence, the resolved text reading back to the identical config, and
 * each class of bad input returning ISTH_EINPUT. (cli_config.sh checks the
 * same through the executable: exit code 2 and the message.)
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
#include "devices.h"
#include "status.h"

static void test_defaults_and_overrides(void **state)
{
    (void)state;
    Config c;
    const char *text = "[model]\nlayers = 3\ndim = 32 # comment\n[train]\nlr = 0.01\n";
    const char *over[] = {"train.lr=0.02", "model.heads=4"};
    assert_int_equal(config_load_text(&c, text, "t.ini", over, 2), ISTH_OK);
    assert_int_equal(c.model.layers, 3);
    assert_int_equal(c.model.dim, 32);
    assert_int_equal(c.model.heads, 4);
    assert_true(c.train.lr == 0.02);
    assert_int_equal(c.model.vocab, 256);
    assert_string_equal(c.train.optimizer, "adamw");
}

static void test_sites_in_section_order(void **state)
{
    (void)state;
    Config c;
    const char *text = "[train]\nmicro_batch = 6\n[site.zeta]\nranks = 4\n[site.alpha]\nranks = 4\n"
                       "learner_ranks = 2\nmicro_batch = 3\n";
    const char *over[] = {"site.zeta.grad_accum=2", "site.extra.ranks=1"};
    assert_int_equal(config_load_text(&c, text, "t.ini", over, 2), ISTH_OK);
    assert_int_equal(c.n_sites, 3);
    assert_string_equal(c.sites[0].name, "zeta");
    assert_string_equal(c.sites[1].name, "alpha");
    assert_string_equal(c.sites[2].name, "extra");
    assert_int_equal(c.sites[0].learner_ranks, 4); /* default: one learner per site */
    assert_int_equal(c.sites[0].micro_batch, 6);   /* inherited from [train] */
    assert_int_equal(c.sites[0].grad_accum, 2);
    assert_int_equal(c.sites[1].learner_ranks, 2);
    assert_int_equal(c.sites[1].micro_batch, 3);
    Config d;
    char *t2 = config_to_text(&c);
    assert_int_equal(config_load_text(&d, t2, "resolved", NULL, 0), ISTH_OK);
    assert_memory_equal(c.sites, d.sites, sizeof c.sites[0] * 3);
    free(t2);
}

static void test_outer_defaults_by_mode(void **state)
{
    (void)state;
    Config c;
    assert_int_equal(config_load_text(&c, "[model]\nlayers = 4\n[outer]\nmode = streaming\n", "t", NULL, 0), ISTH_OK);
    assert_true(c.outer.lr == 0.4);
    assert_int_equal(c.outer.fragments, 4);
    assert_int_equal(config_load_text(&c, "[outer]\nmode = diloco\n", "t", NULL, 0), ISTH_OK);
    assert_true(c.outer.lr == 0.7);
    assert_true(c.outer.momentum == 0.9);
    assert_int_equal(c.outer.fragments, 1);
    const char *over[] = {"outer.lr=0.5"};
    assert_int_equal(config_load_text(&c, "[outer]\nmode = diloco\n", "t", over, 1), ISTH_OK);
    assert_true(c.outer.lr == 0.5);
}

static void test_resolved_text_round_trip(void **state)
{
    (void)state;
    Config a, b;
    const char *over[] = {"train.lr=0.0123456789", "model.capacity_factor=1.1", "train.out_dir=x y"};
    assert_int_equal(config_load_text(&a, "", "t.ini", over, 3), ISTH_OK);
    char *text = config_to_text(&a);
    assert_non_null(text);
    assert_int_equal(config_load_text(&b, text, "resolved", NULL, 0), ISTH_OK);
    assert_memory_equal(&a.model, &b.model, sizeof a.model);
    assert_memory_equal(&a.train, &b.train, sizeof a.train);
    assert_memory_equal(&a.data, &b.data, sizeof a.data);
    free(text);
}

static void expect_bad(const char *text, const char *override)
{
    Config c;
    const char *over[1] = {override};
    assert_int_equal(config_load_text(&c, text, "bad.ini", over, override ? 1 : 0), ISTH_EINPUT);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    status_set_quiet(1);
    expect_bad("[model]\nbogus = 1\n", NULL);               /* unknown key */
    expect_bad("[nosuch]\nx = 1\n", NULL);                  /* unknown section */
    expect_bad("[model]\nlayers = two\n", NULL);            /* wrong type */
    expect_bad("[model]\nlayers = 0\n", NULL);              /* out of range */
    expect_bad("[model]\ncapacity_factor = 0\n", NULL);     /* must be > 0 */
    expect_bad("[model]\ndim = 64\nheads = 5\n", NULL);     /* heads must divide dim */
    expect_bad("[model]\nexperts = 4\ntop_k = 5\n", NULL);  /* top_k > experts */
    expect_bad("[model]\nlayers = 2\nlayers = 3\n", NULL);  /* duplicate */
    expect_bad("[model]\nlayers\n", NULL);                  /* no '=' */
    expect_bad("layers = 2\n", NULL);                       /* outside a section */
    expect_bad("[train]\noptimizer = rmsprop\n", NULL);     /* not an allowed choice */
    expect_bad("[train]\nlr = nan\n", NULL);                /* not finite */
    expect_bad("", "model.layers");                         /* --set without '=' */
    expect_bad("", "layers=3");                             /* --set without section */
    expect_bad("[outer]\nmode = butterfly\nmomentum = -0.5\n", NULL); /* out of range */
    expect_bad("[outer]\nmode = diloco\nfragments = 2\n", NULL); /* fragments need streaming */
    expect_bad("[outer]\nmode = streaming\ninner_steps = 4\noverlap = 4\n", NULL); /* tau < H */
    expect_bad("[model]\nlayers = 2\n[outer]\nmode = streaming\nfragments = 3\n", NULL); /* P <= L */
    expect_bad("[outer]\nmode = diloco\nlr = -0.5\n", NULL);  /* must be > 0 */
    expect_bad("[outer]\ncodec = fp8\n", NULL);             /* not a codec */
    expect_bad("[outer]\nmode = ring\n", NULL);             /* not a mode */
    expect_bad("[checkpoint]\nevery = -5\n", NULL);         /* out of range */
    expect_bad("[checkpoint]\nbogus = 5\n", NULL);          /* unknown key */
    expect_bad("[site.a]\nbogus = 1\n", NULL);              /* unknown site key */
    expect_bad("[site.a]\nlearner_ranks = 2\n", NULL);      /* ranks missing */
    expect_bad("[site.a]\nranks = 4\nlearner_ranks = 3\n", NULL); /* does not divide */
    expect_bad("[model]\nexperts = 4\n[site.a]\nranks = 3\n", NULL); /* 3 does not divide 4 experts */
    status_set_quiet(0);
}

/* devices.c: one GPU per rank, by identity, under each launcher's view. */
static VisibleDevices *sees(int ranks, int n, const char *const *ids_per_rank)
{
    /* ids_per_rank[r]: the bus ids rank r sees, space-separated */
    VisibleDevices *v = calloc((size_t)ranks, sizeof *v);
    for (int r = 0; r < ranks; r++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", ids_per_rank[r < n ? r : n - 1]);
        for (char *t = strtok(buf, " "); t; t = strtok(NULL, " ")) snprintf(v[r].id[v[r].n++], DEVICE_ID_BYTES, "%s", t);
    }
    return v;
}

static void test_device_assign(void **state)
{
    (void)state;
    int d[8];
    char why[512];
    const char *all4[] = {"0:1b 0:1c 0:1d 0:1e"};
    VisibleDevices *v = sees(4, 1, all4); /* --gpus-per-node=4 or mpirun: all see all: local rank r drives the r-th */
    assert_int_equal(device_assign(v, 4, 0, d, why, sizeof why), 0);
    for (int r = 0; r < 4; r++) assert_int_equal(d[r], r);
    free(v);
    const char *own[] = {"0:1b", "0:1c", "0:1d", "0:1e"};
    v = sees(4, 4, own); /* --gpus-per-task=1: each sees one of its own: each drives it */
    assert_int_equal(device_assign(v, 4, 0, d, why, sizeof why), 0);
    for (int r = 0; r < 4; r++) assert_int_equal(d[r], 0);
    free(v);
    const char *bind[] = {"0:1b 0:1c", "0:1b 0:1c", "0:1e 0:1d", "0:1e 0:1d"};
    v = sees(4, 4, bind); /* --gpu-bind: subsets, in an order of their own */
    assert_int_equal(device_assign(v, 4, 0, d, why, sizeof why), 0);
    assert_int_equal(d[0], 0), assert_int_equal(d[1], 1), assert_int_equal(d[2], 0), assert_int_equal(d[3], 1);
    free(v);
    const char *overlap[] = {"0:1c", "0:1b 0:1c"};
    v = sees(2, 2, overlap); /* the second skips the GPU the first took */
    assert_int_equal(device_assign(v, 2, 0, d, why, sizeof why), 0);
    assert_int_equal(d[0], 0), assert_int_equal(d[1], 0);
    free(v);
    const char *fewer[] = {"0:1b 0:1c", "0:1b"};
    v = sees(2, 2, fewer); /* the rank with fewer choices goes first: both get one */
    assert_int_equal(device_assign(v, 2, 0, d, why, sizeof why), 0);
    assert_int_equal(d[0], 1), assert_int_equal(d[1], 0);
    free(v);
    const char *one[] = {"0:1b"};
    v = sees(8, 1, one); /* eight ranks, one GPU between them: refused, then shared when allowed */
    assert_int_not_equal(device_assign(v, 8, 0, d, why, sizeof why), 0);
    assert_non_null(strstr(why, "8 ranks on this host but 1 GPU(s)"));
    assert_non_null(strstr(why, "--gpus-per-node=N with N ranks per node"));
    assert_int_equal(device_assign(v, 8, 1, d, why, sizeof why), 0);
    for (int r = 0; r < 8; r++) assert_int_equal(d[r], 0);
    free(v);
    const char *two[] = {"0:1b 0:1c"};
    v = sees(4, 1, two); /* four ranks, two GPUs: the third is the first left without one */
    assert_int_not_equal(device_assign(v, 4, 0, d, why, sizeof why), 0);
    assert_non_null(strstr(why, "4 ranks on this host but 2 GPU(s) among them (local rank 2"));
    assert_int_equal(device_assign(v, 4, 1, d, why, sizeof why), 0);
    assert_int_equal(d[2], 0), assert_int_equal(d[3], 1);
    free(v);
    VisibleDevices none[2];
    memset(none, 0, sizeof none);
    snprintf(none[0].id[none[0].n++], DEVICE_ID_BYTES, "0:1b");
    assert_int_not_equal(device_assign(none, 2, 1, d, why, sizeof why), 0); /* a rank that sees none */
    assert_non_null(strstr(why, "local rank 1 of this host sees no GPU"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_assign),
        cmocka_unit_test(test_defaults_and_overrides),
        cmocka_unit_test(test_resolved_text_round_trip),
        cmocka_unit_test(test_sites_in_section_order),
        cmocka_unit_test(test_outer_defaults_by_mode),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
