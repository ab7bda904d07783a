/* stop.h — a stop request, from the signal to the exit (docs/architecture.md,
 * failure rule 8): the signal handlers and their flags, the site's vote,
 * who leaves and who stops, whether a stop is a pause or an end, and the
 * pause marker the job scripts requeue a job by.
 *
 * Owns: the stop flags (set by the handlers only), StopVote, the marker's
 * name and its writing.
 * Must not: checkpoint, train, or decide when the vote is cast (run.c);
 * carry the vote between sites (the ballot rides the exchanges: ballot.h).
 */
#ifndef ISTHMUS_STOP_H
#define ISTHMUS_STOP_H

#include <mpi.h>
#include <signal.h>
#include <stddef.h>

#include "config.h"
#include "train.h"

/* Every rank must stop after the same step. Inside a site the flags are
 * combined with a non-blocking all-reduce on the site communicator, started
 * after step t and completed after step t+1 (the site's decision lags one
 * step). Between sites the site's decision rides on the verdicts of the next
 * exchange that finishes (reduce.c), so the vote adds no message and no wait
 * on the link; every site learns it when that exchange finishes, at the same
 * step. The bound on the lag is in docs/architecture.md. */
typedef struct {
    MPI_Request req;
    int send, recv, pending;
} StopVote;

/* SIGUSR1 asks for a pause, SIGTERM and SIGUSR2 for an end: install the
 * handlers (they only raise the flags below). */
void stop_handlers(void);
/* The flag a stop signal raises (non-zero: the signal's number), for
 * waits that a signal ends (federation_join). */
const volatile sig_atomic_t *stop_flag(void);
/* A signal asked to end (SIGTERM, SIGUSR2): no later USR1 undoes it. */
int stop_ended(void);

/* The site's vote, after each step: local and *site_agreed are STOP_NONE,
 * STOP_PAUSE or STOP_END (an end wins); *site_agreed is the site's decision
 * on the previous step's flags. */
int stop_vote(StopVote *v, MPI_Comm site_comm, int local, int *site_agreed);
/* Has every site agreed to stop after this step? (the site's vote goes out
 * with the next verdicts) */
int stop_decided(Trainer *tr, int site_agreed);
/* After the checkpoint of an agreed stop, federated: 1 when the sites that
 * asked leave and this one trains on (they are marked left); 0 when this
 * site stops — *alone: it leaves while others train on. */
int stop_others_leave(Trainer *tr, int *alone);
/* Does this site's job come back after its stop (a pause) or end? */
int stop_pauses(const Trainer *tr, int site_intent, int alone);

/* <out_dir>/paused, or <out_dir>/paused-SITE for a federated site. */
void stop_marker_path(const Config *cfg, const char *site, char *path, size_t cap);
/* Write the marker (the launch's first rank), saying the step and why. */
int stop_mark_paused(const Config *cfg, const char *site, long step, const char *why);

#endif
