/* tundelay.c — a wide-area link for tests: two TUN devices joined by a
 * forwarder that holds every packet for a fixed one-way delay (this kernel
 * has tc's tbf for the rate but no netem for the delay).
 *
 *   tundelay DEV_A DEV_B DELAY_MS [--loss P] [--seed S] [--ready FILE]
 *
 * Creates the TUN devices DEV_A and DEV_B (IFF_TUN, no packet info) and
 * writes FILE (when given) once they exist; the caller then moves each into
 * its site's network namespace and gives them point-to-point addresses
 * (tests/wan/wan.sh). Every IP packet the kernel sends out of one device is
 * written into the other DELAY_MS milliseconds later, in order; with --loss
 * a packet is dropped with probability P (a fixed-seed generator, so a run
 * is repeatable). SIGUSR1 cuts the link (every packet either way dropped,
 * as when a site's uplink dies; those in flight are still delivered) and
 * SIGUSR2 mends it. Counters go to stderr on SIGTERM/SIGINT, which end it.
 *
 * Owns: the two devices' file descriptors and the packets in flight.
 * Must not: touch any address, route or namespace (wan.sh does that), or
 * shape the rate (tc tbf on the devices does that, before the delay).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_PACKET 65536   /* a TUN read never returns more than the MTU; room for jumbo MTUs */
#define QUEUE_BYTES (256u << 20) /* per direction: a 10 Gbit/s link holds 94 MB in 75 ms */

/* One direction's packets in flight: a byte ring of [release time, length,
 * bytes] records in arrival order (the delay is the same for every packet,
 * so arrival order is release order). */
typedef struct {
    unsigned char *ring;
    size_t head, tail, used; /* byte offsets; used = bytes held */
    uint64_t packets, bytes, dropped, overflow, cut;
} Queue;

typedef struct {
    int64_t release_ns;
    uint32_t len;
} Record;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }
static volatile sig_atomic_t link_cut; /* SIGUSR1 sets it, SIGUSR2 clears it */
static void on_cut(int sig) { link_cut = sig == SIGUSR1; }

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int tun_open(const char *name)
{
    const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "tundelay: /dev/net/tun: %s\n", strerror(errno));
        return -1;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "tundelay: cannot create TUN device %s: %s\n", name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Copy n bytes into / out of the ring at *at, wrapping. */
static void ring_put(Queue *q, const void *src, size_t n)
{
    const size_t first = n < QUEUE_BYTES - q->tail ? n : QUEUE_BYTES - q->tail;
    memcpy(q->ring + q->tail, src, first);
    memcpy(q->ring, (const unsigned char *)src + first, n - first);
    q->tail = (q->tail + n) % QUEUE_BYTES;
    q->used += n;
}

static void ring_get(Queue *q, void *dst, size_t n)
{
    const size_t first = n < QUEUE_BYTES - q->head ? n : QUEUE_BYTES - q->head;
    memcpy(dst, q->ring + q->head, first);
    memcpy((unsigned char *)dst + first, q->ring, n - first);
    q->head = (q->head + n) % QUEUE_BYTES;
    q->used -= n;
}

static void ring_peek(const Queue *q, void *dst, size_t n)
{
    Queue copy = *q;
    ring_get(&copy, dst, n);
}

/* xorshift64*: the loss decisions, repeatable for a seed */
static uint64_t rng_state;
static double uniform(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
}

/* Read every packet the kernel has for us on `from` into q. */
static void take(int from, Queue *q, int64_t delay_ns, double loss)
{
    static unsigned char buf[MAX_PACKET];
    for (;;) {
        const ssize_t n = read(from, buf, sizeof buf);
        if (n <= 0) return; /* EAGAIN: drained */
        if (link_cut) {
            q->cut++;
            continue;
        }
        if (loss > 0 && uniform() < loss) {
            q->dropped++;
            continue;
        }
        if (q->used + sizeof(Record) + (size_t)n > QUEUE_BYTES) {
            q->overflow++; /* a full queue drops, like a router's */
            continue;
        }
        const Record r = {now_ns() + delay_ns, (uint32_t)n};
        ring_put(q, &r, sizeof r);
        ring_put(q, buf, (size_t)n);
    }
}

/* Write the packets whose time has come to `to`; returns the next release
 * time, or -1 when the queue is empty. */
static int64_t give(int to, Queue *q)
{
    static unsigned char buf[MAX_PACKET];
    while (q->used > 0) {
        Record r;
        ring_peek(q, &r, sizeof r);
        if (r.release_ns > now_ns()) return r.release_ns;
        ring_get(q, &r, sizeof r);
        ring_get(q, buf, r.len);
        /* a write to a TUN device delivers the packet to the stack at once;
         * one that fails (the device went down) loses the packet */
        if (write(to, buf, r.len) == (ssize_t)r.len) {
            q->packets++;
            q->bytes += r.len;
        } else {
            q->dropped++;
        }
    }
    return -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: tundelay DEV_A DEV_B DELAY_MS [--loss P] [--seed S] [--ready FILE]\n");
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        usage();
        return 2;
    }
    const char *dev[2] = {argv[1], argv[2]}, *ready = NULL;
    char *end;
    const double delay_ms = strtod(argv[3], &end);
    if (*end || delay_ms < 0 || delay_ms > 10000) {
        fprintf(stderr, "tundelay: DELAY_MS '%s': a number of milliseconds in [0, 10000]\n", argv[3]);
        return 2;
    }
    double loss = 0;
    rng_state = 0x9E3779B97F4A7C15ULL;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--loss") && i + 1 < argc) {
            loss = strtod(argv[++i], &end);
            if (*end || loss < 0 || loss >= 1) {
                fprintf(stderr, "tundelay: --loss '%s': a probability in [0, 1)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            rng_state = strtoull(argv[++i], NULL, 0) | 1;
        } else if (!strcmp(argv[i], "--ready") && i + 1 < argc) {
            ready = argv[++i];
        } else {
            usage();
            return 2;
        }
    }
    int fd[2];
    for (int d = 0; d < 2; d++)
        if ((fd[d] = tun_open(dev[d])) < 0) return 1;
    Queue q[2]; /* q[0]: out of A, into B; q[1]: out of B, into A */
    memset(q, 0, sizeof q);
    for (int d = 0; d < 2; d++) {
        q[d].ring = malloc(QUEUE_BYTES);
        if (!q[d].ring) {
            fprintf(stderr, "tundelay: out of memory for a %u-byte queue\n", QUEUE_BYTES);
            return 1;
        }
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGUSR1, on_cut);
    signal(SIGUSR2, on_cut);
    if (ready) {
        FILE *f = fopen(ready, "w");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0) {
            fprintf(stderr, "tundelay: cannot write %s: %s\n", ready, strerror(errno));
            return 1;
        }
    }
    const int64_t delay_ns = (int64_t)(delay_ms * 1e6);
    while (!stop) {
        int64_t next = -1;
        for (int d = 0; d < 2; d++) {
            const int64_t t = give(fd[1 - d], &q[d]);
            if (t >= 0 && (next < 0 || t < next)) next = t;
        }
        struct pollfd p[2] = {{fd[0], POLLIN, 0}, {fd[1], POLLIN, 0}};
        /* sleep until a packet arrives or the next one is due */
        struct timespec ts, *tsp = NULL;
        if (next >= 0) {
            int64_t wait = next - now_ns();
            if (wait < 0) wait = 0;
            ts.tv_sec = (time_t)(wait / 1000000000);
            ts.tv_nsec = (long)(wait % 1000000000);
            tsp = &ts;
        }
        const int n = ppoll(p, 2, tsp, NULL);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "tundelay: poll: %s\n", strerror(errno));
            return 1;
        }
        for (int d = 0; d < 2; d++)
            if (n > 0 && (p[d].revents & POLLIN)) take(fd[d], &q[d], delay_ns, loss);
    }
    for (int d = 0; d < 2; d++)
        fprintf(stderr, "tundelay: %s -> %s: %llu packets, %llu bytes delivered, %llu lost, %llu over the queue, %llu cut\n",
                dev[d], dev[1 - d], (unsigned long long)q[d].packets, (unsigned long long)q[d].bytes,
                (unsigned long long)q[d].dropped, (unsigned long long)q[d].overflow,
                (unsigned long long)q[d].cut);
    return 0;
}
