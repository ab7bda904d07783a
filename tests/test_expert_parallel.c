/* test_expert_parallel.c — run under mpirun with G ranks (2 and 4): one
 * learner sharding its experts over the ranks must compute exactly what one
 * rank computes on the concatenated batch (rank order = sequence order):
 * the same per-token losses, the same expert gradients at each owner, and
 * dense gradients whose sum over ranks is the single-rank gradient —
 * including capacity drops (arrival order = (source rank, position)), the
 * learner-wide load-balancing statistics and the z-loss.
 * Scenarios: random routing; a zero router (every probability ties, every
 * copy goes to experts 0..k-1 on rank 0: other ranks receive nothing and
 * send nothing to themselves, and capacity overflows); sparse routing with
 * more experts than copies (experts that receive nothing).
 * Split experts (model.h's RoutePolicy): a learner holding [b, b + Es) of
 * E routed ROUTE_LOCAL or ROUTE_DROP, its Es experts sharded over the
 * ranks, against one rank holding the same Es experts with the same policy
 * (and the same copies dropped for being held elsewhere).
 * Each rank computes the single-rank reference itself (MPI_COMM_SELF).
 * Tolerance: float32 with different summation splits, |a-b| <= 2e-5 * max|b|.
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

#include "cpu/blas_select.h"
#include "coll.h"
#include "model.h"
#include "rng.h"
#include "testmodel.h"
#include "cpu/transformer.h"

static Coll world, self;

static double max_abs(const float *v, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(v[i]));
    return m;
}

/* The learner's experts: [b, b + Es) routed by `policy` (ROUTE_ALL: all). */
typedef struct {
    RoutePolicy policy;
    int b, Es;
} Split;

/* returns the largest scaled error seen, agreed over all ranks; *remote_out:
 * the copies dropped for being held elsewhere */
static double compare_split(const ModelConfig *c, int B, uint64_t seed, int zero_router, long *dropped_out,
                            Split sp, long *remote_out)
{
    const int G = world.size, me = world.rank, T = c->context, El = sp.Es / G;
    const int NB = B * G; /* sequences in the whole learner batch */
    Model ref, ep;
    Activations ra, ea;
    assert_int_equal(model_create(&ref, c, sp.b, sp.Es), 0);
    assert_int_equal(model_create(&ep, c, sp.b + me * El, El), 0);
    assert_int_equal(model_set_route(&ref, sp.policy, sp.b), 0);
    assert_int_equal(model_set_route(&ep, sp.policy, sp.b), 0);
    test_randomize(&ref, seed, zero_router);
    test_randomize(&ep, seed, zero_router);
    assert_int_equal(acts_create(&ra, c, NB, T, &self, RECOMPUTE_NONE), 0);
    assert_int_equal(acts_create(&ea, c, B, T, &world, RECOMPUTE_NONE), 0);
    int *tok = malloc(sizeof(int) * NB * T), *tgt = malloc(sizeof(int) * NB * T);
    for (int i = 0; i < NB * T; i++) {
        tok[i] = (int)(rng_bits(seed, 10, (uint64_t)i) % 256);
        tgt[i] = (int)(rng_bits(seed, 11, (uint64_t)i) % 256);
    }
    ForwardStats rs, es;
    assert_int_equal(transformer_forward(&ref, &ra, tok, tgt, NB, T, 1, &rs), 0);
    assert_int_equal(transformer_backward(&ref, &ra, tok, tgt, 1.0f), 0);
    const int *mytok = tok + (size_t)me * B * T, *mytgt = tgt + (size_t)me * B * T;
    assert_int_equal(transformer_forward(&ep, &ea, mytok, mytgt, B, T, 1, &es), 0);
    assert_int_equal(transformer_backward(&ep, &ea, mytok, mytgt, 1.0f / G), 0);

    double err = 0;
    /* per-token losses of my sequences */
    double lscale = max_abs(ra.losses, (size_t)NB * T);
    for (int i = 0; i < B * T; i++)
        err = fmax(err, fabs(ea.losses[i] - ra.losses[(size_t)me * B * T + i]) / lscale);
    /* aux and z: the learner's values are the mean of the ranks' shares */
    double shares[4] = {es.aux_loss, es.z_loss, (double)es.dropped, (double)es.remote_dropped};
    MPI_Allreduce(MPI_IN_PLACE, shares, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    err = fmax(err, fabs(shares[0] / G - rs.aux_loss) / rs.aux_loss);
    err = fmax(err, fabs(shares[1] / G - rs.z_loss) / rs.z_loss);
    assert_int_equal((long)shares[2], rs.dropped);
    assert_int_equal((long)shares[3], rs.remote_dropped);
    *dropped_out = rs.dropped;
    *remote_out = rs.remote_dropped;
    /* dense gradients: sum over ranks */
    MPI_Allreduce(MPI_IN_PLACE, ep.grads, (int)ep.dense_end, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int t = 0; t < T_W_GATE; t++) {
        const Tensor *x = &ref.tensors[t];
        const float *gr = ref.grads + x->offset, *ge = ep.grads + ep.tensors[t].offset;
        double s = max_abs(gr, x->numel) + 1e-12;
        for (size_t j = 0; j < x->numel; j++) err = fmax(err, fabs(ge[j] - gr[j]) / s);
    }
    /* expert gradients: my experts against the same experts of the reference */
    const size_t per = (size_t)c->dim * c->ffn;
    for (int t = T_W_GATE; t <= T_W_DOWN; t++) {
        double s = max_abs(ref.grads + ref.tensors[t].offset, ref.tensors[t].numel) + 1e-12;
        for (int l = 0; l < c->layers; l++)
            for (int e = 0; e < El; e++) {
                const float *gr = model_grad(&ref, (TensorId)t, l) + (size_t)(me * El + e) * per;
                const float *ge = model_grad(&ep, (TensorId)t, l) + (size_t)e * per;
                for (size_t j = 0; j < per; j++) err = fmax(err, fabs(ge[j] - gr[j]) / s);
            }
    }
    MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(tok);
    free(tgt);
    acts_destroy(&ra);
    acts_destroy(&ea);
    model_destroy(&ref);
    model_destroy(&ep);
    return err;
}

static double compare(const ModelConfig *c, int B, uint64_t seed, int zero_router, long *dropped_out)
{
    const Split all = {ROUTE_ALL, 0, c->experts};
    long remote;
    const double err = compare_split(c, B, seed, zero_router, dropped_out, all, &remote);
    assert_int_equal(remote, 0);
    return err;
}

static void test_random_routing_with_overflow(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(5, 3);
    long dropped;
    double err = compare(&c, 2, 5, 0, &dropped);
    assert_true(dropped > 0);
    assert_true(err < 2e-5);
}

static void test_zero_router_everything_to_rank0(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(5, 3);
    c.capacity_factor = 1.0;
    long dropped;
    double err = compare(&c, 2, 6, 1, &dropped);
    /* all N*G*K copies went to experts 0..K-1; each keeps its capacity */
    const long copies = 2L * c.context * world.size * c.top_k;
    const long cap = (long)ceil(1.0 * 2 * c.context * world.size * c.top_k / c.experts);
    assert_int_equal(dropped, c.layers * (copies - c.top_k * cap)); /* per layer */
    assert_true(err < 2e-5);
}

static void test_idle_experts_no_capacity_limit(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(5, 3);
    c.experts = 8;
    c.top_k = 1;
    c.capacity_factor = 16.0;
    long dropped;
    double err = compare(&c, 1, 7, 0, &dropped); /* 5 tokens per rank, 8 experts */
    assert_int_equal(dropped, 0);
    assert_true(err < 2e-5);
}

/* E = 8, the learner holds [2, 6) (2 or 1 per rank over 2 or 4 ranks):
 * the masked router, and the full router dropping the copies to 0, 1, 6,
 * 7; with capacity drops. */
static void test_split_experts(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(5, 3);
    c.experts = 8;
    for (int policy = ROUTE_LOCAL; policy <= ROUTE_DROP; policy++) {
        const Split sp = {(RoutePolicy)policy, 2, 4};
        long dropped, remote;
        double err = compare_split(&c, 2, 8 + policy, 0, &dropped, sp, &remote);
        assert_true(dropped > 0);
        assert_true(policy == ROUTE_LOCAL ? remote == 0 : remote > 0);
        assert_true(err < 2e-5);
    }
}

int main(int argc, char **argv)
{
    blas_select_reexec(argv);
    MPI_Init(&argc, &argv);
    coll_init(&world, MPI_COMM_WORLD);
    coll_init(&self, MPI_COMM_SELF);
    if (world.rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_routing_with_overflow),
        cmocka_unit_test(test_zero_router_everything_to_rank0),
        cmocka_unit_test(test_idle_experts_no_capacity_limit),
        cmocka_unit_test(test_split_experts),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
