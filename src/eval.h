/* eval.h — bits per byte on an evaluation file.
 *
 * Owns: the evaluation protocol. The file is cut into
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
    double loss;       /* nats per token */
    double ce_sum;     /* nats */
    size_t predicted;  /* tokens predicted */
    double bytes;      /* bytes of text they stand for (bits per byte divides by it) */
    double seconds;
} EvalResult;

/* One eval set of a config, opened. */
typedef struct {
    EvalConfig cfg;
    Corpus file;
} EvalSet;

/* The config's eval sets ([eval.*], or data.dir's prose and tech) opened,
 * paths expanded and relative to data.dir. train_width: the training
 * data's bytes per token (0: not known); the implicit prose and tech are
 * byte files and are left out (*n = 0) for token data; a set of another
 * kind than the training data, a shard without `bytes`, a byte file whose
 * `bytes` is not its size, a token not below model.vocab (every token of
 * every set is read here, before any training: an evaluation must not
 * find it after the training): ISTH_EINPUT with one line. */
int eval_sets_open(EvalSet sets[CONFIG_MAX_EVALS], int *n, const Config *cfg, int train_width);
void eval_sets_close(EvalSet *sets, int n);

/* Evaluate the first `max_bytes` bytes of `c` (0 = all) with windows of
 * the activations' T, a->B windows per forward pass. */
/* B sequences of T bytes per rank and forward (the learner's ranks split
 * the windows); learner collective over ep. */
int eval_corpus(Backend *be, Coll *ep, int B, int T, Corpus *c, size_t max_bytes, int vocab, EvalResult *out);
/* The same for an eval set: a byte file as eval_corpus (max_bytes applies);
 * a token shard whole, its bits per byte over the bytes its predicted
 * tokens stand for (the set's `bytes` x predicted / tokens). */
int eval_set(Backend *be, Coll *ep, int B, int T, EvalSet *s, size_t max_bytes, int vocab, EvalResult *out);

#endif
