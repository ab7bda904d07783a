/* tamper.c — an attacker on the path between two sites, for tests: a TCP
 * proxy that forwards every connection made to LISTEN_PORT on to
 * 127.0.0.1:TARGET_PORT, both ways, and changes the traffic of the
 * connecting side (the lower-ranked site) as MODE says. It parses the
 * wire's framing (wire_state.h) with its own code: a 56-byte hello, then chunks
 * of a 40-byte header (magic, tag, sequence, offset, total, length) and
 * their data; in a chunk that starts a link frame (the link header's magic
 * at byte 40), the frame's kind is byte 47 (link.h: 0 a site's values, 1
 * its verdict). The K-th frame (from 1, over all connections in arrival
 * order) of values, or of verdicts, is changed:
 *   flip K       one bit in the middle of the K-th values frame flipped
 *   replay K     its bytes replaced by those of the values frame before it
 *                (an authentic frame of an earlier exchange, replayed)
 *   record K F   its bytes written to file F, nothing changed
 *   inject K F   its bytes replaced by those of F (a frame recorded from
 *                another run), when the sizes match
 *   verdict K    one bit of the K-th verdict frame flipped (its last, sealed byte)
 * Prints one line per change to stderr. Runs until killed.
 *   tamper LISTEN_PORT TARGET_PORT MODE K [FILE]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAXC = 64, HELLO = 56, HDR = 40 };

typedef struct {
    int up, down;          /* from the connecting side, to the target */
    size_t hello_left;     /* bytes of the hello still to pass */
    unsigned char hdr[HDR];
    size_t hdr_got;
    unsigned char *data;   /* the current chunk's data, held until whole */
    size_t len, got;
} Pair;

static Pair pairs[MAXC];
static int npairs;
static long k_target, values_seen, verdicts_seen;
static const char *mode, *file;
static unsigned char *last_data;
static size_t last_len;

static void die(const char *what)
{
    fprintf(stderr, "tamper: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void put(int fd, const void *b, size_t n)
{
    const unsigned char *p = b;
    while (n) {
        const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* the other end went: the run's business */
        p += w;
        n -= (size_t)w;
    }
}

/* A whole chunk from the connecting side: change it, or not, and pass it on. */
static void chunk(Pair *c)
{
    uint32_t len;
    memcpy(&len, c->hdr + 32, 4);
    const uint32_t link_magic = 0x49534c4bu;
    int kind = -1;
    if (len > 48 && !memcmp(c->data + 40, &link_magic, 4)) kind = c->data[47];
    const long n = kind == 0 ? ++values_seen : kind == 1 ? ++verdicts_seen : 0;
    const int verdict_mode = !strcmp(mode, "verdict");
    if (n == k_target && kind == (verdict_mode ? 1 : 0)) {
        if (!strcmp(mode, "flip") || verdict_mode) {
            /* a verdict frame is small: its middle may be the header's
             * size field (refused before the seal is opened); its last
             * byte is sealed, so the seal's check is what refuses it */
            c->data[verdict_mode ? len - 1 : len / 2] ^= 0x10;
            fprintf(stderr, "tamper: flipped a bit of %s frame %ld (%u bytes)\n", verdict_mode ? "verdict" : "values", n,
                    len);
        } else if (!strcmp(mode, "replay") && last_data && last_len == len) {
            memcpy(c->data, last_data, len);
            fprintf(stderr, "tamper: replayed values frame %ld as frame %ld (%u bytes)\n", n - 1, n, len);
        } else if (!strcmp(mode, "record")) {
            FILE *f = fopen(file, "wb");
            if (!f || fwrite(c->data, 1, len, f) != len || fclose(f)) die(file);
            fprintf(stderr, "tamper: recorded values frame %ld (%u bytes)\n", n, len);
        } else if (!strcmp(mode, "inject")) {
            FILE *f = fopen(file, "rb");
            if (!f) die(file);
            const size_t r = fread(c->data, 1, len, f);
            fclose(f);
            fprintf(stderr, "tamper: injected %zu recorded bytes as values frame %ld (%u bytes)\n", r, n, len);
        }
    }
    if (kind == 0) { /* the next replay's source */
        free(last_data);
        last_data = malloc(len);
        if (last_data) memcpy(last_data, c->data, len);
        last_len = len;
    }
    put(c->down, c->hdr, HDR);
    put(c->down, c->data, len);
}

/* Bytes from the connecting side, in order. */
static void upstream(Pair *c, const unsigned char *b, size_t n)
{
    while (n) {
        if (c->hello_left) {
            const size_t k = n < c->hello_left ? n : c->hello_left;
            put(c->down, b, k);
            c->hello_left -= k, b += k, n -= k;
            continue;
        }
        if (c->hdr_got < HDR) {
            const size_t k = n < HDR - c->hdr_got ? n : HDR - c->hdr_got;
            memcpy(c->hdr + c->hdr_got, b, k);
            c->hdr_got += k, b += k, n -= k;
            if (c->hdr_got < HDR) continue;
            uint32_t len;
            memcpy(&len, c->hdr + 32, 4);
            c->len = len;
            c->got = 0;
            c->data = malloc(len ? len : 1);
            if (!c->data) die("malloc");
        }
        const size_t k = n < c->len - c->got ? n : c->len - c->got;
        memcpy(c->data + c->got, b, k);
        c->got += k, b += k, n -= k;
        if (c->got == c->len) {
            chunk(c);
            free(c->data);
            c->data = NULL;
            c->hdr_got = 0;
        }
    }
}

/* What one side sent, on to the other (the connecting side's through
 * upstream); a side that closed ends the pair. */
static void relay(Pair *c, int from_up)
{
    unsigned char buf[1 << 16];
    const ssize_t n = recv(from_up ? c->up : c->down, buf, sizeof buf, 0);
    if (n <= 0) {
        close(c->up), close(c->down);
        c->up = c->down = -1;
    } else if (from_up) {
        upstream(c, buf, (size_t)n);
    } else {
        put(c->up, buf, (size_t)n);
    }
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: tamper LISTEN_PORT TARGET_PORT MODE K [FILE]\n");
        return 2;
    }
    const int lport = atoi(argv[1]), tport = atoi(argv[2]);
    mode = argv[3];
    k_target = atol(argv[4]);
    file = argc > 5 ? argv[5] : NULL;
    if ((!strcmp(mode, "record") || !strcmp(mode, "inject")) && !file) {
        fprintf(stderr, "tamper: %s needs a FILE\n", mode);
        return 2;
    }
    const int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)lport)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 64)) die("listen");
    for (;;) {
        struct pollfd p[1 + 2 * MAXC];
        p[0] = (struct pollfd){.fd = l, .events = POLLIN};
        for (int i = 0; i < npairs; i++) {
            p[1 + 2 * i] = (struct pollfd){.fd = pairs[i].up, .events = POLLIN};
            p[2 + 2 * i] = (struct pollfd){.fd = pairs[i].down, .events = POLLIN};
        }
        if (poll(p, (nfds_t)(1 + 2 * npairs), -1) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if ((p[0].revents & POLLIN) && npairs < MAXC) {
            const int up = accept(l, NULL, NULL);
            const int down = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in t = {.sin_family = AF_INET, .sin_port = htons((uint16_t)tport)};
            t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (up >= 0 && down >= 0 && connect(down, (struct sockaddr *)&t, sizeof t) == 0) {
                setsockopt(up, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof one);
                setsockopt(down, IPPROTO_TCP, 1, &one, sizeof one);
                pairs[npairs++] = (Pair){.up = up, .down = down, .hello_left = HELLO};
            } else {
                if (up >= 0) close(up);
                if (down >= 0) close(down);
            }
            continue; /* the poll set changed */
        }
        for (int i = 0; i < npairs; i++) {
            Pair *c = &pairs[i];
            if (c->up >= 0 && (p[1 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))) relay(c, 1);
            if (c->up >= 0 && (p[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))) relay(c, 0);
        }
    }
}
