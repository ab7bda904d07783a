/* test_route.c — the MoE layer's routing when the learner holds only the
 * experts [b, b + Es) of the model's E (split experts, model.h's
 * RoutePolicy), on one rank (test_expert_parallel.c: several):
 *  - ROUTE_LOCAL and ROUTE_DROP over every expert are ROUTE_ALL, bit for bit;
 *  - ROUTE_LOCAL is, bit for bit, a model of Es experts whose router is the
 *    column slice [b, b + Es) and whose experts are the same weights: the
 *    losses, the statistics and every gradient (the router's other columns
 *    exactly zero), training with capacity drops and evaluation;
 *  - the masked top-k (the router's local columns, softmax, top-k) against
 *    a sort of the full row's logits restricted to the range, ties to the
 *    lower index;
 *  - the dispatch plan with copies to experts held elsewhere: they take the
 *    last slots in copy order and are never sent;
 *  - ROUTE_DROP and ROUTE_LOCAL: every gradient against central finite
 *    differences of the double-precision reference (refmodel.c, which
 *    routes from the policies' definitions), and remote_dropped against a
 *    direct count of the top-k choices outside the range and the
 *    reference's count; a zero router with b >= top_k drops every copy;
 *  - train.recompute = layer (each layer routed again before its
 *    backward) gives the same bits; bad routings are refused in one line.
 *
 * Tolerances (finite differences): as test_model.c's — float32 rounding
 * ~1e-6 relative per operation over sums of a few hundred terms, against a
 * double central difference (step 1e-6: truncation ~1e-12, rounding
 * ~1e-10): an element passes at |g - fd| <= 1e-3 max|fd| + 1e-7, the
 * vector at ||g - fd|| <= 1e-4 ||fd||; a wrong term is off by order 1.
 * Everything else is compared bit for bit.
 */
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
#include "cpu/layers.h"
#include "cpu/moe.h"
#include "cpu/transformer.h"
#include "model.h"
#include "refmodel.h"
#include "rng.h"
#include "testmodel.h"

static Coll self; /* a learner of one rank */

static void make_batch(int *tokens, int *targets, int N, uint64_t seed)
{
    for (int t = 0; t < N; t++) {
        tokens[t] = (int)(rng_bits(seed, 1, (uint64_t)t) % 256);
        targets[t] = (int)(rng_bits(seed, 2, (uint64_t)t) % 256);
    }
}

/* A model of cfg's experts holding [b, b + Es), routed by `policy`,
 * randomised (testmodel.c: canonical values, so any two models agree on
 * what they share). */
static void split_model(Model *m, Activations *a, const ModelConfig *cfg, int b, int Es, RoutePolicy policy, int B,
                        int T, uint64_t seed, int zero_router)
{
    assert_int_equal(model_create(m, cfg, b, Es), 0);
    assert_int_equal(model_set_route(m, policy, b), 0);
    assert_int_equal(acts_create(a, cfg, B, T, &self, RECOMPUTE_NONE), 0);
    test_randomize(m, seed, zero_router);
}

/* One training forward and backward (or an evaluation forward). */
static void run(Model *m, Activations *a, const int *tokens, const int *targets, int B, int T, int training,
                ForwardStats *st)
{
    memset(m->grads, 0, m->n_params * sizeof(float));
    assert_int_equal(transformer_forward(m, a, tokens, targets, B, T, training, st), 0);
    if (training) assert_int_equal(transformer_backward(m, a, tokens, targets, 1.0f), 0);
}

static void same_stats(const ForwardStats *x, const ForwardStats *y)
{
    assert_true(x->ce_sum == y->ce_sum);
    assert_true(x->aux_loss == y->aux_loss);
    assert_true(x->z_loss == y->z_loss);
    assert_int_equal(x->n_targets, y->n_targets);
    assert_int_equal(x->dropped, y->dropped);
    assert_int_equal(x->remote_dropped, y->remote_dropped);
}

/* ROUTE_LOCAL and ROUTE_DROP over the whole range take ROUTE_ALL's path:
 * the same bits, training (with capacity drops) and evaluation. */
static void test_full_range_is_route_all(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    const int B = 2, T = 6, N = B * T;
    int tokens[12], targets[12];
    make_batch(tokens, targets, N, 31);
    Model m0, m1;
    Activations a0, a1;
    split_model(&m0, &a0, &c, 0, c.experts, ROUTE_ALL, B, T, 31, 0);
    for (int policy = ROUTE_LOCAL; policy <= ROUTE_DROP; policy++)
        for (int training = 0; training <= 1; training++) {
            split_model(&m1, &a1, &c, 0, c.experts, (RoutePolicy)policy, B, T, 31, 0);
            ForwardStats s0, s1;
            run(&m0, &a0, tokens, targets, B, T, training, &s0);
            run(&m1, &a1, tokens, targets, B, T, training, &s1);
            same_stats(&s0, &s1);
            assert_true(!training || s0.dropped > 0);
            assert_int_equal(s1.remote_dropped, 0);
            assert_memory_equal(a0.losses, a1.losses, sizeof(float) * N);
            assert_memory_equal(m0.grads, m1.grads, sizeof(float) * m0.n_params);
            acts_destroy(&a1);
            model_destroy(&m1);
        }
    acts_destroy(&a0);
    model_destroy(&m0);
}

/* ROUTE_LOCAL over [b, b + Es) of E = 8 against a model of Es = 4 experts:
 * its router the column slice, its experts the same weights. */
static void test_local_is_model_of_its_experts(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 8;
    const int Es = 4, B = 2, T = 6, N = B * T, L = c.layers, D = c.dim;
    ModelConfig cs = c;
    cs.experts = Es;
    int tokens[12], targets[12];
    make_batch(tokens, targets, N, 41);
    const int begins[3] = {0, 3, 4}; /* both ends and an unaligned middle */
    for (int i = 0; i < 3; i++) {
        const int b = begins[i];
        Model m, s;
        Activations a, as;
        split_model(&m, &a, &c, b, Es, ROUTE_LOCAL, B, T, 41 + b, 0);
        assert_int_equal(model_create(&s, &cs, 0, Es), 0);
        assert_int_equal(acts_create(&as, &cs, B, T, &self, RECOMPUTE_NONE), 0);
        for (int t = 0; t < N_TENSORS; t++) { /* the same weights; the router's columns [b, b + Es) */
            const Tensor *x = &m.tensors[t];
            if (t != T_ROUTER) {
                assert_int_equal(x->numel, s.tensors[t].numel);
                memcpy(s.params + s.tensors[t].offset, m.params + x->offset, x->numel * sizeof(float));
                continue;
            }
            for (int l = 0; l < L; l++)
                for (int r = 0; r < D; r++)
                    memcpy(model_param(&s, T_ROUTER, l) + (size_t)r * Es,
                           model_param(&m, T_ROUTER, l) + (size_t)r * c.experts + b, Es * sizeof(float));
        }
        for (int training = 1; training >= 0; training--) {
            ForwardStats sm, ss;
            run(&m, &a, tokens, targets, B, T, training, &sm);
            run(&s, &as, tokens, targets, B, T, training, &ss);
            same_stats(&sm, &ss);
            assert_true(!training || sm.dropped > 0); /* capacity 0.75: the rule was exercised */
            assert_memory_equal(a.losses, as.losses, sizeof(float) * N);
            if (!training) continue;
            for (int t = 0; t < N_TENSORS; t++) {
                const Tensor *x = &m.tensors[t];
                if (t != T_ROUTER) {
                    assert_memory_equal(m.grads + x->offset, s.grads + s.tensors[t].offset, x->numel * sizeof(float));
                    continue;
                }
                for (int l = 0; l < L; l++)
                    for (int r = 0; r < D; r++) {
                        const float *g = model_grad(&m, T_ROUTER, l) + (size_t)r * c.experts;
                        assert_memory_equal(g + b, model_grad(&s, T_ROUTER, l) + (size_t)r * Es, Es * sizeof(float));
                        for (int e = 0; e < c.experts; e++)
                            if (e < b || e >= b + Es) assert_true(g[e] == 0.0f);
                    }
            }
        }
        acts_destroy(&a);
        acts_destroy(&as);
        model_destroy(&m);
        model_destroy(&s);
    }
}

/* The reference order of a token's logits: value descending, index ascending. */
static const float *row_logits;
static int by_logit_then_index(const void *x, const void *y)
{
    const int a = *(const int *)x, b = *(const int *)y;
    if (row_logits[a] != row_logits[b]) return row_logits[a] > row_logits[b] ? -1 : 1;
    return a - b;
}

/* The masked router as the forward runs it — the columns [b, b + Es) of
 * the router (matmul_forward_ldw), their softmax, top-k — on one-hot
 * inputs, so each token's logits are one row of a router drawn from five
 * levels (ties everywhere), against a sort of the row restricted to the
 * range. Every range of E = 9, every K up to Es. */
static void test_masked_topk_against_sort(void **state)
{
    (void)state;
    enum { N = 40, E = 9 };
    static float x[N * N], w[N * E], logits[N * E], probs[N * E], lse[N];
    static int choice[N * E];
    memset(x, 0, sizeof x);
    for (int t = 0; t < N; t++) x[t * N + t] = 1.0f; /* D = N: token t reads router row t */
    unsigned seed = 11;
    for (int i = 0; i < N * E; i++) {
        seed = seed * 1103515245u + 12345u;
        w[i] = (float)((seed >> 16) % 5) - 2.0f;
    }
    int tied = 0;
    for (int b = 0; b < E; b++)
        for (int Es = 1; b + Es <= E; Es++) {
            matmul_forward_ldw(logits, x, w + b, E, N, N, Es);
            router_softmax_forward(probs, lse, logits, N, Es);
            for (int K = 1; K <= Es; K++) {
                router_topk(choice, probs, N, Es, K);
                for (int t = 0; t < N; t++) {
                    int order[E];
                    for (int e = 0; e < Es; e++) order[e] = b + e;
                    row_logits = w + (size_t)t * E;
                    qsort(order, (size_t)Es, sizeof(int), by_logit_then_index);
                    for (int k = 0; k < K; k++) assert_int_equal(choice[t * K + k] + b, order[k]);
                    tied += K < Es && row_logits[order[K - 1]] == row_logits[order[K]];
                }
            }
            for (int t = 0; t < N; t++) { /* renormalised over the range; equal logits, equal bits */
                double sum = 0;
                for (int e = 0; e < Es; e++) {
                    sum += probs[t * Es + e];
                    for (int f = 0; f < Es; f++)
                        if (w[t * E + b + e] == w[t * E + b + f]) assert_true(probs[t * Es + e] == probs[t * Es + f]);
                }
                assert_true(fabs(sum - 1.0) < 1e-6);
            }
        }
    assert_true(tied > 1000); /* ties at the K-th place decided which expert went */
}

/* Copies to experts held elsewhere: after every copy of the learner's
 * experts (kept, then the capacity's dropped), in copy order; not sent. */
static void test_plan_remote_copies_last(void **state)
{
    (void)state;
    enum { N = 5, K = 2, E = 6, OFF = 2, ES = 3 };
    /* experts 2, 3, 4 held (local 0, 1, 2); 0, 1, 5 elsewhere */
    const int choice[N * K] = {2, 0, 3, 2, 5, 2, 1, 4, 2, 3};
    const int cnt[ES] = {4, 2, 1}; /* the learner's counts of its own experts */
    int send_copy[N * K], copy_slot[N * K], send_counts[1], pos[4 * E], remote;
    /* capacity 2: expert 2 keeps copies 0, 3 and drops 5, 8 */
    assert_int_equal(moe_send_plan(send_copy, copy_slot, send_counts, pos, choice, cnt, N, K, 1, ES, 0, 2, OFF, E,
                                   &remote), 5);
    assert_int_equal(remote, 3);
    assert_int_equal(send_counts[0], 5);
    /* kept: e2 {0,3} -> 0,1; e3 {2,9} -> 2,3; e4 {7} -> 4; dropped e2 {5,8} -> 5,6; remote {1,4,6} -> 7,8,9 */
    const int slot[N * K] = {0, 7, 2, 1, 8, 5, 9, 4, 6, 3};
    for (int i = 0; i < N * K; i++) {
        assert_int_equal(copy_slot[i], slot[i]);
        assert_int_equal(send_copy[slot[i]], i);
    }
}

/* Every parameter's gradient against central differences of the reference
 * (which routes as m's policy says); *st: the forward's statistics. */
static void gradient_check(const ModelConfig *cfg, int b, int Es, RoutePolicy policy, int B, int T, uint64_t seed,
                           ForwardStats *st)
{
    Model m;
    Activations a;
    split_model(&m, &a, cfg, b, Es, policy, B, T, seed, 0);
    const int N = B * T;
    int *tokens = malloc(sizeof(int) * N), *targets = malloc(sizeof(int) * N);
    make_batch(tokens, targets, N, seed);
    run(&m, &a, tokens, targets, B, T, 1, st);
    const double loss = st->ce_sum / st->n_targets + st->aux_loss + st->z_loss;

    double *p = malloc(sizeof(double) * m.n_params), *fd = calloc(m.n_params, sizeof(double));
    for (size_t i = 0; i < m.n_params; i++) p[i] = m.params[i];
    uint64_t sig0;
    long remote = 0;
    const double ref = ref_model_loss(&m, p, tokens, targets, B, T, 1, &sig0, &remote);
    assert_true(fabs(loss - ref) <= 1e-5 * fabs(ref));
    assert_int_equal(st->remote_dropped, remote);
    double max_fd = 0;
    int skipped = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        const double eps = 1e-6, keep = p[i];
        uint64_t sp, sm;
        p[i] = keep + eps;
        const double lp = ref_model_loss(&m, p, tokens, targets, B, T, 1, &sp, NULL);
        p[i] = keep - eps;
        const double lm = ref_model_loss(&m, p, tokens, targets, B, T, 1, &sm, NULL);
        p[i] = keep;
        if (sp != sig0 || sm != sig0) { /* a choice flipped: not differentiable here */
            fd[i] = NAN;
            skipped++;
            continue;
        }
        fd[i] = (lp - lm) / (2 * eps);
        max_fd = fmax(max_fd, fabs(fd[i]));
    }
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        if (isnan(fd[i])) continue;
        const double e = fabs(m.grads[i] - fd[i]);
        if (e > 1e-3 * max_fd + 1e-7) print_error("parameter %zu: analytic %.9g, finite difference %.9g\n", i,
                                                  m.grads[i], fd[i]);
        assert_true(e <= 1e-3 * max_fd + 1e-7);
        diff2 += e * e;
        norm2 += fd[i] * fd[i];
    }
    assert_true(sqrt(diff2 / norm2) < 1e-4);
    assert_true(skipped < (int)(m.n_params / 100));
    if (policy == ROUTE_LOCAL) /* the router's columns the learner never read: no gradient */
        for (int l = 0; l < cfg->layers; l++)
            for (int r = 0; r < cfg->dim; r++)
                for (int e = 0; e < cfg->experts; e++)
                    if (e < b || e >= b + Es)
                        assert_true(model_grad(&m, T_ROUTER, l)[(size_t)r * cfg->experts + e] == 0.0f);
    free(p);
    free(fd);
    free(tokens);
    free(targets);
    acts_destroy(&a);
    model_destroy(&m);
}

/* E = 6, the learner holds [2, 5): ROUTE_DROP drops the copies to 0, 1, 5. */
static void test_drop_gradients(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 6;
    ForwardStats st;
    gradient_check(&c, 2, 3, ROUTE_DROP, 2, 6, 51, &st);
    assert_true(st.remote_dropped > 0 && st.dropped > 0);
    c.capacity_factor = 4.0; /* no capacity drops: the remote ones alone */
    gradient_check(&c, 2, 3, ROUTE_DROP, 2, 5, 52, &st);
    assert_true(st.remote_dropped > 0);
    assert_int_equal(st.dropped, 0);
}

static void test_local_gradients(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 6;
    ForwardStats st;
    gradient_check(&c, 2, 3, ROUTE_LOCAL, 2, 6, 53, &st);
    assert_int_equal(st.remote_dropped, 0);
    assert_true(st.dropped > 0);
}

/* remote_dropped against a count of the top-k of each layer's full
 * softmax (kept per layer) outside [b, b + Es), by a sort; a zero router
 * (every probability tied: experts 0..K-1 chosen) with b >= K: every copy
 * is dropped, the experts see nothing. */
static void test_drop_count(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 8;
    const int b = 3, Es = 4, B = 2, T = 6, N = B * T, K = c.top_k;
    int tokens[12], targets[12];
    make_batch(tokens, targets, N, 61);
    for (int zero = 0; zero <= 1; zero++)
        for (int training = 0; training <= 1; training++) {
            Model m;
            Activations a;
            split_model(&m, &a, &c, b, Es, ROUTE_DROP, B, T, 61, zero);
            ForwardStats st;
            run(&m, &a, tokens, targets, B, T, training, &st);
            long count = 0;
            for (int l = 0; l < c.layers; l++) {
                int layer = 0;
                for (int t = 0; t < N; t++) {
                    int order[8];
                    for (int e = 0; e < c.experts; e++) order[e] = e;
                    row_logits = a.route[l].probs + (size_t)t * c.experts;
                    qsort(order, (size_t)c.experts, sizeof(int), by_logit_then_index);
                    for (int k = 0; k < K; k++) layer += order[k] < b || order[k] >= b + Es;
                }
                assert_int_equal(a.route[l].remote, layer);
                count += layer;
            }
            assert_int_equal(st.remote_dropped, count);
            if (!zero) {
                assert_true(count > 0 && count < (long)c.layers * N * K);
            } else {
                assert_int_equal(count, (long)c.layers * N * K);
                assert_int_equal(st.dropped, 0);
                for (int t = T_W_GATE; t <= T_W_DOWN; t++)
                    for (size_t j = 0; j < m.tensors[t].numel; j++)
                        assert_true(m.grads[m.tensors[t].offset + j] == 0.0f);
            }
            acts_destroy(&a);
            model_destroy(&m);
        }
}

/* train.recompute = layer runs each layer's forward again before its
 * backward (its routing and plan again): the same bits, both policies. */
static void test_recompute_layer_same_bits(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 8;
    const int B = 2, T = 6, N = B * T;
    int tokens[12], targets[12];
    make_batch(tokens, targets, N, 81);
    for (int policy = ROUTE_LOCAL; policy <= ROUTE_DROP; policy++) {
        Model m[2];
        Activations a[2];
        ForwardStats st[2];
        for (int i = 0; i < 2; i++) {
            assert_int_equal(model_create(&m[i], &c, 3, 4), 0);
            assert_int_equal(model_set_route(&m[i], (RoutePolicy)policy, 3), 0);
            assert_int_equal(acts_create(&a[i], &c, B, T, &self, i ? RECOMPUTE_LAYER : RECOMPUTE_NONE), 0);
            test_randomize(&m[i], 81, 0);
            run(&m[i], &a[i], tokens, targets, B, T, 1, &st[i]);
        }
        same_stats(&st[0], &st[1]);
        assert_true(policy == ROUTE_LOCAL || st[0].remote_dropped > 0);
        assert_memory_equal(m[0].grads, m[1].grads, sizeof(float) * m[0].n_params);
        for (int i = 0; i < 2; i++) {
            acts_destroy(&a[i]);
            model_destroy(&m[i]);
        }
    }
}

/* Bad routings: one-line errors, the model unchanged; a model that does
 * not fit the learner is refused by the forward. */
static void test_route_refused(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 8;
    Model m;
    Activations a;
    split_model(&m, &a, &c, 3, 4, ROUTE_LOCAL, 1, 6, 71, 0);
    assert_int_not_equal(model_set_route(&m, ROUTE_ALL, 3), 0);  /* all begins at 0 */
    assert_int_not_equal(model_set_route(&m, ROUTE_DROP, 4), 0); /* after this rank's first expert */
    assert_int_not_equal(model_set_route(&m, (RoutePolicy)7, 3), 0);
    assert_int_equal(m.route, ROUTE_LOCAL);
    assert_int_equal(m.route_begin, 3);
    assert_int_equal(model_route_check(&m, 1, 0), 0);
    assert_int_not_equal(model_route_check(&m, 2, 0), 0); /* 2 x 4 from 3 overruns 8 */
    m.route = ROUTE_ALL;                                 /* 4 of 8 experts */
    int tokens[6], targets[6];
    make_batch(tokens, targets, 6, 71);
    ForwardStats st;
    assert_int_not_equal(transformer_forward(&m, &a, tokens, targets, 1, 6, 1, &st), 0);
    c.top_k = 3;
    Model k;
    assert_int_equal(model_create(&k, &c, 6, 2), 0);
    assert_int_equal(model_set_route(&k, ROUTE_LOCAL, 6), 0);
    assert_int_not_equal(model_route_check(&k, 1, 0), 0); /* top 3 of 2 */
    model_destroy(&k);
    acts_destroy(&a);
    model_destroy(&m);
}

int main(int argc, char **argv)
{
    blas_select_reexec(argv); /* test the kernels production uses */
    MPI_Init(&argc, &argv);
    coll_init(&self, MPI_COMM_SELF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_range_is_route_all),
        cmocka_unit_test(test_local_is_model_of_its_experts),
        cmocka_unit_test(test_masked_topk_against_sort),
        cmocka_unit_test(test_plan_remote_copies_last),
        cmocka_unit_test(test_drop_gradients),
        cmocka_unit_test(test_local_gradients),
        cmocka_unit_test(test_drop_count),
        cmocka_unit_test(test_recompute_layer_same_bits),
        cmocka_unit_test(test_route_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
