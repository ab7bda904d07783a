/* mix.h — the butterfly mixer: a fragment's values exchanged between two
 * learners, both keeping the pair's token-weighted average.
 *
 * Owns: the pair plans (per fragment, per bit of the learner id, lossy and
 * exact: the partner's ranks whose chunks overlap mine), the exchange in
 * flight with one partner and its polls, the pair verdict (accepted, and
 * the earliest stop round either side knows of, and which sites asked in
 * it: the stop ballot's butterfly half; and the progress table, passed
 * on), and which sites a missed partner
 * makes lost. Values live in the shard's staging (shard.h), bytes go out
 * through payload.h, over the link the trainer hands in.
 * Point-to-point only: no collective spans learners. outer.c decides the
 * rounds and what the mixed values mean.
 * Must not: sum over sites (reduce.c), frame or decode bytes (payload.c),
 * or write the link's fields (only through its accessors, e.g.
 * link_mark_lost).
 */
#ifndef ISTHMUS_MIX_H
#define ISTHMUS_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "ballot.h"
#include "link.h"
#include "payload.h"
#include "progress.h"
#include "report.h"
#include "shard.h"
#include "topology.h"

/* A butterfly exchange of one fragment with one partner learner. */
typedef struct {
    int partner, crosses;            /* partner learner id; in another site? */
    Codec codec;                     /* the run's, or none for exact averaging */
    PeerSet peers;                   /* the partner's ranks whose chunks overlap mine */
    double w_me, w_them;
    int in_flight, polls, arrived_poll;
    uint64_t exchange;
    double err2, norm2;
} PairPlan;

typedef struct {
    const Topology *topo;
    Shard *shard;              /* values, staging, codec, residuals */
    Link *link;                /* the trainer's */
    StopBallot *ballot;        /* the trainer's: the earliest stop round and its sites ride on the pair verdicts */
    PairPlan *pairs;           /* (fragments, pair_bits, 2) plans (lossy, exact) */
    int pair_bits;             /* k: learners = 2^k */
    int fragments;
    size_t **raw_off;          /* (fragments) byte offsets of my owned chunks as raw float32 (exact rounds) */
    Progress *progress;        /* the trainer's: the table every pair verdict carries on; NULL: none */
} Mixer;

/* Plans and error-feedback state for every fragment and partner. The
 * shard, link and ballot stay the caller's. */
int mixer_create(Mixer *m, Shard *s, Link *l, StopBallot *ballot);
/* Returns 1 when every message was retired (the shard's staging may go). */
int mixer_destroy(Mixer *m);
/* The progress table the pair verdicts carry (the trainer's; NULL: none). */
void mix_watch(Mixer *m, Progress *progress);

/* Mixing of fragment f with learner `partner` (point-to-point between the
 * two learners' ranks on canonical chunk plans, codec and error feedback
 * as for the site reduction). start posts the exchange of `values` (my
 * owned chunks of f, packed in the shard_owned layout); finish writes the
 * pair's weighted average
 *   (w_lo*v_lo + w_hi*v_hi) / (w_lo + w_hi)   (lower learner id first)
 * of the decoded values into `values`, identically on both learners, or
 * leaves them unchanged on both when either side rejected a payload.
 * `exact`: send the values uncompressed and without error feedback (the
 * final exact averaging: learners holding equal values send equal payloads
 * and the result is the mean of the values themselves, not of a codec's
 * rendering); otherwise the run's codec with error feedback. `round`: the
 * butterfly round the exchange belongs to (the stop ballot: a stop raised
 * in round m has reached every learner after round m + k - 1). */
int mix_start(Mixer *m, int f, int partner, const float *values, double w_me, double w_partner, int exact);
int mix_finish(Mixer *m, int f, long round, float *values, ExchangeReport *rep, double *pair_distance);
/* The same keeping the result: *mixed (packed, shard_owned layout) holds
 * the pair's average until shard_release; when a payload was rejected
 * (*accepted 0) it holds what this learner encoded (the decoded values, not
 * the values themselves: the caller keeps its own, outer.c its sent copy). */
int mix_finish_staged(Mixer *m, int f, long round, ExchangeReport *rep, double *pair_distance, float **mixed,
                      int *accepted);
/* Progress the exchanges in flight (call once per inner step). */
int mix_poll(Mixer *m);

#endif
