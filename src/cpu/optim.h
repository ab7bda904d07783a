/* optim.h — the inner optimiser (AdamW, SGD), and the sums of squares and
 * scaling of the gradient clipping.
 *
 * Owns: the runs of the parameters this rank updates (its share of the
 * dense chunks and its experts: the optimiser state is sharded like the
 * outer state, ZeRO stage 1), the AdamW moments of those runs, packed run
 * after run, and the rule that weight decay applies only to tensors
 * flagged PARAM_DECAY in the model table.
 * Must not: reduce gradients across ranks (callers pass the global norm).
 */
#ifndef ISTHMUS_OPTIM_H
#define ISTHMUS_OPTIM_H

#include <stddef.h>

#include "config.h"
#include "elementwise.h"
#include "model.h"

#define ADAM_BETA1 0.9
#define ADAM_BETA2 0.95
#define ADAM_EPS 1e-8

/* Runs of a params-shaped buffer (ascending, disjoint) and where each
 * starts when they are packed one after the other: the layout of the
 * optimiser state of both backends. */
typedef struct {
    size_t *off, *len; /* (n) */
    size_t *packed;    /* (n) offset of each run in the packed layout */
    int n;
    size_t total;      /* values of all runs */
} ParamRuns;

/* A copy of n runs (off, len); refused when they overlap or are not ascending. */
int param_runs_create(ParamRuns *r, const size_t *off, const size_t *len, int n);
void param_runs_destroy(ParamRuns *r);

typedef struct {
    ParamRuns runs;    /* the params updated here */
    float *m, *v;      /* (runs.total) first and second moments, packed */
    long t;            /* updates applied so far (bias correction) */
} AdamW;

/* The moments of n_runs runs (off, len) of a params-shaped buffer,
 * zeroed. */
int adamw_create(AdamW *opt, const size_t *off, const size_t *len, int n_runs);
void adamw_destroy(AdamW *opt);

/* The constants of update t (1-based) for a tensor that decays or not. */
AdamWStep adamw_constants(long t, double lr, double weight_decay, int decays);
/* Where run r meets tensor t: its offset in the params (*param), in the
 * packed layout (*packed) and its length (*n); 0 when they do not meet. */
int run_segment(const ParamRuns *runs, int r, const Tensor *t, size_t *param, size_t *packed, size_t *n);

/* One update of the runs; grads are read, not modified. */
void adamw_step(AdamW *opt, Model *m, double lr, double weight_decay);

/* Plain SGD of the same runs: p = p*(1 - lr*wd) - lr*g (decay on
 * PARAM_DECAY tensors). */
void sgd_step(const ParamRuns *runs, Model *m, double lr, double weight_decay);


/* Sum of squares of this rank's gradients, restricted to tensors whose
 * flags & mask == want (lets callers separate replicated from sharded
 * tensors). Deterministic: fixed chunking, summed in order. */
double grad_sumsq(const Model *m, unsigned mask, unsigned want);
/* The same over any buffer laid out like the params. */
double state_sumsq(const Model *m, const float *buf, unsigned mask, unsigned want);

/* grads *= factor */
void grad_scale(Model *m, float factor);

#endif
