/* ballot.h — the stop vote between sites, as it rides on the exchanges'
 * verdicts (docs/architecture.md, failure rule 8, "The stop vote").
 *
 * Owns: the ballot's fields. The trainer owns one (stop_ballot_init) and
 * hands it to the exchange in use. Who writes what:
 *   request  run.c: this site's vote (the same on every rank of a site);
 *   agreed   reduce.c, when a finished site exchange carried a request;
 *            mix.c, when the earliest round has reached every learner;
 *            run.c clears it when only some sites asked and they leave;
 *   sites    reduce.c records which sites asked (from the verdicts);
 *            run.c clears them with `agreed`;
 *   round    mix.c: the earliest round any learner asked in;
 *   take     run.c: the host asks the live sites to take a knocking site
 *            back (its index + 1; 0 none) and clears it once taken;
 *   take_agreed reduce.c, when a finished site exchange carried the host's
 *            ask; run.c clears it when it has acted on it.
 * Must not: hold behaviour beyond its initial value.
 */
#ifndef ISTHMUS_BALLOT_H
#define ISTHMUS_BALLOT_H

#include "config.h"

typedef struct {
    int request;          /* this site asks to stop */
    int agreed;           /* a finished exchange carried a request: stop after this step */
    unsigned char sites[CONFIG_MAX_SITES]; /* which sites asked (site exchanges; not butterfly) */
    long round;           /* butterfly: earliest round in which a learner asked to stop, -1 none */
    int take;             /* host: take site take - 1 back (0: none) */
    int take_agreed;      /* every live site takes site take_agreed - 1 back after this step (0: none) */
} StopBallot;

/* No vote cast (round -1: a zeroed ballot would read "asked in round 0"). */
static inline void stop_ballot_init(StopBallot *b) { *b = (StopBallot){.round = -1}; }

#endif
