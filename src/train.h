/* train.h — the training loop.
 *
 * Owns: one run's state (model, optimiser, data cursor, activations, corpus
 * maps, metrics file) and the order of a training step: micro-batches
 * forward/backward with gradient accumulation, global-norm clipping,
 * learning-rate schedule, optimiser update, logging, periodic evaluation,
 * and writing the final model.
 * Must not: parse command lines or know which backend computes the layers
 * beyond the transformer.h interface.
 */
#ifndef ISTHMUS_TRAIN_H
#define ISTHMUS_TRAIN_H

#include "config.h"
#include "data.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "transformer.h"

typedef struct {
    Config cfg;
    char *config_text;   /* resolved config, stored in output files */
    Model model;
    AdamW opt;
    Activations acts;
    Corpus train, eval_prose, eval_tech;
    DataCursor cursor;
    int *tokens, *targets; /* (micro_batch, context) */
    Metrics metrics;
    long step;           /* optimiser steps done */
    double tokens_seen;
    int rank;            /* rank in MPI_COMM_WORLD; 0 logs */
    int log;             /* print step lines and write metrics */
} Trainer;

/* Set OpenMP and OpenBLAS thread counts (0 = leave the defaults). */
void set_threads(int threads);

/* Build everything a run needs. `log`: write metrics and print lines. */
int trainer_create(Trainer *tr, const Config *cfg, int log);
void trainer_destroy(Trainer *tr);

/* One optimiser step (grad_accum micro-batches). Fills *out. */
int trainer_step(Trainer *tr, StepLog *out);

/* bpb on both eval sets, logged with the current step. */
int trainer_eval(Trainer *tr, double *bpb_prose, double *bpb_tech);

/* The whole `isthmus train` run. */
int train_run(const Config *cfg);

#endif
