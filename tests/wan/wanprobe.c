/* wanprobe.c — what a plain TCP connection sees across the emulated link:
 * its round-trip time and its steady throughput (tests/wan/wan.sh check).
 *
 *   wanprobe serve PORT                 answer probes until killed
 *   wanprobe ping HOST PORT COUNT       COUNT one-byte round trips: the median, in ms
 *   wanprobe stream HOST PORT SECONDS   send for SECONDS: the receiver's rate over the
 *                                       second half (after TCP's ramp-up), in Mbit/s
 *
 * Owns: its sockets. Must not: configure the link (wan.sh does).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 6000     /* 100 ms slots: a stream of up to 600 s */
#define SLOT_S 0.1

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int full(int fd, void *buf, size_t n, int writing)
{
    unsigned char *p = buf;
    while (n > 0) {
        const ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int dial(const char *host, const char *port)
{
    struct addrinfo hints = {0}, *ai;
    hints.ai_socktype = SOCK_STREAM;
    const int e = getaddrinfo(host, port, &hints, &ai);
    if (e) {
        fprintf(stderr, "wanprobe: %s:%s: %s\n", host, port, gai_strerror(e));
        return -1;
    }
    const int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "wanprobe: connect to %s:%s: %s\n", host, port, strerror(errno));
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* One connection: 'p' echoes bytes until EOF; 's' sinks bytes until EOF
 * and answers with the bytes received in each 100 ms slot. */
static void answer(int fd)
{
    char mode;
    if (full(fd, &mode, 1, 0) != 0) return;
    if (mode == 'p') {
        char c;
        while (full(fd, &c, 1, 0) == 0 && full(fd, &c, 1, 1) == 0) {
        }
    } else if (mode == 's') {
        static uint64_t slot[SLOTS];
        memset(slot, 0, sizeof slot);
        static unsigned char buf[1 << 20];
        double t0 = -1;
        int last = 0;
        for (;;) {
            const ssize_t k = read(fd, buf, sizeof buf);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            const double t = now_s();
            if (t0 < 0) t0 = t;
            int s = (int)((t - t0) / SLOT_S);
            if (s >= SLOTS) s = SLOTS - 1;
            slot[s] += (uint64_t)k;
            if (s > last) last = s;
        }
        uint32_t n = (uint32_t)last + 1;
        if (full(fd, &n, sizeof n, 1) == 0) full(fd, slot, sizeof(uint64_t) * n, 1);
    }
}

static int serve(const char *port)
{
    const int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)atoi(port));
    if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 8) != 0) {
        fprintf(stderr, "wanprobe: listen on %s: %s\n", port, strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    for (;;) {
        const int fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        answer(fd);
        close(fd);
    }
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int ping(const char *host, const char *port, int count)
{
    const int fd = dial(host, port);
    if (fd < 0) return 1;
    double *rtt = malloc(sizeof(double) * (size_t)count);
    char c = 'p';
    if (!rtt || full(fd, &c, 1, 1) != 0) return 1;
    for (int i = 0; i < count; i++) {
        const double t = now_s();
        if (full(fd, &c, 1, 1) != 0 || full(fd, &c, 1, 0) != 0) {
            fprintf(stderr, "wanprobe: ping: connection lost\n");
            return 1;
        }
        rtt[i] = (now_s() - t) * 1e3;
    }
    qsort(rtt, (size_t)count, sizeof *rtt, cmp);
    printf("%.2f\n", rtt[count / 2]);
    close(fd);
    return 0;
}

static int stream(const char *host, const char *port, double seconds)
{
    const int fd = dial(host, port);
    if (fd < 0) return 1;
    static unsigned char buf[1 << 16];
    char c = 's';
    if (full(fd, &c, 1, 1) != 0) return 1;
    const double t0 = now_s();
    while (now_s() - t0 < seconds)
        if (full(fd, buf, sizeof buf, 1) != 0) {
            fprintf(stderr, "wanprobe: stream: connection lost\n");
            return 1;
        }
    shutdown(fd, SHUT_WR);
    uint32_t n;
    static uint64_t slot[SLOTS];
    if (full(fd, &n, sizeof n, 0) != 0 || n == 0 || n > SLOTS || full(fd, slot, sizeof(uint64_t) * n, 0) != 0) {
        fprintf(stderr, "wanprobe: stream: no answer from the receiver\n");
        return 1;
    }
    /* the second half of the full slots (the last one is partial) */
    const uint32_t end = n - 1, begin = end / 2;
    uint64_t bytes = 0;
    for (uint32_t s = begin; s < end; s++) bytes += slot[s];
    if (end <= begin) {
        fprintf(stderr, "wanprobe: stream: too short to measure\n");
        return 1;
    }
    printf("%.3f\n", (double)bytes * 8 / ((double)(end - begin) * SLOT_S) / 1e6);
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "serve")) return serve(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "ping")) return ping(argv[2], argv[3], atoi(argv[4]) > 0 ? atoi(argv[4]) : 1);
    if (argc == 5 && !strcmp(argv[1], "stream")) return stream(argv[2], argv[3], atof(argv[4]));
    fprintf(stderr, "usage: wanprobe serve PORT | ping HOST PORT COUNT | stream HOST PORT SECONDS\n");
    return 2;
}
