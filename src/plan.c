/* plan.c — see plan.h. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "status.h"

int fragment_of(unsigned flags, int layer, int layers, int fragments)
{
    if (!(flags & PARAM_LAYERED)) return (flags & PARAM_AT_END) ? (layers - 1) % fragments : 0;
    return layer % fragments;
}

static int layers_of(const Model *m, const Tensor *x) { return (x->flags & PARAM_LAYERED) ? m->cfg.layers : 1; }

/* Elements of one layer of a tensor on this rank (all its local experts). */
static size_t layer_numel(const Tensor *x) { return (x->flags & PARAM_LAYERED) ? x->numel / x->local[0] : x->numel; }

int chunk_table_create(ChunkTable *ct, const Model *m, int fragments)
{
    memset(ct, 0, sizeof *ct);
    ct->model = m;
    ct->fragments = fragments;
    const int E = m->cfg.experts;
    int n = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        const Tensor *x = &m->tensors[t];
        ct->first[t] = n;
        n += (x->flags & PARAM_EXPERT) ? layers_of(m, x) * E : layers_of(m, x);
    }
    ct->chunks = isth_malloc(sizeof(Chunk) * (size_t)n);
    CHECK_ALLOC(ct->chunks);
    ct->n_chunks = n;
    n = 0;
    for (int t = 0; t < N_TENSORS; t++) { /* canonical order: tensor, layer, expert */
        const Tensor *x = &m->tensors[t];
        for (int l = 0; l < layers_of(m, x); l++) {
            const int f = fragment_of(x->flags, l, m->cfg.layers, fragments);
            if (x->flags & PARAM_EXPERT)
                for (int e = 0; e < E; e++) ct->chunks[n++] = (Chunk){t, l, e, x->chunk_numel, f};
            else
                ct->chunks[n++] = (Chunk){t, l, -1, x->chunk_numel, f};
        }
    }
    return ISTH_OK;
}

void chunk_table_destroy(ChunkTable *ct)
{
    for (int i = 0; i < ct->n_owners; i++) isth_free(ct->owners[i].owner);
    isth_free(ct->owners);
    isth_free(ct->chunks);
    memset(ct, 0, sizeof *ct);
}

int chunk_index(const ChunkTable *ct, int tensor, int layer, int expert)
{
    const Tensor *x = &ct->model->tensors[tensor];
    return ct->first[tensor] + ((x->flags & PARAM_EXPERT) ? layer * ct->model->cfg.experts + expert : layer);
}

static const int *dense_owners(ChunkTable *ct, int G)
{
    for (int i = 0; i < ct->n_owners; i++)
        if (ct->owners[i].G == G) return ct->owners[i].owner;
    OwnerMap *grown = isth_realloc(ct->owners, sizeof(OwnerMap) * (size_t)(ct->n_owners + 1));
    if (!grown) return NULL;
    ct->owners = grown;
    int *owner = isth_malloc(sizeof(int) * (size_t)ct->n_chunks);
    double *load = isth_calloc((size_t)G, sizeof(double));
    if (!owner || !load) {
        isth_free(owner);
        isth_free(load);
        return NULL;
    }
    for (int k = 0; k < ct->n_chunks; k++) {
        if (ct->chunks[k].expert >= 0) {
            owner[k] = -1;
            continue;
        }
        int best = 0;
        for (int j = 1; j < G; j++)
            if (load[j] < load[best]) best = j;
        owner[k] = best;
        load[best] += (double)ct->chunks[k].size;
    }
    isth_free(load);
    ct->owners[ct->n_owners++] = (OwnerMap){G, owner};
    return owner;
}

int chunk_owner(ChunkTable *ct, int c, int G)
{
    const Chunk *ch = &ct->chunks[c];
    if (ch->expert >= 0) return ch->expert / (ct->model->cfg.experts / G);
    const int *owner = dense_owners(ct, G);
    return owner ? owner[c] : -1;
}

int chunk_held(const ChunkTable *ct, int c)
{
    const Chunk *ch = &ct->chunks[c];
    const Model *m = ct->model;
    return ch->expert < 0 || (ch->expert >= m->expert_begin && ch->expert < m->expert_begin + m->experts_local);
}

size_t chunk_offset(const ChunkTable *ct, int c)
{
    const Chunk *ch = &ct->chunks[c];
    const Model *m = ct->model;
    const Tensor *x = &m->tensors[ch->tensor];
    size_t off = x->offset + ((x->flags & PARAM_LAYERED) ? (size_t)ch->layer * layer_numel(x) : 0);
    if (ch->expert >= 0) off += (size_t)(ch->expert - m->expert_begin) * ch->size;
    return off;
}

int owned_build(Owned *o, ChunkTable *ct, int f, int G, int j, Codec codec, CodecParams cp)
{
    memset(o, 0, sizeof *o);
    int n = 0;
    for (int c = 0; c < ct->n_chunks; c++) n += ct->chunks[c].fragment == f;
    o->chunk = isth_malloc(sizeof(int) * (size_t)(n + 1));
    o->off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    o->enc_off = isth_malloc(sizeof(size_t) * (size_t)(n + 1));
    CHECK_ALLOC(o->chunk);
    CHECK_ALLOC(o->off);
    CHECK_ALLOC(o->enc_off);
    for (int c = 0; c < ct->n_chunks; c++) {
        const Chunk *ch = &ct->chunks[c];
        if (ch->fragment != f) continue;
        const int owner = chunk_owner(ct, c, G);
        if (owner < 0) return isth_fail(ISTH_ERUNTIME, "plan: out of memory for ownership tables");
        if (owner != j) continue;
        o->off[o->n] = o->size;
        o->enc_off[o->n] = o->enc_size;
        o->chunk[o->n++] = c;
        o->size += ch->size;
        o->enc_size += codec_encoded_size(codec, ch->size, cp);
        if (ch->size > o->max_chunk) o->max_chunk = ch->size;
    }
    return ISTH_OK;
}

void owned_free(Owned *o)
{
    isth_free(o->chunk);
    isth_free(o->off);
    isth_free(o->enc_off);
    memset(o, 0, sizeof *o);
}

void owned_pack(const ChunkTable *ct, const Owned *o, const float *buf, float *packed)
{
    for (int k = 0; k < o->n; k++)
        memcpy(packed + o->off[k], buf + chunk_offset(ct, o->chunk[k]), ct->chunks[o->chunk[k]].size * sizeof(float));
}

void owned_unpack(const ChunkTable *ct, const Owned *o, const float *packed, float *buf)
{
    for (int k = 0; k < o->n; k++)
        memcpy(buf + chunk_offset(ct, o->chunk[k]), packed + o->off[k], ct->chunks[o->chunk[k]].size * sizeof(float));
}

int peers_add(PeerSet *ps, ChunkTable *ct, const Owned *own, int G, int first, int site, int f, Codec codec,
              CodecParams cp, uint8_t values_kind, size_t verdict_bytes, int local)
{
    Peer *grown = isth_realloc(ps->peers, sizeof(Peer) * (size_t)(ps->n + G));
    CHECK_ALLOC(grown);
    ps->peers = grown;
    for (int j = 0; j < G; j++) {
        Peer *p = &ps->peers[ps->n];
        memset(p, 0, sizeof *p);
        p->chunks = isth_malloc(sizeof(int) * (size_t)(own->n + 1));
        CHECK_ALLOC(p->chunks);
        for (int k = 0; k < own->n; k++) {
            const int owner = chunk_owner(ct, own->chunk[k], G);
            if (owner < 0) return isth_fail(ISTH_ERUNTIME, "plan: out of memory for ownership tables");
            if (owner != j) continue;
            p->chunks[p->n++] = k;
            p->values += ct->chunks[own->chunk[k]].size;
            p->enc_bytes += codec_encoded_size(codec, ct->chunks[own->chunk[k]].size, cp);
        }
        if (!p->n) { /* nothing in common */
            isth_free(p->chunks);
            continue;
        }
        p->world_rank = first + j;
        p->site = site;
        const size_t bytes = sizeof(LinkHeader) + p->enc_bytes, vbytes = sizeof(LinkHeader) + verdict_bytes;
        p->send_off = ps->send_bytes;
        p->recv_off = ps->recv_bytes;
        ps->send_bytes += bytes;
        ps->recv_bytes += bytes;
        link_msg_init_borrowed(&p->msg, p->world_rank, LINK_TAG(values_kind, f), bytes, bytes, local);
        CHECK(link_msg_alloc(&p->verdict, p->world_rank, LINK_TAG(values_kind + 1, f), vbytes, vbytes, local));
        ps->n++;
    }
    return ISTH_OK;
}

int peers_index(PeerSet *ps)
{
    ps->links = isth_malloc(sizeof(LinkMsg *) * (size_t)(2 * ps->n + 1));
    CHECK_ALLOC(ps->links);
    for (int i = 0; i < ps->n; i++) {
        ps->links[i] = &ps->peers[i].msg;
        ps->links[ps->n + i] = &ps->peers[i].verdict;
    }
    return ISTH_OK;
}

int peers_free(PeerSet *ps)
{
    int retired = 1;
    for (int i = 0; i < ps->n; i++) {
        retired &= link_msg_free(&ps->peers[i].msg);
        link_msg_free(&ps->peers[i].verdict);
        isth_free(ps->peers[i].chunks);
    }
    isth_free(ps->peers);
    isth_free(ps->links);
    memset(ps, 0, sizeof *ps);
    return retired;
}

void peers_bind(PeerSet *ps, Slot *s)
{
    for (int i = 0; i < ps->n; i++) {
        ps->peers[i].msg.send = s->send + ps->peers[i].send_off;
        ps->peers[i].msg.recv = s->recv + ps->peers[i].recv_off;
    }
}

void pool_need(StagePool *p, size_t size, size_t enc_bytes, size_t send_bytes, size_t recv_bytes)
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

int pool_renew(StagePool *p, Slot *s)
{
    const AllocCategory was = alloc_category(ALLOC_STAGING);
    /* the old buffers stay where MPI may still write them: never freed */
    const int ok = slot_buffers(p, s);
    alloc_category(was);
    if (!ok) return isth_fail(ISTH_ERUNTIME, "out of memory renewing a staging slot after a lost site");
    return ISTH_OK;
}

int pool_alloc(StagePool *p, int slots, size_t rows, size_t gather_rows)
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

Slot *pool_take(StagePool *p, int user)
{
    for (int i = 0; i < p->n; i++)
        if (p->slots[i].user < 0) {
            p->slots[i].user = user;
            return &p->slots[i];
        }
    return NULL;
}

void pool_give(Slot *s)
{
    if (s) s->user = -1;
}

void pool_free(StagePool *p, int leak)
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

int peers_post(Link *l, const ChunkTable *ct, const Owned *own, Encoded enc, PeerSet *ps, CodecParams cp, uint8_t kind,
               int f, uint32_t from, uint64_t exchange, int send_now, int corrupt)
{
    for (int i = 0; i < ps->n; i++) {
        Peer *p = &ps->peers[i];
        if (p->site >= 0 && p->site < LINK_MAX_SITES && l->lost[p->site]) {
            /* a lost site: nothing posted, nothing awaited */
            p->msg.recv_posted = 0;
            p->msg.recv_done = 1;
            p->msg.send_posted = 2;
            continue;
        }
        unsigned char *payload = p->msg.send + sizeof(LinkHeader);
        for (int j = 0; j < p->n; j++) {
            const int k = p->chunks[j];
            const size_t bytes = codec_encoded_size(enc.codec, ct->chunks[own->chunk[k]].size, cp);
            memcpy(payload, enc.bytes + enc.off[k], bytes);
            payload += bytes;
        }
        link_frame(l, p->world_rank, p->msg.send, (uint8_t)enc.codec, kind, (uint32_t)f, from, exchange, p->values,
                   p->enc_bytes);
        if (corrupt) link_corrupt(p->msg.send, p->msg.send_bytes);
        p->msg.send_posted = 0;
        CHECK(link_post_recv(l, &p->msg));
        if (send_now) CHECK(link_post_send(l, &p->msg));
    }
    return ISTH_OK;
}

const char *peer_take(Link *l, const ChunkTable *ct, const Owned *own, Codec codec, CodecParams cp, const Peer *p,
                      uint8_t kind,
                      int f, uint64_t exchange, float *dst)
{
    const char *bad =
        link_check(l, p->world_rank, p->msg.recv, p->msg.recv_bytes, kind, (uint32_t)f, exchange, p->values, p->enc_bytes);
    const unsigned char *src = p->msg.recv + sizeof(LinkHeader);
    for (int j = 0; j < p->n && !bad; j++) {
        const int k = p->chunks[j];
        const size_t n = ct->chunks[own->chunk[k]].size;
        float *d = dst + own->off[k];
        if (codec_decode(codec, src, n, cp, d)) return "malformed payload (codec layout)";
        src += codec_encoded_size(codec, n, cp);
        for (size_t e = 0; e < n; e++)
            if (!isfinite(d[e])) return "NaN or Inf in payload";
    }
    return bad;
}

/* Sum `n` floats at buf over the learner, in place. */
size_t peers_frame_bytes(ChunkTable *ct, const Owned *own, int G, Codec codec, CodecParams cp)
{
    size_t total = 0;
    for (int j = 0; j < G; j++) {
        size_t enc = 0;
        int n = 0;
        for (int k = 0; k < own->n; k++)
            if (chunk_owner(ct, own->chunk[k], G) == j) {
                enc += codec_encoded_size(codec, ct->chunks[own->chunk[k]].size, cp);
                n++;
            }
        if (n) total += sizeof(LinkHeader) + enc; /* as peers_add frames them */
    }
    return total;
}
