/* ckpt_load.h — loading a checkpoint (ckpt.h describes its contents) into
 * a created trainer: a resume from this site's file, or a rejoin from the
 * live site's.
 *
 * Owns: checking the file against the run (the stored config's model
 * shape, optimiser, outer mode and fragments; the attributes' counters and
 * names; the learners the layout gives), reading the state each rank owns
 * (dense chunks shared inside the learner, so the site reads the file
 * once), the exchanges in flight back into staging, the counters, and the
 * sites' agreement that every one of them loaded the same step. Errors of
 * a site's file are held until the outcome is known and printed once.
 * Must not: choose the file (ckpt_files.h), write or prune checkpoints, or
 * decide when to resume (run.c).
 */
#ifndef ISTHMUS_CKPT_LOAD_H
#define ISTHMUS_CKPT_LOAD_H

#include "train.h"

/* Load the state of `path` into a created trainer (collective). Exit-2
 * errors for a model shape that contradicts the config; allowed changes
 * (schedule, layout) are applied and listed. Every value read is verified
 * (fletcher32, finite). fallback: a damaged value is not an error but a
 * warning ("falling back to an older one") and *damaged is set on every
 * rank of every site, so the caller can choose another step (--resume auto). */
int ckpt_load(Trainer *tr, const char *path, int fallback, int *damaged);

/* Load another site's file (`from_site`'s, received by ckpt_share): this
 * site's learners take copies of that site's learners' states (learner i of
 * this site the state of its learner i mod its count), error-feedback
 * residuals start at zero; the step the live site kept for the sites' next
 * joint restart (attribute every_site) is kept here too. Everything else
 * as ckpt_load, without fallback. */
int ckpt_load_copy(Trainer *tr, const char *path, int from_site);

/* Either, with fallback: from_site < 0 this site's own file (ckpt_load),
 * else another site's (a cold restart's fetch, ckpt_files.h): as
 * ckpt_load_copy, and a damaged value passes the step over. */
int ckpt_load_from(Trainer *tr, const char *path, int from_site, int fallback, int *damaged);

#endif
