/* config_types.h — the run configuration as the program reads it: one
 * struct per section, the limits of names and paths, the outer mode.
 * Owns: the types and limits (config.h loads them, config_keys.h knows the
 * field of each key).
 * Must not: hold behaviour beyond a derived size.
 */
#ifndef ISTHMUS_CONFIG_TYPES_H
#define ISTHMUS_CONFIG_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

#define CONFIG_PATH_MAX 1024
/* a configured directory plus what isthmus adds under it (site, file name) */
#define CONFIG_FILE_PATH_MAX (CONFIG_PATH_MAX + 256)

typedef struct {
    int layers;     /* L */
    int dim;        /* D */
    int heads;      /* H; head dim D/H */
    int experts;    /* E */
    int top_k;      /* k */
    int ffn;        /* F, hidden width of one SwiGLU expert */
    int context;    /* T */
    int vocab;      /* V: 256 = bytes, or the token shards' vocabulary */
    double capacity_factor;
    double aux_loss;
    double z_loss;
    uint64_t init_seed;
} ModelConfig;

typedef struct {
    int steps;
    int micro_batch;
    int grad_accum;
    double lr;
    double min_lr;
    int warmup;
    double weight_decay;
    double clip;
    char optimizer[16]; /* adamw | sgd | shampoo | muon */
    int precond_block;  /* shampoo: rows and columns of a preconditioned block */
    int precond_every;  /* shampoo: updates between inverse roots */
    int precond_stats_every; /* shampoo: updates between two updates of the statistics */
    double precond_eps; /* shampoo: added to a statistic's eigenvalues, times its largest */
    double precond_beta2; /* shampoo: decay of the statistics */
    char backend[8];   /* auto | cpu | cuda */
    char precision[8]; /* fp32 | bf16 (bf16: CUDA only) */
    char recompute[12]; /* none | attention | layer: what backward computes again instead of keeping */
    int gpu_share;     /* 1: ranks on one host may share a GPU (tests) */
    int threads;
    uint64_t seed;
    int eval_every;
    int log_every;
    int sample_every;    /* steps between samples printed during training (0 = none) */
    int sample_tokens;   /* tokens per sample */
    int check_replicas;  /* every N steps: verify all learners hold identical models (0 = off) */
    long mpi_piece_bytes; /* largest single MPI transfer; larger ones go in pieces */
    char out_dir[CONFIG_PATH_MAX];
} TrainConfig;

/* train.recompute as the backends take it */
typedef enum { RECOMPUTE_NONE, RECOMPUTE_ATTENTION, RECOMPUTE_LAYER } Recompute;

typedef struct {
    char dir[CONFIG_PATH_MAX];   /* holds train.txt eval_prose.txt eval_tech.txt */
    char train[4 * CONFIG_PATH_MAX]; /* training files: paths and globs ("" = dir/train.txt) */
    char tokenizer[CONFIG_PATH_MAX]; /* the sentencepiece model of token data ("" none) */
    long eval_bytes;             /* 0 = whole eval files */
} DataConfig;

#define CONFIG_MAX_SITES 64
#define CONFIG_NAME_MAX 64

/* One [site.NAME] section: a cluster. Ranks are assigned to sites in the
 * order the sections appear (file first, then --set additions). */
typedef struct {
    char name[CONFIG_NAME_MAX];
    int ranks;          /* ranks (GPUs) of this site */
    int learner_ranks;  /* ranks per learner = expert-parallel degree; default: ranks */
    int micro_batch;    /* sequences per rank per micro-step; default [train] micro_batch */
    int grad_accum;     /* micro-steps per step; default [train] grad_accum */
    double speed;       /* relative speed: parsed, printed, stored; nothing computes with it; default 1 */
    char experts[24];   /* [outer] experts = split: the experts it trains, "LO-HI" ("" = by compute share) */
} SiteConfig;

/* [outer] mode, parsed once (config_load). */
typedef enum { MODE_SYNC, MODE_DILOCO, MODE_STREAMING, MODE_BUTTERFLY } OuterMode;

typedef struct {
    char mode[16];      /* sync | diloco | streaming | butterfly */
    OuterMode mode_id;  /* the same, as an enum */
    int inner_steps;    /* H */
    double lr;          /* outer learning rate (default by mode: diloco 0.7, streaming 0.4, butterfly 1) */
    double momentum;    /* outer Nesterov momentum */
    int fragments;      /* P (default by mode: 1, streaming: layers) */
    int overlap;        /* tau: inner steps a streaming exchange or butterfly round overlaps */
    double merge_alpha; /* streaming merge: theta = alpha*local + (1-alpha)*outer */
    char codec[8];      /* none | bf16 | int8 | fp4 | topk */
    int codec_block;    /* values per scale (int8, fp4) */
    int topk_chunk;     /* topk: values per chunk */
    int topk_k;         /* topk: values sent per chunk */
    int topk_bits;      /* topk: bits per sent value */
    char topk_mean[8];  /* topk: senders | all (what a sum of sparse payloads is divided by) */
    char error_feedback[4]; /* on | off */
    double ef_decay;    /* error feedback: residual decay per exchange (SparseLoCo's beta) */
    double timeout;     /* seconds an inter-site exchange may take */
    char run_id[64];    /* federated launch: the name published is isthmus-<run_id> ("" = the config fingerprint) */
    char key_file[CONFIG_PATH_MAX]; /* federated launch: the run's key ("" = <out_dir>/run.key) */
    char encrypt[4];    /* on | off: the link's payloads encrypted (always authenticated) */
    double join_timeout; /* federated launch: seconds the sites wait for each other at start; 0 no limit */
    char progress[8];   /* step | poll | thread: when MPI moves the exchanges in flight (docs/configuration.md) */
    long piece_bytes;   /* the link's largest MPI message: frames go in pieces of this size */
    char pace[4];       /* on | off: a streaming payload's pieces posted over its overlap window */
    char transport[4];  /* tcp | mpi: what carries frames between sites (wire.h, or MPI) */
    int streams;        /* tcp: connections per pair of ranks */
    long socket_buffer; /* tcp: SO_SNDBUF/SO_RCVBUF bytes (0 = the kernel's autotuning) */
    char ports[16];     /* tcp: listening ports, "0" (any), "N" or "LO-HI" */
    char interface[32]; /* tcp: the interface whose IPv4 address other sites reach ("" = first non-loopback) */
    char experts[12];   /* replicated | split: every site trains every expert, or each its own (expert_split.h) */
    char expert_routing[8]; /* split: local (the router over the site's experts) | drop (copies to others' dropped) */
    int expert_replicas; /* split: sites holding each expert, owner included (-1: 2, or 1 with one site) */
    int expert_refresh; /* split: outer periods between refreshes of the copies */
    int router_steps;   /* split: steps of the joint router phase at the end (0: none; -1: 200 with split) */
    double router_lr;   /* split: its learning rate (0: [train] lr) */
} OuterConfig;

typedef struct {
    char dir[CONFIG_PATH_MAX]; /* "" = <out_dir>/checkpoints; one subdirectory per site */
    int every;          /* steps between checkpoints (0 = only at the end and on a signal) */
    int keep;           /* newest checkpoints kept per site */
    double timeout;     /* seconds a checkpoint (or model) write or load may take; then the job ends */
} CheckpointConfig;

/* An [eval.NAME] section: a set the model is evaluated on. */
#define CONFIG_MAX_EVALS 16
typedef struct {
    char name[CONFIG_NAME_MAX];
    char path[CONFIG_PATH_MAX]; /* relative to data.dir unless absolute; ${NAME} from the environment */
    long bytes;                 /* bytes of text its tokens stand for (a token shard); 0: a byte file's own */
} EvalConfig;

typedef struct {
    ModelConfig model;
    TrainConfig train;
    DataConfig data;
    OuterConfig outer;
    CheckpointConfig checkpoint;
    SiteConfig sites[CONFIG_MAX_SITES];
    int n_sites;        /* 0: one implicit site holding every rank as one learner */
    EvalConfig evals[CONFIG_MAX_EVALS];
    int n_evals;        /* 0: prose and tech (data.dir's eval_prose.txt and eval_tech.txt) */
    char source[CONFIG_PATH_MAX]; /* file the config came from, for messages */
} Config;

/* One `section.key=value` override from the command line. */
typedef struct {
    const char *assignment;
} ConfigOverride;

/* Derived sizes. */
static inline int config_head_dim(const ModelConfig *m) { return m->dim / m->heads; }

#endif
