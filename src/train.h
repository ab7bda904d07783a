/* train.h — the training loop.
 *
 * Owns: one run's state (a backend handle, the data cursor, corpus maps,
 * metrics file) and the order of a training step: micro-batches
 * forward/backward with gradient accumulation, global-norm clipping,
 * learning-rate schedule, optimiser update, logging, periodic evaluation,
 * and writing the final model.
 * Must not: parse command lines, or know which backend computes: it calls
 * the verbs of backend.h and hands the backend (never its memory) to
 * shard, reduce, outer and ckpt. It owns the exchange's parts (the link,
 * the shard, the reducer or the mixer, the stop ballot) and hands each the
 * others it needs.
 */
#ifndef ISTHMUS_TRAIN_H
#define ISTHMUS_TRAIN_H

#include "assemble.h"
#include "backend.h"
#include "coll.h"
#include "config.h"
#include "data.h"
#include "eval.h"
#include "tokenizer.h"
#include "metrics.h"
#include "model.h"
#include "ballot.h"
#include "link.h"
#include "mix.h"
#include "outer.h"
#include "progress.h"
#include "reduce.h"
#include "shard.h"
#include "topology.h"

typedef struct {
    Config cfg;
    char *config_text;   /* resolved config, stored in output files */
    Topology topo;
    Coll ep;             /* the learner: expert-parallel group */
    Tokenizer tokenizer; /* the samples' text ([data] tokenizer; bytes; or ids) */
    Link link;           /* the inter-site link: every frame between sites (link.h) */
    Shard shard;         /* this rank's owned chunks: staging, residuals, the payload codec */
    Reducer red;         /* the site reduction (sync, diloco, streaming) */
    Mixer mix;           /* the butterfly mixer (butterfly) */
    StopBallot ballot;   /* the stop vote between sites, carried by the exchanges */
    Progress progress;   /* this site's recent steps, every site's summary the exchanges brought */
    Outer outer;         /* diloco / streaming state */
    Assembly whole;      /* split experts: the other sites' experts at the model file's writer (trainer_assemble) */
    ExpertCopies copies; /* split experts: copies of other sites' experts, refreshed (run.c) */
    OuterMode mode;      /* [outer] mode */
    int *site_leaders;   /* world rank of each site's first rank: the ends of control exchanges */
    Backend *be;         /* computes; owns the weights, grads, optimiser state and activations */
    Model model;         /* the table of this rank's tensors (shapes, offsets; no buffers) */
    Dataset train;       /* the training files ([data] train) */
    EvalSet evals[CONFIG_MAX_EVALS]; /* [eval.*] (or prose and tech), opened */
    int n_evals;         /* 0: none apply (token data without [eval.*] sections) */
    DataCursor cursor;
    int micro_batch, grad_accum; /* this rank's site's */
    double loss_weight;  /* scale of this rank's loss: its share of the tokens the update averages */
    uint64_t learner_first_window; /* this learner's first window in each step's global batch */
    int *tokens, *targets; /* (micro_batch, context) */
    Metrics metrics;
    long step;           /* optimiser steps done */
    long ckpt_every_site; /* the newest step whose checkpoint every site completed while all were in (-1 none):
                           * kept by the pruning while a site is out, so that the sites, started again together,
                           * still have a step in common (ckpt.c, ckpt_load.c) */
    int load_dense_only; /* a checkpoint load reads no expert chunk (a split run's rejoin: the host's file holds
                          * none of the joiner's experts, whose state is set apart; ckpt_load.c) */
    double compute_s;    /* this rank's time in the inner steps' own work so far (trainer_step) */
    double data_s;       /* of which reading training windows (data_fill) */
    double inter_site_total; /* the step lines' inter_site_bytes summed over every step of this start */
    double tokens_seen;  /* all learners */
    int rank;            /* rank in the run's world (federation.h; MPI_COMM_WORLD in the joint launch) */
    int log;             /* print step lines and write metrics: world rank 0, and each other site's
                          * first rank in the federated launch */
    char metrics_dir[CONFIG_PATH_MAX + 80]; /* out_dir, or out_dir/site-NAME for another site's log */
    int created;         /* topology and communicators exist */
} Trainer;

/* Linear warmup over `warmup` steps to lr, then cosine decay to min_lr at
 * `steps`. step counts from 0. */
double lr_at(const TrainConfig *tc, long step);

/* Build everything a run needs. `log`: write metrics and print lines, and
 * refuse a token model's byte data (a training run; bench passes 0). */
/* `world`: every rank of the run (MPI_COMM_WORLD, or the federated world);
 * `link_master`: the link's master key (federation.h), NULL: a key every
 * build knows (one site, benchmarks: no frame crosses a site). */
int trainer_create(Trainer *tr, const Config *cfg, int log, MPI_Comm world, const unsigned char *link_master);
void trainer_destroy(Trainer *tr);

/* A blocking control exchange between the sites through the link
 * (link_control): all[s * bytes] = site s's `mine`, on every rank. */
int trainer_control(Trainer *tr, const void *mine, size_t bytes, void *all, const char *what);

/* One optimiser step (grad_accum micro-batches). Fills *out. */
int trainer_step(Trainer *tr, StepLog *out);

/* The first site still present (federated launch: site 0 unless it was
 * lost); its first learner evaluates and writes the model file, to
 * trainer_model_path: <out_dir>/model.h5, or <out_dir>/site-NAME/model.h5. */
int trainer_lead_site(const Trainer *tr);
void trainer_model_path(const Trainer *tr, char *out, size_t cap);
/* bpb on the eval sets, logged with the current step. Split experts: the
 * lead site's model, its experts under its routing (the eval records say
 * "site"; trainer_eval_whole gives the whole model's). */
int trainer_eval(Trainer *tr);
/* train.sample_every: the first learner of the lead site draws
 * train.sample_tokens tokens after a prompt (the start of the first eval
 * set) from the model it evaluates, at temperature 1; the log prints them
 * decoded, one line. Learner collective; the others return. */
int trainer_sample(Trainer *tr);

/* [outer] experts = split: every other site's first learner sends its
 * experts through the link to the lead site's first learner, the writer
 * (assemble.h). Collective over every rank of every live site; a lost site
 * leaves tr->whole.whole 0 (no model.h5), not a failure. */
int trainer_assemble(Trainer *tr);
/* Write the model (the lead site's first learner's ranks write
 * collectively; others return); *written: a file was written. Split
 * experts: the whole model, the dense part and the writer's experts from
 * its backend, every other site's from trainer_assemble, marked
 * experts_whole; when it is not whole, one line says why and nothing is
 * written. */
int trainer_write_model(Trainer *tr, const char *path, int *written);
/* Split experts, after trainer_write_model wrote `path`: the writer's
 * ranks evaluate the whole model (every expert, the full router) from the
 * file, in a backend of its own made after the training one is freed
 * (nothing trains or samples after this); the eval records say "whole",
 * trainer_eval's "site". Learner collective; the others return. */
int trainer_eval_whole(Trainer *tr, const char *path);
/* A StateSelect (stateview.h): chunk c is owned by this rank (ctx: the Shard). */
int trainer_owns_chunk(const void *shard, int c);

#endif
