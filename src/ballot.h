/* ballot.h — the stop vote between sites, as it rides on the exchanges'
 * verdicts (docs/architecture.md, failure rule 8, "The stop vote").
 *
 * Owns: the ballot's fields and the intents a request carries. The trainer
 * owns one (stop_ballot_init) and hands it to the exchange in use. Who
 * writes what:
 *   request  run.c: this site's vote and its intent (the same on every rank
 *            of a site; STOP_PAUSE may become STOP_END, never back);
 *   agreed   reduce.c, when a finished site exchange carried a request;
 *            mix.c, when the earliest round has reached every learner;
 *            run.c clears it when only some sites asked and they leave;
 *   sites    reduce.c records which sites asked (from the verdicts);
 *            mix.c, with `agreed`, the sites that asked in the earliest
 *            round; run.c clears them with `agreed`;
 *   ends     which of those sites asked to end, not to pause: written and
 *            cleared with `sites`;
 *   round    mix.c: the earliest round any learner asked in (run.c resets
 *            it to -1 with `agreed`);
 *   round_sites, round_ends  mix.c: the sites that asked in `round`, and
 *            which of them to end (bit s: site s), OR-combined over the
 *            pair verdicts; run.c clears them with `round`;
 *   take     run.c: the host asks the live sites to take a knocking site
 *            back (its index + 1; 0 none) and clears it once taken;
 *   take_agreed, take_out  reduce.c, when a finished site exchange
 *            carried the host's ask (take_out: the sites any site saw out
 *            then); run.c clears it when it has acted on it.
 * Must not: hold behaviour beyond its initial value.
 */
#ifndef ISTHMUS_BALLOT_H
#define ISTHMUS_BALLOT_H

#include <stdint.h>

#include "config.h"

/* A request's intent. A pause (the time-limit signal, SIGUSR1): every site
 * that stops checkpoints and its job comes back (the job scripts requeue
 * it). An end (SIGTERM: scancel; SIGUSR2: a job script passing SIGTERM
 * on): every site that stops checkpoints and ends. A run-wide stop is an
 * end when any site that asked asked to end. */
enum { STOP_NONE = 0, STOP_PAUSE = 1, STOP_END = 2 };

typedef struct {
    int request;          /* this site asks to stop: STOP_NONE, STOP_PAUSE or STOP_END */
    int agreed;           /* a finished exchange carried a request: stop after this step */
    unsigned char sites[CONFIG_MAX_SITES]; /* which sites asked */
    unsigned char ends[CONFIG_MAX_SITES];  /* which of them asked to end */
    long round;           /* butterfly: earliest round in which a learner asked to stop, -1 none */
    uint64_t round_sites; /* butterfly: the sites that asked in `round` (bit s) */
    uint64_t round_ends;  /* butterfly: which of them asked to end */
    int take;             /* host: take site take - 1 back (0: none) */
    int take_agreed;      /* every live site takes site take_agreed - 1 back after this step (0: none) */
    unsigned char take_out[CONFIG_MAX_SITES]; /* the sites out of the run, as every site agreed with the ask */
} StopBallot;

/* No vote cast (round -1: a zeroed ballot would read "asked in round 0"). */
static inline void stop_ballot_init(StopBallot *b) { *b = (StopBallot){.round = -1}; }

#endif
