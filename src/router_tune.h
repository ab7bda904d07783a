/* router_tune.h — the joint router phase of a split run: the router of
 * the whole model (every expert, ROUTE_ALL) trained alone, every other
 * weight frozen, so that the sites' halves of the router, each trained
 * only over its own experts, learn to share one softmax.
 *
 * On a backend holding a whole model (its experts sharded over a learner
 * of G ranks, `ep`): `steps` optimiser steps of the inner optimiser
 * (its runs limited to the router: optimizer_shard) at a constant `lr`
 * after a linear warm-up of steps / 10, each on B windows per rank of the
 * training data (cursor `cur`, windows first + rank * B + ...; the cursor
 * advances one step each), the router's gradient summed over the learner
 * (sum_runs; the loss weighted 1 / G), clipped at [train] clip.
 *
 * Owns: the phase's loop and its report.
 * Must not: read or write files, choose the data (the caller's cursor), or
 * touch any weight but the router's (unless asked for all of them).
 */
#ifndef ISTHMUS_ROUTER_TUNE_H
#define ISTHMUS_ROUTER_TUNE_H

#include <stdint.h>

#include "backend.h"
#include "coll.h"
#include "config.h"
#include "data.h"

typedef struct {
    int steps;
    double first_loss, last_loss; /* mean training loss (nats per token) of the first and the last tenth */
    double seconds;
} RouterTuneReport;

/* all: every weight trained (the dense part's gradient summed over the
 * learner), not the router alone: the joint phase's wider variant. */
int router_tune(Backend *be, Coll *ep, const Config *cfg, Dataset *d, DataCursor *cur, uint64_t first, int B,
                int steps, double lr, int all, RouterTuneReport *rep);

#endif
