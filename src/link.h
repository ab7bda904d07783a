/* link.h — the inter-site link: everything that crosses between sites goes
 * through here.
 *
 * Owns: payload framing (a fixed header, then the encoded values), the
 * checksum check, posting non-blocking sends and receives, completing them
 * against a deadline, and the byte and wait-time accounting. It also holds
 * two test hooks, read from the environment once:
 *   ISTHMUS_LINK_CORRUPT=SITE:N   ranks of site SITE flip a byte in every
 *                                 payload of their N-th exchange (after the
 *                                 checksum is computed)
 *   ISTHMUS_LINK_DELAY=SITE:S     ranks of site SITE post their sends S
 *                                 polls (inner steps) after an exchange starts
 *   ISTHMUS_LINK_MUTE=SITE:1      ranks of site SITE never send payloads (a
 *                                 cut link; peers must hit their deadline)
 * Must not: know what the values mean (see reduce.c); assume that another
 * site's ranks are in MPI_COMM_WORLD beyond the communicator it is given.
 */
#ifndef ISTHMUS_LINK_H
#define ISTHMUS_LINK_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#define LINK_MAGIC 0x49534c4bu /* "ISLK" */
#define LINK_VERSION 1

/* Header `kind`: what a frame carries (a verdict is its values kind + 1). */
enum { LINK_SITE_VALUES = 0, LINK_SITE_VERDICT = 1, LINK_PAIR_VALUES = 2, LINK_PAIR_VERDICT = 3 };

/* MPI tags: one exchange per fragment and kind is in flight at a time. */
#define LINK_TAG(kind, fragment) (1000 + 2048 * (kind) + (fragment)) /* fragments <= layers <= 1024 */

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint8_t codec;
    uint8_t kind;          /* LINK_SITE_VALUES, ... */
    uint32_t fragment;
    uint32_t from_site;
    uint64_t exchange;     /* sequence number of the exchange */
    uint64_t values;       /* number of encoded values */
    uint64_t payload_bytes;
    uint64_t checksum;     /* checksum64 of the payload */
} LinkHeader;

typedef struct {
    int peer;              /* rank in the link communicator */
    int tag;
    unsigned char *send, *recv; /* header + payload */
    size_t send_bytes, recv_bytes;
    MPI_Request rs, rr;
    int send_posted, recv_done;
    int local;             /* both ends in the same site: counted as intra-site */
} LinkMsg;

typedef struct {
    MPI_Comm comm;
    double timeout_s;
    double bytes_sent, bytes_recv; /* cumulative, this rank, between sites */
    double intra_sent, intra_recv; /* messages whose peer is in this rank's site (butterfly) */
    double wait_s;                 /* cumulative time blocked completing */
    int corrupt_exchange;          /* test hook: 0 = off */
    int delay_polls;               /* test hook: 0 = off */
    int mute;                      /* test hook: never send values */
} Link;

/* Hooks apply when `site_name` matches the variable's SITE. */
void link_init(Link *l, MPI_Comm comm, double timeout_s, const char *site_name);

/* Fill a header + checksum in front of payload (already in buf + sizeof header). */
void link_frame(unsigned char *buf, uint8_t codec, uint8_t kind, uint32_t fragment,
                uint32_t from_site, uint64_t exchange, uint64_t values, uint64_t payload_bytes);
/* Test hook: corrupt one payload byte of a framed message. */
void link_corrupt(unsigned char *buf, size_t bytes);

void link_post_recv(Link *l, LinkMsg *m);
void link_post_send(Link *l, LinkMsg *m);
/* Make progress; returns 1 when every receive (and posted send) completed. */
int link_test(Link *l, LinkMsg *const *msgs, int n);
/* Complete all messages before the deadline; ISTH_ERUNTIME naming the peer
 * when it passes. Posts sends still deferred. */
int link_wait(Link *l, LinkMsg *const *msgs, int n, const char *what);

/* Check a received frame. Returns NULL when valid, else the reason. */
const char *link_check(const unsigned char *buf, size_t bytes, uint8_t kind, uint32_t fragment,
                       uint64_t exchange, uint64_t values, uint64_t payload_bytes);

#endif
