/* optim.h — the inner optimiser (AdamW), learning-rate schedule and
 * gradient clipping.
 *
 * Owns: the AdamW moments (one flat buffer each, laid out like the params)
 * and the rule that weight decay applies only to tensors flagged
 * PARAM_DECAY in the model table.
 * Must not: reduce gradients across ranks (callers pass the global norm).
 */
#ifndef ISTHMUS_OPTIM_H
#define ISTHMUS_OPTIM_H

#include <stddef.h>

#include "config.h"
#include "model.h"

#define ADAM_BETA1 0.9
#define ADAM_BETA2 0.95
#define ADAM_EPS 1e-8

typedef struct {
    float *m, *v; /* (n_params) first and second moments */
    size_t n;
    long t;       /* updates applied so far (bias correction) */
} AdamW;

int adamw_create(AdamW *opt, size_t n);
void adamw_destroy(AdamW *opt);

/* One update of every tensor; grads are read, not modified. */
void adamw_step(AdamW *opt, Model *m, double lr, double weight_decay);

/* Plain SGD: p = p*(1 - lr*wd) - lr*g (decay on PARAM_DECAY tensors). */
void sgd_step(Model *m, double lr, double weight_decay);


/* Sum of squares of this rank's gradients, restricted to tensors whose
 * flags & mask == want (lets callers separate replicated from sharded
 * tensors). Deterministic: fixed chunking, summed in order. */
double grad_sumsq(const Model *m, unsigned mask, unsigned want);
/* The same over any buffer laid out like the params. */
double state_sumsq(const Model *m, const float *buf, unsigned mask, unsigned want);

/* grads *= factor */
void grad_scale(Model *m, float factor);

#endif
