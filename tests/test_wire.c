/* test_wire.c — run under mpirun with 3 ranks: site a = rank 0, site b =
 * ranks 1 and 2; the inter-site transport (wire.h) between them.
 *   messages    sizes around the chunk size, several tags interleaved, 3
 *               streams, receives posted before and after the data came:
 *               every byte as sent, each tag's messages in order
 *   backpressure  more unexpected data than the wire may keep: it waits in
 *               TCP until the receives are posted, nothing lost, no deadlock
 *   raw peer    a connection made here by hand (this file's own hello and
 *               chunk encoding, MAC by libsodium directly): a valid hello and
 *               chunk are delivered; a hello with a wrong MAC is refused and
 *               counted; a malformed chunk fails the peer, and so does a
 *               chunk sent again (a replay on the path); no wait hangs
 *   cancel      a large send given up half-way (its receiver not reading):
 *               the streams stay in step — the next message on the same
 *               tag arrives whole, the receive of the abandoned one never
 *               completes and is cancelled
 *   dead peer   a rank that closes its wire: the other side's receive from it
 *               never completes, the peer is marked failed, and nothing waits
 *   balance     a receiver made here that reads one of four streams slowly:
 *               the chunks go where there is room, so that stream carries
 *               far fewer than its quarter, and the message arrives whole
 *   broken peer by hand: an early arrival half in when its sender dies gives
 *               its room back once its claimed receive is cancelled; a stream
 *               stalled for room whose peer resets it does not make every
 *               progress call return at once (no spin); a chunk sent again on
 *               another stream while the first copy is still being read
 *               fails the peer
 * Every wait in this file has a deadline (a failing check, never a hang).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <mpi.h>
#include <sodium.h>

#include "wire.h"

static const int site_first[3] = {0, 1, 3};
static unsigned char keys[2][2][SEAL_KEY_BYTES]; /* [from][to] */
static int me;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static Wire *open_wire(int streams, size_t chunk, size_t unexpected)
{
    const int site = me == 0 ? 0 : 1;
    unsigned char tx[2][SEAL_KEY_BYTES], rx[2][SEAL_KEY_BYTES];
    for (int s = 0; s < 2; s++) {
        memcpy(tx[s], keys[site][s], SEAL_KEY_BYTES);
        memcpy(rx[s], keys[s][site], SEAL_KEY_BYTES);
    }
    WireOptions o = {.streams = streams, .chunk_bytes = chunk, .unexpected_max = unexpected};
    Wire *w = NULL;
    assert_int_equal(wire_open(&w, MPI_COMM_WORLD, site_first, 2, site, (const unsigned char (*)[SEAL_KEY_BYTES])tx,
                               (const unsigned char (*)[SEAL_KEY_BYTES])rx, &o), 0);
    return w;
}

static unsigned char pattern(int from, int to, int tag, int k, size_t i)
{
    return (unsigned char)(i * 131u + (size_t)k * 7u + (size_t)tag * 3u + (size_t)from * 11u + (size_t)to * 5u + 1u);
}

/* Progress until every op is done (NULL), within the deadline. */
static int wait_all(Wire *w, WireOp **ops, int n, double seconds)
{
    const double t0 = now();
    for (;;) {
        wire_progress(w, 1);
        int left = 0;
        for (int i = 0; i < n; i++) left += !wire_test(w, &ops[i]);
        if (!left) return 1;
        if (now() - t0 > seconds) return 0;
    }
}

/* Progress until peer is failed (10 s at most) and check why. */
static void expect_failed(Wire *w, int peer, const char *why)
{
    const double t0 = now();
    while (!wire_peer_failed(w, peer) && now() - t0 < 10) wire_progress(w, 10);
    assert_non_null(wire_peer_failed(w, peer));
    if (why) assert_non_null(strstr(wire_peer_failed(w, peer), why));
}

/* Receive the hand-made 12-byte message from rank 0 (tag 5). */
static void expect_twelve_bytes(Wire *w)
{
    char got[13] = {0};
    WireOp *op = NULL;
    assert_int_equal(wire_irecv(w, 0, 5, got, 12, &op), 0);
    assert_true(wait_all(w, &op, 1, 10.0));
    assert_string_equal(got, "twelve bytes");
}

enum { TAGS = 3, PER_TAG = 7 };
static const size_t sizes[PER_TAG] = {0, 1, 1000, 4095, 4096, 4097, 5 * 4096 + 17};

static void test_messages_arrive_whole_and_in_order(void **state)
{
    (void)state;
    Wire *w = open_wire(3, 4096, (size_t)64 << 20);
    /* rank 0 talks to 1 and 2; 1 and 2 to 0 (same site: never to each other) */
    const int peers[2] = {me == 0 ? 1 : 0, me == 0 ? 2 : -1};
    enum { N = 2 * TAGS * PER_TAG };
    unsigned char *sbuf[N] = {0}, *rbuf[N] = {0};
    WireOp *ops[2 * N] = {0};
    int n = 0;
    for (int late = 0; late < 2; late++) /* receives first, then sends; then the other way round */
        for (int pi = 0; pi < 2; pi++) {
            const int peer = peers[pi];
            for (int t = 0; peer >= 0 && t < TAGS; t++)
                for (int k = 0; k < PER_TAG; k++) {
                    const int slot = (pi * TAGS + t) * PER_TAG + k;
                    const size_t len = sizes[(k + t) % PER_TAG];
                    const int recv_first = (t % 2) ^ late; /* per tag: each side posts a tag's messages in one order */
                    if (recv_first && !rbuf[slot]) {
                        rbuf[slot] = calloc(len + 1, 1);
                        assert_int_equal(wire_irecv(w, peer, 100 + t, rbuf[slot], len, &ops[n++]), 0);
                    } else if (!recv_first && !sbuf[slot]) {
                        sbuf[slot] = malloc(len + 1);
                        for (size_t i = 0; i < len; i++) sbuf[slot][i] = pattern(me, peer, t, k, i);
                        assert_int_equal(wire_isend(w, peer, 100 + t, sbuf[slot], len, &ops[n++]), 0);
                    }
                }
            MPI_Barrier(MPI_COMM_WORLD); /* the first half's data reaches the other side before its receives */
        }
    for (int pi = 0; pi < 2; pi++) /* what is not posted yet, in each tag's order */
        for (int t = 0; t < TAGS; t++)
            for (int k = 0; k < PER_TAG; k++) {
                const int peer = peers[pi], slot = (pi * TAGS + t) * PER_TAG + k;
                if (peer < 0) continue;
                const size_t len = sizes[(k + t) % PER_TAG];
                if (!rbuf[slot]) {
                    rbuf[slot] = calloc(len + 1, 1);
                    assert_int_equal(wire_irecv(w, peer, 100 + t, rbuf[slot], len, &ops[n++]), 0);
                }
                if (!sbuf[slot]) {
                    sbuf[slot] = malloc(len + 1);
                    for (size_t i = 0; i < len; i++) sbuf[slot][i] = pattern(me, peer, t, k, i);
                    assert_int_equal(wire_isend(w, peer, 100 + t, sbuf[slot], len, &ops[n++]), 0);
                }
            }
    assert_true(wait_all(w, ops, n, 30.0));
    long bad = 0;
    for (int pi = 0; pi < 2; pi++)
        for (int t = 0; t < TAGS; t++)
            for (int k = 0; k < PER_TAG; k++) {
                const int peer = peers[pi], slot = (pi * TAGS + t) * PER_TAG + k;
                if (peer < 0) continue;
                const size_t len = sizes[(k + t) % PER_TAG];
                for (size_t i = 0; i < len; i++) bad += rbuf[slot][i] != pattern(peer, me, t, k, i);
                free(rbuf[slot]);
                free(sbuf[slot]);
            }
    assert_int_equal(bad, 0);
    assert_null(wire_peer_failed(w, peers[0]));
    MPI_Barrier(MPI_COMM_WORLD);
    wire_close(w);
}

static void test_backpressure_beyond_the_unexpected_bound(void **state)
{
    (void)state;
    enum { M = 6, LEN = 40000 };
    Wire *w = open_wire(2, 4096, 50000); /* room for one message, not six */
    unsigned char *buf = malloc((size_t)M * LEN);
    WireOp *ops[M] = {0};
    if (me == 1) {
        for (int k = 0; k < M; k++) {
            for (size_t i = 0; i < LEN; i++) buf[(size_t)k * LEN + i] = pattern(1, 0, 9, k, i);
            assert_int_equal(wire_isend(w, 0, 9, buf + (size_t)k * LEN, LEN, &ops[k]), 0);
        }
        assert_true(wait_all(w, ops, M, 30.0));
    } else if (me == 0) {
        const double t0 = now();
        while (now() - t0 < 1.0) wire_progress(w, 10); /* the data comes before any receive */
        for (int k = 0; k < M; k++) assert_int_equal(wire_irecv(w, 1, 9, buf + (size_t)k * LEN, LEN, &ops[k]), 0);
        assert_true(wait_all(w, ops, M, 30.0));
        long bad = 0;
        for (int k = 0; k < M; k++)
            for (size_t i = 0; i < LEN; i++) bad += buf[(size_t)k * LEN + i] != pattern(1, 0, 9, k, i);
        assert_int_equal(bad, 0);
    }
    free(buf);
    MPI_Barrier(MPI_COMM_WORLD);
    wire_close(w);
}

/* This file's own encoding of the wire's first bytes and chunk header. */
static void hello(unsigned char out[56], int from, int to, int stream, int streams, const unsigned char *key, int good)
{
    const uint32_t f[6] = {0x48575349u, 1u, (uint32_t)from, (uint32_t)to, (uint32_t)stream, (uint32_t)streams};
    memcpy(out, f, 24);
    crypto_generichash(out + 24, 32, out, 24, key, SEAL_KEY_BYTES);
    if (!good) out[30] ^= 1;
}

static void chunk(unsigned char out[40], int tag, uint64_t seq, uint64_t off, uint64_t total, uint32_t len, int good)
{
    const uint32_t m[2] = {good ? 0x43575349u : 0xdeadbeefu, (uint32_t)tag};
    const uint64_t q[3] = {seq, off, total};
    const uint32_t l[2] = {len, 0};
    memcpy(out, m, 8);
    memcpy(out + 8, q, 24);
    memcpy(out + 32, l, 8);
}

static int raw_connect(int port)
{
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void test_a_peer_by_hand(void **state)
{
    (void)state;
    Wire *w = open_wire(1, 4096, 1 << 20);
    int port1 = wire_listen_port(w), port2 = wire_listen_port(w);
    MPI_Bcast(&port1, 1, MPI_INT, 1, MPI_COMM_WORLD); /* rank 1's port, to everyone */
    MPI_Bcast(&port2, 1, MPI_INT, 2, MPI_COMM_WORLD); /* and rank 2's */
    if (me == 0) {
        /* a wrong MAC: refused */
        unsigned char h[56], c[40];
        int fd = raw_connect(port1);
        hello(h, 0, 1, 0, 1, keys[0][1], 0);
        assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
        char x;
        assert_true(recv(fd, &x, 1, 0) <= 0); /* closed on us */
        close(fd);
        MPI_Barrier(MPI_COMM_WORLD);
        /* a valid hello and chunk: delivered */
        fd = raw_connect(port1);
        hello(h, 0, 1, 0, 1, keys[0][1], 1);
        const char msg[] = "twelve bytes";
        chunk(c, 5, 0, 0, 12, 12, 1);
        assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
        assert_int_equal(write(fd, c, sizeof c), (ssize_t)sizeof c);
        assert_int_equal(write(fd, msg, 12), 12);
        MPI_Barrier(MPI_COMM_WORLD);
        /* then a malformed chunk header: rank 1 fails us and closes */
        chunk(c, 5, 1, 0, 12, 12, 0);
        assert_int_equal(write(fd, c, sizeof c), (ssize_t)sizeof c);
        assert_true(recv(fd, &x, 1, 0) <= 0);
        close(fd);
        /* to rank 2: a valid chunk, then the same chunk again */
        fd = raw_connect(port2);
        hello(h, 0, 2, 0, 1, keys[0][1], 1);
        chunk(c, 5, 0, 0, 12, 12, 1);
        for (int again = 0; again < 2; again++) {
            if (again == 0) assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
            assert_int_equal(write(fd, c, sizeof c), (ssize_t)sizeof c);
            assert_int_equal(write(fd, msg, 12), 12);
        }
        assert_true(recv(fd, &x, 1, 0) <= 0);
        close(fd);
        MPI_Barrier(MPI_COMM_WORLD);
    } else if (me == 1) {
        const double t0 = now();
        while (wire_refused(w) < 1 && now() - t0 < 10) wire_progress(w, 10);
        assert_true(wire_refused(w) >= 1);
        MPI_Barrier(MPI_COMM_WORLD);
        expect_twelve_bytes(w);
        MPI_Barrier(MPI_COMM_WORLD);
        char got[13] = {0};
        WireOp *op = NULL;
        assert_int_equal(wire_irecv(w, 0, 5, got, 12, &op), 0);
        expect_failed(w, 0, "malformed");
        assert_int_equal(wire_test(w, &op), 0);
        wire_cancel(w, &op);
        assert_null(op);
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        expect_twelve_bytes(w);
        expect_failed(w, 0, "already complete");
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    wire_close(w);
}

static void test_a_cancelled_send_keeps_the_streams_in_step(void **state)
{
    (void)state;
    enum { BIG = 8 << 20, SMALL = 50000 };
    Wire *w = open_wire(2, 4096, 1 << 20); /* room for little: the big one waits in TCP */
    unsigned char *big = malloc(BIG), *small = malloc(SMALL);
    for (size_t i = 0; i < SMALL; i++) small[i] = pattern(0, 1, 4, 1, i);
    memset(big, 0x5a, BIG);
    if (me == 0) {
        WireOp *a = NULL, *b = NULL;
        assert_int_equal(wire_isend(w, 1, 4, big, BIG, &a), 0);
        const double t0 = now();
        while (now() - t0 < 1.0) wire_progress(w, 10); /* part of it goes, then the sockets fill */
        assert_int_equal(wire_test(w, &a), 0);          /* 8 MB cannot all be in the kernel's buffers */
        wire_cancel(w, &a);
        memset(big, 0, BIG); /* the wire must not read it any more */
        assert_int_equal(wire_isend(w, 1, 4, small, SMALL, &b), 0);
        MPI_Barrier(MPI_COMM_WORLD);
        const int sent = wait_all(w, &b, 1, 20.0);
        if (!sent) wire_dump(w, 1, stderr);
        assert_true(sent);
    } else if (me == 1) {
        MPI_Barrier(MPI_COMM_WORLD); /* only now read anything */
        unsigned char *got_big = malloc(BIG), *got = calloc(SMALL, 1);
        WireOp *a = NULL, *b = NULL;
        assert_int_equal(wire_irecv(w, 0, 4, got_big, BIG, &a), 0);
        assert_int_equal(wire_irecv(w, 0, 4, got, SMALL, &b), 0);
        const int arrived = wait_all(w, &b, 1, 20.0);
        if (!arrived) wire_dump(w, 0, stderr);
        assert_true(arrived);
        long bad = 0;
        for (size_t i = 0; i < SMALL; i++) bad += got[i] != pattern(0, 1, 4, 1, i);
        assert_int_equal(bad, 0);
        assert_int_equal(wire_test(w, &a), 0); /* the abandoned one never completes */
        assert_null(wire_peer_failed(w, 0));
        wire_cancel(w, &a);
        free(got_big);
        free(got);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    wire_close(w);
    free(big);
    free(small);
}

static void test_a_dead_peer_never_blocks(void **state)
{
    (void)state;
    Wire *w = open_wire(2, 4096, 1 << 20);
    if (me == 2) {
        /* connected (rank 0 reaches us first), then gone */
        WireOp *op = NULL;
        char one = 0;
        assert_int_equal(wire_irecv(w, 0, 7, &one, 1, &op), 0);
        assert_true(wait_all(w, &op, 1, 10.0));
        MPI_Barrier(MPI_COMM_WORLD);
        wire_close(w);
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
    if (me == 0) {
        char one = 1, big[100000];
        WireOp *op = NULL, *r = NULL, *s = NULL;
        assert_int_equal(wire_isend(w, 2, 7, &one, 1, &op), 0);
        assert_true(wait_all(w, &op, 1, 10.0));
        assert_int_equal(wire_irecv(w, 2, 8, big, sizeof big, &r), 0);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD); /* rank 2 has closed */
        expect_failed(w, 2, NULL);
        const double t1 = now();
        assert_int_equal(wire_isend(w, 2, 8, big, sizeof big, &s), 0); /* to a failed peer: returns, never completes */
        assert_false(wait_all(w, &r, 1, 0.2));
        assert_int_equal(wire_test(w, &s), 0);
        assert_true(now() - t1 < 2.0);
        wire_cancel(w, &r);
        wire_cancel(w, &s);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    wire_close(w);
}

/* Rank 0's wire sends to a receiver made here on rank 1 (at its wire's
 * port + 1: rank 0 connects there through the port-shift hook). */
static void test_chunks_go_where_there_is_room(void **state)
{
    (void)state;
    enum { STREAMS = 4, CHUNK = 65536, LEN = 32 << 20 };
    const int site = me == 0 ? 0 : 1;
    unsigned char tx[2][SEAL_KEY_BYTES], rx[2][SEAL_KEY_BYTES];
    for (int s = 0; s < 2; s++) {
        memcpy(tx[s], keys[site][s], SEAL_KEY_BYTES);
        memcpy(rx[s], keys[s][site], SEAL_KEY_BYTES);
    }
    /* small socket buffers: a stream that is not read cannot hide many chunks in them */
    WireOptions o = {.streams = STREAMS, .chunk_bytes = CHUNK, .unexpected_max = 1 << 20, .port_shift = 1,
                     .socket_buffer = 1 << 18};
    Wire *w = NULL;
    assert_int_equal(wire_open(&w, MPI_COMM_WORLD, site_first, 2, site, (const unsigned char (*)[SEAL_KEY_BYTES])tx,
                               (const unsigned char (*)[SEAL_KEY_BYTES])rx, &o), 0);
    int port = wire_listen_port(w), lfd = -1, ok = 1;
    MPI_Bcast(&port, 1, MPI_INT, 1, MPI_COMM_WORLD);
    if (me == 1) {
        lfd = socket(AF_INET, SOCK_STREAM, 0);
        const int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + 1))};
        a.sin_addr.s_addr = htonl(INADDR_ANY); /* the wire connects to the address it was given */
        ok = bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 8) == 0;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 1, MPI_COMM_WORLD);
    if (!ok) { /* the port above the wire's was taken: nothing to measure with */
        if (lfd >= 0) close(lfd);
        wire_close(w);
        skip();
    }
    unsigned char *buf = malloc(LEN);
    for (size_t i = 0; i < LEN; i++) buf[i] = pattern(0, 1, 3, 0, i);
    if (me == 0) {
        WireOp *op = NULL;
        assert_int_equal(wire_isend(w, 1, 3, buf, LEN, &op), 0);
        assert_true(wait_all(w, &op, 1, 60.0));
    } else if (me == 1) {
        int fd[STREAMS], got_chunks[STREAMS] = {0};
        for (int s = 0; s < STREAMS; s++) { /* each connection's hello says its stream */
            const int c = accept(lfd, NULL, NULL);
            assert_true(c >= 0);
            unsigned char h[56];
            assert_int_equal(recv(c, h, sizeof h, MSG_WAITALL), (ssize_t)sizeof h);
            uint32_t stream;
            memcpy(&stream, h + 16, 4);
            assert_true(stream < STREAMS);
            fd[stream] = c;
        }
        unsigned char *got = calloc(LEN, 1);
        size_t arrived = 0;
        const double t0 = now();
        /* streams 1-3 read at once, stream 0 16 KiB every 10 ms: a slow link */
        unsigned char hdr[STREAMS][40];
        size_t hgot[STREAMS] = {0}, left[STREAMS] = {0}, at[STREAMS] = {0};
        double next_slow = t0;
        while (arrived < LEN && now() - t0 < 60) {
            for (int s = 0; s < STREAMS; s++) {
                size_t budget = s == 0 ? (now() >= next_slow ? 16384 : 0) : (size_t)1 << 30;
                if (s == 0 && budget) next_slow = now() + 0.01;
                while (budget) {
                    ssize_t n;
                    if (left[s] == 0) {
                        n = recv(fd[s], hdr[s] + hgot[s], 40 - hgot[s], MSG_DONTWAIT);
                        if (n <= 0) break;
                        hgot[s] += (size_t)n;
                        if (hgot[s] < 40) continue;
                        uint64_t off;
                        uint32_t len;
                        memcpy(&off, hdr[s] + 16, 8);
                        memcpy(&len, hdr[s] + 32, 4);
                        at[s] = off;
                        left[s] = len;
                        hgot[s] = 0;
                        got_chunks[s]++;
                        continue;
                    }
                    const size_t want = left[s] < budget ? left[s] : budget;
                    n = recv(fd[s], got + at[s], want, MSG_DONTWAIT);
                    if (n <= 0) break;
                    at[s] += (size_t)n;
                    left[s] -= (size_t)n;
                    arrived += (size_t)n;
                    budget -= s == 0 ? (size_t)n : 0;
                }
            }
        }
        if (arrived != LEN) fprintf(stderr, "arrived %zu of %d; chunks %d %d %d %d\n", arrived, LEN, got_chunks[0],
                                    got_chunks[1], got_chunks[2], got_chunks[3]);
        assert_int_equal(arrived, LEN);
        assert_memory_equal(got, buf, LEN);
        const int quarter = LEN / CHUNK / STREAMS;
        fprintf(stderr, "chunks per stream: %d %d %d %d (a quarter: %d)\n", got_chunks[0], got_chunks[1], got_chunks[2],
                got_chunks[3], quarter);
        assert_true(got_chunks[0] < quarter / 2); /* fixed striping would give it a quarter */
        assert_int_equal(got_chunks[0] + got_chunks[1] + got_chunks[2] + got_chunks[3], LEN / CHUNK);
        for (int s = 0; s < STREAMS; s++) close(fd[s]);
        free(got);
    }
    free(buf);
    if (lfd >= 0) close(lfd);
    MPI_Barrier(MPI_COMM_WORLD);
    wire_close(w);
}

/* Part `part` of the broken-peer test: rank 0 speaks to rank 1 by hand. */
static void broken_peer_part(int part)
{
    Wire *w = open_wire(part == 2 ? 2 : 1, 4096, part == 1 ? 5000 : 100000);
    int port = wire_listen_port(w);
    MPI_Bcast(&port, 1, MPI_INT, 1, MPI_COMM_WORLD);
    static unsigned char data[4096];
    unsigned char h[56], c[40];
    if (me == 0) {
        int fd = raw_connect(port), fd2 = -1;
        hello(h, 0, 1, 0, part == 2 ? 2 : 1, keys[0][1], 1);
        assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
        chunk(c, 5, 0, 0, part == 2 ? 4096 : 40000, 4096, 1); /* part 2: a message of one chunk */
        assert_int_equal(write(fd, c, sizeof c), (ssize_t)sizeof c);
        assert_int_equal(write(fd, data, part == 2 ? 2000 : 4096), part == 2 ? 2000 : 4096); /* part 2: half a chunk */
        MPI_Barrier(MPI_COMM_WORLD); /* rank 1 has it (part 0: held; 1: stalled; 2: being read) */
        if (part == 1) { /* a reset: the peer's error, seen by a stream that cannot read yet */
            const struct linger l = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        if (part == 2) { /* the same chunk on the other stream */
            fd2 = raw_connect(port);
            hello(h, 0, 1, 1, 2, keys[0][1], 1);
            assert_int_equal(write(fd2, h, sizeof h), (ssize_t)sizeof h);
            assert_int_equal(write(fd2, c, sizeof c), (ssize_t)sizeof c);
            assert_int_equal(write(fd2, data, 4096), 4096);
        } else {
            close(fd);
            fd = -1;
        }
        MPI_Barrier(MPI_COMM_WORLD); /* rank 1 has checked */
        if (fd >= 0) close(fd);
        if (fd2 >= 0) close(fd2);
    } else if (me == 1) {
        static unsigned char got[40000];
        WireOp *op = NULL;
        double t0 = now();
        if (part == 1)
            while (now() - t0 < 0.5) wire_progress(w, 10); /* header read, no room: stalled */
        else
            while (wire_held(w) != (part == 2 ? 4096u : 40000u) && now() - t0 < 10) wire_progress(w, 10);
        assert_int_equal(wire_held(w), part == 1 ? 0u : part == 2 ? 4096u : 40000u);
        if (part == 0) assert_int_equal(wire_irecv(w, 0, 5, got, 40000, &op), 0); /* claimed, half in */
        MPI_Barrier(MPI_COMM_WORLD);
        if (part == 0) {
            expect_failed(w, 0, "closed");
            assert_int_equal(wire_held(w), 40000u); /* still the receive's */
            wire_cancel(w, &op);
            assert_int_equal(wire_held(w), 0u);
        } else if (part == 1) {
            int calls = 0;
            t0 = now();
            while (now() - t0 < 1.0) wire_progress(w, 50), calls++;
            assert_true(calls < 100); /* ~20 when each call waits its 50 ms; a spin makes thousands */
            assert_int_equal(wire_irecv(w, 0, 5, got, 40000, &op), 0); /* room now: the reset is read */
            expect_failed(w, 0, NULL);
            wire_cancel(w, &op);
        } else {
            expect_failed(w, 0, "already complete");
        }
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    wire_close(w);
}

static void test_what_a_broken_peer_leaves(void **state)
{
    (void)state;
    for (int part = 0; part < 3; part++) broken_peer_part(part);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n != 3 || sodium_init() < 0) {
        fprintf(stderr, "test_wire: needs 3 ranks and libsodium\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int f = 0; f < 2; f++) /* distinct keys per direction, the same on every rank */
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < SEAL_KEY_BYTES; i++) keys[f][t][i] = (unsigned char)(f * 64 + t * 32 + i);
    if (me != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages_arrive_whole_and_in_order),
        cmocka_unit_test(test_backpressure_beyond_the_unexpected_bound),
        cmocka_unit_test(test_a_peer_by_hand),
        cmocka_unit_test(test_a_cancelled_send_keeps_the_streams_in_step),
        cmocka_unit_test(test_a_dead_peer_never_blocks),
        cmocka_unit_test(test_what_a_broken_peer_leaves),
        cmocka_unit_test(test_chunks_go_where_there_is_room),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return rc;
}
