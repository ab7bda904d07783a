/* wire_conn.c — see wire_conn.h. */
#include "wire_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "status.h"
#include "wire_stream.h"

#define MAX_PENDING 1024        /* connections waiting for their hello: beyond this the oldest goes */

/* --- connecting ----------------------------------------------------------------------------- */

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

void wire_peer_start(Wire *w, int peer, Peer *p)
{
    if (p->started || p->failed[0]) return;
    p->started = 1;
    if (w->rank > peer) return; /* it connects to us */
    const int to_site = site_of(w, peer);
    for (int s = 0; s < w->streams; s++) {
        Conn *c = &p->conn[s];
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->fd < 0) {
            wire_fail_peer(w, peer, "cannot create a socket");
            return;
        }
        tune(w, c->fd);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(w->port[peer] + w->o.port_shift))};
        a.sin_addr.s_addr = w->addr[peer];
        if (connect(c->fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
            wire_fail_peer(w, peer, "connection refused");
            return;
        }
        c->state = CONN_CONNECTING;
        Hello h = {HELLO_MAGIC, WIRE_VERSION, (uint32_t)w->rank, (uint32_t)peer, (uint32_t)s, (uint32_t)w->streams, {0}};
        hello_mac(h.mac, &h, w->tx[to_site]);
        c->tail = isth_malloc(sizeof h);
        if (!c->tail) {
            wire_fail_peer(w, peer, "out of memory");
            return;
        }
        memcpy(c->tail, &h, sizeof h);
        c->tail_len = sizeof h;
        c->tail_off = 0;
        wire_set_events(w, c, EPOLLIN | EPOLLOUT);
        if (p->failed[0]) return;
    }
}

/* --- connections coming in ------------------------------------------------------------------ */

void wire_pending_drop(Wire *w, Pending *q)
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

void wire_accept_all(Wire *w)
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

/* Exactly the hello's bytes are read: the data after it is the stream's. */
void wire_pending_read(Wire *w, Pending *q)
{
    const ssize_t n = recv(q->fd, (unsigned char *)&q->hello + q->got, sizeof q->hello - q->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
        wire_pending_drop(w, q);
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
    Peer *p = ok ? wire_peer_get(w, from) : NULL;
    if (!p || p->failed[0] || p->conn[h->stream].fd >= 0) {
        w->refused += 1;
        wire_pending_drop(w, q);
        return;
    }
    Conn *c = &p->conn[h->stream];
    epoll_ctl(w->ep, EPOLL_CTL_DEL, q->fd, NULL);
    c->fd = q->fd;
    q->fd = -1;
    wire_pending_drop(w, q);
    tune(w, c->fd);
    c->state = CONN_READY;
    p->started = 1;
    wire_set_events(w, c, EPOLLIN | EPOLLOUT);
    wire_recv_pump(w, c);
    wire_send_pump(w, c);
}

/* --- setting up ----------------------------------------------------------------------------- */

/* The IPv4 address other sites reach this rank at. */
int wire_conn_local_address(const char *interface, uint32_t *addr)
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

int wire_conn_listen(Wire *w, uint16_t *port, char *why, size_t why_len)
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

/* this rank's group: the ranks of its host that listen on the same range */
typedef struct {
    int lo, hi, rank;
} RangeOf;

int wire_conn_ports_enough(MPI_Comm comm, const WireOptions *o)
{
    int rank = 0, size = 1, host_n = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Comm host = MPI_COMM_NULL;
    RangeOf mine = {o->port_lo, o->port_hi, rank}, *all = NULL;
    /* a host whose ranks cannot be told (an error here) is not checked: its listen still says why */
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) != MPI_SUCCESS ||
        MPI_Comm_size(host, &host_n) != MPI_SUCCESS)
        host_n = 0;
    if (host_n > 0) all = isth_malloc(sizeof *all * (size_t)host_n); /* a few ints */
    /* every rank of the host gathers, or none (a rank without the buffer
     * must not leave the others in the gather) */
    int have = all != NULL;
    if (host_n > 0 && MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, host) != MPI_SUCCESS) have = 0;
    if (have && MPI_Allgather(&mine, 3, MPI_INT, all, 3, MPI_INT, host) != MPI_SUCCESS) host_n = 0;
    if (!have) host_n = 0;
    if (host != MPI_COMM_NULL) MPI_Comm_free(&host);
    int same = 0, first = size; /* ranks of my group; its lowest rank */
    for (int i = 0; i < host_n && o->port_lo; i++)
        if (all[i].lo == o->port_lo && all[i].hi == o->port_hi) {
            same++;
            if (all[i].rank < first) first = all[i].rank;
        }
    const int ports = o->port_hi - o->port_lo + 1;
    /* the lowest rank of the first group short of ports prints the line (the others stay silent) */
    int me = same > ports && first == rank ? rank : size, printer = size;
    const int rc = MPI_Allreduce(&me, &printer, 1, MPI_INT, MPI_MIN, comm);
    if (rc == MPI_SUCCESS && printer == rank) {
        char ranks[320] = "", name[256] = "?";
        size_t n = 0;
        for (int i = 0, listed = 0; i < host_n; i++) {
            if (all[i].lo != o->port_lo || all[i].hi != o->port_hi) continue;
            if (listed++ == 16) {
                snprintf(ranks + n, sizeof ranks - n, ", ...");
                break;
            }
            const int w = snprintf(ranks + n, sizeof ranks - n, "%s%d", n ? ", " : "", all[i].rank);
            if (w < 0 || (size_t)w >= sizeof ranks - n) break;
            n += (size_t)w;
        }
        gethostname(name, sizeof name - 1);
        char range[32];
        if (ports == 1) snprintf(range, sizeof range, "%d", o->port_lo);
        else snprintf(range, sizeof range, "%d-%d", o->port_lo, o->port_hi);
        const int was = status_set_quiet(0); /* this rank's line is the run's, whatever its rank */
        isth_fail(ISTH_EINPUT, "wire: [outer] ports = %s holds %d port%s, but %d ranks on host %s listen on it "
                  "(world ranks %s): each needs a port of its own", range, ports, ports == 1 ? "" : "s", same, name,
                  ranks);
        status_set_quiet(was);
    }
    isth_free(all);
    if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "wire: the ranks could not count their hosts' ports (MPI)");
    return printer == size ? ISTH_OK : ISTH_EINPUT;
}
