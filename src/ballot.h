/* ballot.h — the stop vote between sites, as it rides on the exchanges'
 * verdicts (docs/architecture.md, failure rule 8, "The stop vote").
 *
 * Owns: the ballot's fields. The run loop (run.c) casts this site's vote
 * (request, the same on every rank of a site) and reads the outcome;
 * the site reduction (reduce.c) carries requests in its verdicts and
 * records which sites asked; the butterfly mixer (mix.c) carries the
 * earliest round in which a learner asked and decides when it has reached
 * every learner. The trainer owns one and hands it to both.
 * Must not: hold behaviour (a type only).
 */
#ifndef ISTHMUS_BALLOT_H
#define ISTHMUS_BALLOT_H

#include "config.h"

typedef struct {
    int request;          /* this site asks to stop */
    int agreed;           /* a finished exchange carried a request: stop after this step */
    unsigned char sites[CONFIG_MAX_SITES]; /* which sites asked (site exchanges; not butterfly) */
    long round;           /* butterfly: earliest round in which a learner asked to stop, -1 none */
} StopBallot;

#endif
