/* wire_stream.c — see wire_stream.h. */
#include "wire_stream.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "alloc.h"

#define MAX_MESSAGE ((uint64_t)1 << 40)

/* --- sending ------------------------------------------------------------------------------- */

/* One holder of a send lets it go: a detached or cancelled one is freed by the last. */
static void release_send(WireOp *op)
{
    if (--op->holders == 0 && op->written == op->chunks) {
        op->done = 1;
        if (op->detached || op->cancelled) wire_free_op(op);
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
void wire_send_pump(Wire *w, Conn *c)
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
                wire_set_events(w, c, c->stalled ? 0u : (unsigned)EPOLLIN);
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
        wire_set_events(w, c, (c->stalled ? 0u : (unsigned)EPOLLIN) | EPOLLOUT);
        return;
    }
    wire_fail_peer(w, c->peer, p && errno == EPIPE ? "connection closed by the peer" : "send failed");
}

/* --- receiving ----------------------------------------------------------------------------- */

/* A receive has all its bytes. */
void wire_recv_complete(Wire *w, Peer *p, WireOp *op)
{
    if (op->unexpected && !op->claimed && !op->cancelled) {
        op->done = 1; /* kept for the receive that will ask for it */
        return;
    }
    wire_unlink_recv(p, op);
    if (op->unexpected) {
        w->unexpected_bytes -= op->len;
        if (op->claimed && !op->cancelled) memcpy(op->dest, op->buf, op->len);
        isth_free(op->buf);
        op->buf = NULL;
        op->unexpected = 0;
        for (int r = 0; r < w->size; r++) /* room again: streams that waited for it */
            if (w->peers[r]) wire_unstall(w, w->peers[r]);
    }
    op->done = 1;
    if (op->cancelled) wire_free_op(op);
}

/* A chunk's header is in: which message it belongs to, and room for it. 0
 * when the chunk can be read now, 1 when it must wait for room, -1 when the
 * peer broke the protocol (failed). */
static int chunk_target(Wire *w, Peer *p, Conn *c)
{
    const ChunkHeader *h = &c->rhdr;
    if (h->magic != CHUNK_MAGIC || h->total > MAX_MESSAGE || h->offset > h->total || h->len > h->total - h->offset ||
        h->reserved) {
        wire_fail_peer(w, c->peer, "malformed chunk");
        return -1;
    }
    WireOp *op = wire_find_recv(p, (int)h->tag, h->seq);
    if (!op) {
        const TagSeq *ts = wire_tag_seq(p, (int)h->tag);
        if (ts && h->seq < ts->recv) { /* its receive was posted and is gone: complete, a chunk again */
            wire_fail_peer(w, c->peer, "a chunk of a message already complete");
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
        wire_append_recv(p, op);
    }
    if (op->len != h->total) {
        wire_fail_peer(w, c->peer, "message size differs from the receive posted");
        return -1;
    }
    if (op->done || op->taken + h->len > op->len) { /* a chunk again (a replay on the path) */
        wire_fail_peer(w, c->peer, "a chunk of a message already complete");
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
    if (op->got >= op->len && op->refs == 0) wire_recv_complete(w, p, op);
}

void wire_recv_pump(Wire *w, Conn *c)
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
                wire_set_events(w, c, c->events | EPOLLIN);
            }
            if (t == 1) { /* no room: stop watching its input until a receive or room comes (wire_unstall) */
                c->stalled = 1;
                wire_set_events(w, c, c->events & ~(unsigned)EPOLLIN);
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
    wire_fail_peer(w, c->peer, n == 0 ? "connection closed by the peer" : "receive failed");
}

void wire_unstall(Wire *w, Peer *p)
{
    for (int s = 0; s < w->streams; s++)
        if (p->conn[s].stalled && p->conn[s].fd >= 0) {
            p->conn[s].stalled = 0;
            wire_set_events(w, &p->conn[s], p->conn[s].events | EPOLLIN);
            wire_recv_pump(w, &p->conn[s]);
        }
}

/* --- a send cancelled ----------------------------------------------------------------------- */

void wire_stream_cancel_send(Wire *w, Peer *p, WireOp *op)
{
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
                wire_fail_peer(w, op->peer, "out of memory");
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
                        wire_fail_peer(w, op->peer, "out of memory");
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
}
