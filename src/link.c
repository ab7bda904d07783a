/* link.c — see link.h. */
#include "link.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "codec.h"
#include "coll.h"
#include "fault.h"
#include "clock.h"
#include "status.h"

/* The site of a rank of the link communicator (the last site for a rank
 * beyond the table: its frames then fail to open, never crash). */
static int site_of_rank(const Link *l, int rank)
{
    int s = 0;
    while (s + 1 < l->n_sites && rank >= l->site_first[s + 1]) s++;
    return s;
}

/* Does a message to or from this peer go over the wire? */
static int over_wire(const Link *l, int peer) { return l->wire && site_of_rank(l, peer) != l->my_site; }

static int req_null(const LinkReq *r) { return !r->wire && r->mpi == MPI_REQUEST_NULL; }

void link_mark(Link *l)
{
    l->mark_bytes = l->bytes_sent + l->bytes_recv;
    l->mark_wait = l->wait_s;
}

void link_since_mark(const Link *l, double *bytes, double *wait_s)
{
    *bytes = l->bytes_sent + l->bytes_recv - l->mark_bytes;
    *wait_s = l->wait_s - l->mark_wait;
}

void link_set_keys(Link *l, const unsigned char master[SEAL_KEY_BYTES], int encrypt, int my_site,
                   const int *site_first, int n_sites)
{
    l->n_sites = n_sites < LINK_MAX_SITES ? n_sites : LINK_MAX_SITES;
    l->my_site = my_site;
    l->encrypt = encrypt;
    for (int s = 0; s <= l->n_sites; s++) l->site_first[s] = site_first[s];
    for (int s = 0; s < l->n_sites; s++) {
        seal_pair_key(l->tx_key[s], master, my_site, s);
        seal_pair_key(l->rx_key[s], master, s, my_site);
    }
}

void link_forget_keys(Link *l)
{
    seal_wipe(l->tx_key, sizeof l->tx_key);
    seal_wipe(l->rx_key, sizeof l->rx_key);
}

int link_open_wire(Link *l, const WireOptions *o)
{
    return wire_open(&l->wire, l->comm, l->site_first, l->n_sites, l->my_site,
                     (const unsigned char (*)[SEAL_KEY_BYTES])l->tx_key,
                     (const unsigned char (*)[SEAL_KEY_BYTES])l->rx_key, o);
}

void link_close_wire(Link *l)
{
    wire_close(l->wire);
    l->wire = NULL;
}


void link_init(Link *l, MPI_Comm comm, double timeout_s, const char *site_name)
{
    memset(l, 0, sizeof *l);
    l->comm = comm;
    l->timeout_s = timeout_s;
    int size = 1;
    if (comm != MPI_COMM_NULL) {
        MPI_Comm_rank(comm, &l->rank);
        MPI_Comm_size(comm, &size);
    }
    (void)seal_init();
    const unsigned char zero[SEAL_KEY_BYTES] = {0};
    const int first[2] = {0, size};
    link_set_keys(l, zero, 1, 0, first, 1);
    l->corrupt_exchange = (int)fault_hook_for("ISTHMUS_LINK_CORRUPT", site_name);
    l->delay_polls = (int)fault_hook_for("ISTHMUS_LINK_DELAY", site_name);
    l->mute = (int)fault_hook_for("ISTHMUS_LINK_MUTE", site_name);
}

void link_survive(Link *l, int on) { l->survive = on; }

void link_mark_lost(Link *l, int s, const char *what, double after_s)
{
    if (s < 0 || s >= LINK_MAX_SITES || l->lost[s]) return;
    l->lost[s] = 1;
    l->lost_new = 1;
    snprintf(l->lost_what[s], sizeof l->lost_what[s], "%s", what);
    l->lost_after_s[s] = after_s;
}

void link_mark_left(Link *l, int s)
{
    if (s < 0 || s >= LINK_MAX_SITES || l->lost[s]) return;
    link_mark_lost(l, s, "its own stop request", 0.0);
    l->left[s] = 1;
}

int link_is_lost(const Link *l, int s) { return s >= 0 && s < LINK_MAX_SITES && l->lost[s]; }

int link_has_left(const Link *l, int s) { return s >= 0 && s < LINK_MAX_SITES && l->left[s]; }

const char *link_lost_what(const Link *l, int s, double *after_s)
{
    if (after_s) *after_s = s >= 0 && s < LINK_MAX_SITES ? l->lost_after_s[s] : 0.0;
    return s >= 0 && s < LINK_MAX_SITES ? l->lost_what[s] : "";
}

int link_lost_news(const Link *l) { return l->lost_new; }

int link_survives(const Link *l) { return l->survive; }

double link_timeout(const Link *l) { return l->timeout_s; }

void link_set_piece_bytes(Link *l, size_t bytes) { l->piece_bytes = bytes; }

int link_corrupts(const Link *l, uint64_t exchange)
{
    return l->corrupt_exchange && (uint64_t)l->corrupt_exchange == exchange;
}

int link_delay_polls(const Link *l) { return l->delay_polls; }

double link_set_timeout(Link *l, double timeout_s)
{
    const double was = l->timeout_s;
    l->timeout_s = timeout_s;
    return was;
}

LinkCounters link_counters(const Link *l)
{
    return (LinkCounters){l->bytes_sent, l->bytes_recv, l->auth_failures, l->wait_s};
}

void link_counters_add(Link *l, LinkCounters c)
{
    l->bytes_sent += c.bytes_sent;
    l->bytes_recv += c.bytes_recv;
    l->auth_failures += c.auth_failures;
    l->wait_s += c.wait_s;
}

int link_any_lost(const Link *l, int n_sites)
{
    for (int s = 0; s < n_sites && s < LINK_MAX_SITES; s++)
        if (l->lost[s]) return 1;
    return 0;
}

int link_take_lost(Link *l, unsigned char *out, int n_sites)
{
    int n = 0;
    for (int s = 0; s < n_sites && s < LINK_MAX_SITES; s++) {
        out[s] = l->lost[s] && !l->lost_reported[s];
        if (out[s]) {
            l->lost_reported[s] = 1;
            n++;
        }
    }
    l->lost_new = 0;
    return n;
}

/* The notice over the wire: a sealed control frame of the sender's site
 * number, fragment 1 (never a control exchange's), exchange 0 (a notice
 * comes once per epoch: a site lost is back only through a rejoin, which
 * changes the keys). */
#define NOTICE_BYTES (sizeof(LinkHeader) + sizeof(uint64_t))

void link_notify_dropped(Link *l, int peer, int my_site, uint64_t live)
{
    /* MPI (or the wire) reads a notice whenever it can and its request is
     * never awaited: never on the stack, and a peer lost again takes the
     * next of a few slots, not the one an earlier notice may still be read from */
    enum { SLOTS = 16 }; /* a notice to each site out at every loss: many before one is read */
    static uint64_t sent[LINK_MAX_SITES][SLOTS];
    static unsigned char notice[LINK_MAX_SITES][SLOTS][NOTICE_BYTES];
    static unsigned turn[LINK_MAX_SITES];
    const int ps = site_of_rank(l, peer) % LINK_MAX_SITES;
    const unsigned slot = turn[ps]++ % SLOTS;
    if (over_wire(l, peer)) {
        unsigned char *f = notice[ps][slot];
        memcpy(f + sizeof(LinkHeader), &live, sizeof live);
        link_frame(l, peer, f, 0, LINK_CONTROL, 1, (uint32_t)my_site, 0, sizeof live, sizeof live);
        (void)wire_isend(l->wire, peer, LINK_TAG_DROPPED, f, NOTICE_BYTES, NULL); /* detached: never awaited */
        wire_progress(l->wire, 0);
        return;
    }
    MPI_Request req;
    uint64_t *v = &sent[ps][slot];
    *v = live;
    if (MPI_Isend(v, 1, MPI_UINT64_T, peer, LINK_TAG_DROPPED, l->comm, &req) == MPI_SUCCESS) MPI_Request_free(&req);
}

uint64_t link_was_dropped(Link *l, int peer)
{
    uint64_t live = 0;
    if (over_wire(l, peer)) {
        if (!wire_probe(l->wire, peer, LINK_TAG_DROPPED)) return 0;
        unsigned char f[NOTICE_BYTES];
        WireOp *op = NULL;
        if (wire_irecv(l->wire, peer, LINK_TAG_DROPPED, f, sizeof f, &op) != ISTH_OK) return 0;
        if (!wire_test(l->wire, &op)) {
            wire_cancel(l->wire, &op);
            return 0;
        }
        if (link_check(l, peer, f, sizeof f, LINK_CONTROL, 1, 0, sizeof live, sizeof live) != NULL) return 0;
        memcpy(&live, f + sizeof(LinkHeader), sizeof live);
        return live;
    }
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(peer, LINK_TAG_DROPPED, l->comm, &flag, &st) != MPI_SUCCESS || !flag) return 0;
    MPI_Recv(&live, 1, MPI_UINT64_T, peer, LINK_TAG_DROPPED, l->comm, MPI_STATUS_IGNORE);
    return live;
}

static void msg_init(LinkMsg *m, int peer, int tag, size_t send_bytes, size_t recv_bytes, int local)
{
    memset(m, 0, sizeof *m);
    m->peer = peer;
    m->tag = tag;
    m->send_bytes = send_bytes;
    m->recv_bytes = recv_bytes;
    m->local = local;
}

int link_msg_alloc(LinkMsg *m, int peer, int tag, size_t send_bytes, size_t recv_bytes, int local)
{
    msg_init(m, peer, tag, send_bytes, recv_bytes, local);
    m->send = isth_malloc(send_bytes ? send_bytes : 1);
    m->recv = isth_malloc(recv_bytes ? recv_bytes : 1);
    if (!m->send || !m->recv) {
        isth_free(m->send);
        isth_free(m->recv);
        m->send = m->recv = NULL;
        return isth_fail(ISTH_ERUNTIME, "link: out of memory for a %zu-byte message", send_bytes + recv_bytes);
    }
    return ISTH_OK;
}

static int retire_within(MPI_Request *req, int n, double grace_s)
{
    if (n <= 0) return 1;
    for (int i = 0; i < n; i++)
        if (req[i] != MPI_REQUEST_NULL) MPI_Cancel(&req[i]);
    const double t0 = now_s();
    int done = 0;
    for (;;) {
        if (MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return 0;
        if (done || now_s() - t0 >= grace_s) return done;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

int link_retire(MPI_Request *req, int n) { return retire_within(req, n, 1.0); }

int link_raw_post(Link *l, int peer, int tag, void *buf, size_t bytes, int is_send, LinkReq *r)
{
    *r = (LinkReq){MPI_REQUEST_NULL, NULL};
    if (over_wire(l, peer))
        return is_send ? wire_isend(l->wire, peer, tag, buf, bytes, &r->wire)
                       : wire_irecv(l->wire, peer, tag, buf, bytes, &r->wire);
    if (is_send) CHECK_MPI(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, l->comm, &r->mpi));
    else CHECK_MPI(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, l->comm, &r->mpi));
    return ISTH_OK;
}

static int req_test(Wire *w, LinkReq *r, int *flag);

int link_raw_test(Link *l, LinkReq *r, int n, int *done)
{
    if (l->wire) wire_progress(l->wire, 0);
    *done = 1;
    for (int i = 0; i < n; i++) {
        int one = 1;
        CHECK(req_test(l->wire, &r[i], &one));
        *done &= one;
    }
    return ISTH_OK;
}

static int retire_pieces(Wire *w, LinkReq *req, int n, double grace_s);

int link_raw_retire(Link *l, LinkReq *r, int n) { return retire_pieces(l->wire, r, n, 1.0); }

/* Retire a message's pieces: those on the wire are cancelled at once (the
 * wire never writes a buffer after that); MPI's within the grace period. */
static int retire_pieces(Wire *w, LinkReq *req, int n, double grace_s)
{
    if (!req || n <= 0) return 1;
    for (int i = 0; i < n; i++)
        if (req[i].wire) wire_cancel(w, &req[i].wire);
    MPI_Request *mpi = isth_malloc(sizeof(MPI_Request) * (size_t)n);
    if (!mpi) return 0;
    for (int i = 0; i < n; i++) mpi[i] = req[i].mpi;
    const int done = retire_within(mpi, n, grace_s);
    for (int i = 0; i < n; i++) req[i].mpi = mpi[i];
    isth_free(mpi);
    return done;
}

void link_msg_init_borrowed(LinkMsg *m, int peer, int tag, size_t send_bytes, size_t recv_bytes, int local)
{
    msg_init(m, peer, tag, send_bytes, recv_bytes, local);
    m->borrowed = 1;
}

int link_msg_free(LinkMsg *m)
{
    int free_recv = 1, free_send = 1;
    if (m->recv_posted && !m->recv_done) free_recv = retire_pieces(m->wire, m->rr, m->recv_pieces, 1.0);
    if (m->send_posted == 1) free_send = retire_pieces(m->wire, m->rs, m->send_pieces, 1.0);
    if (free_recv) {
        if (!m->borrowed) isth_free(m->recv);
        isth_free(m->rr);
    }
    if (free_send) {
        if (!m->borrowed) isth_free(m->send);
        isth_free(m->rs);
    }
    memset(m, 0, sizeof *m);
    return free_recv && free_send;
}

void link_frame(Link *l, int peer, unsigned char *buf, uint8_t codec, uint8_t kind, uint32_t fragment,
                uint32_t from_site, uint64_t exchange, uint64_t values, uint64_t payload_bytes)
{
    LinkHeader h;
    memset(&h, 0, sizeof h);
    h.magic = LINK_MAGIC;
    h.version = LINK_VERSION;
    h.codec = codec;
    h.kind = kind;
    h.fragment = fragment;
    h.from_site = from_site;
    h.exchange = exchange;
    h.values = values;
    h.payload_bytes = payload_bytes;
    h.from_rank = (uint32_t)l->rank;
    h.to_rank = (uint32_t)peer;
    h.flags = l->encrypt ? LINK_ENCRYPTED : 0u;
    memcpy(buf, &h, sizeof h);
    /* the nonce and tag are written in place (buf need not be aligned for a LinkHeader) */
    seal_frame(l->tx_key[site_of_rank(l, peer)], l->encrypt, buf + offsetof(LinkHeader, nonce),
               buf + offsetof(LinkHeader, tag), buf + LINK_HEADER_AD_OFFSET,
               sizeof h - LINK_HEADER_AD_OFFSET, buf + sizeof h, payload_bytes);
}

void link_corrupt(unsigned char *buf, size_t bytes)
{
    if (bytes > sizeof(LinkHeader)) buf[sizeof(LinkHeader) + (bytes - sizeof(LinkHeader)) / 2] ^= 0x5a;
}

/* A frame goes in pieces of at most this many bytes, in order: MPI's
 * non-overtaking rule matches the pieces of a send with the pieces of the
 * receive posted in the same order. */
static size_t piece_of(const Link *l)
{
    const size_t most = coll_max_message();
    return l->piece_bytes && l->piece_bytes < most ? l->piece_bytes : most;
}

/* Requests for `bytes` in pieces, every one null (not posted). */
static int alloc_pieces(const Link *l, size_t bytes, LinkReq **req, int *pieces)
{
    const size_t piece = piece_of(l);
    const int n = bytes ? (int)((bytes + piece - 1) / piece) : 1;
    if (n > *pieces || !*req) {
        LinkReq *r = isth_realloc(*req, sizeof(LinkReq) * (size_t)n);
        CHECK_ALLOC(r);
        *req = r;
    }
    *pieces = n;
    for (int i = 0; i < n; i++) (*req)[i] = (LinkReq){MPI_REQUEST_NULL, NULL};
    return ISTH_OK;
}

/* Post pieces [from, to) of buf. */
static int post_range(Link *l, unsigned char *buf, size_t bytes, int peer, int tag, int is_send, LinkReq *req,
                      int from, int to)
{
    const size_t piece = piece_of(l);
    const int wire = over_wire(l, peer);
    for (int i = from; i < to; i++) {
        const size_t off = (size_t)i * piece, len = bytes - off < piece ? bytes - off : piece;
        if (wire && is_send)
            CHECK(wire_isend(l->wire, peer, tag, buf + off, len, &req[i].wire));
        else if (wire)
            CHECK(wire_irecv(l->wire, peer, tag, buf + off, len, &req[i].wire));
        else if (is_send)
            CHECK_MPI(MPI_Isend(buf + off, (int)len, MPI_BYTE, peer, tag, l->comm, &req[i].mpi));
        else
            CHECK_MPI(MPI_Irecv(buf + off, (int)len, MPI_BYTE, peer, tag, l->comm, &req[i].mpi));
    }
    return ISTH_OK;
}

int link_post_recv(Link *l, LinkMsg *m)
{
    m->recv_done = 0;
    m->recv_posted = 1;
    m->recv_pieces_done = 0;
    if (over_wire(l, m->peer)) m->wire = l->wire;
    CHECK(alloc_pieces(l, m->recv_bytes, &m->rr, &m->recv_pieces));
    return post_range(l, m->recv, m->recv_bytes, m->peer, m->tag, 0, m->rr, 0, m->recv_pieces);
}

int link_post_send_upto(Link *l, LinkMsg *m, size_t bytes)
{
    if (m->send_posted == 2) return ISTH_OK;
    if (m->send_posted == 0) {
        LinkHeader h;
        memcpy(&h, m->send, sizeof h);
        if (l->mute && (h.kind == LINK_SITE_VALUES || h.kind == LINK_PAIR_VALUES)) { /* test hook: values never leave */
            m->send_posted = 2;
            return ISTH_OK;
        }
        m->send_posted = 1;
        m->send_next = 0;
        if (over_wire(l, m->peer)) m->wire = l->wire;
        *(m->local ? &l->intra_sent : &l->bytes_sent) += (double)m->send_bytes;
        CHECK(alloc_pieces(l, m->send_bytes, &m->rs, &m->send_pieces));
    }
    const size_t piece = piece_of(l);
    int to = m->send_next;
    while (to < m->send_pieces && (size_t)to * piece < bytes) to++;
    CHECK(post_range(l, m->send, m->send_bytes, m->peer, m->tag, 1, m->rs, m->send_next, to));
    m->send_next = to;
    return ISTH_OK;
}

int link_post_send(Link *l, LinkMsg *m) { return link_post_send_upto(l, m, m->send_bytes); }

double link_recv_fraction(const LinkMsg *m)
{
    if (m->recv_done || !m->recv_posted) return 1.0;
    return m->recv_pieces > 0 ? (double)m->recv_pieces_done / m->recv_pieces : 0.0;
}

/* Has this piece completed? (a null one has) */
static int req_test(Wire *w, LinkReq *r, int *flag)
{
    *flag = 1;
    if (r->wire) *flag = wire_test(w, &r->wire);
    else if (r->mpi != MPI_REQUEST_NULL) CHECK_MPI(MPI_Test(&r->mpi, flag, MPI_STATUS_IGNORE));
    return ISTH_OK;
}

int link_test(Link *l, LinkMsg *const *msgs, int n, int *all)
{
    *all = 1;
    if (l->wire) wire_progress(l->wire, 0);
    for (int i = 0; i < n; i++) {
        LinkMsg *m = msgs[i];
        if (!m->recv_done && m->recv_posted) {
            /* piece by piece, in order (they arrive in order): how far it
             * has come is worth knowing (reduce.c warns of a late one) */
            for (int k = m->recv_pieces_done; k < m->recv_pieces; k++) {
                int flag = 0;
                CHECK(req_test(m->wire, &m->rr[k], &flag));
                if (!flag) break;
                m->recv_pieces_done = k + 1;
            }
            if (m->recv_pieces_done >= m->recv_pieces) {
                m->recv_done = 1;
                *(m->local ? &l->intra_recv : &l->bytes_recv) += (double)m->recv_bytes;
            }
        }
        if (!m->recv_done) *all = 0;
        if (m->send_posted == 1) {
            int flag = 1;
            for (int k = 0; k < m->send_next; k++) {
                int one = 1;
                if (!req_null(&m->rs[k])) CHECK(req_test(m->wire, &m->rs[k], &one));
                flag &= one;
            }
            if (flag && m->send_next == m->send_pieces) m->send_posted = 2;
            else *all = 0;
        }
    }
    return ISTH_OK;
}

static void progress_pause(int on);

/* Complete the messages (posting sends still deferred) or reach the
 * deadline: *all says which; the time blocked is counted. */
static int complete_by_deadline(Link *l, LinkMsg *const *msgs, int n, int *all, double *waited)
{
    for (int i = 0; i < n; i++) /* sends not posted yet, or paced and not posted whole */
        if (msgs[i]->send_posted != 2) CHECK(link_post_send(l, msgs[i]));
    const double t0 = now_s();
    progress_pause(1);
    int rc = ISTH_OK;
    for (;;) {
        rc = link_test(l, msgs, n, all);
        if (rc != ISTH_OK || *all || now_s() - t0 > l->timeout_s) break;
        struct timespec ts = {0, 50000}; /* 50 us: yield the core to the ranks computing */
        nanosleep(&ts, NULL);
    }
    progress_pause(0);
    *waited = now_s() - t0;
    l->wait_s += *waited;
    return rc;
}

int link_wait(Link *l, LinkMsg *const *msgs, int n, const char *what)
{
    int all;
    double waited;
    CHECK(complete_by_deadline(l, msgs, n, &all, &waited));
    if (all) return ISTH_OK;
    int peer = -1;
    for (int i = 0; i < n && peer < 0; i++)
        if (!msgs[i]->recv_done || msgs[i]->send_posted == 1) peer = msgs[i]->peer;
    return isth_fail(ISTH_ERUNTIME,
                     "link: %s: nothing from world rank %d within [outer] timeout = %g s "
                     "(peer site down or link cut)", what, peer, l->timeout_s);
}

void link_msg_skip(LinkMsg *m)
{
    m->recv_posted = 0;
    m->recv_done = 1;
    m->send_posted = 2;
}

void link_msg_bind(LinkMsg *m, unsigned char *send, unsigned char *recv)
{
    m->send = send;
    m->recv = recv;
}

void link_msg_rearm(LinkMsg *m) { m->send_posted = 0; }

int link_msg_take_stuck(LinkMsg *m)
{
    const int stuck = m->stuck;
    m->stuck = 0;
    return stuck;
}

void link_abandon(LinkMsg *m)
{
    /* a send MPI cannot cancel only reads its buffer; a receive that
     * cannot be cancelled could still be written: either makes it stuck */
    /* a lost peer: no long grace (Open MPI cancels receives at once and
     * sends never), so detection stays close to the deadline */
    if (m->recv_posted && !m->recv_done && !retire_pieces(m->wire, m->rr, m->recv_pieces, 0.1)) m->stuck = 1;
    if (m->send_posted == 1 && !retire_pieces(m->wire, m->rs, m->send_pieces, 0.0)) m->stuck = 1;
    m->recv_done = 1;
    m->send_posted = 2;
}

int link_wait_live(Link *l, LinkMsg *const *msgs, int n, const char *what, unsigned char *late, double *waited)
{
    for (int i = 0; i < n; i++) late[i] = 0;
    *waited = 0.0;
    if (!l->survive) return link_wait(l, msgs, n, what);
    int all;
    CHECK(complete_by_deadline(l, msgs, n, &all, waited));
    for (int i = 0; !all && i < n; i++) {
        LinkMsg *m = msgs[i];
        if (m->recv_done && m->send_posted != 1) continue;
        late[i] = 1;
        link_abandon(m);
    }
    return ISTH_OK;
}

int link_send_blob(Link *l, int peer, int tag, unsigned char *frame, size_t bytes, uint64_t seq, const char *what)
{
    LinkMsg m;
    link_msg_init_borrowed(&m, peer, tag, sizeof(LinkHeader) + bytes, 0, 0);
    m.send = frame;
    link_frame(l, peer, frame, 0, LINK_CONTROL, 0, 0, seq, bytes, bytes);
    m.recv_done = 1; /* one way */
    LinkMsg *msgs[1] = {&m};
    const int rc = link_wait(l, msgs, 1, what);
    link_msg_free(&m);
    return rc;
}

int link_recv_blob(Link *l, int peer, int tag, unsigned char *frame, size_t bytes, uint64_t seq, const char *what)
{
    LinkMsg m;
    link_msg_init_borrowed(&m, peer, tag, 0, sizeof(LinkHeader) + bytes, 0);
    m.recv = frame;
    m.send_posted = 2; /* one way */
    int rc = link_post_recv(l, &m);
    LinkMsg *msgs[1] = {&m};
    if (rc == ISTH_OK) rc = link_wait(l, msgs, 1, what);
    const char *bad = rc == ISTH_OK ? link_check(l, peer, frame, m.recv_bytes, LINK_CONTROL, 0, seq, bytes, bytes)
                                    : NULL;
    if (bad) rc = isth_fail(ISTH_ERUNTIME, "link: %s: frame from world rank %d rejected: %s", what, peer, bad);
    link_msg_free(&m);
    return rc;
}

static const char *check_frame(Link *l, int peer, unsigned char *buf, size_t bytes, uint8_t kind, uint32_t fragment,
                       uint64_t exchange, uint64_t values, uint64_t payload_bytes)
{
    LinkHeader h;
    if (bytes < sizeof h) return "short frame";
    memcpy(&h, buf, sizeof h);
    /* the size the frame claims decides how much is authenticated: it must
     * be the size received; then nothing is trusted before the seal opens */
    if (h.payload_bytes != bytes - sizeof h) return "wrong payload size";
    if (seal_open(l->rx_key[site_of_rank(l, peer)], (h.flags & LINK_ENCRYPTED) != 0, h.nonce, h.tag,
                  buf + LINK_HEADER_AD_OFFSET, sizeof h - LINK_HEADER_AD_OFFSET, buf + sizeof h, h.payload_bytes))
        return "failed authentication";
    if (h.magic != LINK_MAGIC || h.version != LINK_VERSION) return "bad magic or version";
    if (h.from_rank != (uint32_t)peer || h.to_rank != (uint32_t)l->rank) return "from or to the wrong rank";
    if ((h.flags & LINK_ENCRYPTED) != (l->encrypt ? LINK_ENCRYPTED : 0u) || h.reserved)
        return "encryption not as agreed";
    if (h.kind != kind || h.fragment != fragment || h.exchange != exchange) return "unexpected fragment or exchange";
    if (h.values != values || h.payload_bytes != payload_bytes) return "wrong payload size";
    return NULL;
}

const char *link_check(Link *l, int peer, unsigned char *buf, size_t bytes, uint8_t kind, uint32_t fragment,
                       uint64_t exchange, uint64_t values, uint64_t payload_bytes)
{
    const char *bad = check_frame(l, peer, buf, bytes, kind, fragment, exchange, values, payload_bytes);
    if (bad) l->auth_failures++;
    return bad;
}

int link_control(Link *l, const void *mine, size_t bytes, void *all, const int *site_leaders, int n_sites,
                 int my_site, MPI_Comm site_comm, const char *what)
{
    const uint64_t seq = ++l->control_seq;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(site_comm, &site_rank));
    unsigned char was[LINK_MAX_SITES]; /* the site's common view before this exchange */
    memcpy(was, l->lost, sizeof was);
    unsigned char *out = all;
    memset(out, 0, (size_t)n_sites * bytes); /* lost sites' slots stay zero */
    memcpy(out + (size_t)my_site * bytes, mine, bytes);
    int rc = ISTH_OK;
    if (site_rank == 0 && n_sites > 1) {
        const size_t frame = sizeof(LinkHeader) + bytes;
        LinkMsg *msgs = isth_calloc((size_t)n_sites, sizeof(LinkMsg));
        LinkMsg **ptrs = isth_calloc((size_t)n_sites, sizeof(LinkMsg *));
        int *site_of = isth_calloc((size_t)n_sites, sizeof(int));
        unsigned char *late = isth_calloc((size_t)n_sites, 1);
        int n = 0;
        if (!msgs || !ptrs || !site_of || !late)
            rc = isth_fail(ISTH_ERUNTIME, "link: out of memory for the %s control exchange", what);
        for (int s = 0; s < n_sites && rc == ISTH_OK; s++) {
            if (s == my_site || (s < LINK_MAX_SITES && l->lost[s])) continue;
            LinkMsg *m = &msgs[n];
            rc = link_msg_alloc(m, site_leaders[s], LINK_TAG_CONTROL, frame, frame, 0);
            if (rc != ISTH_OK) break;
            site_of[n] = s;
            ptrs[n++] = m;
            memcpy(m->send + sizeof(LinkHeader), mine, bytes);
            link_frame(l, site_leaders[s], m->send, 0, LINK_CONTROL, 0, (uint32_t)my_site, seq, bytes, bytes);
            rc = link_post_recv(l, m);
            if (rc == ISTH_OK) rc = link_post_send(l, m);
            l->control_calls += 2;
        }
        double waited = 0.0;
        if (rc == ISTH_OK) rc = link_wait_live(l, ptrs, n, what, late, &waited);
        for (int i = 0; rc == ISTH_OK && i < n; i++) {
            const int s = site_of[i];
            if (late[i]) {
                link_mark_lost(l, s, what, waited);
                continue;
            }
            const char *bad = link_check(l, ptrs[i]->peer, ptrs[i]->recv, ptrs[i]->recv_bytes, LINK_CONTROL, 0, seq,
                                         bytes, bytes);
            LinkHeader h;
            memcpy(&h, ptrs[i]->recv, sizeof h);
            if (!bad && h.from_site != (uint32_t)s) bad = "from the wrong site";
            if (bad) rc = isth_fail(ISTH_ERUNTIME, "link: %s: control frame from world rank %d rejected: %s", what,
                                    ptrs[i]->peer, bad);
            else memcpy(out + (size_t)s * bytes, ptrs[i]->recv + sizeof(LinkHeader), bytes);
        }
        for (int i = 0; i < n; i++)
            if (!late[i]) link_msg_free(ptrs[i]); /* a lost peer's buffers stay with MPI */
        isth_free(msgs);
        isth_free(ptrs);
        isth_free(site_of);
        isth_free(late);
    }
    CHECK(rc);
    CHECK(coll_bcast_bytes(site_comm, all, (size_t)n_sites * bytes, 0));
    if (!l->survive) return ISTH_OK;
    /* the leader's view of who is lost, and why, to the whole site */
    const int ns = n_sites < LINK_MAX_SITES ? n_sites : LINK_MAX_SITES;
    CHECK(coll_bcast_bytes(site_comm, l->lost, (size_t)ns, 0));
    int fresh = 0; /* the same on every rank after the broadcast */
    for (int s = 0; s < ns; s++) fresh |= l->lost[s] && !was[s];
    if (!fresh) return ISTH_OK;
    /* the details only when the leader found a loss */
    CHECK(coll_bcast_bytes(site_comm, l->lost_after_s, sizeof(double) * (size_t)ns, 0));
    CHECK(coll_bcast_bytes(site_comm, l->lost_what, sizeof l->lost_what[0] * (size_t)ns, 0));
    l->lost_new = 1;
    return ISTH_OK;
}

/* --- the progress thread ------------------------------------------------------- */

static pthread_t progress_thread;
static atomic_int progress_paused; /* > 0 while the main thread completes messages itself */
static atomic_int progress_run; /* 1 while the thread should go on */
static int progress_started;

static void *progress_main(void *arg)
{
    (void)arg;
    while (atomic_load(&progress_run)) {
        int flag = 0;
        /* no message is ever sent with this tag on MPI_COMM_SELF: the probe
         * finds nothing, and on the way drives every transport's progress;
         * not while the main thread waits on the link itself (it polls then) */
        if (!atomic_load(&progress_paused))
            MPI_Iprobe(MPI_ANY_SOURCE, LINK_TAG_PROGRESS, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
        struct timespec ts = {0, LINK_PROGRESS_US * 1000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int link_progress_start(void)
{
    if (progress_started) return ISTH_OK;
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
        return isth_fail(ISTH_EINPUT, "[outer] progress = thread needs MPI_THREAD_MULTIPLE; this MPI provides level %d "
                         "(use progress = step)", provided);
    atomic_store(&progress_run, 1);
    if (pthread_create(&progress_thread, NULL, progress_main, NULL) != 0) {
        atomic_store(&progress_run, 0);
        return isth_fail(ISTH_ERUNTIME, "link: cannot start the progress thread");
    }
    progress_started = 1;
    return ISTH_OK;
}

void link_progress_stop(void)
{
    if (!progress_started) return;
    atomic_store(&progress_run, 0);
    pthread_join(progress_thread, NULL);
    progress_started = 0;
}

static void progress_pause(int on) { atomic_fetch_add(&progress_paused, on ? 1 : -1); }
