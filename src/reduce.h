/* reduce.h — the site reduction: a fragment summed over every learner of
 * every site — the gradient sum of `sync` mode and the pseudo-gradient
 * average of the DiLoCo modes.
 *
 * Owns: per fragment the site exchange (the peers in the other sites'
 * first learners, the exchange in flight and its polls), the agreement on
 * which sites' payloads are applied (verdicts, which carry the stop
 * ballot's requests), the overlap window of an exchange (pacing its sends
 * across it, warning before it will be late), and the communicator of the
 * same learner rank across the site's learners. Values live in the shard's
 * staging (shard.h), bytes go out through payload.h, over the link the
 * trainer hands in (link.h).
 *
 * A reduction of fragment f runs in two halves so that the wide-area part
 * can overlap with training:
 *   start   (1) gradients only: dense chunks summed inside the learner;
 *           (2) every rank packs the chunks it owns; the learners of a site
 *               sum them in learner order (site network, blocking);
 *           (3) the first learner of each site encodes its site sum
 *               (payload_encode: codec + error feedback; its own
 *               contribution is the decoded value, exactly what the other
 *               sites will decode) and posts it to the ranks of every other
 *               site's first learner that own the same chunks, with the
 *               matching receives (payload_post);
 *   finish  (4) completes the link against the deadline, checks and
 *               decodes every payload (payload_take), and agrees — inside
 *               the site, then across sites with a small verdict — on the
 *               set of sites whose payloads every site accepted; the
 *               rejected ones are left out and the rest re-weighted;
 *           (5) sums the accepted sites in site order, broadcasts to the
 *               site's other learners and shares dense chunks inside the
 *               learner.
 * Every rank of every learner ends with the same values for the chunks it
 * holds. Callers pre-scale their values by their token share (of the run).
 * Experts split across sites (plan.h's chunk_crosses): an expert chunk is
 * summed in (2) only, never encoded or sent in (3), whatever the verdicts;
 * its result in (5) is the site's sum divided by the site's token share:
 * the token-weighted average of the site's learners (one learner: its own
 * value, up to rounding). Only the dense chunks' payloads are counted.
 * With Topology.router_by_owner (split, local routing) a router chunk
 * crosses like any dense chunk but its column e is, in (5), the owner
 * site's payload of it over that site's share (0 when not accepted).
 * Must not: apply updates (optim.c, outer.c), compute gradients, frame or
 * decode bytes (payload.c), or write the link's fields (only through its
 * accessors, e.g. link_mark_lost).
 */
#ifndef ISTHMUS_REDUCE_H
#define ISTHMUS_REDUCE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "ballot.h"
#include "link.h"
#include "metrics.h"
#include "payload.h"
#include "progress.h"
#include "report.h"
#include "shard.h"
#include "topology.h"

/* One fragment's site exchange. */
/* A site verdict's bytes for S sites (reduce.c says what they hold):
 * whether each payload was accepted, each site's stop vote, the host's ask
 * to take each back, whether the site sees each in the run, and each
 * site's progress summary (progress.h; the sender's own slot only). */
#define REDUCE_VERDICT_BYTES(S) ((4 + PROGRESS_BYTES) * (size_t)(S))

typedef struct {
    PeerSet site;              /* ranks of the other sites' first learners (first learner of a site) */
    int in_flight, polls, arrived_poll, sends_deferred, sent_poll;
    uint64_t exchange;
    double err2, norm2;
    double started_s;          /* now_s() when the exchange started */
    int late_warned;           /* its lateness was logged */
    int paced;                 /* its sends are posted across the window */
    int window_polls_seen;     /* polls since the start on every rank of the site (polls: the leaders' own) */
    /* the site's verdict: agreed and posted (at the finish, or one poll
     * before it when everything had arrived), with what it was made of */
    int verdict_posted;
    unsigned char verdict[REDUCE_VERDICT_BYTES(CONFIG_MAX_SITES) + CONFIG_MAX_SITES]; /* + the alive bytes */
    unsigned char early_ok[CONFIG_MAX_SITES + 1], early_alive[CONFIG_MAX_SITES];
    char early_rejected[512];
} SiteExchange;

typedef struct {
    const Topology *topo;
    Shard *shard;              /* values, staging, codec, residuals */
    Link *link;                /* the trainer's */
    StopBallot *ballot;        /* the trainer's: requests ride on the verdicts */
    SiteExchange *frag;
    int fragments;
    int leader;                /* my learner is the first of its site */
    MPI_Comm site_peers;       /* my learner rank in every learner of the site */
    double *site_weight;       /* token share of each site */
    /* a site exchange's window: the polls (inner steps) before its result
     * is applied (streaming: overlap); 0 when it is awaited at once. With
     * pace on, its pieces are posted across the window; either way an
     * exchange that will not arrive in it is logged before it stalls */
    int window_polls;
    int pace;
    int pace_ok;               /* the link kept up with this rank's last exchange (reduce_finish_staged) */
    int log;                   /* print and record warnings (the trainer's logging rank) */
    Metrics *metrics;          /* where they are recorded; NULL: none */
    Progress *progress;        /* the trainer's: this site's summary rides on the verdicts, the others' are
                                * learned from them; NULL: none sent (every slot empty) */
} Reducer;

enum { REDUCE_GRADS, REDUCE_REPLICATED };

/* Collective over `world`. The shard, link and ballot stay the caller's. */
int reducer_create(Reducer *r, Shard *s, Link *l, StopBallot *ballot, MPI_Comm world);
/* Returns 1 when every message was retired (the shard's staging may go). */
int reducer_destroy(Reducer *r);
/* The overlap window (polls; 0: awaited at once), pacing, and where
 * warnings go. */
void reduce_set_window(Reducer *r, int window_polls, int pace);
void reduce_log_to(Reducer *r, int log, Metrics *metrics);
/* The progress table the verdicts carry (the trainer's; NULL: none). */
void reduce_watch(Reducer *r, Progress *progress);

/* Begin reducing fragment f of the backend's state `which`. REDUCE_GRADS
 * sums the dense chunks inside the learner first; REDUCE_REPLICATED takes
 * them as they are (every rank of a learner holds the same dense values).
 * The caller must not change f's chunks of the state until reduce_finish. */
int reduce_start(Reducer *r, Backend *be, int f, StateKind which, int kind);
/* The same from packed values: reduce_stage takes a staging slot and
 * returns where to put my owned chunks of f (shard_owned layout);
 * reduce_start_staged begins the exchange. */
float *reduce_stage(Reducer *r, int f);
int reduce_start_staged(Reducer *r, int f);
/* Progress every exchange in flight (call once per inner step). */
int reduce_poll(Reducer *r);
/* Test the messages of the site exchanges in flight, nothing else (MPI
 * moves them on the way): what the backend calls between layers with
 * [outer] progress = poll. No MPI call when nothing is in flight. */
void reduce_progress(void *reducer);
/* Finish fragment f: the reduced values of every chunk of f this rank holds
 * are written into the state. */
int reduce_finish(Reducer *r, Backend *be, int f, StateKind which, ExchangeReport *rep);
/* Finish fragment f keeping the result (my owned chunks, packed) in its
 * slot until shard_release; *result points at it. */
int reduce_finish_staged(Reducer *r, int f, ExchangeReport *rep, float **result);

#endif
