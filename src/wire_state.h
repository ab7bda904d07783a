/* wire_state.h — the wire's state, shared by its parts: wire.c (the ops a
 * caller posts, and progress), wire_stream.c (chunks on one stream),
 * wire_conn.c (connections). Nothing outside wire*.c includes it.
 *
 * A peer (a rank of another site) has up to WIRE_MAX_STREAMS streams (one
 * TCP connection each), the receives posted for it and the messages that
 * came before their receive, in one list in posted (or arrival) order, a
 * per-tag sequence number each way, and the queue of sends whose chunks no
 * stream has taken yet. A send is held by the queue (while chunks are
 * left) and by each stream writing one of its chunks; the last holder of a
 * detached or cancelled send frees it.
 * Owns: the structs (peer, stream, op, pending connection, and the chunk
 * header and hello as they go on the socket), a peer's lists, a stream's
 * epoll interest, and a peer's failure (its sockets closed, its early
 * arrivals let go).
 * Must not: read or write a socket's bytes (wire_stream.c), or make or
 * accept a connection (wire_conn.c).
 */
#ifndef ISTHMUS_WIRE_STATE_H
#define ISTHMUS_WIRE_STATE_H

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#include "seal.h"
#include "wire_types.h"

#define CHUNK_MAGIC 0x43575349u /* "ISWC" */
#define HELLO_MAGIC 0x48575349u /* "ISWH" */
#define WIRE_VERSION 1u

/* In front of every chunk (little-endian hosts only, as the link header). */
typedef struct {
    uint32_t magic, tag;
    uint64_t seq;      /* the message's number among (sender, receiver, tag) */
    uint64_t offset;   /* of this chunk in the message */
    uint64_t total;    /* the message's length */
    uint32_t len, reserved;
} ChunkHeader;

/* The first bytes on a connection, from the connecting side. */
typedef struct {
    uint32_t magic, version, from_rank, to_rank, stream, streams;
    unsigned char mac[crypto_generichash_BYTES]; /* keyed BLAKE2b of the fields above, the pair key */
} Hello;

enum { EV_LISTEN, EV_CONN, EV_PENDING };
enum { CONN_IDLE, CONN_CONNECTING, CONN_READY };

typedef struct {
    int kind; /* EV_*: what an epoll event's pointer points at */
} Ev;

struct WireOp {
    int is_send, peer, tag;
    uint64_t seq;
    unsigned char *buf;   /* the caller's, or owned (unexpected) */
    size_t len;
    size_t got;           /* receive: bytes arrived */
    size_t taken;         /* receive: bytes of the chunks begun (a chunk read twice at once cannot pass) */
    size_t chunks;        /* send: chunks of it */
    size_t handed;        /* send: chunks a stream has taken */
    size_t written;       /* send: chunks written whole */
    int holders;          /* send: the peer's queue (while chunks are left) and each stream writing one */
    WireOp *snext;        /* send: the peer's queue of messages with chunks left */
    int done, cancelled, detached;
    int unexpected;       /* created by the wire for a message nobody had asked for yet */
    int claimed;          /* unexpected, then asked for: copy into `dest` when done */
    unsigned char *dest;
    int refs;             /* receive: streams reading a chunk into it now */
    WireOp *next;         /* the peer's receives (posted and unexpected), in order */
};

typedef struct {
    Ev ev;
    int fd, state, peer, stream;
    unsigned events;      /* asked of epoll */
    int registered;       /* fd added to epoll */
    /* sending: owned bytes first (the hello; the rest of a cancelled chunk) */
    unsigned char *tail;
    size_t tail_len, tail_off;
    WireOp *sop;          /* the message of the chunk being written (NULL: none) */
    size_t schunk;        /* its index */
    ChunkHeader shdr;
    size_t ssent;         /* bytes of that chunk (header + data) written */
    /* receiving */
    ChunkHeader rhdr;
    size_t rhdr_got;
    WireOp *rop;          /* the message the chunk being read belongs to */
    size_t roff, rleft;
    int stalled;          /* a header read, no room kept for its message yet */
} Conn;

typedef struct {
    Conn conn[WIRE_MAX_STREAMS];
    int started;          /* connections asked for (or awaited) */
    char failed[96];
    WireOp *recvs, *recvs_tail;
    struct TagSeq *tags;
    WireOp *sq_head, *sq_tail; /* messages with chunks no stream has taken yet, in order */
} Peer;

typedef struct TagSeq {
    int tag;
    uint64_t send, recv;
    struct TagSeq *next;
} TagSeq;

typedef struct Pending {
    Ev ev;
    int fd;
    Hello hello;
    size_t got;
    double t0;
    struct Pending *next;
} Pending;

struct Wire {
    Ev listen_ev;
    int ep, lfd, rank, size, n_sites, my_site, streams;
    int *site_first;
    uint32_t *addr;
    uint16_t *port;
    Peer **peers;
    Pending *pending;
    WireOptions o;
    unsigned char tx[WIRE_MAX_SITES][SEAL_KEY_BYTES], rx[WIRE_MAX_SITES][SEAL_KEY_BYTES];
    size_t unexpected_bytes;
    int room_back;        /* a failed peer let early arrivals go: stalled streams may read again */
    double refused;
    unsigned char discard[65536];
};

static inline int site_of(const Wire *w, int rank)
{
    int s = 0;
    while (s + 1 < w->n_sites && rank >= w->site_first[s + 1]) s++;
    return s;
}

/* What epoll watches on a stream (0: out of epoll). A stream epoll cannot
 * watch fails its peer. */
void wire_set_events(Wire *w, Conn *c, unsigned events);
/* Close a stream's socket; the chunk it was reading will never finish. */
void wire_close_conn(Wire *w, Conn *c);
/* Nothing more to or from this peer: its messages never complete (the
 * caller's deadline decides what that means). The first reason is kept. */
void wire_fail_peer(Wire *w, int peer, const char *why);
/* The peer's state, made on first use (NULL: no memory). */
Peer *wire_peer_get(Wire *w, int peer);
/* Free an op (an unexpected one's own buffer with it). */
void wire_free_op(WireOp *op);
/* The sequence numbers of (peer, tag), made on first use (NULL: no memory). */
TagSeq *wire_tag_seq(Peer *p, int tag);
/* The peer's receive list: find by (tag, seq), take one out, add at the end. */
WireOp *wire_find_recv(Peer *p, int tag, uint64_t seq);
void wire_unlink_recv(Peer *p, WireOp *op);
void wire_append_recv(Peer *p, WireOp *op);

#endif
