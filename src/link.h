/* link.h — the inter-site link: everything that crosses between sites goes
 * through here.
 *
 * Owns: the frame (a fixed header in front of the bytes payload.h packs),
 * every frame sealed (seal.h: authenticated under its pair of sites' key, the
 * payload encrypted unless outer.encrypt = off) and opened, posting non-blocking sends and receives in pieces of at
 * most coll_max_message() bytes (so no MPI count overflows an int) — to
 * another site over the wire (wire.h: isthmus's own TCP transport, whose
 * waits no dead peer can prolong) unless outer.transport = mpi, within a
 * site (butterfly's pairs) over MPI — completing
 * them against a deadline, cancelling what a failed exchange left posted,
 * the small blocking control exchanges between the sites' first ranks
 * (checkpoint outcomes, the resume step, step statistics, replica checks),
 * the byte and wait-time accounting, and the MPI tags of every message that
 * crosses sites. Test hooks (fault.h): ISTHMUS_LINK_CORRUPT, _DELAY, _MUTE.
 * Who owns it: the trainer (train.h), one per run; the reducer, the mixer,
 * payload.c, the checkpoints and the run loop are handed a pointer and
 * read its state through the accessors below, never its fields.
 * Must not: know what the values mean or how frames are filled (payload.h
 * packs them); assume that another site's ranks are in MPI_COMM_WORLD
 * beyond the communicator it is given.
 */
#ifndef ISTHMUS_LINK_H
#define ISTHMUS_LINK_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "seal.h"
#include "wire.h"

#define LINK_MAGIC 0x49534c4bu /* "ISLK" */
#define LINK_VERSION 2

/* Header `kind`: what a frame carries (a verdict is its values kind + 1). */
enum {
    LINK_SITE_VALUES = 0,
    LINK_SITE_VERDICT = 1,
    LINK_PAIR_VALUES = 2,
    LINK_PAIR_VERDICT = 3,
    LINK_CONTROL = 4,
};

/* MPI tags: one exchange per fragment and kind is in flight at a time;
 * fragments <= [model] layers <= 1024 keep the kinds' ranges apart. */
#define LINK_MAX_FRAGMENTS 1024
#define LINK_TAG(kind, fragment) (1000 + 2048 * (kind) + (fragment))
#define LINK_TAG_CONTROL LINK_TAG(LINK_CONTROL, 0)
#define LINK_TAG_SPREAD LINK_TAG(LINK_CONTROL + 1, 0) /* the butterfly spread probe */
#define LINK_TAG_DROPPED LINK_TAG(LINK_CONTROL + 2, 0) /* "you missed our deadline": to a lost site */
#define LINK_TAG_REJOIN LINK_TAG(LINK_CONTROL + 3, 0)  /* the live site's checkpoint, to a rejoining site */
#define LINK_TAG_PROGRESS LINK_TAG(LINK_CONTROL + 4, 0) /* never sent: the progress thread's probe */
#define LINK_TAG_ASSEMBLY LINK_TAG(LINK_CONTROL + 5, 0) /* split experts: a site's experts to the model's writer */
#define LINK_TAG_REFRESH LINK_TAG(LINK_CONTROL + 6, 0)  /* split experts: the refresh of a site's copies */

/* A frame's header. The seal's nonce and tag come first so that the
 * fields after them and the payload are one run of bytes (the associated
 * data of an unencrypted frame). Every field is authenticated; the
 * receiver checks each against what it expects (link_check). */
typedef struct {
    unsigned char nonce[SEAL_NONCE_BYTES];
    unsigned char tag[SEAL_TAG_BYTES];
    uint32_t magic;
    uint16_t version;
    uint8_t codec;
    uint8_t kind;          /* LINK_SITE_VALUES, ... */
    uint32_t fragment;
    uint32_t from_site;
    uint64_t exchange;     /* sequence number of the exchange */
    uint64_t values;       /* number of encoded values */
    uint64_t payload_bytes;
    uint32_t from_rank, to_rank; /* sender and receiver, ranks of the link communicator */
    uint32_t flags;        /* LINK_ENCRYPTED */
    uint32_t reserved;     /* zero */
} LinkHeader;
#define LINK_ENCRYPTED 1u
/* The authenticated fields: from magic to the end of the header. */
#define LINK_HEADER_AD_OFFSET (SEAL_NONCE_BYTES + SEAL_TAG_BYTES)

/* A piece in flight: over MPI, or over the wire (the other is null). */
typedef struct {
    MPI_Request mpi;
    WireOp *wire;
} LinkReq;

/* One framed message each way with one peer. The pieces' requests live in
 * rs/rr (n_pieces of each); the buffers belong to the owner of the message
 * and are released with link_msg_free, which never frees a buffer MPI may
 * still write. */
typedef struct {
    int peer;              /* rank in the link communicator */
    int tag;
    unsigned char *send, *recv; /* header + payload */
    size_t send_bytes, recv_bytes;
    LinkReq *rs, *rr;      /* (pieces); pieces not posted yet are null */
    Wire *wire;            /* the wire the pieces went on (NULL: MPI) */
    int send_pieces, recv_pieces;
    int send_next;         /* pieces of the send posted so far (a paced send posts them over several polls) */
    int recv_pieces_done;  /* pieces of the receive complete (how far an exchange has come) */
    int send_posted;       /* 0 not yet, 1 in flight, 2 complete (or muted) */
    int recv_posted, recv_done;
    int local;             /* both ends in the same site: counted as intra-site */
    int stuck;             /* abandoned with a request MPI would not cancel: its buffers stay MPI's */
    int borrowed;          /* send/recv point into the owner's staging: not freed here */
} LinkMsg;

/* Sites the link can tell apart (config.h's CONFIG_MAX_SITES). */
#define LINK_MAX_SITES 64

typedef struct {
    MPI_Comm comm;
    int rank;              /* mine in comm */
    double timeout_s;
    /* the frames' keys (link_set_keys; until then a key every build knows:
     * integrity only): per site, the key of frames to it and from it */
    unsigned char tx_key[LINK_MAX_SITES][SEAL_KEY_BYTES], rx_key[LINK_MAX_SITES][SEAL_KEY_BYTES];
    int encrypt;           /* payloads encrypted (outer.encrypt); keys wiped by link_forget_keys */
    int n_sites, my_site;
    int site_first[LINK_MAX_SITES + 1]; /* site s's ranks are [site_first[s], site_first[s + 1]) */
    double auth_failures;  /* frames rejected by link_check: a seal that did not open, or not the frame expected */
    size_t piece_bytes;    /* largest MPI message of a frame ([outer] piece_bytes; at most coll_max_message) */
    /* the federated launch survives a site's loss (link_survive): a peer
     * site that misses a deadline is marked lost here, on every rank of
     * the site alike, and nothing is sent to or awaited from it again */
    int survive;
    unsigned char lost[LINK_MAX_SITES];
    unsigned char lost_reported[LINK_MAX_SITES]; /* handed out by link_take_lost */
    int lost_new;                  /* sites lost since link_take_lost */
    char lost_what[LINK_MAX_SITES][64]; /* the operation that found each loss */
    double lost_after_s[LINK_MAX_SITES]; /* how long it waited */
    unsigned char left[LINK_MAX_SITES];  /* lost because it stopped on its own request (a signal) */
    double bytes_sent, bytes_recv; /* cumulative, this rank, between sites */
    double intra_sent, intra_recv; /* messages whose peer is in this rank's site (butterfly) */
    double wait_s;                 /* cumulative time blocked completing */
    double mark_bytes, mark_wait;  /* bytes and wait_s at link_mark */
    uint64_t control_seq;          /* control exchanges done (equal on every rank) */
    double control_calls;          /* messages posted by control exchanges (a counter for tests) */
    int corrupt_exchange;          /* test hook: 0 = off */
    int delay_polls;               /* test hook: 0 = off */
    int mute;                      /* test hook: never send values */
    Wire *wire;                    /* the transport to other sites (NULL: MPI) */
} Link;

/* Hooks apply when `site_name` matches the variable's SITE. The keys are
 * those of the zero master key, one site (link_set_keys sets the run's). */
void link_init(Link *l, MPI_Comm comm, double timeout_s, const char *site_name);
/* The run's keys: `master` (seal_master), this rank's site, the sites'
 * first ranks in comm (n_sites + 1 entries: the last is comm's size), and
 * whether payloads are encrypted. Every rank of every site the same. */
void link_set_keys(Link *l, const unsigned char master[SEAL_KEY_BYTES], int encrypt, int my_site,
                   const int *site_first, int n_sites);
/* Wipe the keys (the link is done). */
void link_forget_keys(Link *l);
/* Collective over the link communicator, after link_set_keys: frames to
 * other sites go over the wire (wire.h) from now on. */
int link_open_wire(Link *l, const WireOptions *o);
/* Close the wire (after every message is freed). */
void link_close_wire(Link *l);
/* The federated launch: a site that misses a deadline is lost, not fatal. */
void link_survive(Link *l, int on);
/* Site s is lost: found by `what` after waiting `after_s` (idempotent). */
void link_mark_lost(Link *l, int s, const char *what, double after_s);
/* Site s left: it stopped on a signal to its job, after the checkpoint all
 * sites wrote at the agreed step (lost from now on, without a deadline). */
void link_mark_left(Link *l, int s);
/* Site s lost (or left), and left of its own accord. The link's fields are
 * its own: every other module asks through these. */
int link_is_lost(const Link *l, int s);
int link_has_left(const Link *l, int s);
/* The operation that found site s lost, and (after_s) how long it waited. */
const char *link_lost_what(const Link *l, int s, double *after_s);
/* Has a site been lost since the last link_take_lost? */
int link_lost_news(const Link *l);
/* Does the link survive a site's loss (link_survive)? */
int link_survives(const Link *l);
/* The largest MPI message of a frame ([outer] piece_bytes). */
void link_set_piece_bytes(Link *l, size_t bytes);
/* The deadline of every wait. */
double link_timeout(const Link *l);
/* Test hooks (fault.h): is exchange number `exchange` to be corrupted
 * (ISTHMUS_LINK_CORRUPT), and how many polls sends are held back
 * (ISTHMUS_LINK_DELAY, 0: none)? */
int link_corrupts(const Link *l, uint64_t exchange);
int link_delay_polls(const Link *l);
/* The deadline of every wait from now on; returns the one it replaces (a
 * checkpoint's outcome waits longer than an exchange, then puts it back). */
double link_set_timeout(Link *l, double timeout_s);
/* What crossed and how long the link blocked, this rank, cumulative; a
 * trainer made again adds the old one's so that a run's totals go on. */
typedef struct {
    double bytes_sent, bytes_recv, auth_failures, wait_s;
} LinkCounters;
LinkCounters link_counters(const Link *l);
void link_counters_add(Link *l, LinkCounters c);
/* Is any of the n_sites lost? */
int link_any_lost(const Link *l, int n_sites);
/* Newly lost sites since the last call (0 or 1 each in out[n_sites]);
 * returns how many. */
int link_take_lost(Link *l, unsigned char *out, int n_sites);
/* Tell a lost site's first rank (peer) that this site dropped it: one
 * small message, never awaited (a dead peer never takes it; a stalled one
 * finds it when it wakes and knows it was dropped rather than left alone).
 * It carries the sites this one trains on with (bit s: site s, itself
 * included), so that the two sides of a split decide alike who goes on. */
void link_notify_dropped(Link *l, int peer, int my_site, uint64_t live);
/* Did the site whose first rank is `peer` drop us? Its sites (bit s: site
 * s), 0 when not (a probe, no waiting; a notice that fails its check is
 * not one). */
uint64_t link_was_dropped(Link *l, int peer);
/* Inter-site bytes and time blocked since the last link_mark (a step's share). */
void link_mark(Link *l);
void link_since_mark(const Link *l, double *bytes, double *wait_s);

/* Allocate a message's buffers (header + payload bytes each way). */
int link_msg_alloc(LinkMsg *m, int peer, int tag, size_t send_bytes, size_t recv_bytes, int local);
/* A message whose buffers the owner points into its own staging (send and
 * recv set before each post; sizes fixed here). */
void link_msg_init_borrowed(LinkMsg *m, int peer, int tag, size_t send_bytes, size_t recv_bytes, int local);
/* Cancel what is still posted, then free the buffers (leaked instead when a
 * request cannot be retired: MPI might still write them). Returns 1 when
 * nothing is left posted (borrowed buffers may then go too). */
int link_msg_free(LinkMsg *m);

/* Cancel and retire n MPI requests (MPI_REQUEST_NULL ones are skipped) within a
 * short grace period; 1 when all are retired and their buffers may go. */
int link_retire(MPI_Request *req, int n);

/* Unframed messages for a diagnostic whose values are only logged (the
 * butterfly spread probe): to or from another site's rank over the wire
 * (when open), else MPI on the link communicator. A null request is
 * {MPI_REQUEST_NULL, NULL}. */
int link_raw_post(Link *l, int peer, int tag, void *buf, size_t bytes, int is_send, LinkReq *r);
/* *done = 1 when every one of the n requests completed. */
int link_raw_test(Link *l, LinkReq *r, int n, int *done);
/* Cancel the n requests; 1 when all are retired and their buffers may go. */
int link_raw_retire(Link *l, LinkReq *r, int n);

/* Fill the header in front of the payload (already in buf + sizeof header)
 * and seal the frame for `peer` (a rank of the link communicator). */
void link_frame(Link *l, int peer, unsigned char *buf, uint8_t codec, uint8_t kind, uint32_t fragment,
                uint32_t from_site, uint64_t exchange, uint64_t values, uint64_t payload_bytes);
/* Test hook: corrupt one payload byte of a framed message. */
void link_corrupt(unsigned char *buf, size_t bytes);

int link_post_recv(Link *l, LinkMsg *m);
int link_post_send(Link *l, LinkMsg *m);
/* Post the send's pieces up to its first `bytes` (the rest later, by
 * another call or by the wait): a send paced over an overlap window. */
int link_post_send_upto(Link *l, LinkMsg *m, size_t bytes);
/* How far the message has come: pieces received of all of them. */
double link_recv_fraction(const LinkMsg *m);

/* The progress thread ([outer] progress = thread): while it runs, MPI is
 * entered every LINK_PROGRESS_US microseconds from a thread of its own, so
 * that sends and receives in flight move while the backend computes,
 * instead of only when the step polls. Needs MPI_THREAD_MULTIPLE (main.c
 * asks for it for `isthmus train`); it touches no request of the link (it
 * probes MPI_COMM_SELF: Open MPI's progress engine serves every transport
 * on any call) and pauses while the main thread waits on the link. Not the
 * default: with Open MPI 4.1.4's TCP transport it made about half of the
 * blocking 7 MB exchanges on the emulated link take twice as long
 * (docs/results/the-wan.md). Start and stop are idempotent. */
#define LINK_PROGRESS_US 250
int link_progress_start(void);
void link_progress_stop(void);

/* Make progress; *all = 1 when every receive (and posted send) completed. */
int link_test(Link *l, LinkMsg *const *msgs, int n, int *all);
/* Complete all messages before the deadline; ISTH_ERUNTIME naming the peer
 * when it passes. Posts sends still deferred. */
int link_wait(Link *l, LinkMsg *const *msgs, int n, const char *what);

/* link_wait that, with link_survive on, does not fail at the deadline:
 * the messages still incomplete get late[i] = 1, their requests are
 * cancelled (buffers left alone where MPI keeps them), and ISTH_OK is
 * returned; *waited = seconds spent. Without survive: link_wait. */
int link_wait_live(Link *l, LinkMsg *const *msgs, int n, const char *what, unsigned char *late, double *waited);

/* Give up a message to a lost peer: cancel what is posted; what cannot be
 * cancelled marks it stuck (its buffers must not be reused). */
void link_abandon(LinkMsg *m);
/* A message left unposted because its peer's site is lost: counted as
 * complete both ways, nothing sent, nothing awaited. */
void link_msg_skip(LinkMsg *m);
/* Point a message whose buffers are borrowed at (send, recv) (a staging
 * slot's frames). */
void link_msg_bind(LinkMsg *m, unsigned char *send, unsigned char *recv);
/* Ready a message for its next exchange: its send not yet posted. */
void link_msg_rearm(LinkMsg *m);
/* Did an abandon leave m stuck (a request MPI would not cancel)? Clears
 * the mark: the caller renews the buffers MPI may still write. */
int link_msg_take_stuck(LinkMsg *m);

/* Open and check a frame received from `peer`: its size, its seal (the
 * payload is decrypted in place: call once per frame received), then that
 * it is the frame expected (version, kind, fragment, exchange, sender and
 * receiver, sizes). Returns NULL when valid, else the reason; a failed
 * frame (any reason) counts in auth_failures. */
const char *link_check(Link *l, int peer, unsigned char *buf, size_t bytes, uint8_t kind, uint32_t fragment,
                       uint64_t exchange, uint64_t values, uint64_t payload_bytes);

/* One framed block one way, blocking, within the deadline. `frame` holds
 * sizeof(LinkHeader) bytes of room, then the `bytes` of data (the sender's
 * are sent in place; the receiver's, the same size, are filled), checked
 * (header, checksum, seq); ISTH_ERUNTIME naming `what` otherwise. */
int link_send_blob(Link *l, int peer, int tag, unsigned char *frame, size_t bytes, uint64_t seq, const char *what);
int link_recv_blob(Link *l, int peer, int tag, unsigned char *frame, size_t bytes, uint64_t seq, const char *what);

/* A blocking control exchange of `bytes` per site, collective over every
 * rank of every site: each site's first rank (site_leaders[s], ranks in the
 * link communicator) sends `mine` to the other sites' first ranks and
 * receives theirs, framed and checked, within the deadline; then it
 * broadcasts the gathered all[n_sites * bytes] (site order) over site_comm.
 * Every rank passes its site's value in `mine` (the leader's is sent).
 * Lost sites are skipped (their slots zero); with survive on, a site that
 * misses the deadline becomes lost, and every rank of the site learns it
 * with the broadcast. */
int link_control(Link *l, const void *mine, size_t bytes, void *all, const int *site_leaders, int n_sites,
                 int my_site, MPI_Comm site_comm, const char *what);

#endif
