/* test_butterfly.c — run under mpirun with N = 2, 4, 8 ranks, each rank one
 * learner (one site of N learners of 1 rank):
 *  - pairing: partner(partner(i)) = i, one partner per round, every bit used;
 *  - k rounds of pairwise averaging of distinct starting values, no local
 *    updates: every learner holds the exact (token-weighted) mean, and all
 *    hold bit-identical values — with codec none, and with fp4 in the
 *    uncompressed `exact` rounds that end training (fp4's own rounds are
 *    shown to miss the mean, so the check can tell them apart);
 *  - a round between learners 0 and 1 completes while every other learner
 *    stays away: the exchange waits on the partner only (no collective
 *    across learners);
 *  - the spread probe: rank 0 records its sample without waiting for the
 *    others, and once they arrive logs max_i |x_i - mean| / |mean| =
 *    (N-1)/(N+1) for learners holding the constants 1..N (and the formula
 *    itself on hand-computed rows, equal and unequal weights).
 * Tolerance: float32 averaging of k terms, |x - mean| <= 1e-6 * max|x|.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mpi.h>

#include "backend.h"
#include "backend_choose.h"
#include "coll.h"
#include "config.h"
#include "model.h"
#include "outer.h"
#include "link.h"
#include "mix.h"
#include "payload.h"
#include "shard.h"
#include "rng.h"
#include "spread.h"
#include "topology.h"

static int N, me;

typedef struct {
    Config cfg;
    Topology topo;
    Model m;
    Link link;
    Shard shard;
    StopBallot ballot;
    Mixer mix;
} World;

/* Owned chunks between a params-shaped buffer and the packed layout. */
static void owned_pack(const ChunkTable *ct, const Owned *o, const float *buf, float *packed)
{
    for (int k = 0; k < o->n; k++)
        memcpy(packed + o->off[k], buf + chunk_offset(ct, o->chunk[k]), ct->chunks[o->chunk[k]].size * sizeof(float));
}

static void owned_unpack(const ChunkTable *ct, const Owned *o, const float *packed, float *buf)
{
    for (int k = 0; k < o->n; k++)
        memcpy(buf + chunk_offset(ct, o->chunk[k]), packed + o->off[k], ct->chunks[o->chunk[k]].size * sizeof(float));
}

/* One round of fragment f with `partner` on the params (each learner is one
 * rank: its owned chunks are every chunk it holds), as outer.c stages it. */
static void mix_pair(World *w, int f, int partner, double w_me, double w_partner, int exact, ExchangeReport *rep)
{
    const Owned *own = shard_owned(&w->shard, f);
    float *values = malloc(sizeof(float) * (own->size + 1));
    assert_non_null(values);
    owned_pack(&w->shard.table, own, w->m.params, values);
    assert_int_equal(mix_start(&w->mix, f, partner, values, w_me, w_partner, exact), 0);
    assert_int_equal(mix_finish(&w->mix, f, 0, values, rep, NULL), 0);
    owned_unpack(&w->shard.table, own, values, w->m.params);
    free(values);
}

static void setup(World *w, int fragments, Codec codec)
{
    char ranks[64], frag[64];
    snprintf(ranks, sizeof ranks, "site.a.ranks=%d", N);
    snprintf(frag, sizeof frag, "outer.fragments=%d", fragments);
    const char *over[] = {ranks, "site.a.learner_ranks=1", "outer.mode=butterfly", frag, "outer.timeout=20"};
    assert_int_equal(config_load_text(&w->cfg, "", "t", over, 5), 0);
    assert_int_equal(topology_create(&w->topo, &w->cfg, MPI_COMM_WORLD), 0);
    assert_int_equal(model_create(&w->m, &w->cfg.model, 0, w->cfg.model.experts), 0);
    link_init(&w->link, MPI_COMM_WORLD, 20, w->topo.sites[w->topo.site].name);
    PayloadCodec pc;
    payload_codec_init(&pc, codec, codec_params(128), 1, 0);
    assert_int_equal(shard_create(&w->shard, &w->topo, &w->m, fragments, &pc), 0);
    stop_ballot_init(&w->ballot);
    assert_int_equal(mixer_create(&w->mix, &w->shard, &w->link, &w->ballot), 0);
    for (size_t i = 0; i < w->m.n_params; i++) w->m.params[i] = (float)rng_normal(5, (uint64_t)me, i);
}

static void teardown(World *w)
{
    link_forget_keys(&w->link);
    shard_destroy(&w->shard, !mixer_destroy(&w->mix));
    model_destroy(&w->m);
    topology_destroy(&w->topo);
}

static void test_pairing(void **state)
{
    (void)state;
    for (int k = 1; k <= 3; k++) {
        const int n = 1 << k;
        for (long r = 0; r < 3L * k; r++) {
            int seen[8] = {0};
            for (int i = 0; i < n; i++) {
                int p = butterfly_partner(i, r, k);
                assert_true(p != i && p >= 0 && p < n);
                assert_int_equal(butterfly_partner(p, r, k), i); /* symmetric */
                seen[p]++;
            }
            for (int i = 0; i < n; i++) assert_int_equal(seen[i], 1); /* one partner each */
        }
        /* a fragment gets k consecutive rounds, one per bit */
        for (int P = 1; P <= 3; P++)
            for (long r = 0; r < 2L * k * P; r++) assert_int_equal(butterfly_fragment(r, k, P), (int)((r / k) % P));
    }
}

/* k rounds of pairwise averaging of every fragment, no local updates, with
 * token weights 1, 2, 3, ...; returns max |x - mean| / max |mean| against
 * the weighted mean of the starting values in double. `identical`: whether
 * every learner ends bit-identical. */
static double mix_k_rounds(Codec codec, int exact, int *identical)
{
    const int fragments = 2;
    World w;
    setup(&w, fragments, codec);
    int k = 0;
    while ((1 << k) < N) k++;
    double weights[8], total = 0;
    for (int i = 0; i < N; i++) total += (weights[i] = i + 1);
    for (int i = 0; i < N; i++) weights[i] /= total;
    float *start = malloc(sizeof(float) * w.m.n_params);
    memcpy(start, w.m.params, sizeof(float) * w.m.n_params);
    for (int f = 0; f < fragments; f++)
        for (int d = 0; d < k; d++) {
            const int partner = me ^ (1 << d);
            double gw_me = 0, gw_p = 0; /* group weights as outer.c computes them */
            for (int j = 0; j < N; j++) {
                if ((j >> d) == (me >> d)) gw_me += weights[j];
                if ((j >> d) == (partner >> d)) gw_p += weights[j];
            }
            ExchangeReport rep;
            mix_pair(&w, f, partner, gw_me, gw_p, exact, &rep);
            assert_int_equal(rep.partner, partner);
            assert_int_equal(rep.codec, exact ? CODEC_NONE : codec);
        }
    float *all = malloc(sizeof(float) * w.m.n_params * (size_t)N);
    MPI_Allgather(start, (int)w.m.n_params, MPI_FLOAT, all, (int)w.m.n_params, MPI_FLOAT, MPI_COMM_WORLD);
    double maxerr = 0, scale = 0;
    for (size_t i = 0; i < w.m.n_params; i++) {
        double mean = 0;
        for (int j = 0; j < N; j++) mean += weights[j] * all[(size_t)j * w.m.n_params + i];
        maxerr = fmax(maxerr, fabs(w.m.params[i] - mean));
        scale = fmax(scale, fabs(mean));
    }
    MPI_Allgather(w.m.params, (int)w.m.n_params, MPI_FLOAT, all, (int)w.m.n_params, MPI_FLOAT, MPI_COMM_WORLD);
    *identical = 1;
    for (int j = 1; j < N; j++)
        if (memcmp(all, all + (size_t)j * w.m.n_params, w.m.n_params * sizeof(float))) *identical = 0;
    free(all);
    free(start);
    teardown(&w);
    return maxerr / scale;
}

static void test_exact_mean_after_k_rounds(void **state)
{
    (void)state;
    if (N < 2) skip();
    int identical;
    /* codec none: the regular rounds are already exact */
    assert_true(mix_k_rounds(CODEC_NONE, 0, &identical) <= 1e-6);
    assert_true(identical);
    /* fp4: the exact rounds (the end of training) send the values as they
     * are; the regular ones carry fp4's error (|err| <= scale per block,
     * up to a sixth of a block's largest value) */
    assert_true(mix_k_rounds(CODEC_FP4, 1, &identical) <= 1e-6);
    assert_true(identical);
    assert_true(mix_k_rounds(CODEC_FP4, 0, &identical) > 1e-3);
}

static void test_round_waits_on_partner_only(void **state)
{
    (void)state;
    if (N < 4) skip();
    World w;
    setup(&w, 1, CODEC_NONE);
    if (me < 2) { /* learners 0 and 1 mix; the others never call anything */
        ExchangeReport rep;
        mix_pair(&w, 0, me ^ 1, 0.5, 0.5, 1, &rep);
        assert_int_equal(rep.accepted_sites, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* only the test synchronises, after the round */
    teardown(&w);
}

static void test_spread_probe(void **state)
{
    (void)state;
    const float rows[] = {0, 0, 2, 0, 1, 3}; /* mean (1,1): distances sqrt2, 1, 2; |mean| sqrt2 */
    assert_true(fabs(spread_max_rel_distance(rows, NULL, 3, 2) - sqrt(2.0)) < 1e-12);
    const double wt[] = {1, 2, 1}; /* mean (1.25, 0.75): row 3 is farthest, |(-.25, 2.25)| / |(1.25, .75)| */
    assert_true(fabs(spread_max_rel_distance(rows, wt, 3, 2) - sqrt(5.125 / 2.125)) < 1e-12);
    World w;
    setup(&w, 1, CODEC_NONE);
    /* the samples come from a backend's weights, as in training */
    Coll learner;
    assert_int_equal(coll_init(&learner, w.topo.learner_comm), 0);
    Backend *be = NULL;
    assert_int_equal(backend_create(&be, &w.cfg, 1, 0, w.cfg.model.experts, &learner), 0);
    for (size_t i = 0; i < w.m.n_params; i++) w.m.params[i] = (float)(me + 1);
    const size_t all = 0, n = w.m.n_params;
    assert_int_equal(be->ops->put(be, STATE_PARAMS, &all, &n, 1, w.m.params), 0);
    Spread s;
    assert_int_equal(spread_create(&s, &w.topo, &w.m, &w.link, NULL), 0);
    if (me == 0) { /* first: nobody else has sent; this must not wait */
        assert_int_equal(spread_round(&s, 0, 10, be, NULL), 0);
        assert_int_equal(s.last_round, N > 1 ? -1 : 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me != 0) assert_int_equal(spread_round(&s, 0, 10, be, NULL), 0);
    assert_int_equal(spread_finish(&s, NULL), 0);
    if (me == 0) {
        assert_int_equal(s.last_round, 0);
        assert_true(fabs(s.last_value - (double)(N - 1) / (N + 1)) < 1e-12);
    }
    spread_destroy(&s);
    backend_destroy(be);
    teardown(&w);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    if (me != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairing),
        cmocka_unit_test(test_exact_mean_after_k_rounds),
        cmocka_unit_test(test_round_waits_on_partner_only),
        cmocka_unit_test(test_spread_probe),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
