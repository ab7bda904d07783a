/* test_split_plan.c — who owns which chunk when the experts are split
 * across sites ([outer] experts = split), against the same layout
 * replicated. One process plays every rank (topology_layout: no MPI):
 *   site a: 4 ranks, learners of 2 (two learners), experts 0-5 (3 a rank);
 *   site b: 2 ranks, one learner of 2, experts 6-7 (1 a rank).
 * Split: a rank's experts are global ids of its site's range; inside a
 * learner each of its site's experts is owned (and held) by exactly one
 * rank, another site's by none (chunk_owner -1); no expert chunk crosses;
 * the dense owners are those of the replicated table (and of the greedy
 * rule worked out here again); the encoded sizes count the dense chunks
 * only. Replicated: the owners and sizes of before (e / (E / G), every
 * chunk encoded). The memory plan holds only the site's experts; the
 * layout banner names each site's range.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "codec.h"
#include "config.h"
#include "memory.h"
#include "model.h"
#include "payload.h"
#include "plan.h"
#include "shard.h"
#include "topology.h"
#include "plan_ref.h"

enum { RANKS = 6, E = 8, P = 2 };

static void load(Config *c, int split)
{
    char text[1024];
    snprintf(text, sizeof text,
             "[model]\nexperts = %d\ntop_k = 1\nlayers = 2\ndim = 32\nffn = 32\n"
             "[outer]\nmode = diloco\ncodec = int8\nerror_feedback = on\nexperts = %s\n"
             "[site.a]\nranks = 4\nlearner_ranks = 2\n%s"
             "[site.b]\nranks = 2\nlearner_ranks = 2\n%s",
             E, split ? "split" : "replicated", split ? "experts = 0-5\n" : "", split ? "experts = 6-7\n" : "");
    assert_int_equal(config_load_text(c, text, "t.ini", NULL, 0), 0);
}

typedef struct {
    Topology t;
    Model m;
    Shard s;
} Rank;

static void make_ranks(const Config *cfg, Rank *r)
{
    PayloadCodec pc;
    payload_codec_init(&pc, CODEC_INT8, config_codec_params(&cfg->outer), 1, 0);
    for (int w = 0; w < RANKS; w++) {
        assert_int_equal(topology_layout(&r[w].t, cfg, RANKS, w), 0);
        model_describe(&r[w].m, &cfg->model, r[w].t.expert_begin, r[w].t.experts_local);
        assert_int_equal(shard_create(&r[w].s, &r[w].t, &r[w].m, P, &pc), 0);
    }
}

static void free_ranks(Rank *r)
{
    for (int w = 0; w < RANKS; w++) shard_destroy(&r[w].s, 0);
}

/* Owned sizes and encoded sizes of every fragment, worked out from the
 * ownership: every owned chunk's values; encoded, only those that cross. */
static void check_sizes(const Rank *r, int split)
{
    const ChunkTable *ct = &r->s.table;
    for (int f = 0; f < P; f++) {
        const Owned *own = shard_owned(&r->s, f);
        size_t size = 0, enc = 0;
        for (int k = 0; k < own->n; k++) {
            const Chunk *ch = &ct->chunks[own->chunk[k]];
            assert_int_equal(ch->fragment, f);
            assert_int_equal(own->off[k], size);
            size += ch->size;
            if (!split || ch->expert < 0) enc += codec_encoded_size(CODEC_INT8, ch->size, r->s.codec.cp);
        }
        assert_int_equal(own->size, size);
        assert_int_equal(own->enc_size, enc);
    }
}

static void test_split_ownership(void **state)
{
    (void)state;
    Config cfg;
    load(&cfg, 1);
    static Rank r[RANKS];
    make_ranks(&cfg, r);
    const int begin[RANKS] = {0, 3, 0, 3, 6, 7}, local[RANKS] = {3, 3, 3, 3, 1, 1};
    for (int w = 0; w < RANKS; w++) {
        assert_true(r[w].t.experts_split);
        assert_int_equal(r[w].t.expert_begin, begin[w]);
        assert_int_equal(r[w].t.experts_local, local[w]);
    }
    assert_int_equal(r[0].t.sites[0].expert_begin, 0);
    assert_int_equal(r[0].t.sites[0].experts, 6);
    assert_int_equal(r[0].t.sites[1].expert_begin, 6);
    assert_int_equal(r[0].t.sites[1].experts, 2);
    /* a replicated table of the same model, for the dense owners */
    Model full;
    model_describe(&full, &cfg.model, 0, E);
    ChunkTable rep;
    assert_int_equal(chunk_table_create(&rep, &full, P), 0);
    int *greedy = malloc(sizeof(int) * (size_t)rep.n_chunks);
    assert_non_null(greedy);
    greedy_dense(&rep, 2, greedy);
    const int learner_first[3] = {0, 2, 4}, learner_site[3] = {0, 0, 1};
    for (int c = 0; c < rep.n_chunks; c++) {
        const int e = rep.chunks[c].expert;
        for (int l = 0; l < 3; l++) {
            const int lo = learner_site[l] ? 6 : 0, n = learner_site[l] ? 2 : 6;
            const int mine = e >= lo && e < lo + n;
            int owners = 0;
            for (int j = 0; j < 2; j++) {
                Rank *x = &r[learner_first[l] + j];
                ChunkTable *ct = &x->s.table;
                assert_int_equal(ct->chunks[c].expert, e); /* the same canonical chunks everywhere */
                const int owner = chunk_owner(ct, c, 2);
                if (e < 0) {
                    assert_int_equal(owner, greedy[c]);
                    assert_int_equal(owner, chunk_owner(&rep, c, 2));
                    assert_true(chunk_crosses(ct, c));
                    assert_true(chunk_held(ct, c));
                    owners += shard_owns(&x->s, c);
                    continue;
                }
                assert_false(chunk_crosses(ct, c)); /* no expert leaves its site */
                assert_int_equal(owner, mine ? (e - lo) / (n / 2) : -1);
                const int held = e >= x->t.expert_begin && e < x->t.expert_begin + x->t.experts_local;
                assert_int_equal(chunk_held(ct, c), held);
                assert_int_equal(shard_owns(&x->s, c), held);
                owners += shard_owns(&x->s, c);
            }
            assert_int_equal(owners, e < 0 || mine ? 1 : 0); /* another site's expert: nobody's */
        }
    }
    for (int w = 0; w < RANKS; w++) check_sizes(&r[w], 1);
    /* a site-a rank's payload for site b's learner (G = 2): dense frames only */
    const Owned *own = shard_owned(&r[0].s, 0);
    size_t want = 0;
    for (int j = 0; j < 2; j++) {
        size_t enc = 0;
        for (int k = 0; k < own->n; k++) {
            const int c = own->chunk[k];
            if (rep.chunks[c].expert < 0 && greedy[c] == j)
                enc += codec_encoded_size(CODEC_INT8, rep.chunks[c].size, r[0].s.codec.cp);
        }
        if (enc) want += sizeof(LinkHeader) + enc;
    }
    assert_true(want > 0);
    assert_int_equal(peers_frame_bytes(&r[0].s.table, own, 2, CODEC_INT8, r[0].s.codec.cp), want);
    free(greedy);
    chunk_table_destroy(&rep);
    free_ranks(r);
}

static void test_replicated_unchanged(void **state)
{
    (void)state;
    Config cfg;
    load(&cfg, 0);
    static Rank r[RANKS];
    make_ranks(&cfg, r);
    for (int w = 0; w < RANKS; w++) {
        const Topology *t = &r[w].t;
        assert_false(t->experts_split);
        assert_int_equal(t->experts_local, E / 2);
        assert_int_equal(t->expert_begin, t->learner_rank * (E / 2));
        for (int s = 0; s < t->n_sites; s++) {
            assert_int_equal(t->sites[s].expert_begin, 0);
            assert_int_equal(t->sites[s].experts, E);
        }
        const ChunkTable *ct = &r[w].s.table;
        int *greedy = malloc(sizeof(int) * (size_t)ct->n_chunks);
        assert_non_null(greedy);
        greedy_dense(ct, 2, greedy);
        for (int c = 0; c < ct->n_chunks; c++) {
            const int e = ct->chunks[c].expert;
            assert_true(chunk_crosses(ct, c));
            /* the owner of before: an expert's shard e / (E / G), the dense greedy */
            const int was = e >= 0 ? e / (E / 2) : greedy[c];
            assert_int_equal(chunk_owner(&r[w].s.table, c, 2), was);
            assert_int_equal(shard_owns(&r[w].s, c), was == t->learner_rank);
        }
        free(greedy);
        check_sizes(&r[w], 0);
    }
    free_ranks(r);
}

/* topology_print's lines (stdout) into buf. */
static void printed(const Topology *t, const Config *cfg, char *buf, size_t cap)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    fflush(stdout);
    const int saved = dup(1);
    assert_true(saved >= 0 && dup2(fileno(f), 1) >= 0);
    topology_print(t, cfg);
    fflush(stdout);
    assert_true(dup2(saved, 1) >= 0);
    close(saved);
    rewind(f);
    const size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* The layout banner names each site's experts when they are split. */
static void test_print(void **state)
{
    (void)state;
    Config split, rep;
    load(&split, 1);
    load(&rep, 0);
    Topology t;
    char out[2048];
    assert_int_equal(topology_layout(&t, &split, RANKS, 0), 0);
    printed(&t, &split, out, sizeof out);
    assert_non_null(strstr(out, "site a            ranks 0-3 | 2 learner(s) of 2 ranks (experts 0-5, 3 experts per rank)"));
    assert_non_null(strstr(out, "site b            ranks 4-5 | 1 learner(s) of 2 ranks (experts 6-7, 1 experts per rank)"));
    assert_int_equal(topology_layout(&t, &rep, RANKS, 0), 0);
    printed(&t, &rep, out, sizeof out);
    assert_non_null(strstr(out, "site a            ranks 0-3 | 2 learner(s) of 2 ranks (4 experts per rank)"));
    assert_null(strstr(out, "experts 0-"));
}

/* The memory plan of a split rank holds its site's experts only: the
 * weights of a model of those, fewer than replicated. */
static void test_memory_split(void **state)
{
    (void)state;
    Config split, rep;
    load(&split, 1);
    load(&rep, 0);
    for (int w = 0; w < RANKS; w++) {
        MemoryPlan ms, mr;
        assert_int_equal(memory_plan(&split, RANKS, w, &ms), 0);
        assert_int_equal(memory_plan(&rep, RANKS, w, &mr), 0);
        const int local = w < 4 ? 3 : 1;
        assert_int_equal(ms.experts_local, local);
        Model m;
        model_describe(&m, &split.model, 0, local);
        assert_true(ms.bytes[ALLOC_WEIGHTS] >= 4.0 * (double)m.n_params);
        assert_true(ms.bytes[ALLOC_WEIGHTS] < 4.0 * (double)m.n_params + 64);
        assert_true(ms.bytes[ALLOC_WEIGHTS] < mr.bytes[ALLOC_WEIGHTS]);
        assert_true(ms.bytes[ALLOC_STAGING] < mr.bytes[ALLOC_STAGING]); /* fewer owned values, dense frames */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_ownership),
        cmocka_unit_test(test_replicated_unchanged),
        cmocka_unit_test(test_memory_split),
        cmocka_unit_test(test_print),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
