/* outer.h — the low-communication training modes across learners:
 * DiLoCo and Streaming DiLoCo.
 *
 * Owns: the outer state (anchor = the global model, Nesterov momentum, the
 * pseudo-gradient buffer), the schedule of outer steps, and the merge of
 * outer results into local progress.
 *   diloco     every H inner steps: delta = anchor - theta, averaged over
 *              learners (token-weighted, via reduce.c), outer Nesterov SGD
 *              on the anchor, theta = anchor.
 *   streaming  fragment p (strided over layers) syncs after inner steps t
 *              with t mod H = p*H/P; its exchange is started then and
 *              finished `overlap` inner steps later; the outer result is
 *              merged: theta = alpha*theta_local + (1-alpha)*anchor.
 * Inner optimiser state is never exchanged. At the end of training every
 * fragment with local progress takes one more outer step and every learner
 * ends on the anchor, so the run's final model is the global model.
 * Must not: compute gradients or the inner update.
 */
#ifndef ISTHMUS_OUTER_H
#define ISTHMUS_OUTER_H

#include "config.h"
#include "metrics.h"
#include "model.h"
#include "reduce.h"

typedef struct {
    int streaming;
    int H, P, tau;
    double lr, momentum, alpha;
    double learner_weight;     /* this learner's share of a step's tokens */
    float *anchor, *mom, *delta; /* (n_params) */
    long *started;             /* per fragment: inner step its exchange started, -1 if idle */
    long *last_sync;           /* per fragment: inner step of its last start */
    long outer_steps;          /* outer updates applied (all fragments) */
} Outer;

/* The schedule: fragment p of P starts an outer step after inner step t
 * (t >= 1) when t mod H == floor(p*H/P). */
int outer_fragment_due(long step, int p, int H, int P);

int outer_create(Outer *o, const OuterConfig *cfg, const Model *m, double learner_weight);
void outer_destroy(Outer *o);

/* After inner step `step` (1-based): finish exchanges due, start the ones
 * scheduled. Outer events are logged through `mt` when `log`. */
int outer_after_step(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log);

/* End of training: finish what is in flight, one last outer step for every
 * fragment with local progress, theta = anchor everywhere. */
int outer_finish(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log);

#endif
