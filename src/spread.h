/* spread.h — how far apart the butterfly learners are: at the start of
 * every mixing round, the largest relative distance of a learner's
 * parameters to the learners' mean, ‖x_i − x̄‖ / ‖x̄‖, on a fixed sample of
 * the dense (replicated, identically laid out) parameters.
 *
 * Owns: the sample positions, one small point-to-point message per round
 * from the first rank of every learner to world rank 0 (through the link's
 * raw messages: over the wire from another site), and rank 0's queue
 * of rounds still waiting for samples. Rank 0 only tests for arrivals
 * (never waits during training), so the probe adds no wait to any learner
 * and no collective across learners; it waits only in spread_finish, at the
 * end of the run, and then against the link's deadline. The bytes that cross sites are counted (inter_site_bytes).
 * Must not: change parameters, or take part in the mixing itself.
 */
#ifndef ISTHMUS_SPREAD_H
#define ISTHMUS_SPREAD_H

#include <mpi.h>
#include <stddef.h>

#include "backend.h"
#include "link.h"
#include "metrics.h"
#include "model.h"
#include "topology.h"

#define SPREAD_SAMPLES 1024
#define SPREAD_QUEUE 64           /* rounds rank 0 may hold open (or a sender may have in flight) */

typedef struct {
    long round, step;
    float *values;                /* (learners, samples): row i = learner i */
    LinkReq *req;                 /* (learners) rank 0: receives; a sender: req[0] */
} SpreadRound;

typedef struct {
    const Topology *topo;
    Link *link;                   /* samples from another site go over its wire (never MPI across sites) */
    size_t *pos;                  /* (samples) offsets into [0, dense_end) */
    size_t *ones;                 /* (samples) 1: each sample a run of one value */
    double *weights;              /* rank 0: (learners) token shares, the mean's weights */
    int samples, active;          /* active: rank 0, or the first rank of a learner */
    SpreadRound q[SPREAD_QUEUE];  /* ring */
    int head, count;
    double inter_site_bytes;      /* this rank, sent + received */
    double timeout_s;             /* deadline of a wait ([outer] timeout; 600 s unless set) */
    int tolerant;                 /* federated launch: samples missing at the deadline stop the probe */
    long last_round;              /* rank 0: the latest round logged (-1: none), and its spread */
    double last_value;
} Spread;

/* weights: every learner's token share (NULL: equal). */
int spread_create(Spread *s, const Topology *t, const Model *m, Link *link, const double *weights);
void spread_destroy(Spread *s);
/* Round r starts after inner step `step`: send (or, on rank 0, keep) this
 * learner's sample of the weights (taken from the backend). */
int spread_round(Spread *s, long round, long step, Backend *be, Metrics *mt);
/* Rank 0: log every completed round, oldest first, without waiting. */
int spread_poll(Spread *s, Metrics *mt);
/* Complete everything still open (the end of the run). */
int spread_finish(Spread *s, Metrics *mt);
/* A site was lost (federated launch): the probe stops for the rest of the
 * run, its open rounds cancelled (it measures all learners or nothing). */
void spread_stop(Spread *s);

/* max_i ‖x_i − mean‖ / ‖mean‖ over n rows of length len, the mean weighted
 * by w (NULL: equal weights); double sums. */
double spread_max_rel_distance(const float *rows, const double *w, int n, int len);

#endif
