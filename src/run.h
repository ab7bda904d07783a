/* run.h — one `isthmus train` run from start to end.
 *
 * Owns: the run loop around trainer_step (train.h): periodic replica
 * checks, evaluation and checkpoints, the stop vote (SIGUSR1 a pause,
 * SIGTERM/SIGUSR2 an end, the test hook) and the pause marker, resume,
 * the end of training (outer_finish, the final checkpoint, evaluation and
 * model file) and the traffic summary.
 * Must not: compute a step (train.c) or know which backend computes.
 */
#ifndef ISTHMUS_RUN_H
#define ISTHMUS_RUN_H

#include "config.h"
#include "train.h"

/* The whole `isthmus train` run; resume: NULL, a checkpoint file or "auto". */
/* site: NULL for the joint launch (one mpirun, every site); the name of
 * this mpirun's [site.NAME] for the federated launch (federation.h). */
int train_run(const Config *cfg, const char *resume, const char *site);

#endif
