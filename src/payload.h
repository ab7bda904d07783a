/* payload.h — what crosses between learners, from values to frames and
 * back: encode -> frame -> post, and take -> open -> decode.
 *
 * Owns: what a payload codec is (PayloadCodec: codec, its parameters,
 * where it runs: the backend's encode_ef or the host; the run's instance is
 * the shard's) and the encoding of a fragment's owned chunks with error
 * feedback; the peers of an exchange (the ranks of
 * another learner, and which of my owned chunks each of them owns too: the
 * canonical-chunk plan that lets layouts differ between sites); packing a
 * peer's encoded chunks into its frame, posting it and its receive on the
 * link; checking an arrived frame (link_check: seal, size, identity) and
 * decoding it (codec layout, finite values); the small verdict frames that
 * follow a payload. Only the chunks that cross (plan.h's chunk_crosses:
 * with experts split, the dense ones) are encoded, framed and sent. One payload's bytes have this one owner between the
 * values and the link.
 * Must not: decide when to exchange or what the values mean (reduce.c,
 * mix.c, outer.c); own the staging buffers (shard.h: peers_bind borrows
 * them); move bytes itself (link.h does, against its deadlines).
 */
#ifndef ISTHMUS_PAYLOAD_H
#define ISTHMUS_PAYLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "codec.h"
#include "link.h"
#include "plan.h"

/* A run's payload codec. */
typedef struct {
    Codec codec;
    CodecParams cp;            /* block, topk_k, topk_bits, decay */
    int error_feedback;        /* residuals kept (a lossy codec with [outer] error_feedback = on) */
    int sender_mean;           /* topk: each index averaged over the sites that sent it */
    Backend *encoder;          /* encodes on the backend (payload_encode_on), NULL: the host codec */
    float *scratch;            /* (largest owned chunk) decoded values while encoding in place */
} PayloadCodec;

void payload_codec_init(PayloadCodec *pc, Codec codec, CodecParams cp, int error_feedback, int sender_mean);
/* Scratch for encoding in place, max_chunk values: the largest owned
 * chunk (a rank that sends payloads). */
int payload_codec_reserve(PayloadCodec *pc, size_t max_chunk);
void payload_codec_free(PayloadCodec *pc);
/* Encode with the backend's encode_ef where it has one (the same bytes as
 * the host codec; the CUDA backend's GPU), else on the host. */
void payload_encode_on(PayloadCodec *pc, Backend *be);

/* Encode my owned chunks of one fragment that cross (packed, plan.h's
 * Owned layout) chunk by chunk with the codec, into enc (chunk k at
 * own->enc_off[k]); the others' values and residuals are left as they are;
 * residual (or NULL) is the error feedback, updated; decoded gets what the
 * receivers will decode (it may be `values` itself). *err2 and *norm2: the
 * codec's error and signal energies. */
int payload_encode(const PayloadCodec *pc, const ChunkTable *ct, const Owned *own, const float *values,
                   float *residual, unsigned char *enc, float *decoded, double *err2, double *norm2);

/* One rank of another learner: which of my owned chunks that cross it owns too, and
 * the messages (payload buffers borrowed from a staging slot). */
typedef struct {
    int world_rank, site;
    int *chunks;               /* indices into the Owned list */
    int n;
    size_t values, enc_bytes;
    size_t send_off, recv_off; /* its frames in a slot's send/recv areas */
    LinkMsg msg, verdict;
    int verdict_waited;        /* a verdict was posted to and is awaited from it (reduce.c) */
} Peer;

typedef struct {
    Peer *peers;
    int n;
    LinkMsg **links;           /* (2n) payload messages, then verdicts */
    size_t send_bytes, recv_bytes; /* the frames of every peer */
} PeerSet;

/* The peers among the G ranks of another learner (first world rank
 * `first`, at site `site`) for my owned chunks `own` of fragment f. */
int peers_add(PeerSet *ps, ChunkTable *ct, const Owned *own, int G, int first, int site, int f, Codec codec,
              CodecParams cp, uint8_t values_kind, size_t verdict_bytes, int local);
/* The frame bytes peers_add would stage for those G ranks (planning). */
size_t peers_frame_bytes(ChunkTable *ct, const Owned *own, int G, Codec codec, CodecParams cp);
/* Build the link list once every peer is in. */
int peers_index(PeerSet *ps);
/* Returns 1 when every message was retired (borrowed buffers may go). */
int peers_free(PeerSet *ps);
/* Point the peers' payload messages into a staging slot's frame areas. */
void peers_bind(PeerSet *ps, unsigned char *send, unsigned char *recv);
/* Abandon the posted messages of peers on lost sites (federated launch);
 * returns 1 when one of them could not be cancelled (MPI may still write
 * its buffers: the staging slot must be renewed). */
int peers_abandon_lost(const Link *l, PeerSet *ps);
/* Whether a wait the link gave up on left any of the peers' messages stuck
 * (then the staging slot must be renewed); clears the marks. */
int peers_take_stuck(PeerSet *ps);

/* A fragment's owned chunks, encoded: chunk k at bytes + off[k]. */
typedef struct {
    Codec codec;
    const unsigned char *bytes;
    const size_t *off;
} Encoded;

/* Frame each peer's chunks of `enc` and post the receives (and the sends
 * unless send_now is 0); peers on lost sites are skipped. corrupt: the
 * test hook flips a byte. */
int payload_post(Link *l, const ChunkTable *ct, const Owned *own, Encoded enc, PeerSet *ps, CodecParams cp,
                 uint8_t kind, int f, uint32_t from, uint64_t exchange, int send_now, int corrupt);
/* Check a peer's frame and decode its chunks into dst (packed layout).
 * NULL, or the reason for rejecting it. */
const char *payload_take(Link *l, const ChunkTable *ct, const Owned *own, Codec codec, CodecParams cp, const Peer *p,
                         uint8_t kind, int f, uint64_t exchange, float *dst);

/* A verdict (`bytes` of `data`) framed for peer p and posted with its
 * receive. */
int payload_post_verdict(Link *l, Peer *p, uint8_t kind, int f, uint32_t from, uint64_t exchange, const void *data,
                         size_t bytes);
/* Check peer p's arrived verdict; NULL and *data pointing at its `bytes`,
 * or the reason it is unreadable. */
const char *payload_open_verdict(Link *l, const Peer *p, uint8_t kind, int f, uint64_t exchange, size_t bytes,
                                 const unsigned char **data);

#endif
