/* wire.c — see wire.h. The ops a caller posts, and progress; the state
 * is in wire_state.c, the chunks on a stream in wire_stream.c, the
 * connections in wire_conn.c. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "alloc.h"
#include "clock.h"
#include "status.h"
#include "wire_conn.h"
#include "wire_state.h"
#include "wire_stream.h"

/* --- progress ------------------------------------------------------------------------------- */

static void on_event(Wire *w, Ev *ev, unsigned events)
{
    if (ev->kind == EV_LISTEN) {
        wire_accept_all(w);
        return;
    }
    if (ev->kind == EV_PENDING) {
        wire_pending_read(w, (Pending *)ev);
        return;
    }
    Conn *c = (Conn *)ev;
    if (c->state == CONN_CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
            wire_fail_peer(w, c->peer, "cannot connect");
            return;
        }
        c->state = CONN_READY;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) wire_recv_pump(w, c);
    if (c->fd >= 0 && (events & EPOLLOUT)) wire_send_pump(w, c);
    /* still stalled (the error waits behind the chunk that has no room) and nothing to send:
     * out of epoll, or the error would be reported at every call */
    if (c->fd >= 0 && c->stalled && (events & (EPOLLERR | EPOLLHUP)) && !(c->events & EPOLLOUT))
        wire_set_events(w, c, 0);
}

static void wake_stalled(Wire *w)
{
    while (w->room_back) {
        w->room_back = 0;
        for (int r = 0; r < w->size; r++)
            if (w->peers[r]) wire_unstall(w, w->peers[r]);
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
            wire_pending_drop(w, q);
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
    Peer *p = wire_peer_get(w, peer);
    TagSeq *ts = p ? wire_tag_seq(p, tag) : NULL;
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
    wire_peer_start(w, peer, p);
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
        if (!p->conn[s].sop) wire_send_pump(w, &p->conn[s]);
    return ISTH_OK;
}

int wire_irecv(Wire *w, int peer, int tag, void *buf, size_t len, WireOp **out)
{
    CHECK(check_peer(w, peer));
    Peer *p = wire_peer_get(w, peer);
    TagSeq *ts = p ? wire_tag_seq(p, tag) : NULL;
    if (!ts) return isth_fail(ISTH_ERUNTIME, "wire: out of memory");
    const uint64_t seq = ts->recv++;
    wire_peer_start(w, peer, p);
    WireOp *op = wire_find_recv(p, tag, seq);
    if (op) { /* it came first */
        if (op->len != len) {
            wire_fail_peer(w, peer, "message size differs from the receive posted"); /* which lets the op go */
            op = NULL;
        } else {
            op->claimed = 1;
            op->dest = buf;
            if (op->done && op->refs == 0) wire_recv_complete(w, p, op);
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
    wire_append_recv(p, op);
    wire_unstall(w, p);
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
        wire_unlink_recv(p, op);
        if (op->unexpected) {
            w->unexpected_bytes -= op->len;
            w->room_back = 1;
        }
        wire_free_op(op);
        return;
    }
    if (!op->is_send) {
        /* stays matched (later chunks of it are read and dropped): freed
         * when its last byte is in, or at close */
        if (op->unexpected) op->claimed = 0;
        return;
    }
    wire_stream_cancel_send(w, p, op);
    isth_free(op);
}

int wire_probe(Wire *w, int peer, int tag)
{
    if (check_peer(w, peer) != ISTH_OK) return 0;
    Peer *p = wire_peer_get(w, peer);
    TagSeq *ts = p ? wire_tag_seq(p, tag) : NULL;
    if (!ts) return 0;
    wire_peer_start(w, peer, p);
    wire_progress(w, 0);
    const WireOp *op = wire_find_recv(p, tag, ts->recv);
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
    if (ok && wire_conn_local_address(o->interface, &me_addr)) {
        ok = 0;
        snprintf(why, sizeof why, "[outer] interface = %s has no IPv4 address on this host", o->interface);
    }
    /* a range with fewer ports than a host's ranks on it: one line, whichever rank would lose the race */
    const int enough = wire_conn_ports_enough(comm, o) == ISTH_OK;
    if (!enough) ok = 0;
    if (ok && wire_conn_listen(w, &me_port, why, sizeof why)) ok = 0;
    if (ok) {
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &w->listen_ev};
        if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->lfd, &e)) ok = 0, snprintf(why, sizeof why, "epoll_ctl: %s", strerror(errno));
    }
    int first = ok ? size : rank, first_failed = size; /* the first rank that failed prints why */
    int rc = MPI_Allreduce(&first, &first_failed, 1, MPI_INT, MPI_MIN, comm);
    const int all_ok = first_failed == size;
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
        if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "wire: the address exchange failed");
        if (enough && rank == first_failed) { /* its line, whatever its rank's quiet mode; the others none */
            const int was = status_set_quiet(0);
            isth_fail(ISTH_EINPUT, "wire: rank %d: %s", rank, why);
            status_set_quiet(was);
        }
        return ISTH_EINPUT;
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
            wire_close_conn(w, c);
            isth_free(c->tail);
            /* a chunk being written: the stream lets its message go (a detached one,
             * the wire's own, is freed by its last holder; the caller's are theirs) */
            if (c->sop) {
                WireOp *op = c->sop;
                c->sop = NULL;
                if (--op->holders == 0 && op->detached) wire_free_op(op);
            }
        }
        for (WireOp *op = p->sq_head, *next; op; op = next) { /* and the queue its hold */
            next = op->snext;
            op->snext = NULL;
            if (--op->holders == 0 && op->detached) wire_free_op(op);
        }
        for (WireOp *op = p->recvs, *next; op; op = next) {
            next = op->next;
            if (op->unexpected || op->cancelled) wire_free_op(op);
        }
        for (TagSeq *t = p->tags, *next; t; t = next) {
            next = t->next;
            isth_free(t);
        }
        isth_free(p);
    }
    while (w->pending) wire_pending_drop(w, w->pending);
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
