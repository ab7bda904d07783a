/* shard.c — see shard.h: this rank's owned chunks, their way to and from
 * the backend, the staging pool and the residuals. */
#include "shard.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

/* --- the staging pool: slots taken by fragments, renewed when MPI kept one */

static void pool_free(StagePool *p, int leak);

static void pool_need(StagePool *p, size_t size, size_t enc_bytes, size_t send_bytes, size_t recv_bytes)
{
    if (size > p->size) p->size = size;
    if (enc_bytes > p->enc_bytes) p->enc_bytes = enc_bytes;
    if (send_bytes > p->send_bytes) p->send_bytes = send_bytes;
    if (recv_bytes > p->recv_bytes) p->recv_bytes = recv_bytes;
}

static int slot_buffers(const StagePool *p, Slot *s)
{
    s->values = isth_malloc(sizeof(float) * (p->size * p->rows + 1));
    s->gather = p->gather_rows ? isth_malloc(sizeof(float) * (p->size * p->gather_rows + 1)) : NULL;
    s->enc = isth_malloc(p->enc_bytes + 1);
    s->send = isth_malloc(p->send_bytes + 1);
    s->recv = isth_malloc(p->recv_bytes + 1);
    return s->values && (s->gather || !p->gather_rows) && s->enc && s->send && s->recv;
}

static int pool_renew(StagePool *p, Slot *s)
{
    const AllocCategory was = alloc_category(ALLOC_STAGING);
    /* the old buffers stay where MPI may still write them: never freed */
    const int ok = slot_buffers(p, s);
    alloc_category(was);
    if (!ok) return isth_fail(ISTH_ERUNTIME, "out of memory renewing a staging slot after a lost site");
    return ISTH_OK;
}

static int pool_alloc(StagePool *p, int slots, size_t rows, size_t gather_rows)
{
    const AllocCategory was = alloc_category(ALLOC_STAGING);
    p->rows = rows;
    p->gather_rows = gather_rows;
    p->slots = isth_calloc((size_t)slots, sizeof(Slot));
    int ok = p->slots != NULL;
    for (int i = 0; ok && i < slots; i++) {
        Slot *s = &p->slots[i];
        p->n++;
        s->user = -1;
        ok = slot_buffers(p, s);
    }
    alloc_category(was);
    if (!ok) { /* nothing half-built is left to look ready */
        const size_t size = p->size;
        pool_free(p, 0);
        return isth_fail(ISTH_ERUNTIME, "out of memory for %d staging slot(s) of %zu values", slots, size);
    }
    return ISTH_OK;
}

static Slot *pool_take(StagePool *p, int user)
{
    for (int i = 0; i < p->n; i++)
        if (p->slots[i].user < 0) {
            p->slots[i].user = user;
            return &p->slots[i];
        }
    return NULL;
}

static void pool_give(Slot *s)
{
    if (s) s->user = -1;
}

static void pool_free(StagePool *p, int leak)
{
    for (int i = 0; !leak && i < p->n; i++) {
        isth_free(p->slots[i].values);
        isth_free(p->slots[i].gather);
        isth_free(p->slots[i].enc);
        isth_free(p->slots[i].send);
        isth_free(p->slots[i].recv);
    }
    isth_free(p->slots);
    memset(p, 0, sizeof *p);
}

/* --- plans ------------------------------------------------------------------- */

static int build_fragment(Shard *s, int f)
{
    const Topology *t = s->topo;
    ChunkTable *ct = &s->table;
    ShardFragment *fs = &s->frag[f];
    CHECK(owned_build(&fs->own, ct, f, t->learner_size, t->learner_rank, s->codec.codec, s->codec.cp));
    int n = 0;
    for (int c = 0; c < ct->n_chunks; c++) n += ct->chunks[c].fragment == f;
    fs->held_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fs->held_len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fs->dense_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fs->dense_len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    fs->dense_owner = isth_malloc(sizeof(int) * (size_t)(n + 1));
    fs->own_off = isth_malloc(sizeof(size_t) * (size_t)(fs->own.n + 1));
    fs->own_len = isth_malloc(sizeof(size_t) * (size_t)(fs->own.n + 1));
    CHECK_ALLOC(fs->held_off);
    CHECK_ALLOC(fs->held_len);
    CHECK_ALLOC(fs->dense_off);
    CHECK_ALLOC(fs->dense_len);
    CHECK_ALLOC(fs->dense_owner);
    CHECK_ALLOC(fs->own_off);
    CHECK_ALLOC(fs->own_len);
    for (int c = 0; c < ct->n_chunks; c++) {
        const Chunk *ch = &ct->chunks[c];
        if (ch->fragment != f) continue;
        if (chunk_held(ct, c)) {
            fs->held_off[fs->n_held] = chunk_offset(ct, c);
            fs->held_len[fs->n_held++] = ch->size;
        }
        if (ch->expert < 0) {
            const int owner = chunk_owner(ct, c, t->learner_size);
            if (owner < 0) return isth_fail(ISTH_ERUNTIME, "shard: out of memory for ownership tables");
            fs->dense_off[fs->n_dense] = chunk_offset(ct, c);
            fs->dense_len[fs->n_dense] = ch->size;
            fs->dense_owner[fs->n_dense++] = owner;
        }
    }
    for (int k = 0; k < fs->own.n; k++) {
        fs->own_off[k] = chunk_offset(ct, fs->own.chunk[k]);
        fs->own_len[k] = ct->chunks[fs->own.chunk[k]].size;
    }
    pool_need(&s->pool, fs->own.size, fs->own.enc_size, 0, 0);
    return ISTH_OK;
}

typedef struct {
    size_t off;
    int chunk;
} PlacedChunk;

static int by_offset(const void *a, const void *b)
{
    const size_t x = ((const PlacedChunk *)a)->off, y = ((const PlacedChunk *)b)->off;
    return x < y ? -1 : x > y;
}

/* The owned chunks in memory order, merged into runs; each chunk's place
 * in the packed runs. */
static int build_runs(Shard *s)
{
    const int n = s->table.n_chunks;
    PlacedChunk *mine = isth_malloc(sizeof(PlacedChunk) * (size_t)(n + 1));
    s->run_pos = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    s->run_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    s->run_len = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    if (!mine || !s->run_pos || !s->run_off || !s->run_len) {
        isth_free(mine);
        return isth_fail(ISTH_ERUNTIME, "out of memory for the optimizer's runs (%d chunks)", n);
    }
    int k = 0;
    for (int c = 0; c < n; c++) {
        s->run_pos[c] = SIZE_MAX;
        if (s->owned_pos[c] != SIZE_MAX) mine[k++] = (PlacedChunk){chunk_offset(&s->table, c), c};
    }
    qsort(mine, (size_t)k, sizeof *mine, by_offset);
    size_t packed = 0;
    s->n_runs = 0;
    for (int i = 0; i < k; i++) {
        const int c = mine[i].chunk;
        const size_t off = mine[i].off, size = s->table.chunks[c].size;
        s->run_pos[c] = packed;
        packed += size;
        if (s->n_runs && s->run_off[s->n_runs - 1] + s->run_len[s->n_runs - 1] == off) {
            s->run_len[s->n_runs - 1] += size;
        } else {
            s->run_off[s->n_runs] = off;
            s->run_len[s->n_runs++] = size;
        }
    }
    isth_free(mine);
    return ISTH_OK;
}

int shard_create(Shard *s, const Topology *t, const Model *m, int fragments, const PayloadCodec *codec)
{
    memset(s, 0, sizeof *s);
    s->topo = t;
    s->model = m;
    s->fragments = fragments;
    s->slots = 1;
    s->codec = *codec;
    s->codec.scratch = NULL;
    CHECK(chunk_table_create(&s->table, m, fragments));
    if (t->experts_split) /* the learner holds its site's experts only: the others are nobody's here */
        chunk_table_set_experts(&s->table, t->sites[t->site].expert_begin, t->sites[t->site].experts);
    s->frag = isth_calloc((size_t)fragments, sizeof(ShardFragment));
    CHECK_ALLOC(s->frag);
    size_t max_chunk = 1;
    for (int f = 0; f < fragments; f++) {
        CHECK(build_fragment(s, f));
        if (s->frag[f].own.max_chunk > max_chunk) max_chunk = s->frag[f].own.max_chunk;
    }
    s->owned_pos = isth_malloc(sizeof(size_t) * (size_t)s->table.n_chunks);
    CHECK_ALLOC(s->owned_pos);
    for (int c = 0; c < s->table.n_chunks; c++) s->owned_pos[c] = SIZE_MAX;
    for (int f = 0; f < fragments; f++)
        for (int k = 0; k < s->frag[f].own.n; k++) s->owned_pos[s->frag[f].own.chunk[k]] = s->frag[f].own.off[k];
    CHECK(build_runs(s));
    /* payloads are encoded only when there is another learner to send them to */
    return t->n_sites > 1 || t->n_learners > 1 ? payload_codec_reserve(&s->codec, max_chunk) : ISTH_OK;
}

void shard_destroy(Shard *s, int leak)
{
    for (int f = 0; s->frag && f < s->fragments; f++) {
        ShardFragment *fs = &s->frag[f];
        owned_free(&fs->own);
        void *bufs[] = {fs->held_off, fs->held_len, fs->dense_off, fs->dense_len, fs->dense_owner,
                        fs->own_off, fs->own_len, fs->residual};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) isth_free(bufs[i]);
    }
    pool_free(&s->pool, leak);
    isth_free(s->frag);
    payload_codec_free(&s->codec);
    isth_free(s->owned_pos);
    isth_free(s->run_pos);
    isth_free(s->run_off);
    isth_free(s->run_len);
    chunk_table_destroy(&s->table);
    memset(s, 0, sizeof *s);
}

const Owned *shard_owned(const Shard *s, int f) { return &s->frag[f].own; }

void shard_fragment_runs(const Shard *s, int f, const size_t **off, const size_t **len, int *n)
{
    *off = s->frag[f].held_off;
    *len = s->frag[f].held_len;
    *n = s->frag[f].n_held;
}

void shard_owned_runs(const Shard *s, const size_t **off, const size_t **len, int *n)
{
    *off = s->run_off;
    *len = s->run_len;
    *n = s->n_runs;
}

size_t shard_canonical_params(const Shard *s)
{
    size_t n = 0;
    for (int c = 0; c < s->table.n_chunks; c++) n += s->table.chunks[c].size;
    return n;
}

int shard_owns(const Shard *s, int c) { return s->owned_pos[c] != SIZE_MAX; }

/* --- values between the backend and packed staging ---------------------------- */

int shard_get(const Shard *s, Backend *be, int f, StateKind which, float *packed)
{
    const ShardFragment *fs = &s->frag[f];
    return be->ops->get(be, which, fs->own_off, fs->own_len, fs->own.n, packed);
}

int shard_put(const Shard *s, Backend *be, int f, StateKind which, const float *packed)
{
    const ShardFragment *fs = &s->frag[f];
    return be->ops->put(be, which, fs->own_off, fs->own_len, fs->own.n, packed);
}

int shard_sum_dense(const Shard *s, Backend *be, int f, StateKind which)
{
    const ShardFragment *fs = &s->frag[f];
    if (s->topo->learner_size == 1) return ISTH_OK;
    return be->ops->sum_runs(be, which, fs->dense_off, fs->dense_len, fs->n_dense);
}

int shard_share_dense(const Shard *s, Backend *be, int f, StateKind which)
{
    const ShardFragment *fs = &s->frag[f];
    if (s->topo->learner_size == 1) return ISTH_OK;
    return be->ops->share_runs(be, which, fs->dense_off, fs->dense_len, fs->dense_owner, fs->n_dense);
}

int shard_share_params(const Shard *s, Backend *be)
{
    for (int f = 0; s->topo->learner_size > 1 && f < s->fragments; f++)
        CHECK(shard_share_dense(s, be, f, STATE_PARAMS));
    return ISTH_OK;
}

int shard_learner_sum(const Shard *s, Backend *be)
{
    for (int f = 0; f < s->fragments; f++) CHECK(shard_sum_dense(s, be, f, STATE_GRADS));
    return ISTH_OK;
}

/* --- staging -------------------------------------------------------------------- */

void shard_set_slots(Shard *s, int slots) { s->slots = slots > 0 ? slots : 1; }

/* The pool is sized once, at the first exchange: every plan must have said
 * what it needs before then. */
static int pool_sized(const Shard *s)
{
    return s->pool.slots ? isth_fail(ISTH_ERUNTIME, "exchange: staging planned after the first exchange") : ISTH_OK;
}

int shard_stage_need(Shard *s, size_t send_bytes, size_t recv_bytes)
{
    CHECK(pool_sized(s));
    pool_need(&s->pool, 0, 0, send_bytes, recv_bytes);
    return ISTH_OK;
}

int shard_stage_rows(Shard *s, size_t rows, size_t result_row, size_t gather_rows)
{
    CHECK(pool_sized(s));
    s->pool.rows = rows;
    s->pool.gather_rows = gather_rows;
    s->result_row = result_row;
    return ISTH_OK;
}

Slot *shard_stage(Shard *s, int f)
{
    /* the pool, sized for every plan, is allocated at the first exchange */
    if (!s->pool.slots && pool_alloc(&s->pool, s->slots, s->pool.rows, s->pool.gather_rows) != ISTH_OK) return NULL;
    Slot *slot = pool_take(&s->pool, f);
    if (!slot) isth_fail(ISTH_ERUNTIME, "exchange: more than %d exchange(s) in flight (fragment %d)", s->slots, f);
    s->frag[f].slot = slot;
    return slot;
}

Slot *shard_slot(const Shard *s, int f) { return s->frag[f].slot; }

size_t shard_row_size(const Shard *s) { return s->pool.size; }

void shard_set_result(Shard *s, int f) { s->frag[f].has_result = 1; }

float *shard_result(const Shard *s, int f)
{
    const ShardFragment *fs = &s->frag[f];
    if (!fs->has_result) return NULL;
    return fs->slot->values + s->result_row * s->pool.size;
}

float *shard_hold(Shard *s, int f)
{
    ShardFragment *fs = &s->frag[f];
    if (!fs->slot && !shard_stage(s, f)) return NULL;
    fs->has_result = 1;
    return shard_result(s, f);
}

void shard_mark_stuck(Shard *s, int f) { s->frag[f].slot_stuck = 1; }

void shard_release(Shard *s, int f)
{
    ShardFragment *fs = &s->frag[f];
    if (fs->slot && fs->slot_stuck && pool_renew(&s->pool, fs->slot) != ISTH_OK) {
        fs->slot->user = -2; /* kept out of the pool for good: MPI may still write it */
        fs->slot = NULL;
    }
    fs->slot_stuck = 0;
    pool_give(fs->slot);
    fs->slot = NULL;
    fs->has_result = 0;
}

/* --- error feedback ---------------------------------------------------------------- */

int shard_alloc_residuals(Shard *s)
{
    if (!s->codec.error_feedback) return ISTH_OK;
    for (int f = 0; f < s->fragments; f++) {
        ShardFragment *fs = &s->frag[f];
        if (fs->residual) continue;
        const AllocCategory was = alloc_category(ALLOC_RESIDUAL);
        fs->residual = isth_calloc(fs->own.size + 1, sizeof(float));
        alloc_category(was);
        CHECK_ALLOC(fs->residual);
    }
    return ISTH_OK;
}

float *shard_residual(const Shard *s, int f) { return s->frag[f].residual; }

float *shard_residual_at(const Shard *s, int tensor, int layer, int expert)
{
    const int c = chunk_index(&s->table, tensor, layer, expert < 0 ? 0 : expert);
    float *res = shard_residual(s, s->table.chunks[c].fragment);
    return res && s->owned_pos[c] != SIZE_MAX ? res + s->owned_pos[c] : NULL;
}

void shard_zero_residuals(Shard *s)
{
    for (int f = 0; f < s->fragments; f++) {
        float *res = shard_residual(s, f);
        if (res) memset(res, 0, sizeof(float) * (s->frag[f].own.size + 1));
    }
}

int shard_has_residual(const Shard *s) { return s->frag && shard_residual(s, 0) != NULL; }

int shard_any_residual(const Shard *s) { return s->codec.error_feedback && s->topo->n_sites > 1; }

/* --- counters ------------------------------------------------------------------------- */

uint64_t shard_next_exchange(Shard *s) { return ++s->exchanges; }

void shard_restore_exchanges(Shard *s, uint64_t exchanges) { s->exchanges = exchanges; }

void shard_waited_on(Shard *s, int n)
{
    if (n > s->max_peer_learners) s->max_peer_learners = n;
}
