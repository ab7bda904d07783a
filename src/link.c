/* link.c — see link.h. */
#include "link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "status.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int hook_value(const char *var, const char *site)
{
    const char *v = getenv(var);
    if (!v || !site) return 0;
    const char *colon = strrchr(v, ':');
    if (!colon || (size_t)(colon - v) != strlen(site) || strncmp(v, site, strlen(site))) return 0;
    return atoi(colon + 1);
}

void link_init(Link *l, MPI_Comm comm, double timeout_s, const char *site_name)
{
    memset(l, 0, sizeof *l);
    l->comm = comm;
    l->timeout_s = timeout_s;
    l->corrupt_exchange = hook_value("ISTHMUS_LINK_CORRUPT", site_name);
    l->delay_polls = hook_value("ISTHMUS_LINK_DELAY", site_name);
    l->mute = hook_value("ISTHMUS_LINK_MUTE", site_name);
}

void link_frame(unsigned char *buf, uint8_t codec, uint8_t kind, uint32_t fragment,
                uint32_t from_site, uint64_t exchange, uint64_t values, uint64_t payload_bytes)
{
    LinkHeader h = {LINK_MAGIC, LINK_VERSION, codec, kind, fragment, from_site, exchange, values,
                    payload_bytes, checksum64(buf + sizeof h, payload_bytes)};
    memcpy(buf, &h, sizeof h);
}

void link_corrupt(unsigned char *buf, size_t bytes)
{
    if (bytes > sizeof(LinkHeader)) buf[sizeof(LinkHeader) + (bytes - sizeof(LinkHeader)) / 2] ^= 0x5a;
}

void link_post_recv(Link *l, LinkMsg *m)
{
    m->recv_done = 0;
    MPI_Irecv(m->recv, (int)m->recv_bytes, MPI_BYTE, m->peer, m->tag, l->comm, &m->rr);
}

void link_post_send(Link *l, LinkMsg *m)
{
    LinkHeader h;
    memcpy(&h, m->send, sizeof h);
    if (l->mute && (h.kind == LINK_SITE_VALUES || h.kind == LINK_PAIR_VALUES)) { /* test hook: values never leave */
        m->send_posted = 2;
        return;
    }
    MPI_Isend(m->send, (int)m->send_bytes, MPI_BYTE, m->peer, m->tag, l->comm, &m->rs);
    m->send_posted = 1;
    *(m->local ? &l->intra_sent : &l->bytes_sent) += (double)m->send_bytes;
}

int link_test(Link *l, LinkMsg *const *msgs, int n)
{
    int all = 1;
    for (int i = 0; i < n; i++) {
        LinkMsg *m = msgs[i];
        if (!m->recv_done) {
            int flag = 0;
            MPI_Test(&m->rr, &flag, MPI_STATUS_IGNORE);
            if (flag) {
                m->recv_done = 1;
                *(m->local ? &l->intra_recv : &l->bytes_recv) += (double)m->recv_bytes;
            }
        }
        if (!m->recv_done) all = 0;
        if (m->send_posted == 1) {
            int flag = 0;
            MPI_Test(&m->rs, &flag, MPI_STATUS_IGNORE);
            if (flag) m->send_posted = 2;
            else all = 0;
        }
    }
    return all;
}

int link_wait(Link *l, LinkMsg *const *msgs, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (!msgs[i]->send_posted) link_post_send(l, msgs[i]);
    const double t0 = now_s();
    while (!link_test(l, msgs, n)) {
        if (now_s() - t0 > l->timeout_s) {
            int peer = -1;
            for (int i = 0; i < n && peer < 0; i++)
                if (!msgs[i]->recv_done || msgs[i]->send_posted == 1) peer = msgs[i]->peer;
            l->wait_s += now_s() - t0;
            return isth_fail(ISTH_ERUNTIME,
                             "link: %s: nothing from world rank %d within [outer] timeout = %g s "
                             "(peer site down or link cut)", what, peer, l->timeout_s);
        }
        struct timespec ts = {0, 50000}; /* 50 us: yield the core to the ranks computing */
        nanosleep(&ts, NULL);
    }
    l->wait_s += now_s() - t0;
    return ISTH_OK;
}

const char *link_check(const unsigned char *buf, size_t bytes, uint8_t kind, uint32_t fragment,
                       uint64_t exchange, uint64_t values, uint64_t payload_bytes)
{
    LinkHeader h;
    if (bytes < sizeof h) return "short frame";
    memcpy(&h, buf, sizeof h);
    if (h.magic != LINK_MAGIC || h.version != LINK_VERSION) return "bad magic or version";
    if (h.kind != kind || h.fragment != fragment || h.exchange != exchange) return "unexpected fragment or exchange";
    if (h.values != values || h.payload_bytes != payload_bytes || bytes != sizeof h + payload_bytes)
        return "wrong payload size";
    if (checksum64(buf + sizeof h, payload_bytes) != h.checksum) return "bad checksum";
    return NULL;
}
