/* sample.h — drawing the next token, and generating a continuation.
 *
 * The rule: temperature 0 takes the most likely token (the lowest index on
 * ties); otherwise the logits divided by the temperature, cut to the top_k
 * largest (0: all; ties at the cut kept by lower index), softmaxed in
 * double, and one uniform draw from rng.h's stream (seed, SAMPLE_STREAM,
 * draw number) picks the token by the cumulative sum in index order. Same
 * seed, same logits: the same tokens on any machine that computes the same
 * logits.
 * Owns: that rule and the generation loop over a Decoder (how a window
 * longer than the context goes on).
 * Must not: load models or know tokenizers.
 */
#ifndef ISTHMUS_SAMPLE_H
#define ISTHMUS_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "decoder.h"

typedef struct {
    double temperature; /* >= 0 */
    int top_k;          /* 0 = every token */
    uint64_t seed;
} SampleRule;

/* The token the rule draws from logits (V) for draw number `draw`.
 * scratch: V doubles. */
int sample_draw(const float *logits, int V, const SampleRule *r, uint64_t draw, double *scratch);

/* Feed the prompt's n (>= 1) tokens, then draw `count` more, each passed
 * to emit(ctx, token) as it is drawn; out (count) receives them too when
 * not NULL. When the context fills, the decoder restarts on the last half
 * of the context's tokens (T/2, rounded down; prompt and continuation
 * alike), so generation is not limited by it; a prompt longer than the
 * context starts from its last T/2 tokens (at least one). */
int sample_generate(Decoder *d, const int *prompt, size_t n, int count, const SampleRule *r, int *out,
                    void (*emit)(void *ctx, int token), void *ctx);

#endif
