/* payload.c — see payload.h: the codec of a run's payloads, the peers of an
 * exchange, and a payload's way into frames and out of them. */
#include "payload.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

void payload_codec_init(PayloadCodec *pc, Codec codec, CodecParams cp, int error_feedback, int sender_mean)
{
    memset(pc, 0, sizeof *pc);
    pc->codec = codec;
    pc->cp = cp;
    pc->error_feedback = error_feedback && codec != CODEC_NONE;
    pc->sender_mean = sender_mean;
}

int payload_codec_reserve(PayloadCodec *pc, size_t max_chunk)
{
    const AllocCategory was = alloc_category(ALLOC_STAGING);
    pc->scratch = isth_malloc(sizeof(float) * max_chunk);
    alloc_category(was);
    CHECK_ALLOC(pc->scratch);
    return ISTH_OK;
}

void payload_codec_free(PayloadCodec *pc)
{
    isth_free(pc->scratch);
    memset(pc, 0, sizeof *pc);
}

void payload_encode_on(PayloadCodec *pc, Backend *be) { pc->encoder = be && be->ops->encode_ef ? be : NULL; }

/* codec_encode_ef of one chunk, where payload_encode_on said. */
static int encode_chunk(const PayloadCodec *pc, const float *x, float *residual, size_t n, unsigned char *out,
                        float *decoded, double *err2, double *norm2)
{
    /* the backends encode the element-wise codecs with plain feedback; the
     * sparse codec and a decaying residual are the host's */
    if (pc->encoder && pc->codec != CODEC_TOPK && pc->cp.decay == 1.0f)
        return pc->encoder->ops->encode_ef(pc->encoder, pc->codec, x, residual, n, pc->cp.block, out, decoded, err2,
                                           norm2);
    if (codec_encode_ef(pc->codec, x, residual, n, pc->cp, out, decoded, err2, norm2))
        return isth_fail(ISTH_ERUNTIME, "codec %s: out of memory encoding a %zu-value chunk", codec_name(pc->codec), n);
    return ISTH_OK;
}

int payload_encode(const PayloadCodec *pc, const ChunkTable *ct, const Owned *own, const float *values,
                   float *residual, unsigned char *enc, float *decoded, double *err2, double *norm2)
{
    const int in_place = values == decoded; /* decoded through the scratch, then over the values */
    double e2_sum = 0.0, n2_sum = 0.0;
    for (int k = 0; k < own->n; k++) {
        if (!chunk_crosses(ct, own->chunk[k])) continue; /* a split expert: the site's own sum, exact */
        const size_t n = ct->chunks[own->chunk[k]].size, at = own->off[k];
        double e2, n2;
        CHECK(encode_chunk(pc, values + at, residual ? residual + at : NULL, n, enc + own->enc_off[k],
                           in_place ? pc->scratch : decoded + at, &e2, &n2));
        if (in_place) memcpy(decoded + at, pc->scratch, n * sizeof(float));
        e2_sum += e2;
        n2_sum += n2;
    }
    *err2 = e2_sum;
    *norm2 = n2_sum;
    return ISTH_OK;
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
            if (!chunk_crosses(ct, own->chunk[k])) continue; /* split experts stay at their site */
            const int owner = chunk_owner(ct, own->chunk[k], G);
            if (owner < 0) return isth_fail(ISTH_ERUNTIME, "payload: out of memory for ownership tables");
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

void peers_bind(PeerSet *ps, unsigned char *send, unsigned char *recv)
{
    for (int i = 0; i < ps->n; i++)
        link_msg_bind(&ps->peers[i].msg, send + ps->peers[i].send_off, recv + ps->peers[i].recv_off);
}

int peers_abandon_lost(const Link *l, PeerSet *ps)
{
    int stuck = 0;
    for (int i = 0; i < ps->n; i++) {
        Peer *p = &ps->peers[i];
        if (p->site < 0 || p->site >= LINK_MAX_SITES || !link_is_lost(l, p->site)) continue;
        link_abandon(&p->msg);
        link_abandon(&p->verdict);
        if (link_msg_take_stuck(&p->msg) | link_msg_take_stuck(&p->verdict)) stuck = 1;
    }
    return stuck;
}

int peers_take_stuck(PeerSet *ps)
{
    int stuck = 0;
    for (int i = 0; i < ps->n; i++)
        if (link_msg_take_stuck(&ps->peers[i].msg) | link_msg_take_stuck(&ps->peers[i].verdict)) stuck = 1;
    return stuck;
}

int payload_post(Link *l, const ChunkTable *ct, const Owned *own, Encoded enc, PeerSet *ps, CodecParams cp,
                 uint8_t kind, int f, uint32_t from, uint64_t exchange, int send_now, int corrupt)
{
    for (int i = 0; i < ps->n; i++) {
        Peer *p = &ps->peers[i];
        if (p->site >= 0 && p->site < LINK_MAX_SITES && link_is_lost(l, p->site)) {
            link_msg_skip(&p->msg); /* a lost site: nothing posted, nothing awaited */
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
        link_msg_rearm(&p->msg);
        CHECK(link_post_recv(l, &p->msg));
        if (send_now) CHECK(link_post_send(l, &p->msg));
    }
    return ISTH_OK;
}

const char *payload_take(Link *l, const ChunkTable *ct, const Owned *own, Codec codec, CodecParams cp, const Peer *p,
                         uint8_t kind, int f, uint64_t exchange, float *dst)
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

size_t peers_frame_bytes(ChunkTable *ct, const Owned *own, int G, Codec codec, CodecParams cp)
{
    size_t total = 0;
    for (int j = 0; j < G; j++) {
        size_t enc = 0;
        int n = 0;
        for (int k = 0; k < own->n; k++)
            if (chunk_crosses(ct, own->chunk[k]) && chunk_owner(ct, own->chunk[k], G) == j) {
                enc += codec_encoded_size(codec, ct->chunks[own->chunk[k]].size, cp);
                n++;
            }
        if (n) total += sizeof(LinkHeader) + enc; /* as peers_add frames them */
    }
    return total;
}

int payload_post_verdict(Link *l, Peer *p, uint8_t kind, int f, uint32_t from, uint64_t exchange, const void *data,
                         size_t bytes)
{
    memcpy(p->verdict.send + sizeof(LinkHeader), data, bytes);
    link_frame(l, p->world_rank, p->verdict.send, 0, kind, (uint32_t)f, from, exchange, bytes, bytes);
    link_msg_rearm(&p->verdict);
    CHECK(link_post_recv(l, &p->verdict));
    return link_post_send(l, &p->verdict);
}

const char *payload_open_verdict(Link *l, const Peer *p, uint8_t kind, int f, uint64_t exchange, size_t bytes,
                                 const unsigned char **data)
{
    *data = p->verdict.recv + sizeof(LinkHeader);
    return link_check(l, p->world_rank, p->verdict.recv, p->verdict.recv_bytes, kind, (uint32_t)f, exchange, bytes,
                      bytes);
}
