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
 *   butterfly  every H inner steps a mixing round r: learner i exchanges
 *              fragment (r / k) mod P with learner i XOR 2^(r mod k) and both
 *              keep the pair's token-weighted average (weights: the tokens
 *              behind each side's value in this butterfly cycle), started
 *              after step t and applied after t+overlap keeping the local
 *              progress made meanwhile; optionally an outer Nesterov step
 *              on the change since the learner's previous mix (lr != 1 or
 *              momentum != 0). Point-to-point only: no collective spans
 *              learners. At the end k rounds of every fragment without local
 *              updates give every learner the exact global mean.
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
#include "spread.h"

typedef struct {
    int streaming, butterfly;
    int learner, n_learners, k; /* butterfly: my id, N = 2^k */
    double *weights;           /* butterfly: token share of every learner */
    float *sent;               /* butterfly: theta when the fragment was sent */
    int outer_step;            /* butterfly: apply Nesterov to the mixed change (lr != 1 or momentum != 0) */
    long round;                /* butterfly rounds started */
    Spread spread;             /* butterfly: the learners' spread, sampled at every round */
    int H, P, tau;
    double lr, momentum, alpha;
    double learner_weight;     /* this learner's share of a step's tokens */
    float *anchor, *mom, *delta; /* (n_params) */
    long *started;             /* per fragment: inner step its exchange started, -1 if idle */
    long *last_sync;           /* per fragment: inner step of its last start */
    int *reduced;              /* per fragment: its exchange completed early (outer_drain); the
                                * result waits in delta until the fragment's own finishing step */
    ReduceReport *pending;     /* per fragment: the report of that exchange */
    double *pending_dist;      /* butterfly: its pair distance */
    long outer_steps;          /* outer updates applied (all fragments) */
} Outer;

/* The schedule: fragment p of P starts an outer step after inner step t
 * (t >= 1) when t mod H == floor(p*H/P). */
int outer_fragment_due(long step, int p, int H, int P);

int outer_create(Outer *o, const OuterConfig *cfg, const Model *m, double learner_weight);
/* Butterfly: learner id, every learner's token share (N = power of two). */
int outer_set_butterfly(Outer *o, Reducer *r, int learner, int n_learners, const double *weights);
/* Butterfly: log spread samples still open (before a stop; outer_finish does it too). */
int outer_drain_probes(Outer *o, Metrics *mt);
/* Butterfly partner of `learner` in round r, and the round's fragment. */
int butterfly_partner(int learner, long round, int k);
int butterfly_fragment(long round, int k, int P);
void outer_destroy(Outer *o);

/* After inner step `step` (1-based): finish exchanges due, start the ones
 * scheduled. Outer events are logged through `mt` when `log`. */
int outer_after_step(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log);

/* Before a checkpoint: complete every exchange in flight now (its result is
 * kept in delta and applied at its scheduled step, as without a
 * checkpoint), so that the state is a set of buffers: a checkpoint at any
 * step, and a restart that continues bit for bit. */
int outer_drain(Outer *o, Reducer *r, Model *m);

/* End of training: finish what is in flight, one last outer step for every
 * fragment with local progress, theta = anchor everywhere. */
int outer_finish(Outer *o, Reducer *r, Model *m, long step, Metrics *mt, int log);

#endif
