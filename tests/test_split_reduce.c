/* test_split_reduce.c — the site reduction with the experts split across
 * sites ([outer] experts = split), under mpirun with 3 or 4 ranks, two
 * sites in one job:
 *   3 ranks: site a one learner of 1 rank (experts 0-1), site b two
 *            learners of 1 rank (experts 2-3);
 *   4 ranks: site a one learner of 2 ranks (experts 0-1, one a rank),
 *            site b two learners of 1 rank (experts 2-3).
 * Sites have unequal tokens per step (micro_batch 3 against 1). Every
 * learner stages its owned chunks of both fragments, pre-scaled by its
 * run-wide token share as outer.c does, two rounds each, with codec none
 * and with int8 and error feedback. After each reduce:
 *   - a dense chunk is the sum over every learner (site sums in learner
 *     order, then sites in site order: bit for bit with codec none; with
 *     int8 within the codec's error of the run-wide weighted average);
 *   - an expert chunk is the site's own learners' sum divided by the
 *     site's token share, bit for bit with either codec (never encoded),
 *     close to their token-weighted average, and at site a (one learner)
 *     its own value up to rounding;
 *   - a router chunk, with expert_routing = local, takes column e from the
 *     site owning expert e: that site's sum over its share (bit for bit
 *     with codec none, the owner's token-weighted average within the
 *     codec's error with int8), the same at every site; with drop it is a
 *     dense chunk like any other (run once more with codec none);
 *   - the bytes this rank sent and received on the link are the dense
 *     frames only, worked out here from the chunk sizes, the dense owners
 *     (plan.h's greedy rule, again) and the codec's encoded sizes, plus
 *     one verdict frame per peer; the report's payload bytes are the
 *     site's dense frames; the error-feedback residuals of expert chunks
 *     stay zero.
 * Every rank checks its own result; the count of failures is summed.
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

#include "codec.h"
#include "config.h"
#include "link.h"
#include "model.h"
#include "payload.h"
#include "reduce.h"
#include "rng.h"
#include "shard.h"
#include "topology.h"
#include "plan_ref.h"

enum { P = 2, ROUNDS = 2 };

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

/* Learner l's value of chunk c, element i, in round `round`. */
static float value(int round, int l, int c, size_t i)
{
    return (float)rng_normal(4200 + (uint64_t)round, (uint64_t)l, ((uint64_t)c << 32) | i);
}

/* The frames rank j of a learner of G sends, for fragment f, to the ranks
 * of another site's learner of Go: a header and the encoded dense chunks
 * both own, per rank with any. *peers: how many. */
static double frames(const ChunkTable *ct, const int *own_g, const int *own_o, int Go, int j, int f, Codec codec,
                     CodecParams cp, int *peers)
{
    double bytes = 0;
    *peers = 0;
    for (int jo = 0; jo < Go; jo++) {
        size_t enc = 0;
        for (int c = 0; c < ct->n_chunks; c++)
            if (ct->chunks[c].fragment == f && ct->chunks[c].expert < 0 && own_g[c] == j && own_o[c] == jo)
                enc += codec_encoded_size(codec, ct->chunks[c].size, cp);
        if (enc) bytes += (double)(sizeof(LinkHeader) + enc), ++*peers;
    }
    return bytes;
}

static void run(const char *codec_name, const char *routing)
{
    char codec_key[64], routing_key[64];
    snprintf(codec_key, sizeof codec_key, "outer.codec=%s", codec_name);
    snprintf(routing_key, sizeof routing_key, "outer.expert_routing=%s", routing);
    const int by_owner = !strcmp(routing, "local");
    const int four = n_ranks == 4;
    const char *over[] = {"site.a.ranks=1", "site.a.learner_ranks=1", "site.a.micro_batch=3", "site.a.experts=0-1",
                          "site.b.ranks=2", "site.b.learner_ranks=1", "site.b.micro_batch=1", "site.b.experts=2-3",
                          "outer.mode=diloco", "outer.experts=split", codec_key, "outer.error_feedback=on",
                          "outer.timeout=20", "model.layers=2", "model.dim=32", "model.ffn=32", "model.experts=4",
                          "model.top_k=1", routing_key};
    if (four) over[0] = "site.a.ranks=2", over[1] = "site.a.learner_ranks=2";
    Config cfg;
    assert_int_equal(config_load_text(&cfg, "", "t", over, (int)(sizeof over / sizeof *over)), 0);
    Topology t;
    assert_int_equal(topology_create(&t, &cfg, MPI_COMM_WORLD), 0);
    assert_true(t.experts_split);
    assert_int_equal(t.router_by_owner, by_owner);
    Model m;
    model_describe(&m, &cfg.model, t.expert_begin, t.experts_local);
    const Codec codec = (Codec)codec_from_name(codec_name);
    const CodecParams cp = config_codec_params(&cfg.outer);
    Link link;
    link_init(&link, MPI_COMM_WORLD, 20, t.sites[t.site].name);
    PayloadCodec pc;
    payload_codec_init(&pc, codec, cp, 1, 0);
    Shard shard;
    assert_int_equal(shard_create(&shard, &t, &m, P, &pc), 0);
    StopBallot ballot;
    stop_ballot_init(&ballot);
    Reducer r;
    assert_int_equal(reducer_create(&r, &shard, &link, &ballot, MPI_COMM_WORLD), 0);
    const ChunkTable *ct = &shard.table;
    const SiteInfo *site = &t.sites[t.site];
    const int S = t.n_sites;
    /* token shares, from the layout */
    double wl[8], ws[2];
    for (int s = 0; s < S; s++) {
        ws[s] = t.sites[s].tokens_per_step * t.sites[s].learners / t.total_tokens_per_step;
        for (int l = 0; l < t.sites[s].learners; l++)
            wl[t.sites[s].first_learner + l] = t.sites[s].tokens_per_step / t.total_tokens_per_step;
    }
    /* the frames expected on the link, from the chunk sizes and the codec */
    int *own_of[2];
    for (int s = 0; s < S; s++) {
        own_of[s] = malloc(sizeof(int) * (size_t)ct->n_chunks);
        assert_non_null(own_of[s]);
        greedy_dense(ct, t.sites[s].learner_ranks, own_of[s]);
    }
    const int leader = t.learner == site->first_learner, o = 1 - t.site;
    double want_sent = 0, want_site[P] = {0}, replicated = 0;
    for (int f = 0; f < P; f++) {
        int peers;
        for (int j = 0; j < site->learner_ranks; j++)
            want_site[f] += frames(ct, own_of[t.site], own_of[o], t.sites[o].learner_ranks, j, f, codec, cp, &peers);
        const double mine = frames(ct, own_of[t.site], own_of[o], t.sites[o].learner_ranks, t.learner_rank, f, codec,
                                   cp, &peers);
        if (leader) want_sent += mine + peers * (double)(sizeof(LinkHeader) + REDUCE_VERDICT_BYTES(S));
    }
    for (int c = 0; c < ct->n_chunks; c++) replicated += (double)codec_encoded_size(codec, ct->chunks[c].size, cp);
    want_sent *= ROUNDS;

    for (int round = 0; round < ROUNDS; round++)
        for (int f = 0; f < P; f++) {
            const Owned *own = shard_owned(&shard, f);
            float *mine = reduce_stage(&r, f);
            assert_non_null(mine);
            const float w = (float)wl[t.learner];
            for (int k = 0; k < own->n; k++)
                for (size_t i = 0; i < ct->chunks[own->chunk[k]].size; i++)
                    mine[own->off[k] + i] = value(round, t.learner, own->chunk[k], i) * w;
            assert_int_equal(reduce_start_staged(&r, f), 0);
            ExchangeReport rep;
            float *res = NULL;
            assert_int_equal(reduce_finish_staged(&r, f, &rep, &res), 0);
            EXPECT(rep.accepted_sites == S, "fragment %d: %d sites accepted (%s)", f, rep.accepted_sites, rep.rejected);
            EXPECT(rep.payload_bytes == want_site[f], "fragment %d: the site's payload bytes %.0f, want %.0f (dense "
                   "frames)", f, rep.payload_bytes, want_site[f]);
            double peak = 0;
            for (int k = 0; k < own->n; k++) {
                const int c = own->chunk[k], e = ct->chunks[c].expert;
                for (size_t i = 0; i < ct->chunks[c].size; i++) {
                    float sums[2];
                    double avg = 0, site_avg = 0;
                    for (int s = 0; s < S; s++) {
                        sums[s] = 0.0f;
                        for (int l = t.sites[s].first_learner; l < t.sites[s].first_learner + t.sites[s].learners; l++) {
                            sums[s] += value(round, l, c, i) * (float)wl[l];
                            avg += wl[l] * value(round, l, c, i);
                            if (s == t.site) site_avg += wl[l] / ws[s] * value(round, l, c, i);
                        }
                    }
                    const float got = res[own->off[k] + i];
                    const int col_site = (int)(i % (size_t)cfg.model.experts) < t.sites[1].expert_begin ? 0 : 1;
                    if (by_owner && ct->chunks[c].tensor == T_ROUTER) {
                        double owner_avg = 0;
                        for (int l = t.sites[col_site].first_learner;
                             l < t.sites[col_site].first_learner + t.sites[col_site].learners; l++)
                            owner_avg += wl[l] / ws[col_site] * value(round, l, c, i);
                        if (codec == CODEC_NONE) {
                            const float want = sums[col_site] / (float)ws[col_site];
                            EXPECT(!memcmp(&got, &want, sizeof got), "router chunk %d [%zu] (expert %d of site %d): "
                                   "%.9g, want %.9g (the owner's sum / its share)", c, i,
                                   (int)(i % (size_t)cfg.model.experts), col_site, got, want);
                        }
                        EXPECT(fabs(got - owner_avg) <= (codec == CODEC_NONE ? 1e-5 : 0.1) * (1 + fabs(owner_avg)),
                               "router chunk %d [%zu]: %.9g, the owner site's average %.9g", c, i, got, owner_avg);
                    } else if (e >= 0) {
                        EXPECT(e >= site->expert_begin && e < site->expert_begin + site->experts,
                               "owns expert %d of another site", e);
                        const float want = sums[t.site] / (float)ws[t.site];
                        EXPECT(!memcmp(&got, &want, sizeof got), "expert %d chunk %d [%zu]: %.9g, want %.9g (the "
                               "site's sum / its share)", e, c, i, got, want);
                        EXPECT(fabs(got - site_avg) <= 1e-5 * (1 + fabs(site_avg)), "expert %d: %.9g, the site's "
                               "average %.9g", e, got, site_avg);
                        if (site->learners == 1) {
                            const float x = value(round, t.learner, c, i);
                            EXPECT(fabsf(got - x) <= 2e-7f * fabsf(x) + 1e-30f, "one learner's expert %d: %.9g, "
                                   "its own %.9g", e, got, x);
                        }
                    } else if (codec == CODEC_NONE) {
                        const float want = 0.0f + sums[0] + sums[1];
                        EXPECT(!memcmp(&got, &want, sizeof got), "dense chunk %d [%zu]: %.9g, want %.9g", c, i, got,
                               want);
                        EXPECT(fabs(got - avg) <= 1e-5 * (1 + fabs(avg)), "dense: %.9g, the average %.9g", got, avg);
                    } else {
                        peak = fmax(peak, fabs(got - avg));
                    }
                }
            }
            EXPECT(peak <= 0.1, "dense chunks off the weighted average by %.3g under %s", peak, codec_name);
            shard_release(&shard, f);
        }
    /* error feedback: the dense residuals moved, the experts' never did */
    if (codec != CODEC_NONE && leader) {
        double dense = 0, expert = 0;
        for (int c = 0; c < ct->n_chunks; c++) {
            if (!shard_owns(&shard, c)) continue;
            const Chunk *ch = &ct->chunks[c];
            const float *res = shard_residual_at(&shard, ch->tensor, ch->layer, ch->expert);
            EXPECT(res != NULL, "no residual for owned chunk %d", c);
            for (size_t i = 0; res && i < ch->size; i++) *(ch->expert < 0 ? &dense : &expert) += fabs(res[i]);
        }
        EXPECT(expert == 0.0, "expert residuals %.3g: an expert was encoded", expert);
        EXPECT(dense > 0.0 || want_sent == 0, "dense residuals all zero under %s", codec_name);
    }
    const LinkCounters lc = link_counters(&link);
    EXPECT(lc.bytes_sent == want_sent, "%s: sent %.0f bytes on the link, want %.0f (dense frames + verdicts; all "
           "chunks would encode to %.0f a round)", codec_name, lc.bytes_sent, want_sent, replicated);
    EXPECT(lc.bytes_recv == want_sent, "%s: received %.0f bytes, want %.0f", codec_name, lc.bytes_recv, want_sent);
    if (me == 0)
        printf("# %s, %d ranks: rank 0 sent %.0f bytes in %d rounds; the whole model encodes to "
               "%.0f a round\n", codec_name, n_ranks, lc.bytes_sent, ROUNDS, replicated);
    for (int s = 0; s < S; s++) free(own_of[s]);
    link_forget_keys(&link);
    shard_destroy(&shard, !reducer_destroy(&r));
    topology_destroy(&t);
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_split_reduce(void **state)
{
    (void)state;
    assert_true(n_ranks == 3 || n_ranks == 4);
    run("none", "local");
    run("int8", "local");
    run("none", "drop");
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_split_reduce)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return rc;
}
