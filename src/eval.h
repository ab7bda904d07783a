/* eval.h — bits per byte on an evaluation file.
 *
 * Owns: the evaluation protocol of DESIGN.md. The file is cut into
 * consecutive windows of T+1 bytes overlapping by one byte (inputs bytes
 * j*T .. j*T+T-1, targets one byte later; the last window may be shorter;
 * rotary positions restart at 0 in each window). Every byte after the first
 * is predicted exactly once; bpb = sum of cross-entropy / (bytes predicted * ln 2).
 * No tokens are dropped (the forward runs without capacity limits).
 * Must not: change parameters or optimiser state.
 */
#ifndef ISTHMUS_EVAL_H
#define ISTHMUS_EVAL_H

#include <stddef.h>

#include "data.h"
#include "model.h"
#include "backend.h"
#include "coll.h"

typedef struct {
    double bpb;
    double ce_sum;     /* nats */
    size_t predicted;  /* bytes predicted */
    double seconds;
} EvalResult;

/* Evaluate the first `max_bytes` bytes of `c` (0 = all) with windows of
 * the activations' T, a->B windows per forward pass. */
/* B sequences of T bytes per rank and forward (the learner's ranks split
 * the windows); learner collective over ep. */
int eval_corpus(Backend *be, Coll *ep, int B, int T, Corpus *c, size_t max_bytes, int vocab, EvalResult *out);

#endif
