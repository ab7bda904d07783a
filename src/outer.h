/* outer.h — the low-communication training modes across learners:
 * DiLoCo and Streaming DiLoCo.
 *
 * Owns: the outer state of the chunks this rank owns (anchor = the global
 * model, Nesterov momentum, butterfly's sent values; the pseudo-gradient
 * lives in a staging slot of the shard), the schedule of outer steps (and
 * how many exchanges it can have in flight), and the merge of outer
 * results into local progress.
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
 * It drives the exchanges: the site reduction (reduce.h) in diloco and
 * streaming, the butterfly mixer (mix.h) in butterfly, each polled here
 * after every inner step.
 * Must not: compute gradients or the inner update, touch backend memory
 * (weights move through the shard's get, put and share_dense, into host
 * staging of the owned chunks), or move bytes on the link itself (the
 * reducer and the mixer do; outer reads its deadline, and hands it to the
 * butterfly's spread probe).
 */
#ifndef ISTHMUS_OUTER_H
#define ISTHMUS_OUTER_H

#include "config.h"
#include "metrics.h"
#include "model.h"
#include "mix.h"
#include "reduce.h"
#include "report.h"
#include "shard.h"
#include "spread.h"

typedef struct {
    OuterMode mode;            /* diloco, streaming or butterfly (callers read Trainer.mode) */
    Shard *shard;              /* the owned chunks and their staging (the trainer's) */
    Reducer *red;              /* diloco, streaming: the site reduction (the trainer's) */
    Mixer *mix;                /* butterfly: the mixer (the trainer's) */
    int learner, n_learners, k; /* butterfly: my id, N = 2^k */
    double *weights;           /* butterfly: token share of every learner */
    int nesterov_mix;          /* butterfly: apply Nesterov to the mixed change (lr != 1 or momentum != 0) */
    long round;                /* butterfly rounds started */
    Spread spread;             /* butterfly: the learners' spread, sampled at every round */
    int H, P, tau;
    double lr, momentum, alpha;
    double learner_weight;     /* this learner's share of a step's tokens */
    /* outer state of the chunks this rank owns, packed: fragment f's chunk
     * k at off[f] + shard_owned(f)->off[k]; pos[c]: chunk c's position,
     * SIZE_MAX when another rank of the learner owns it */
    float *anchor, *mom;       /* the global model (butterfly: the learner's last mix), Nesterov momentum */
    float *sent;               /* butterfly: theta when the fragment was sent */
    float *theta;              /* staging: one fragment's owned weights, taken from the backend for a merge */
    size_t *off, *pos, owned;
    long *started;             /* per fragment: inner step its exchange started, -1 if idle */
    long *last_sync;           /* per fragment: inner step of its last start */
    int *reduced;              /* per fragment: its exchange completed early (outer_drain); the
                                * result waits in its staging slot until the fragment's own finishing step */
    ExchangeReport *pending;     /* per fragment: the report of that exchange */
    double *pending_dist;      /* butterfly: its pair distance */
    long outer_steps;          /* outer updates applied (all fragments) */
} Outer;

/* Model-shaped outer state, for checkpoints and checks. */
typedef enum { OUTER_ANCHOR, OUTER_MOMENTUM, OUTER_SENT, OUTER_PENDING } OuterState;

/* The schedule: fragment p of P starts an outer step after inner step t
 * (t >= 1) when t mod H == floor(p*H/P). */
int outer_fragment_due(long step, int p, int H, int P);

/* The outer state starts as the owned chunks of the backend's weights
 * (every outer function moves weights through the backend's get and put,
 * in host staging). r: the site reduction (NULL in butterfly: then
 * outer_set_butterfly hands in the mixer). */
int outer_create(Outer *o, const OuterConfig *cfg, Shard *s, Reducer *r, Backend *be, double learner_weight);
/* Exchanges in flight at once under this schedule (sizes the staging). */
int outer_max_in_flight(const OuterConfig *cfg);
/* Is an exchange in flight after inner step `step` (started within the
 * last overlap steps, so still waiting for its own step: a checkpoint
 * written then holds its drained result)? From the schedule alone. */
int outer_in_flight_at(const OuterConfig *cfg, long step);
/* Where chunk (tensor, layer, expert) of state `which` lives on this rank,
 * or NULL when another rank of the learner owns it. OUTER_PENDING: the
 * drained result of the chunk's fragment (the anchor's values when the
 * fragment is idle: written, never read back). */
float *outer_view(const Outer *o, OuterState which, int tensor, int layer, int expert);
/* Resume: the schedule of a checkpoint (per fragment its last start and the
 * start of the exchange in flight, -1 none) at `step`, and its count of
 * outer updates; drained results are
 * read into staging slots taken with shard_hold. */
void outer_restore(Outer *o, const double *last_sync, const double *started, int n_sites, long step, long outer_steps);
/* Evaluation of the anchor: the backend's weights hold the anchor until
 * outer_view_end; their own values wait in the grads (unused between
 * steps). Learner collective. */
int outer_view_anchor(Outer *o, Backend *be);
int outer_view_end(Backend *be);
/* Butterfly: the mixer, the link its spread probe samples go over,
 * learner id, every learner's token share (N = power of two). */
int outer_set_butterfly(Outer *o, Mixer *m, Link *l, int learner, int n_learners, const double *weights);
/* Butterfly: log spread samples still open (before a stop; outer_finish does it too). */
int outer_drain_probes(Outer *o, Metrics *mt);
/* Butterfly partner of `learner` in round r, and the round's fragment. */
int butterfly_partner(int learner, long round, int k);
int butterfly_fragment(long round, int k, int P);
void outer_destroy(Outer *o);

/* After inner step `step` (1-based): finish exchanges due, start the ones
 * scheduled. Outer events are logged through `mt` when `log`. */
int outer_after_step(Outer *o, Backend *be, long step, Metrics *mt, int log);

/* Before a checkpoint: complete every exchange in flight now (its result is
 * kept in its staging slot and applied at its scheduled step, as without a
 * checkpoint), so that the state is a set of buffers: a checkpoint at any
 * step, and a restart that continues bit for bit. */
int outer_drain(Outer *o);

/* End of training: finish what is in flight, one last outer step for every
 * fragment with local progress, theta = anchor everywhere. */
int outer_finish(Outer *o, Backend *be, long step, Metrics *mt, int log);

#endif
