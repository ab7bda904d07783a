/* wire.c — see wire.h. */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "status.h"

#define CHUNK_MAGIC 0x43575349u /* "ISWC" */
#define HELLO_MAGIC 0x48575349u /* "ISWH" */
#define WIRE_VERSION 1u
#define MAX_PENDING 1024        /* connections waiting for their hello: beyond this the oldest goes */
#define MAX_MESSAGE ((uint64_t)1 << 40)

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

static int site_of(const Wire *w, int rank)
{
    int s = 0;
    while (s + 1 < w->n_sites && rank >= w->site_first[s + 1]) s++;
    return s;
}

/* --- sockets ------------------------------------------------------------------------------ */

static void fail_peer(Wire *w, int peer, const char *why);

static void set_events(Wire *w, Conn *c, unsigned events)
{
    if (c->fd < 0 || (c->registered && c->events == events)) return;
    if (events == 0) { /* out of epoll: an error or hang-up is reported even for an empty mask, and a
                        * stalled stream must not be woken by one it cannot read yet (unstall re-adds it) */
        if (c->registered) epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
        c->registered = 0;
        c->events = 0;
        return;
    }
    struct epoll_event e = {.events = events, .data.ptr = &c->ev};
    if (epoll_ctl(w->ep, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &e)) {
        fail_peer(w, c->peer, "epoll_ctl failed"); /* a stream epoll cannot watch would stall unseen */
        return;
    }
    c->registered = 1;
    c->events = events;
}

static void tune(const Wire *w, int fd)
{
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (w->o.socket_buffer > 0) {
        const int b = (int)w->o.socket_buffer;
        /* FORCE goes past net.core.[rw]mem_max (root); else the plain call, capped by it */
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &b, sizeof b)) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &b, sizeof b)) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
    }
}

static void hello_mac(unsigned char mac[crypto_generichash_BYTES], const Hello *h, const unsigned char *key)
{
    crypto_generichash(mac, crypto_generichash_BYTES, (const unsigned char *)h, offsetof(Hello, mac), key,
                       SEAL_KEY_BYTES);
}

static void free_op(WireOp *op)
{
    if (op->unexpected) isth_free(op->buf);
    isth_free(op);
}

static TagSeq *tag_seq(Peer *p, int tag)
{
    for (TagSeq *t = p->tags; t; t = t->next)
        if (t->tag == tag) return t;
    TagSeq *t = isth_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->tag = tag;
    t->next = p->tags;
    p->tags = t;
    return t;
}

static void unlink_recv(Peer *p, WireOp *op);

static void close_conn(Wire *w, Conn *c)
{
    if (c->fd >= 0) {
        if (c->registered) epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
    c->events = 0;
    c->registered = 0;
    c->state = CONN_IDLE;
    c->stalled = 0;
    if (c->rop) { /* the chunk being read will never finish */
        c->rop->refs--;
        c->rop = NULL;
    }
    c->rhdr_got = 0;
}

/* Nothing more to or from this peer: its messages never complete (the
 * caller's deadline decides what that means). */
static void fail_peer(Wire *w, int peer, const char *why)
{
    Peer *p = w->peers[peer];
    if (!p || p->failed[0]) return;
    snprintf(p->failed, sizeof p->failed, "%s", why);
    for (int s = 0; s < w->streams; s++) close_conn(w, &p->conn[s]);
    /* what arrived early from it and nobody asked for: its room goes back */
    for (WireOp *op = p->recvs, *next; op; op = next) {
        next = op->next;
        if (!op->unexpected || op->claimed || op->refs) continue;
        unlink_recv(p, op);
        w->unexpected_bytes -= op->len;
        free_op(op);
        w->room_back = 1; /* the stalled streams are woken at the end of the progress call */
    }
}

static Peer *peer_get(Wire *w, int peer)
{
    if (!w->peers[peer]) {
        Peer *p = isth_calloc(1, sizeof *p);
        if (!p) return NULL;
        for (int s = 0; s < WIRE_MAX_STREAMS; s++) {
            p->conn[s].ev.kind = EV_CONN;
            p->conn[s].fd = -1;
            p->conn[s].peer = peer;
            p->conn[s].stream = s;
        }
        w->peers[peer] = p;
    }
    return w->peers[peer];
}

/* The lower rank of a pair connects, the first time either end has
 * something for the other. */
static void peer_start(Wire *w, int peer, Peer *p)
{
    if (p->started || p->failed[0]) return;
    p->started = 1;
    if (w->rank > peer) return; /* it connects to us */
    const int to_site = site_of(w, peer);
    for (int s = 0; s < w->streams; s++) {
        Conn *c = &p->conn[s];
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->fd < 0) {
            fail_peer(w, peer, "cannot create a socket");
            return;
        }
        tune(w, c->fd);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(w->port[peer] + w->o.port_shift))};
        a.sin_addr.s_addr = w->addr[peer];
        if (connect(c->fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
            fail_peer(w, peer, "connection refused");
            return;
        }
        c->state = CONN_CONNECTING;
        Hello h = {HELLO_MAGIC, WIRE_VERSION, (uint32_t)w->rank, (uint32_t)peer, (uint32_t)s, (uint32_t)w->streams, {0}};
        hello_mac(h.mac, &h, w->tx[to_site]);
        c->tail = isth_malloc(sizeof h);
        if (!c->tail) {
            fail_peer(w, peer, "out of memory");
            return;
        }
        memcpy(c->tail, &h, sizeof h);
        c->tail_len = sizeof h;
        c->tail_off = 0;
        set_events(w, c, EPOLLIN | EPOLLOUT);
        if (p->failed[0]) return;
    }
}

/* --- sending ------------------------------------------------------------------------------- */

static size_t n_chunks(const Wire *w, size_t len) { return len ? (len + w->o.chunk_bytes - 1) / w->o.chunk_bytes : 1; }

/* One holder of a send lets it go: a detached or cancelled one is freed by the last. */
static void release_send(WireOp *op)
{
    if (--op->holders == 0 && op->written == op->chunks) {
        op->done = 1;
        if (op->detached || op->cancelled) free_op(op);
    }
}

/* The next chunk for a stream with room: the oldest message's next one.
 * Chunks go to whichever stream can take them, so a stream whose window
 * is small (a loss, a slow start) carries less instead of holding up
 * every message it has a fixed share of. */
static WireOp *take_chunk(Peer *p, Conn *c)
{
    WireOp *op = p->sq_head;
    if (!op) return NULL;
    c->schunk = op->handed++;
    op->holders++;
    if (op->handed == op->chunks) { /* all taken: off the queue */
        p->sq_head = op->snext;
        if (!p->sq_head) p->sq_tail = NULL;
        op->snext = NULL;
        op->holders--; /* the queue's hold (the stream's keeps it alive) */
    }
    return op;
}

static ssize_t send_some(int fd, const void *a, size_t alen, const void *b, size_t blen)
{
    struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
    struct msghdr m = {.msg_iov = alen ? iov : iov + 1, .msg_iovlen = alen ? 2 : 1};
    return sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Write what this stream has, until the socket would block. */
static void send_pump(Wire *w, Conn *c)
{
    Peer *p = w->peers[c->peer];
    if (c->fd < 0 || c->state != CONN_READY) return;
    for (;;) {
        if (c->tail) {
            const ssize_t n = send_some(c->fd, NULL, 0, c->tail + c->tail_off, c->tail_len - c->tail_off);
            if (n < 0) break;
            c->tail_off += (size_t)n;
            if (c->tail_off < c->tail_len) continue;
            isth_free(c->tail);
            c->tail = NULL;
            continue;
        }
        if (!c->sop) {
            c->sop = p ? take_chunk(p, c) : NULL;
            if (!c->sop) {
                set_events(w, c, c->stalled ? 0u : (unsigned)EPOLLIN);
                return;
            }
            c->ssent = 0;
        }
        WireOp *op = c->sop;
        const size_t k = c->schunk;
        const size_t off = k * w->o.chunk_bytes, len = op->len - off < w->o.chunk_bytes ? op->len - off : w->o.chunk_bytes;
        if (c->ssent == 0)
            c->shdr = (ChunkHeader){CHUNK_MAGIC, (uint32_t)op->tag, op->seq, off, op->len, (uint32_t)len, 0};
        const size_t h = sizeof c->shdr;
        const ssize_t n = c->ssent < h ? send_some(c->fd, (unsigned char *)&c->shdr + c->ssent, h - c->ssent, op->buf + off, len)
                                       : send_some(c->fd, NULL, 0, op->buf + off + (c->ssent - h), len - (c->ssent - h));
        if (n < 0) break;
        c->ssent += (size_t)n;
        if (c->ssent == h + len) {
            c->sop = NULL;
            c->ssent = 0;
            op->written++;
            release_send(op);
        }
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        set_events(w, c, (c->stalled ? 0u : (unsigned)EPOLLIN) | EPOLLOUT);
        return;
    }
    fail_peer(w, c->peer, p && errno == EPIPE ? "connection closed by the peer" : "send failed");
}

/* --- receiving ----------------------------------------------------------------------------- */

static WireOp *find_recv(Peer *p, int tag, uint64_t seq)
{
    for (WireOp *op = p->recvs; op; op = op->next)
        if (op->tag == tag && op->seq == seq) return op;
    return NULL;
}

static void unlink_recv(Peer *p, WireOp *op)
{
    WireOp **pp = &p->recvs, *prev = NULL;
    while (*pp && *pp != op) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = op->next;
    if (p->recvs_tail == op) p->recvs_tail = prev;
    op->next = NULL;
}

static void append_recv(Peer *p, WireOp *op)
{
    op->next = NULL;
    if (p->recvs_tail) p->recvs_tail->next = op;
    else p->recvs = op;
    p->recvs_tail = op;
}

static void unstall(Wire *w, Peer *p);

/* A receive has all its bytes. */
static void recv_complete(Wire *w, Peer *p, WireOp *op)
{
    if (op->unexpected && !op->claimed && !op->cancelled) {
        op->done = 1; /* kept for the receive that will ask for it */
        return;
    }
    unlink_recv(p, op);
    if (op->unexpected) {
        w->unexpected_bytes -= op->len;
        if (op->claimed && !op->cancelled) memcpy(op->dest, op->buf, op->len);
        isth_free(op->buf);
        op->buf = NULL;
        op->unexpected = 0;
        for (int r = 0; r < w->size; r++) /* room again: streams that waited for it */
            if (w->peers[r]) unstall(w, w->peers[r]);
    }
    op->done = 1;
    if (op->cancelled) free_op(op);
}

/* A chunk's header is in: which message it belongs to, and room for it. 0
 * when the chunk can be read now, 1 when it must wait for room, -1 when the
 * peer broke the protocol (failed). */
static int chunk_target(Wire *w, Peer *p, Conn *c)
{
    const ChunkHeader *h = &c->rhdr;
    if (h->magic != CHUNK_MAGIC || h->total > MAX_MESSAGE || h->offset > h->total || h->len > h->total - h->offset ||
        h->reserved) {
        fail_peer(w, c->peer, "malformed chunk");
        return -1;
    }
    WireOp *op = find_recv(p, (int)h->tag, h->seq);
    if (!op) {
        const TagSeq *ts = tag_seq(p, (int)h->tag);
        if (ts && h->seq < ts->recv) { /* its receive was posted and is gone: complete, a chunk again */
            fail_peer(w, c->peer, "a chunk of a message already complete");
            return -1;
        }
        if (w->unexpected_bytes + h->total > w->o.unexpected_max) return 1;
        op = isth_calloc(1, sizeof *op);
        unsigned char *buf = op ? isth_malloc(h->total ? h->total : 1) : NULL;
        if (!buf) {
            isth_free(op);
            return 1;
        }
        op->peer = c->peer;
        op->tag = (int)h->tag;
        op->seq = h->seq;
        op->buf = buf;
        op->len = h->total;
        op->unexpected = 1;
        w->unexpected_bytes += h->total;
        append_recv(p, op);
    }
    if (op->len != h->total) {
        fail_peer(w, c->peer, "message size differs from the receive posted");
        return -1;
    }
    if (op->done || op->taken + h->len > op->len) { /* a chunk again (a replay on the path) */
        fail_peer(w, c->peer, "a chunk of a message already complete");
        return -1;
    }
    op->taken += h->len;
    c->rop = op;
    c->roff = h->offset;
    c->rleft = h->len;
    op->refs++;
    return 0;
}

static void chunk_done(Wire *w, Peer *p, Conn *c)
{
    WireOp *op = c->rop;
    op->got += c->rhdr.len;
    op->refs--;
    c->rop = NULL;
    c->rhdr_got = 0;
    if (op->got >= op->len && op->refs == 0) recv_complete(w, p, op);
}

static void recv_pump(Wire *w, Conn *c)
{
    Peer *p = w->peers[c->peer];
    ssize_t n = 0;
    while (c->fd >= 0 && c->state == CONN_READY) {
        if (!c->rop) {
            if (c->rhdr_got < sizeof c->rhdr) {
                n = recv(c->fd, (unsigned char *)&c->rhdr + c->rhdr_got, sizeof c->rhdr - c->rhdr_got, MSG_DONTWAIT);
                if (n <= 0) goto io;
                c->rhdr_got += (size_t)n;
                if (c->rhdr_got < sizeof c->rhdr) continue;
            }
            const int t = chunk_target(w, p, c);
            if (t < 0) return;
            if (t == 0 && c->stalled) {
                c->stalled = 0;
                set_events(w, c, c->events | EPOLLIN);
            }
            if (t == 1) { /* no room: stop watching its input until a receive or room comes (unstall) */
                c->stalled = 1;
                set_events(w, c, c->events & ~(unsigned)EPOLLIN);
                return;
            }
            if (c->rleft == 0) chunk_done(w, p, c);
            continue;
        }
        WireOp *op = c->rop;
        const int sink = op->cancelled && !op->unexpected;
        unsigned char *dst = sink ? w->discard : op->buf + c->roff;
        const size_t want = sink && c->rleft > sizeof w->discard ? sizeof w->discard : c->rleft;
        n = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (n <= 0) goto io;
        c->roff += (size_t)n;
        c->rleft -= (size_t)n;
        if (c->rleft == 0) chunk_done(w, p, c);
    }
    return;
io:
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    fail_peer(w, c->peer, n == 0 ? "connection closed by the peer" : "receive failed");
}

static void unstall(Wire *w, Peer *p)
{
    for (int s = 0; s < w->streams; s++)
        if (p->conn[s].stalled && p->conn[s].fd >= 0) {
            p->conn[s].stalled = 0;
            set_events(w, &p->conn[s], p->conn[s].events | EPOLLIN);
            recv_pump(w, &p->conn[s]);
        }
}

/* --- connections coming in ------------------------------------------------------------------ */

static void pending_drop(Wire *w, Pending *q)
{
    Pending **pp = &w->pending;
    while (*pp && *pp != q) pp = &(*pp)->next;
    if (*pp) *pp = q->next;
    if (q->fd >= 0) {
        epoll_ctl(w->ep, EPOLL_CTL_DEL, q->fd, NULL);
        close(q->fd);
    }
    isth_free(q);
}

static void accept_all(Wire *w)
{
    for (;;) {
        const int fd = accept4(w->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int n = 0;
        for (const Pending *r = w->pending; r; r = r->next) n++;
        if (n >= MAX_PENDING) { /* a flood: refused at the door (the ones waiting keep their turn) */
            close(fd);
            w->refused += 1;
            continue;
        }
        Pending *q = isth_calloc(1, sizeof *q);
        if (!q) {
            close(fd);
            return;
        }
        q->ev.kind = EV_PENDING;
        q->fd = fd;
        q->t0 = now_s();
        q->next = w->pending;
        w->pending = q;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &q->ev};
        epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &e);
    }
}

/* Read a hello (exactly its bytes: the data after it is the stream's). */
static void pending_read(Wire *w, Pending *q)
{
    const ssize_t n = recv(q->fd, (unsigned char *)&q->hello + q->got, sizeof q->hello - q->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
        pending_drop(w, q);
        return;
    }
    q->got += (size_t)n;
    if (q->got < sizeof q->hello) return;
    const Hello *h = &q->hello;
    unsigned char mac[crypto_generichash_BYTES];
    const int from = (int)h->from_rank;
    int ok = h->magic == HELLO_MAGIC && h->version == WIRE_VERSION && from >= 0 && from < w->size &&
             from < w->rank && site_of(w, from) != w->my_site && h->to_rank == (uint32_t)w->rank &&
             h->streams == (uint32_t)w->streams && h->stream < (uint32_t)w->streams;
    if (ok) {
        hello_mac(mac, h, w->rx[site_of(w, from)]);
        ok = sodium_memcmp(mac, h->mac, sizeof mac) == 0;
    }
    Peer *p = ok ? peer_get(w, from) : NULL;
    if (!p || p->failed[0] || p->conn[h->stream].fd >= 0) {
        w->refused += 1;
        pending_drop(w, q);
        return;
    }
    Conn *c = &p->conn[h->stream];
    epoll_ctl(w->ep, EPOLL_CTL_DEL, q->fd, NULL);
    c->fd = q->fd;
    q->fd = -1;
    pending_drop(w, q);
    tune(w, c->fd);
    c->state = CONN_READY;
    p->started = 1;
    set_events(w, c, EPOLLIN | EPOLLOUT);
    recv_pump(w, c);
    send_pump(w, c);
}

/* --- progress ------------------------------------------------------------------------------- */

static void on_event(Wire *w, Ev *ev, unsigned events)
{
    if (ev->kind == EV_LISTEN) {
        accept_all(w);
        return;
    }
    if (ev->kind == EV_PENDING) {
        pending_read(w, (Pending *)ev);
        return;
    }
    Conn *c = (Conn *)ev;
    if (c->state == CONN_CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
            fail_peer(w, c->peer, "cannot connect");
            return;
        }
        c->state = CONN_READY;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) recv_pump(w, c);
    if (c->fd >= 0 && (events & EPOLLOUT)) send_pump(w, c);
    /* still stalled (the error waits behind the chunk that has no room) and nothing to send:
     * out of epoll, or the error would be reported at every call */
    if (c->fd >= 0 && c->stalled && (events & (EPOLLERR | EPOLLHUP)) && !(c->events & EPOLLOUT))
        set_events(w, c, 0);
}

static void wake_stalled(Wire *w)
{
    while (w->room_back) {
        w->room_back = 0;
        for (int r = 0; r < w->size; r++)
            if (w->peers[r]) unstall(w, w->peers[r]);
    }
}

void wire_progress(Wire *w, int wait_ms)
{
    struct epoll_event ev[64];
    for (int round = 0; round < 64; round++) {
        const int n = epoll_wait(w->ep, ev, 64, round ? 0 : wait_ms);
        if (n <= 0) break;
        for (int i = 0; i < n; i++) on_event(w, ev[i].data.ptr, ev[i].events);
    }
    wake_stalled(w);
    const double now = now_s();
    for (Pending *q = w->pending, *next; q; q = next) {
        next = q->next;
        if (now - q->t0 > w->o.hello_timeout_s) {
            w->refused += 1;
            pending_drop(w, q);
        }
    }
}

/* --- ops ------------------------------------------------------------------------------------ */

static int check_peer(const Wire *w, int peer)
{
    if (peer < 0 || peer >= w->size || site_of(w, peer) == w->my_site)
        return isth_fail(ISTH_ERUNTIME, "wire: rank %d is not a rank of another site", peer);
    return ISTH_OK;
}

int wire_isend(Wire *w, int peer, int tag, const void *buf, size_t len, WireOp **out)
{
    CHECK(check_peer(w, peer));
    Peer *p = peer_get(w, peer);
    TagSeq *ts = p ? tag_seq(p, tag) : NULL;
    WireOp *op = ts ? isth_calloc(1, sizeof *op) : NULL;
    if (!op) return isth_fail(ISTH_ERUNTIME, "wire: out of memory");
    op->is_send = 1;
    op->peer = peer;
    op->tag = tag;
    op->seq = ts->send++;
    op->buf = (unsigned char *)buf;
    op->len = len;
    op->detached = out == NULL;
    if (out) *out = op;
    peer_start(w, peer, p);
    if (p->failed[0]) { /* never completes */
        if (op->detached) isth_free(op);
        return ISTH_OK;
    }
    op->chunks = n_chunks(w, len);
    op->holders = 1; /* the queue's */
    if (p->sq_tail) p->sq_tail->snext = op;
    else p->sq_head = op;
    p->sq_tail = op;
    /* every idle stream takes chunks while its socket has room (a pump may
     * finish and free a detached op: it is not touched after) */
    for (int s = 0; s < w->streams; s++)
        if (!p->conn[s].sop) send_pump(w, &p->conn[s]);
    return ISTH_OK;
}

int wire_irecv(Wire *w, int peer, int tag, void *buf, size_t len, WireOp **out)
{
    CHECK(check_peer(w, peer));
    Peer *p = peer_get(w, peer);
    TagSeq *ts = p ? tag_seq(p, tag) : NULL;
    if (!ts) return isth_fail(ISTH_ERUNTIME, "wire: out of memory");
    const uint64_t seq = ts->recv++;
    peer_start(w, peer, p);
    WireOp *op = find_recv(p, tag, seq);
    if (op) { /* it came first */
        if (op->len != len) {
            fail_peer(w, peer, "message size differs from the receive posted"); /* which lets the op go */
            op = NULL;
        } else {
            op->claimed = 1;
            op->dest = buf;
            if (op->done && op->refs == 0) recv_complete(w, p, op);
            *out = op;
            return ISTH_OK;
        }
    }
    op = isth_calloc(1, sizeof *op);
    if (!op) return isth_fail(ISTH_ERUNTIME, "wire: out of memory");
    op->peer = peer;
    op->tag = tag;
    op->seq = seq;
    op->buf = buf;
    op->len = len;
    *out = op;
    append_recv(p, op);
    unstall(w, p);
    return ISTH_OK;
}

int wire_test(Wire *w, WireOp **op)
{
    (void)w;
    if (!*op) return 1;
    if (!(*op)->done) return 0;
    isth_free(*op);
    *op = NULL;
    return 1;
}

void wire_cancel(Wire *w, WireOp **opp)
{
    WireOp *op = *opp;
    *opp = NULL;
    if (!op) return;
    if (op->done) {
        isth_free(op);
        return;
    }
    Peer *p = w->peers[op->peer];
    op->cancelled = 1;
    if (!op->is_send && p->failed[0]) { /* nothing more comes: let it go now, with its room if it came early */
        unlink_recv(p, op);
        if (op->unexpected) {
            w->unexpected_bytes -= op->len;
            w->room_back = 1;
        }
        free_op(op);
        return;
    }
    if (!op->is_send) {
        /* stays matched (later chunks of it are read and dropped): freed
         * when its last byte is in, or at close */
        if (op->unexpected) op->claimed = 0;
        return;
    }
    /* a send: off the queue and every stream; a chunk half written goes on
     * from a copy, so the stream stays in step */
    for (WireOp **pp = &p->sq_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->snext)
        if (*pp == op) {
            *pp = op->snext;
            if (p->sq_tail == op) p->sq_tail = prev;
            break;
        }
    for (int s = 0; s < w->streams; s++) {
        Conn *c = &p->conn[s];
        if (c->sop != op) continue;
        if (c->ssent > 0 && c->fd >= 0) {
            const size_t off = c->schunk * w->o.chunk_bytes;
            const size_t len = op->len - off < w->o.chunk_bytes ? op->len - off : w->o.chunk_bytes;
            const size_t h = sizeof c->shdr, rest = h + len - c->ssent;
            unsigned char *t = isth_malloc(rest);
            if (!t) {
                fail_peer(w, op->peer, "out of memory");
            } else {
                size_t o = 0;
                if (c->ssent < h) {
                    memcpy(t, (unsigned char *)&c->shdr + c->ssent, h - c->ssent);
                    o = h - c->ssent;
                }
                memcpy(t + o, op->buf + off + (c->ssent > h ? c->ssent - h : 0), rest - o);
                /* an owned tail goes before the chunks: only one can be pending (a hello is sent first) */
                if (c->tail) {
                    unsigned char *both = isth_malloc(c->tail_len - c->tail_off + rest);
                    if (both) {
                        memcpy(both, c->tail + c->tail_off, c->tail_len - c->tail_off);
                        memcpy(both + c->tail_len - c->tail_off, t, rest);
                        isth_free(c->tail);
                        isth_free(t);
                        c->tail_len = c->tail_len - c->tail_off + rest;
                        c->tail_off = 0;
                        c->tail = both;
                    } else {
                        isth_free(t);
                        fail_peer(w, op->peer, "out of memory");
                    }
                } else {
                    c->tail = t;
                    c->tail_len = rest;
                    c->tail_off = 0;
                }
            }
        }
        c->sop = NULL;
        c->ssent = 0;
    }
    isth_free(op);
}

int wire_probe(Wire *w, int peer, int tag)
{
    if (check_peer(w, peer) != ISTH_OK) return 0;
    Peer *p = peer_get(w, peer);
    TagSeq *ts = p ? tag_seq(p, tag) : NULL;
    if (!ts) return 0;
    peer_start(w, peer, p);
    wire_progress(w, 0);
    const WireOp *op = find_recv(p, tag, ts->recv);
    return op && op->unexpected && op->done;
}

const char *wire_peer_failed(const Wire *w, int peer)
{
    const Peer *p = peer >= 0 && peer < w->size ? w->peers[peer] : NULL;
    return p && p->failed[0] ? p->failed : NULL;
}

double wire_refused(const Wire *w) { return w->refused; }

size_t wire_held(const Wire *w) { return w->unexpected_bytes; }

void wire_dump(const Wire *w, int peer, FILE *f)
{
    const Peer *p = peer >= 0 && peer < w->size ? w->peers[peer] : NULL;
    if (!p) {
        fprintf(f, "wire: rank %d: no state for peer %d\n", w->rank, peer);
        return;
    }
    for (int s = 0; s < w->streams; s++) {
        const Conn *c = &p->conn[s];
        fprintf(f, "wire: rank %d peer %d stream %d: fd %d state %d events %u tail %zu/%zu chunk %s%zu ssent %zu "
                "rhdr %zu rop %s roff %zu rleft %zu stalled %d\n", w->rank, peer, s, c->fd, c->state, c->events,
                c->tail_off, c->tail_len, c->sop ? "" : "-", c->sop ? c->schunk : 0, c->ssent, c->rhdr_got, c->rop ? "set" : "-", c->roff, c->rleft,
                c->stalled);
    }
    int posted = 0, queued = 0;
    for (const WireOp *op = p->recvs; op; op = op->next) posted++;
    for (const WireOp *op = p->sq_head; op; op = op->snext) queued++;
    fprintf(f, "wire: rank %d peer %d: %d receive(s) listed, %d send(s) with chunks untaken, %zu unexpected bytes, "
            "failed '%s'\n", w->rank, peer, posted, queued, w->unexpected_bytes, p->failed);
}

int wire_listen_port(const Wire *w) { return w->port[w->rank]; }

/* --- setting up ----------------------------------------------------------------------------- */

int wire_parse_ports(const char *s, int *lo, int *hi)
{
    char *end;
    const long a = strtol(s, &end, 10);
    long b = a;
    if (end == s) return -1;
    if (*end == '-') {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        if (end == t) return -1;
    }
    if (*end || a < 0 || b < a || b > 65535 || (a == 0 && b != 0)) return -1;
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

/* The IPv4 address other sites reach this rank at. */
static int local_address(const char *interface, uint32_t *addr)
{
    struct ifaddrs *ifs = NULL;
    *addr = htonl(INADDR_LOOPBACK);
    if (getifaddrs(&ifs)) return interface[0] ? -1 : 0;
    int found = 0;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        if (interface[0] ? strcmp(i->ifa_name, interface) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
        *addr = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        found = 1;
    }
    freeifaddrs(ifs);
    return interface[0] && !found ? -1 : 0;
}

static int listen_on(Wire *w, uint16_t *port, char *why, size_t why_len)
{
    int err = 0;
    for (int p = w->o.port_lo; p <= w->o.port_hi; p++) {
        /* a fresh socket per try: one whose bind or listen failed cannot bind again */
        w->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (w->lfd < 0) {
            snprintf(why, why_len, "cannot create a socket: %s", strerror(errno));
            return -1;
        }
        const int one = 1;
        setsockopt(w->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        tune(w, w->lfd); /* accepted sockets inherit the buffers (the window scale is fixed at the handshake) */
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(w->lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(w->lfd, 256) == 0) {
            socklen_t len = sizeof a;
            getsockname(w->lfd, (struct sockaddr *)&a, &len);
            *port = ntohs(a.sin_port);
            return 0;
        }
        err = errno;
        close(w->lfd);
        w->lfd = -1;
    }
    if (w->o.port_lo == w->o.port_hi)
        snprintf(why, why_len, "cannot listen on port %d: %s", w->o.port_lo, strerror(err));
    else
        snprintf(why, why_len, "no free port in [outer] ports = %d-%d", w->o.port_lo, w->o.port_hi);
    return -1;
}

int wire_open(Wire **out, MPI_Comm comm, const int *site_first, int n_sites, int my_site,
              const unsigned char (*tx)[SEAL_KEY_BYTES], const unsigned char (*rx)[SEAL_KEY_BYTES],
              const WireOptions *o)
{
    *out = NULL;
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    /* every rank reaches both collectives below, whatever failed here:
     * a rank that returned early would leave the others waiting in them */
    char why[160] = "";
    Wire *w = isth_calloc(1, sizeof *w);
    if (w) w->lfd = w->ep = -1;
    uint64_t *all = isth_malloc(sizeof(uint64_t) * (size_t)size);
    int ok = w && all;
    if (!ok) snprintf(why, sizeof why, "out of memory");
    if (ok) {
        w->o = *o;
        w->listen_ev.kind = EV_LISTEN;
        w->streams = o->streams < 1 ? 1 : o->streams > WIRE_MAX_STREAMS ? WIRE_MAX_STREAMS : o->streams;
        if (!w->o.chunk_bytes) w->o.chunk_bytes = (size_t)1 << 20;
        if (w->o.hello_timeout_s <= 0) w->o.hello_timeout_s = 600.0;
        w->n_sites = n_sites < WIRE_MAX_SITES ? n_sites : WIRE_MAX_SITES;
        w->my_site = my_site;
        w->rank = rank;
        w->size = size;
        w->site_first = isth_malloc(sizeof(int) * (size_t)(w->n_sites + 1));
        w->addr = isth_calloc((size_t)size, sizeof *w->addr);
        w->port = isth_calloc((size_t)size, sizeof *w->port);
        w->peers = isth_calloc((size_t)size, sizeof *w->peers);
        ok = w->site_first && w->addr && w->port && w->peers;
        if (!ok) snprintf(why, sizeof why, "out of memory");
    }
    if (ok) {
        for (int s = 0; s <= w->n_sites; s++) w->site_first[s] = site_first[s];
        for (int s = 0; s < w->n_sites; s++) {
            memcpy(w->tx[s], tx[s], SEAL_KEY_BYTES);
            memcpy(w->rx[s], rx[s], SEAL_KEY_BYTES);
        }
        w->ep = epoll_create1(EPOLL_CLOEXEC);
        if (w->ep < 0) ok = 0, snprintf(why, sizeof why, "epoll_create1: %s", strerror(errno));
    }
    uint32_t me_addr = 0;
    uint16_t me_port = 0;
    if (ok && local_address(o->interface, &me_addr)) {
        ok = 0;
        snprintf(why, sizeof why, "[outer] interface = %s has no IPv4 address on this host", o->interface);
    }
    if (ok && listen_on(w, &me_port, why, sizeof why)) ok = 0;
    if (ok) {
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &w->listen_ev};
        if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->lfd, &e)) ok = 0, snprintf(why, sizeof why, "epoll_ctl: %s", strerror(errno));
    }
    int all_ok = 0;
    int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (rc == MPI_SUCCESS && all_ok) { /* everyone's address and port */
        const uint64_t mine = (uint64_t)me_addr << 32 | (uint64_t)me_port << 16;
        rc = MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, comm);
        for (int r = 0; rc == MPI_SUCCESS && r < size; r++) {
            w->addr[r] = (uint32_t)(all[r] >> 32);
            w->port[r] = (uint16_t)(all[r] >> 16);
        }
    }
    isth_free(all);
    if (rc != MPI_SUCCESS || !all_ok) {
        wire_close(w);
        if (!ok) return isth_fail(ISTH_EINPUT, "wire: rank %d: %s", rank, why);
        if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "wire: the address exchange failed");
        return isth_fail(ISTH_ERUNTIME, "wire: another rank could not listen (its own line says why)");
    }
    *out = w;
    return ISTH_OK;
}

void wire_close(Wire *w)
{
    if (!w) return;
    for (int r = 0; w->peers && r < w->size; r++) {
        Peer *p = w->peers[r];
        if (!p) continue;
        for (int s = 0; s < WIRE_MAX_STREAMS; s++) {
            Conn *c = &p->conn[s];
            close_conn(w, c);
            isth_free(c->tail);
            /* a chunk being written: the stream lets its message go (a detached one,
             * the wire's own, is freed by its last holder; the caller's are theirs) */
            if (c->sop) {
                WireOp *op = c->sop;
                c->sop = NULL;
                if (--op->holders == 0 && op->detached) free_op(op);
            }
        }
        for (WireOp *op = p->sq_head, *next; op; op = next) { /* and the queue its hold */
            next = op->snext;
            op->snext = NULL;
            if (--op->holders == 0 && op->detached) free_op(op);
        }
        for (WireOp *op = p->recvs, *next; op; op = next) {
            next = op->next;
            if (op->unexpected || op->cancelled) free_op(op);
        }
        for (TagSeq *t = p->tags, *next; t; t = next) {
            next = t->next;
            isth_free(t);
        }
        isth_free(p);
    }
    while (w->pending) pending_drop(w, w->pending);
    if (w->lfd >= 0) close(w->lfd);
    if (w->ep >= 0) close(w->ep);
    w->lfd = w->ep = -1;
    sodium_memzero(w->tx, sizeof w->tx);
    sodium_memzero(w->rx, sizeof w->rx);
    isth_free(w->site_first);
    isth_free(w->addr);
    isth_free(w->port);
    isth_free(w->peers);
    isth_free(w);
}
