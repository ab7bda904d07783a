/* wire_state.c — see wire_state.h. */
#include "wire_state.h"

#include <stdio.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "alloc.h"

void wire_set_events(Wire *w, Conn *c, unsigned events)
{
    if (c->fd < 0 || (c->registered && c->events == events)) return;
    if (events == 0) { /* out of epoll: an error or hang-up is reported even for an empty mask, and a
                        * stalled stream must not be woken by one it cannot read yet (wire_unstall re-adds it) */
        if (c->registered) epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
        c->registered = 0;
        c->events = 0;
        return;
    }
    struct epoll_event e = {.events = events, .data.ptr = &c->ev};
    if (epoll_ctl(w->ep, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &e)) {
        wire_fail_peer(w, c->peer, "epoll_ctl failed"); /* a stream epoll cannot watch would stall unseen */
        return;
    }
    c->registered = 1;
    c->events = events;
}

void wire_free_op(WireOp *op)
{
    if (op->unexpected) isth_free(op->buf);
    isth_free(op);
}

TagSeq *wire_tag_seq(Peer *p, int tag)
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

void wire_close_conn(Wire *w, Conn *c)
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

void wire_fail_peer(Wire *w, int peer, const char *why)
{
    Peer *p = w->peers[peer];
    if (!p || p->failed[0]) return;
    snprintf(p->failed, sizeof p->failed, "%s", why);
    for (int s = 0; s < w->streams; s++) wire_close_conn(w, &p->conn[s]);
    /* what arrived early from it and nobody asked for: its room goes back */
    for (WireOp *op = p->recvs, *next; op; op = next) {
        next = op->next;
        if (!op->unexpected || op->claimed || op->refs) continue;
        wire_unlink_recv(p, op);
        w->unexpected_bytes -= op->len;
        wire_free_op(op);
        w->room_back = 1; /* the stalled streams are woken at the end of the progress call */
    }
}

Peer *wire_peer_get(Wire *w, int peer)
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

WireOp *wire_find_recv(Peer *p, int tag, uint64_t seq)
{
    for (WireOp *op = p->recvs; op; op = op->next)
        if (op->tag == tag && op->seq == seq) return op;
    return NULL;
}

void wire_unlink_recv(Peer *p, WireOp *op)
{
    WireOp **pp = &p->recvs, *prev = NULL;
    while (*pp && *pp != op) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = op->next;
    if (p->recvs_tail == op) p->recvs_tail = prev;
    op->next = NULL;
}

void wire_append_recv(Peer *p, WireOp *op)
{
    op->next = NULL;
    if (p->recvs_tail) p->recvs_tail->next = op;
    else p->recvs = op;
    p->recvs_tail = op;
}
