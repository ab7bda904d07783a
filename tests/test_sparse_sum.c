/* test_sparse_sum.c — run under mpirun with 3 ranks: three sites of one
 * rank, outer.codec = topk. Each site stages known values for fragment 0;
 * the reducer's result must equal, bit for bit, the sum this test computes
 * itself from every site's own encoding (codec_encode_ef with the site's
 * error-feedback residual, chunk by chunk, in the reducer's order):
 *   exchange 1  topk_mean = all:      sum over sites in site order
 *   exchange 2  topk_mean = senders:  each value over the token share of
 *               the sites that sent it (-0.0 marks "sent, decoded to 0")
 *   exchange 3  all, site c's payload corrupted on the way: every site
 *               leaves c out and re-weights a and b by 1 / (w_a + w_b)
 *   exchange 4  senders, c corrupted: only a's and b's senders count
 * Every rank checks every element; the count of mismatches, summed over
 * ranks, decides.
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
#include "codec_topk.h"
#include "config.h"
#include "link.h"
#include "model.h"
#include "payload.h"
#include "reduce.h"
#include "rng.h"
#include "shard.h"
#include "topology.h"

enum { SITES = 3, EXCHANGES = 4 };

static void test_sparse_sums_match_a_direct_sum(void **state)
{
    (void)state;
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    assert_int_equal(n, SITES);
    const char *over[] = {"site.a.ranks=1", "site.b.ranks=1", "site.c.ranks=1", "outer.mode=diloco",
                          "outer.codec=topk", "outer.topk_chunk=64", "outer.topk_k=3", "outer.timeout=20",
                          "model.layers=2", "model.dim=32", "model.ffn=32", "model.experts=2", "model.top_k=1"};
    Config cfg;
    assert_int_equal(config_load_text(&cfg, "", "t", over, (int)(sizeof over / sizeof *over)), 0);
    Topology topo;
    assert_int_equal(topology_create(&topo, &cfg, MPI_COMM_WORLD), 0);
    Model m;
    assert_int_equal(model_create(&m, &cfg.model, 0, cfg.model.experts), 0);
    const CodecParams cp = config_codec_params(&cfg.outer);
    Link link;
    link_init(&link, MPI_COMM_WORLD, 20, topo.sites[topo.site].name);
    PayloadCodec pc;
    payload_codec_init(&pc, CODEC_TOPK, cp, 1, 0);
    Shard shard;
    assert_int_equal(shard_create(&shard, &topo, &m, 1, &pc), 0);
    StopBallot ballot;
    stop_ballot_init(&ballot);
    Reducer r;
    assert_int_equal(reducer_create(&r, &shard, &link, &ballot, MPI_COMM_WORLD), 0);
    const Owned *own = shard_owned(&shard, 0);
    const size_t size = own->size;
    /* every site's values and residuals, as every rank can compute them */
    float *x = malloc(sizeof(float) * size * SITES), *res = calloc(size * SITES, sizeof(float));
    float *dec = malloc(sizeof(float) * size * SITES), *want = malloc(sizeof(float) * size);
    unsigned char *enc = malloc(codec_encoded_size(CODEC_TOPK, own->max_chunk, cp) + 16);
    assert_true(x && res && dec && want && enc);
    long bad = 0;
    for (int ex = 1; ex <= EXCHANGES; ex++) {
        const int senders = ex % 2 == 0, corrupt = ex >= 3;
        shard.codec.sender_mean = senders;
        link.corrupt_exchange = corrupt && me == 2 ? ex : 0;
        for (int s = 0; s < SITES; s++)
            for (size_t i = 0; i < size; i++) /* some exact zeros: a value sent may decode to 0 */
                x[(size_t)s * size + i] = i % 11 == 4 ? 0.0f : (float)rng_normal(100 + (uint64_t)ex, (uint64_t)s, i);
        for (int s = 0; s < SITES; s++)
            for (int k = 0; k < own->n; k++) {
                const size_t off = (size_t)s * size + own->off[k];
                double e2, n2;
                const size_t cn = shard.table.chunks[own->chunk[k]].size;
                assert_int_equal(codec_encode_ef(CODEC_TOPK, x + off, res + off, cn, cp, enc, dec + off, &e2, &n2), 0);
            }
        const int in[SITES] = {1, 1, !corrupt};
        double wsum = 0.0;
        for (int s = 0; s < SITES; s++)
            if (in[s]) wsum += r.site_weight[s];
        const float rescale = corrupt ? (float)(1.0 / wsum) : 1.0f;
        for (size_t i = 0; i < size; i++) { /* as reduce.c sums: site order, float */
            float sum = 0.0f, w = 0.0f;
            for (int s = 0; s < SITES; s++) {
                const float v = dec[(size_t)s * size + i];
                if (!in[s]) continue;
                if (senders && codec_topk_sent(v)) sum += v, w += (float)r.site_weight[s];
                else if (!senders) sum += v;
            }
            want[i] = senders ? (w > 0.0f ? sum / w : 0.0f) : rescale == 1.0f ? sum : sum * rescale;
        }
        float *mine = reduce_stage(&r, 0);
        assert_non_null(mine);
        memcpy(mine, x + (size_t)me * size, sizeof(float) * size);
        assert_int_equal(reduce_start_staged(&r, 0), 0);
        ExchangeReport rep;
        float *result = NULL;
        assert_int_equal(reduce_finish_staged(&r, 0, &rep, &result), 0);
        assert_int_equal(rep.accepted_sites, corrupt ? 2 : 3);
        if (corrupt && me != 2) assert_non_null(strstr(rep.rejected, "c: failed authentication"));
        for (size_t i = 0; i < size; i++) bad += memcmp(&result[i], &want[i], sizeof(float)) != 0;
        shard_release(&shard, 0);
    }
    long all_bad = 0;
    MPI_Allreduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (all_bad) print_error("%ld element(s) differ from the direct sums\n", all_bad);
    assert_int_equal(all_bad, 0);
    free(x), free(res), free(dec), free(want), free(enc);
    link_forget_keys(&link);
    shard_destroy(&shard, !reducer_destroy(&r));
    model_destroy(&m);
    topology_destroy(&topo);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sparse_sums_match_a_direct_sum)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return rc;
}
