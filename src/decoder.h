/* decoder.h — a model run one token at a time with a KV cache, on the host:
 * what `isthmus generate` samples with.
 *
 * The arithmetic is the forward of src/cpu/transformer.c without capacity
 * limits (as evaluation runs it), with every expert on this process: for
 * position p only the new token's rows are computed; attention reads the
 * keys and values of positions 0..p from the cache. Its logits equal the
 * full forward's at every position up to float rounding (tests/test_generate.c).
 * Owns: the cache and the one-token scratch.
 * Must not: allocate or change parameters, or draw tokens (sample.h).
 */
#ifndef ISTHMUS_DECODER_H
#define ISTHMUS_DECODER_H

#include "model.h"

typedef struct {
    const Model *m;     /* every expert (model_create with experts_local = experts) */
    int T;              /* the context: the cache's positions */
    ModelDims dims;     /* the model's sizes (model.h) */
    int pos;            /* positions in the cache */
    float *kcache, *vcache;  /* (L, T, D) keys (rotated) and values */
    float *x, *xn, *q, *k, *v, *ao, *o, *h;  /* (D) */
    float *scores;      /* (T) */
    float *router, *gates, lse;              /* (E) */
    int *choice;        /* (K) */
    float *ea, *eu, *eh, *ey;                /* (F), (F), (F), (D) */
    float *rope_cos, *rope_sin;              /* (T, Dh/2) */
    float *block;       /* everything above */
} Decoder;

/* A decoder of the model's context (m->cfg.context positions). */
int decoder_create(Decoder *d, const Model *m);
void decoder_destroy(Decoder *d);
/* Forget the cache: the next token is at position 0. */
void decoder_reset(Decoder *d);
/* Feed `token` at position d->pos (< T; ISTH_ERUNTIME when the cache is
 * full) and write the next token's logits (V). */
int decoder_step(Decoder *d, int token, float *logits);

#endif
