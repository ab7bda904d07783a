/* test_model.c — whole-model checks of the CPU backend against the naive
 * double-precision reference (refmodel.c):
 *  - forward loss equals the reference, training (capacity, aux, z) and eval;
 *  - every parameter's gradient equals a central finite difference of the
 *    reference loss, with the router, capacity drops and auxiliary losses;
 *  - an all-zero embedding predicts uniformly (loss ln 256 exactly);
 *  - router semantics: top-k ties, capacity overflow, experts without tokens;
 *  - AdamW on runs (the optimiser state sharded over a learner): inside the
 *    runs bit for bit the update of the whole model, outside untouched.
 *
 * Tolerances: float32 forward/backward carries relative rounding of ~1e-6
 * per operation, accumulated over sums of at most a few hundred terms here;
 * the double-precision central difference with step 1e-6 has truncation
 * error ~1e-12 and rounding ~1e-10. An element passes when
 * |g - fd| <= 1e-3 * max|fd| + 1e-7, and the whole vector must satisfy
 * ||g - fd|| <= 1e-4 ||fd||: a wrong term (a missing factor, a wrong index)
 * gives errors of order 1, far above either bound.
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

#include "cpu/blas_select.h"
#include "coll.h"
#include "model.h"
#include "cpu/moe.h"
#include "route_draw.h"
#include "route_plan.h"
#include "cpu/optim.h"
#include "refmodel.h"
#include "rng.h"
#include "testmodel.h"
#include "cpu/transformer.h"
#include "../cuda/acts_plan.h" /* plain arithmetic: the GPU's memory plan */

static Coll self; /* a learner of one rank */

static void make_batch(int *tokens, int *targets, int N, uint64_t seed)
{
    for (int t = 0; t < N; t++) {
        tokens[t] = (int)(rng_bits(seed, 1, (uint64_t)t) % 256);
        targets[t] = (int)(rng_bits(seed, 2, (uint64_t)t) % 256);
    }
}

typedef struct {
    long dropped;
    int skipped;       /* parameters skipped: a +-eps step changed routing */
    double max_err, rel_err;
} GradReport;

static void gradient_check(const ModelConfig *cfg, int B, int T, uint64_t seed, GradReport *rep)
{
    Model m;
    Activations a;
    assert_int_equal(model_create(&m, cfg, 0, cfg->experts), 0);
    assert_int_equal(acts_create(&a, cfg, B, T, &self, RECOMPUTE_NONE), 0);
    test_randomize(&m, seed, 0);
    const int N = B * T;
    int *tokens = malloc(sizeof(int) * N), *targets = malloc(sizeof(int) * N);
    make_batch(tokens, targets, N, seed);

    ForwardStats st;
    assert_int_equal(transformer_forward(&m, &a, tokens, targets, B, T, 1, &st), 0);
    assert_int_equal(transformer_backward(&m, &a, tokens, targets, 1.0f), 0);
    const double loss = st.ce_sum / st.n_targets + st.aux_loss + st.z_loss;
    rep->dropped = st.dropped;

    double *p = malloc(sizeof(double) * m.n_params);
    for (size_t i = 0; i < m.n_params; i++) p[i] = m.params[i];
    uint64_t sig0;
    const double ref = ref_model_loss(&m, p, tokens, targets, B, T, 1, &sig0, NULL);
    assert_true(fabs(loss - ref) <= 1e-5 * fabs(ref));

    /* finite differences over every parameter */
    double *fd = calloc(m.n_params, sizeof(double));
    double max_fd = 0;
    rep->skipped = 0;
    for (int ti = 0; ti < N_TENSORS; ti++) {
        const Tensor *t = &m.tensors[ti];
        for (size_t j = 0; j < t->numel; j++) {
            size_t i = t->offset + j;
            const double eps = 1e-6, keep = p[i];
            uint64_t sp, sm;
            p[i] = keep + eps;
            double lp = ref_model_loss(&m, p, tokens, targets, B, T, 1, &sp, NULL);
            p[i] = keep - eps;
            double lm = ref_model_loss(&m, p, tokens, targets, B, T, 1, &sm, NULL);
            p[i] = keep;
            if (sp != sig0 || sm != sig0) { /* routing flipped: not differentiable here */
                fd[i] = NAN;
                rep->skipped++;
                continue;
            }
            fd[i] = (lp - lm) / (2 * eps);
            if (fabs(fd[i]) > max_fd) max_fd = fabs(fd[i]);
        }
    }
    double diff2 = 0, norm2 = 0;
    rep->max_err = 0;
    for (int ti = 0; ti < N_TENSORS; ti++) {
        const Tensor *t = &m.tensors[ti];
        for (size_t j = 0; j < t->numel; j++) {
            size_t i = t->offset + j;
            if (isnan(fd[i])) continue;
            double e = fabs(m.grads[i] - fd[i]);
            if (e > 1e-3 * max_fd + 1e-7)
                print_error("tensor %s element %zu: analytic %.9g, finite difference %.9g\n", t->name,
                            j, m.grads[i], fd[i]);
            assert_true(e <= 1e-3 * max_fd + 1e-7);
            if (e > rep->max_err) rep->max_err = e;
            diff2 += e * e;
            norm2 += fd[i] * fd[i];
        }
    }
    rep->rel_err = sqrt(diff2 / norm2);
    assert_true(rep->rel_err < 1e-4);
    assert_true(rep->skipped < (int)(m.n_params / 100));
    free(fd);
    free(p);
    free(tokens);
    free(targets);
    acts_destroy(&a);
    model_destroy(&m);
}

static void test_gradients_with_capacity_drops(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    GradReport r;
    gradient_check(&c, 2, 6, 11, &r);
    assert_true(r.dropped > 0); /* the capacity path was exercised */
}

static void test_gradients_without_drops(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.capacity_factor = 4.0;
    c.top_k = 1;
    GradReport r;
    gradient_check(&c, 2, 5, 12, &r);
    assert_int_equal(r.dropped, 0);
}

/* Experts that receive no token get an exactly zero gradient, and the rest
 * of the model is still right. 8 experts, top-1, 3 tokens: at least 5 idle. */
static void test_expert_without_tokens(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    c.experts = 8;
    c.top_k = 1;
    c.layers = 1;
    c.capacity_factor = 8.0;
    GradReport r;
    gradient_check(&c, 1, 3, 13, &r);

    Model m;
    Activations a;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    assert_int_equal(acts_create(&a, &c, 1, 3, &self, RECOMPUTE_NONE), 0);
    test_randomize(&m, 13, 0);
    int tokens[3], targets[3];
    make_batch(tokens, targets, 3, 13);
    ForwardStats st;
    assert_int_equal(transformer_forward(&m, &a, tokens, targets, 1, 3, 1, &st), 0);
    assert_int_equal(transformer_backward(&m, &a, tokens, targets, 1.0f), 0);
    const MoeRouting *route = &a.route[0];
    int idle = 0;
    for (int e = 0; e < c.experts; e++) {
        if (route->expert_start[e + 1] != route->expert_start[e]) continue;
        idle++;
        const size_t DF = (size_t)c.dim * c.ffn;
        for (size_t j = 0; j < DF; j++) {
            assert_true(model_grad(&m, T_W_GATE, 0)[e * DF + j] == 0.0f);
            assert_true(model_grad(&m, T_W_UP, 0)[e * DF + j] == 0.0f);
            assert_true(model_grad(&m, T_W_DOWN, 0)[e * DF + j] == 0.0f);
        }
    }
    assert_true(idle >= 5);
    acts_destroy(&a);
    model_destroy(&m);
}

/* Evaluation mode: no capacity, no auxiliary losses, equal to the reference. */
static void test_eval_forward_matches_reference(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    Model m;
    Activations a;
    const int B = 2, T = 6, N = B * T;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    assert_int_equal(acts_create(&a, &c, B, T, &self, RECOMPUTE_NONE), 0);
    test_randomize(&m, 21, 0);
    int tokens[12], targets[12];
    make_batch(tokens, targets, N, 21);
    targets[3] = -1; /* unscored position */
    ForwardStats st;
    assert_int_equal(transformer_forward(&m, &a, tokens, targets, B, T, 0, &st), 0);
    assert_int_equal(st.dropped, 0);
    assert_int_equal(st.n_targets, N - 1);
    double *p = malloc(sizeof(double) * m.n_params);
    for (size_t i = 0; i < m.n_params; i++) p[i] = m.params[i];
    double ref = ref_model_loss(&m, p, tokens, targets, B, T, 0, NULL, NULL);
    assert_true(fabs(st.ce_sum / st.n_targets - ref) <= 1e-5 * ref);
    free(p);
    acts_destroy(&a);
    model_destroy(&m);
}

/* x = 0 everywhere: norms give 0, attention and experts give 0, logits are
 * all 0, so every byte has probability 1/256. */
static void test_zero_embedding_is_uniform(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(6, 7);
    Model m;
    Activations a;
    assert_int_equal(model_create(&m, &c, 0, c.experts), 0);
    assert_int_equal(acts_create(&a, &c, 2, 6, &self, RECOMPUTE_NONE), 0);
    model_init(&m);
    memset(model_param(&m, T_EMBED, 0), 0, m.tensors[T_EMBED].numel * sizeof(float));
    int tokens[12], targets[12];
    make_batch(tokens, targets, 12, 3);
    ForwardStats st;
    assert_int_equal(transformer_forward(&m, &a, tokens, targets, 2, 6, 0, &st), 0);
    for (int t = 0; t < 12; t++) assert_true(a.losses[t] == logf(256.0f));
    assert_true(fabs(st.ce_sum / st.n_targets - log(256.0)) < 1e-6);
    acts_destroy(&a);
    model_destroy(&m);
}

static void test_topk_ties_go_to_lower_index(void **state)
{
    (void)state;
    const float probs[3 * 4] = {0.25f, 0.25f, 0.25f, 0.25f, /* all tied */
                                0.1f, 0.3f, 0.3f, 0.3f,     /* tie among 1,2,3 */
                                0.4f, 0.1f, 0.4f, 0.1f};    /* tie 0/2 then 1/3 */
    int choice[3 * 3];
    router_topk(choice, probs, 3, 4, 3);
    const int want[9] = {0, 1, 2, 1, 2, 3, 0, 2, 1};
    for (int i = 0; i < 9; i++) assert_int_equal(choice[i], want[i]);
}

/* The reference order: probability descending, then index ascending. */
static const float *topk_probs;
static int by_prob_then_index(const void *x, const void *y)
{
    const int a = *(const int *)x, b = *(const int *)y;
    if (topk_probs[a] != topk_probs[b]) return topk_probs[a] > topk_probs[b] ? -1 : 1;
    return a - b;
}

/* route_topk.h (the GPU kernel's code, compiled here) through router_topk
 * against a sort, on random probabilities drawn from a few levels so that
 * most tokens hold ties, for every K from 1 to E. */
static void test_topk_against_sort(void **state)
{
    (void)state;
    enum { N = 200, EMAX = 16 };
    static float probs[N * EMAX];
    static int choice[N * EMAX];
    unsigned seed = 7;
    int tied = 0;
    for (int E = 1; E <= EMAX; E++)
        for (int K = 1; K <= E; K++) {
            for (int i = 0; i < N * E; i++) {
                seed = seed * 1103515245u + 12345u;
                probs[i] = (float)((seed >> 16) % 5) / 8.0f; /* 5 levels */
            }
            router_topk(choice, probs, N, E, K);
            for (int t = 0; t < N; t++) {
                int order[EMAX];
                for (int e = 0; e < E; e++) order[e] = e;
                topk_probs = probs + (size_t)t * E;
                qsort(order, (size_t)E, sizeof(int), by_prob_then_index);
                for (int k = 0; k < K; k++) assert_int_equal(choice[t * K + k], order[k]);
                tied += K < E && topk_probs[order[K - 1]] == topk_probs[order[K]];
            }
        }
    assert_true(tied > 1000); /* the ties at the K-th place that decide which expert goes */
}

static void test_capacity_overflow_in_arrival_order(void **state)
{
    (void)state;
    enum { N = 5, E = 3, K = 2 };
    /* one rank: copies in copy order (token 0 k0, token 0 k1, token 1 k0, ...) */
    const int choice[N * K] = {0, 1, 0, 2, 0, 1, 0, 1, 2, 1};
    const int cnt[E] = {4, 4, 2}; /* the rank's histogram: the learner's count matrix */
    int send_copy[N * K], copy_slot[N * K], send_counts[1], pos[4 * E], recv_counts[1];
    int recv_row[N * K], row_src[N * K], start[E + 1], dropped;
    assert_int_equal(moe_capacity(1.0, N, K, E), 4); /* ceil(1.0*5*2/3) */
    /* expert 0 chosen by copies 0,2,4,6: 4,6 dropped; expert 1 by 1,5,7,9:
     * 7,9 dropped; expert 2 by 3,8: both kept. Kept copies first, by
     * expert, then the dropped ones by expert */
    int remote;
    assert_int_equal(moe_send_plan(send_copy, copy_slot, send_counts, pos, choice, cnt, N, K, 1, E, 0, 2, 0, E, &remote),
                     6);
    assert_int_equal(send_counts[0], 6);
    assert_int_equal(remote, 0);
    const int slot[N * K] = {0, 2, 1, 4, 6, 3, 7, 8, 5, 9};
    for (int i = 0; i < N * K; i++) {
        assert_int_equal(copy_slot[i], slot[i]);
        assert_int_equal(send_copy[slot[i]], i);
    }
    assert_int_equal(moe_recv_count(recv_counts, cnt, 1, E, 0, 2), 6);
    assert_int_equal(moe_owner_plan(recv_row, row_src, start, &dropped, cnt, 1, E, 0, 2), 6);
    assert_int_equal(dropped, 4);
    const int want_start[E + 1] = {0, 2, 4, 6};
    for (int e = 0; e <= E; e++) assert_int_equal(start[e], want_start[e]);
    for (int a = 0; a < 6; a++) { /* one rank: arrivals are already grouped by expert */
        assert_int_equal(recv_row[a], a);
        assert_int_equal(row_src[a], a);
    }
    /* evaluation: no capacity, nothing dropped */
    assert_int_equal(moe_send_plan(send_copy, copy_slot, send_counts, pos, choice, cnt, N, K, 1, E, 0, -1, 0, E, &remote),
                     N * K);
    assert_int_equal(moe_owner_plan(recv_row, row_src, start, &dropped, cnt, 1, E, 0, -1), N * K);
    assert_int_equal(dropped, 0);
}

/* The plan every rank derives from the count matrix (route_plan.h, used by
 * moe.c on the host, per copy on a GPU) against the capacity rule applied
 * directly: every source sends every copy to its expert's owner (grouped by
 * destination, copy order inside); the owner takes them in (source rank,
 * position) order and each expert keeps its first `cap`, grouped into rows
 * in that order. Random routings (skewed, so that capacity bites), G ranks
 * of El experts, with and without capacity. */
static void test_plan_against_direct_rule(void **state)
{
    (void)state;
    enum { GMAX = 4, ELMAX = 3, N = 13, K = 2, EMAX = GMAX * ELMAX, C = N * K };
    unsigned seed = 12345;
    int checked_drops = 0;
    for (int trial = 0; trial < 60; trial++) {
        const int G = 1 + trial % GMAX, El = 1 + (trial / GMAX) % ELMAX, E = G * El;
        if (E < K) continue;
        const int cap = trial % 5 == 4 ? -1 : 1 + trial % 7;
        int choice[GMAX][C], cnt[GMAX * EMAX] = {0};
        for (int s = 0; s < G; s++) route_draw(choice[s], cnt + s * E, N, K, E, &seed);
        /* the direct rule: arrivals at each owner, capacity in arrival order */
        int want_row[GMAX][C]; /* row at the owner, -1 dropped */
        int want_rows[GMAX] = {0}, want_dropped[GMAX] = {0};
        for (int d = 0; d < G; d++) {
            int seen[ELMAX] = {0}, start[ELMAX + 1] = {0}, used[ELMAX] = {0};
            for (int s = 0; s < G; s++) /* pass 1: how many each expert keeps */
                for (int i = 0; i < C; i++)
                    if (choice[s][i] / El == d) {
                        if (cap < 0 || seen[choice[s][i] % El] < cap) seen[choice[s][i] % El]++;
                        else want_dropped[d]++;
                    }
            for (int el = 0; el < El; el++) start[el + 1] = start[el] + seen[el];
            for (int s = 0; s < G; s++) /* pass 2: rows, arrival order inside each expert */
                for (int i = 0; i < C; i++) {
                    const int e = choice[s][i], el = e % El;
                    if (e / El != d) continue;
                    want_row[s][i] = used[el] < seen[el] ? start[el] + used[el]++ : -1;
                }
            want_rows[d] = start[El];
            checked_drops += want_dropped[d];
        }
        /* the plan */
        int send_copy[GMAX][C], copy_slot[GMAX][C], send_counts[GMAX][GMAX], n_sent[GMAX], pos[4 * EMAX];
        for (int s = 0; s < G; s++) {
            int remote;
            n_sent[s] = moe_send_plan(send_copy[s], copy_slot[s], send_counts[s], pos, choice[s], cnt, N, K, G, El,
                                      s, cap, 0, E, &remote);
            int sent = 0;
            for (int d = 0; d < G; d++) sent += send_counts[s][d];
            assert_int_equal(sent, n_sent[s]);
        }
        for (int d = 0; d < G; d++) {
            int recv_counts[GMAX], recv_row[GMAX * C], row_src[GMAX * C], start[ELMAX + 1], dropped;
            const int n_recv = moe_recv_count(recv_counts, cnt, G, El, d, cap);
            assert_int_equal(moe_owner_plan(recv_row, row_src, start, &dropped, cnt, G, El, d, cap), n_recv);
            assert_int_equal(n_recv, want_rows[d]);
            assert_int_equal(dropped, want_dropped[d]);
            for (int row = 0; row < n_recv; row++) assert_int_equal(recv_row[row_src[row]], row);
            /* the per-arrival form a GPU computes, from the owner's counts */
            int counts2[GMAX], start2[ELMAX + 1], dropped2;
            assert_int_equal(route_owner_counts(cnt, G, El, d, cap, counts2, start2, &dropped2), n_recv);
            assert_int_equal(dropped2, dropped);
            for (int el = 0; el <= El; el++) assert_int_equal(start2[el], start[el]);
            for (int q = 0; q < G; q++) assert_int_equal(counts2[q], recv_counts[q]);
            for (int a = 0; a < n_recv; a++)
                assert_int_equal(route_arrival_row(cnt, G, El, d, cap, counts2, start2, a), recv_row[a]);
            for (int s = 0, base = 0; s < G; base += recv_counts[s++]) {
                assert_int_equal(recv_counts[s], send_counts[s][d]);
                int offset = 0; /* where s's rows for d start among its slots */
                for (int q = 0; q < d; q++) offset += send_counts[s][q];
                for (int i = 0; i < C; i++) {
                    const int e = choice[s][i];
                    if (e / El != d) continue;
                    const int slot = copy_slot[s][i];
                    int p = 0; /* the copy's position among s's copies of e: the per-copy form a GPU computes */
                    for (int j = 0; j < i; j++) p += choice[s][j] == e;
                    assert_int_equal(route_copy_slot(cnt, E, s, e, p, cap), slot);
                    if (want_row[s][i] < 0) {
                        assert_true(slot >= n_sent[s]);
                        continue;
                    }
                    assert_true(slot >= offset && slot < offset + send_counts[s][d]);
                    assert_int_equal(recv_row[base + slot - offset], want_row[s][i]);
                    assert_int_equal(route_row(cnt, G, E, El, d, s, e % El, p, cap), want_row[s][i]);
                }
            }
        }
    }
    assert_true(checked_drops > 100); /* the capacity rule was exercised */
}

/* Runs that cross tensor boundaries, leave gaps and end at the last
 * parameter: three AdamW steps equal the whole model's, element for
 * element, in the weights and in the packed moments; weights outside the
 * runs keep their values. */
static void test_adamw_runs_match_whole(void **state)
{
    (void)state;
    const ModelConfig cfg = test_model_config(8, 7);
    Model whole, part;
    assert_int_equal(model_create(&whole, &cfg, 0, cfg.experts), 0);
    assert_int_equal(model_create(&part, &cfg, 0, cfg.experts), 0);
    test_randomize(&whole, 11, 0);
    const size_t n = whole.n_params;
    for (size_t j = 0; j < n; j++) whole.grads[j] = (float)(0.01 * sin((double)j));
    memcpy(part.params, whole.params, n * sizeof(float));
    memcpy(part.grads, whole.grads, n * sizeof(float));
    const size_t t1 = whole.tensors[1].offset; /* a boundary between tensors */
    assert_true(t1 > 40 && t1 + 200 < n);
    const size_t off[3] = {3, t1 - 5, t1 + 100}, len[3] = {t1 - 20, 40, n - (t1 + 100)};
    AdamW a, b;
    const size_t all = 0;
    assert_int_equal(adamw_create(&a, &all, &n, 1), 0);
    assert_int_equal(adamw_create(&b, off, len, 3), 0);
    assert_int_equal(b.runs.total, len[0] + len[1] + len[2]);
    for (int step = 0; step < 3; step++) {
        adamw_step(&a, &whole, 1e-2, 0.1);
        adamw_step(&b, &part, 1e-2, 0.1);
    }
    float *orig = malloc(n * sizeof(float));
    assert_non_null(orig);
    Model fresh;
    assert_int_equal(model_create(&fresh, &cfg, 0, cfg.experts), 0);
    test_randomize(&fresh, 11, 0);
    memcpy(orig, fresh.params, n * sizeof(float));
    model_destroy(&fresh);
    size_t in_runs = 0, changed = 0;
    for (size_t j = 0; j < n; j++) {
        int r = -1;
        for (int k = 0; k < 3; k++)
            if (j >= off[k] && j < off[k] + len[k]) r = k;
        if (r < 0) {
            assert_memory_equal(&part.params[j], &orig[j], sizeof(float));
            continue;
        }
        const size_t at = b.runs.packed[r] + (j - off[r]);
        assert_memory_equal(&part.params[j], &whole.params[j], sizeof(float));
        assert_memory_equal(&b.m[at], &a.m[j], sizeof(float));
        assert_memory_equal(&b.v[at], &a.v[j], sizeof(float));
        changed += part.params[j] != orig[j];
        in_runs++;
    }
    assert_int_equal(in_runs, b.runs.total);
    assert_true(changed > in_runs / 2); /* the update happened (alignment padding stays 0) */
    /* overlapping runs are refused */
    AdamW bad;
    const size_t bo[2] = {0, 4}, bl[2] = {5, 2};
    assert_int_not_equal(adamw_create(&bad, bo, bl, 2), 0);
    free(orig);
    adamw_destroy(&a);
    adamw_destroy(&b);
    model_destroy(&whole);
    model_destroy(&part);
}

/* The GPU's expert-row plan (acts_plan.h) in fp32 is the CPU's: the same
 * buffers grown by the same rule; in bf16 the rows' x and h take 2 bytes
 * of their 4, i.e. (D + F) * 2 bytes less per grown row and kept layer. */
static void test_gpu_expert_rows_plan(void **state)
{
    (void)state;
    ModelConfig c = test_model_config(16, 1);
    const double ns[] = {0.0, 1.0, 37.5, 1000.0, 123457.0};
    for (int recompute = 0; recompute < 2; recompute++)
        for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
            const int kept = cuda_acts_kept_layers(c.layers, recompute);
            const double cpu = acts_expert_row_bytes(&c, ns[i], recompute ? RECOMPUTE_LAYER : RECOMPUTE_NONE);
            const double gpu32 = cuda_expert_row_bytes(kept, c.dim, c.ffn, ns[i], 0);
            const double gpu16 = cuda_expert_row_bytes(kept, c.dim, c.ffn, ns[i], 1);
            const size_t rows = (size_t)ns[i], grown = rows + rows / 4 + 64;
            assert_true(gpu32 == cpu);
            assert_true(gpu32 - gpu16 == (double)kept * (double)grown * (c.dim + c.ffn) * 2.0);
        }
}

int main(int argc, char **argv)
{
    blas_select_reexec(argv); /* test the kernels production uses */
    MPI_Init(&argc, &argv);
    coll_init(&self, MPI_COMM_SELF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_ties_go_to_lower_index),
        cmocka_unit_test(test_capacity_overflow_in_arrival_order),
        cmocka_unit_test(test_plan_against_direct_rule),
        cmocka_unit_test(test_topk_against_sort),
        cmocka_unit_test(test_adamw_runs_match_whole),
        cmocka_unit_test(test_zero_embedding_is_uniform),
        cmocka_unit_test(test_eval_forward_matches_reference),
        cmocka_unit_test(test_gradients_with_capacity_drops),
        cmocka_unit_test(test_gradients_without_drops),
        cmocka_unit_test(test_expert_without_tokens),
        cmocka_unit_test(test_gpu_expert_rows_plan),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
