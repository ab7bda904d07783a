/* test_expert_copies.c — split experts' copies ([outer] expert_replicas =
 * 2), under mpirun with 4 ranks, two sites in one job: site a one learner
 * of 2 ranks (experts 0-1, one a rank), site b two learners of 1 rank
 * (experts 2-3, both on each). Every rank's backend holds weights that
 * change each round; three refreshes, with codec none and with fp4:
 *   - the initial weights of a chunk from model_init_expert_chunk are
 *     model_init's (the copies' and mirrors' starting point);
 *   - each expert of the other site is copied on exactly one rank of a
 *     site's first learner (copies_place), none on site b's second
 *     learner, and no site copies its own;
 *   - after each refresh the owner's mirror of each expert is its holder's
 *     copy, bit for bit, and a copy is, bit for bit, what an independent
 *     replay of the rule gives (start from the initial weights; each
 *     refresh adds decode(encode(weights - copy))); with codec none it is
 *     the owner's weights up to rounding, with fp4 within fp4's error of
 *     that refresh's difference;
 *   - the bytes each rank sent and received are one frame per expert
 *     tensor and pair of ranks with anything between them: header + the
 *     encoded chunks, worked out here from the placement rule;
 *   - the whole model's assembly with site b marked lost (site a alone
 *     calls it): whole, nothing crosses, and the writer's expert chunks of
 *     b are its copies; without a refresh, not whole.
 * Every rank checks its own part; the failures are summed.
 */
#include <float.h>
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

#include "assemble.h"
#include "backend_choose.h"
#include "codec.h"
#include "coll.h"
#include "config.h"
#include "expert_copies.h"
#include "link.h"
#include "model.h"
#include "plan.h"
#include "rng.h"
#include "topology.h"

enum { ROUNDS = 3 };

static int me, n_ranks;
static long bad;

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            if (bad++ < 8) {                                                                                           \
                fprintf(stderr, "rank %d: ", me);                                                                      \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fputc('\n', stderr);                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

/* The weight of expert chunk c's element i in round r (any rank can say). */
static float weight(int r, int c, size_t i) { return (float)(0.05 * rng_normal(9100 + (uint64_t)r, (uint64_t)c, i)); }

static int tensor_end(const ChunkTable *ct, int T) { return T + 1 < N_TENSORS ? ct->first[T + 1] : ct->n_chunks; }

static void run(const char *codec_name)
{
    char codec_key[64];
    snprintf(codec_key, sizeof codec_key, "outer.codec=%s", codec_name);
    const char *over[] = {"site.a.ranks=2", "site.a.learner_ranks=2", "site.a.experts=0-1", "site.b.ranks=2",
                          "site.b.learner_ranks=1", "site.b.experts=2-3", "outer.mode=diloco", "outer.experts=split",
                          "outer.expert_replicas=2", "outer.expert_refresh=1", codec_key, "outer.timeout=20",
                          "model.layers=2", "model.dim=32", "model.ffn=32", "model.experts=4", "model.top_k=1"};
    Config cfg;
    assert_int_equal(config_load_text(&cfg, "", "t", over, (int)(sizeof over / sizeof *over)), 0);
    Topology t;
    assert_int_equal(topology_create(&t, &cfg, MPI_COMM_WORLD), 0);
    Model m;
    assert_int_equal(model_create(&m, &cfg.model, t.expert_begin, t.experts_local), 0);
    model_init(&m);
    ChunkTable ct;
    assert_int_equal(chunk_table_create(&ct, &m, 1), 0);
    chunk_table_set_experts(&ct, t.sites[t.site].expert_begin, t.sites[t.site].experts);
    const int E = cfg.model.experts, first = t.learner == t.sites[t.site].first_learner;
    const Codec codec = (Codec)codec_from_name(codec_name);
    const CodecParams cp = config_codec_params(&cfg.outer);
    size_t most = 0;
    for (int c = 0; c < ct.n_chunks; c++)
        if (ct.chunks[c].size > most) most = ct.chunks[c].size;
    float *tmp = malloc(sizeof(float) * most), *want = malloc(sizeof(float) * most);
    unsigned char *enc = malloc(codec_encoded_size(codec, most, cp));
    assert_non_null(tmp);
    assert_non_null(want);
    assert_non_null(enc);

    /* the initial weights, two ways */
    for (int c = 0; c < ct.n_chunks; c++) {
        const Chunk *ch = &ct.chunks[c];
        if (ch->expert < 0 || !chunk_held(&ct, c)) continue;
        model_init_expert_chunk(&m, (TensorId)ch->tensor, ch->layer, ch->expert, tmp);
        EXPECT(!memcmp(tmp, m.params + chunk_offset(&ct, c), ch->size * sizeof(float)),
               "chunk %d (expert %d): model_init_expert_chunk differs from model_init", c, ch->expert);
    }

    Coll learner;
    assert_int_equal(coll_init(&learner, t.learner_comm), 0);
    Backend *be = NULL;
    assert_int_equal(backend_create(&be, &cfg, 1, t.expert_begin, t.experts_local, &learner), 0);
    Link link;
    link_init(&link, MPI_COMM_WORLD, 20, t.sites[t.site].name);
    ExpertCopies x;
    assert_int_equal(copies_create(&x, &cfg, &t, &ct), 0);
    EXPECT(x.on && x.replicas == 2 && x.every == cfg.outer.inner_steps, "copies: on %d, r %d, every %ld", x.on,
           x.replicas, x.every);

    /* placement: each expert of the other site on one rank of my first learner */
    int held[8] = {0};
    for (int c = 0; c < ct.n_chunks; c++) {
        const int e = ct.chunks[c].expert;
        if (e < 0 || !copies_chunk(&x, c)) continue;
        EXPECT(first, "a copy on a rank outside the site's first learner (chunk %d)", c);
        EXPECT(topology_expert_site(&t, e) != t.site, "a copy of my own site's expert %d", e);
        /* the rule (the i-th of the n experts outside the site, on rank i * G / n), for this layout: site a's
         * two ranks copy experts 2 and 3 one each, site b's one rank both 0 and 1 */
        const int want_rank = t.site == 0 ? e - 2 : 0;
        EXPECT(t.learner_rank == want_rank && copies_place(&t, t.site, E, e) == want_rank, "expert %d copied on rank "
               "%d, want %d", e, t.learner_rank, want_rank);
        if (ct.chunks[c].tensor == T_W_GATE && ct.chunks[c].layer == 0) held[e] = 1;
    }
    int sum[8];
    MPI_Allreduce(held, sum, 8, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int e = 0; e < E; e++) EXPECT(sum[e] == 1, "expert %d copied on %d ranks, want 1", e, sum[e]);

    /* the replay: every copy this rank holds, from the initial weights */
    float **replay = calloc((size_t)ct.n_chunks, sizeof(float *));
    assert_non_null(replay);
    for (int c = 0; c < ct.n_chunks; c++)
        if (copies_chunk(&x, c)) {
            const Chunk *ch = &ct.chunks[c];
            replay[c] = malloc(sizeof(float) * ch->size);
            assert_non_null(replay[c]);
            model_init_expert_chunk(&m, (TensorId)ch->tensor, ch->layer, ch->expert, replay[c]);
        }

    /* the frames expected: per expert tensor, pair of first-learner ranks */
    double want_sent = 0, want_recv = 0;
    for (int T = 0; T < N_TENSORS; T++) {
        if (!(m.tensors[T].flags & PARAM_EXPERT) || !first) continue;
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < t.sites[s].learner_ranks; k++)
                for (int to = 0; to < t.sites[1 - s].learner_ranks; to++) {
                    const int from = t.sites[s].first_rank + k, dest = t.sites[1 - s].first_rank + to;
                    size_t bytes = 0;
                    for (int c = ct.first[T]; c < tensor_end(&ct, T); c++) {
                        const int e = ct.chunks[c].expert;
                        if (topology_expert_site(&t, e) == s && copies_sender(&t, s, E, e) == from &&
                            copies_place(&t, 1 - s, E, e) == to)
                            bytes += codec_encoded_size(codec, ct.chunks[c].size, cp);
                    }
                    if (!bytes) continue;
                    if (from == t.world_rank) want_sent += (double)(sizeof(LinkHeader) + bytes);
                    if (dest == t.world_rank) want_recv += (double)(sizeof(LinkHeader) + bytes);
                }
    }

    for (int r = 0; r < ROUNDS; r++) {
        for (int c = 0; c < ct.n_chunks; c++)
            if (ct.chunks[c].expert >= 0 && chunk_held(&ct, c))
                for (size_t i = 0; i < ct.chunks[c].size; i++) m.params[chunk_offset(&ct, c) + i] = weight(r, c, i);
        const size_t all = 0, n = m.n_params;
        assert_int_equal(be->ops->put(be, STATE_PARAMS, &all, &n, 1, m.params), 0);
        const long step = x.every * (r + 1); /* refreshes come every `every` steps: their frames' ids from it */
        assert_int_equal(copies_refresh(&x, &link, &t, &ct, be, step), 0);
        EXPECT(x.refreshes == r + 1 && x.step == step && x.mirror_step == step && x.live_refreshes[1 - t.site] == r + 1,
               "refresh %d: count %d step %ld mirror step %ld live %d", r, x.refreshes, x.step, x.mirror_step,
               x.live_refreshes[1 - t.site]);
        double err = 0, diff = 0;
        for (int c = 0; c < ct.n_chunks; c++) {
            const float *copy = copies_chunk(&x, c);
            if (!copy) continue;
            const size_t size = ct.chunks[c].size;
            for (size_t i = 0; i < size; i++) want[i] = weight(r, c, i) - replay[c][i];
            assert_int_equal(codec_encode(codec, want, size, cp, enc), 0);
            assert_int_equal(codec_decode(codec, enc, size, cp, tmp), 0);
            for (size_t i = 0; i < size; i++) {
                diff += (double)want[i] * want[i];
                const float prev = replay[c][i];
                replay[c][i] += tmp[i];
                const double off = (double)copy[i] - weight(r, c, i);
                err += off * off;
                /* codec none: (w - prev) then prev + that, two roundings of
                 * at most half an ulp of their results */
                if (codec == CODEC_NONE)
                    EXPECT(fabs(off) <= FLT_EPSILON * (fabs(weight(r, c, i)) + fabs(prev)), "chunk %d [%zu]: copy "
                           "%.9g, the owner's %.9g", c, i, copy[i], weight(r, c, i));
            }
            EXPECT(!memcmp(copy, replay[c], size * sizeof(float)), "refresh %d: chunk %d's copy is not the replay's", r,
                   c);
        }
        /* the owner's mirror is, bit for bit, the holder's copy (r = 2: one of each per expert chunk) */
        uint64_t *sums = calloc((size_t)2 * (size_t)ct.n_chunks, sizeof(uint64_t));
        assert_non_null(sums);
        for (int c = 0; c < ct.n_chunks; c++) {
            if (x.mirror && x.mirror[c]) sums[c] = checksum64(x.mirror[c], ct.chunks[c].size * sizeof(float));
            if (copies_chunk(&x, c)) sums[ct.n_chunks + c] = checksum64(copies_chunk(&x, c), ct.chunks[c].size * sizeof(float));
        }
        MPI_Allreduce(MPI_IN_PLACE, sums, 2 * ct.n_chunks, MPI_UINT64_T, MPI_BOR, MPI_COMM_WORLD);
        for (int c = 0; c < ct.n_chunks; c++)
            EXPECT(ct.chunks[c].expert < 0 || (sums[c] && sums[c] == sums[ct.n_chunks + c]), "refresh %d: chunk %d: "
                   "the owner's mirror is not the holder's copy", r, c);
        free(sums);
        if (codec == CODEC_FP4 && diff > 0)
            EXPECT(sqrt(err / diff) <= 0.25, "refresh %d: the copy off its owner by %.3g of the difference sent", r,
                   sqrt(err / diff));
    }
    const LinkCounters lc = link_counters(&link);
    EXPECT(lc.bytes_sent == ROUNDS * want_sent, "%s: sent %.0f bytes, want %.0f", codec_name, lc.bytes_sent,
           ROUNDS * want_sent);
    EXPECT(lc.bytes_recv == ROUNDS * want_recv, "%s: received %.0f bytes, want %.0f", codec_name, lc.bytes_recv,
           ROUNDS * want_recv);
    EXPECT(x.bytes == lc.bytes_sent + lc.bytes_recv, "the copies counted %.0f bytes, the link %.0f", x.bytes,
           lc.bytes_sent + lc.bytes_recv);

    /* the whole model with site b lost: a's writer takes b's experts from its copies */
    MPI_Barrier(MPI_COMM_WORLD);
    if (t.site == 0) {
        link_survive(&link, 1);
        link_mark_lost(&link, 1, "the test", 0.0);
        const double before = x.bytes;
        Assembly a;
        assert_int_equal(assembly_gather(&a, &link, &t, &ct, be, &x, 0), 0);
        EXPECT(a.whole && a.from_copy[1] && !a.from_copy[0] && a.copy_step[1] == x.every * ROUNDS, "assembly: whole %d, "
               "from copy %d/%d, step %ld", a.whole, a.from_copy[0], a.from_copy[1], a.copy_step[1]);
        EXPECT(a.bytes == 0 && x.bytes == before, "assembly from the writer's own copies moved %.0f bytes", a.bytes);
        for (int c = 0; c < ct.n_chunks; c++) {
            const int e = ct.chunks[c].expert;
            if (e < 0 || topology_expert_site(&t, e) != 1) continue;
            const float *got = assembly_chunk(&a, c);
            const int mine = copies_place(&t, 0, E, e) == t.learner_rank;
            EXPECT(mine ? got == copies_chunk(&x, c) : got == NULL, "chunk %d (expert %d): %p, the copy %p", c, e,
                   (const void *)got, (const void *)copies_chunk(&x, c));
        }
        assembly_free(&a);
        /* no refresh yet: not whole */
        ExpertCopies none = x;
        none.live_refreshes[1] = 0;
        assert_int_equal(assembly_gather(&a, &link, &t, &ct, be, &none, 0), 0);
        EXPECT(!a.whole && a.lost_site == 1, "assembly without a refresh: whole %d, lost %d", a.whole, a.lost_site);
        assembly_free(&a);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        printf("# %s: rank 0 sent %.0f bytes in %d refreshes (its share of its site's experts, encoded)\n", codec_name,
               lc.bytes_sent, ROUNDS);
    for (int c = 0; c < ct.n_chunks; c++) free(replay[c]);
    free(replay);
    free(tmp);
    free(want);
    free(enc);
    copies_destroy(&x);
    link_forget_keys(&link);
    backend_destroy(be);
    chunk_table_destroy(&ct);
    model_destroy(&m);
    topology_destroy(&t);
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_expert_copies(void **state)
{
    (void)state;
    assert_int_equal(n_ranks, 4);
    run("none");
    run("fp4");
    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (all) print_error("%ld check(s) failed over the ranks\n", all);
    assert_int_equal(all, 0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    if (me != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_expert_copies)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return rc;
}
