/* config_keys.c — see config_keys.h. */
#include "config_keys.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

#ifndef ISTHMUS_DATADIR
#define ISTHMUS_DATADIR "share/data"
#endif

typedef enum { KEY_INT, KEY_LONG, KEY_REAL, KEY_U64, KEY_STR, KEY_ENUM } KeyType;

struct KeySpec {
    const char *section;
    const char *key;
    KeyType type;
    size_t offset;        /* into Config */
    size_t size;          /* for KEY_STR / KEY_ENUM: buffer size */
    double min, max;      /* inclusive range for numbers */
    int min_exclusive;    /* min is exclusive (e.g. capacity_factor > 0) */
    const char *choices;  /* KEY_ENUM: '|'-separated */
    const char *dflt;
    const char *help;        /* one line for `config --keys` (docs/configuration.md has the full text) */
    const char *dflt_words;  /* the default as `config --keys` shows it where dflt is a sentinel
                                resolved later ("-1", "0", "") or NULL (required); else NULL */
    const char *type_words;  /* the accepted values where [min, max] includes such a sentinel */
};

#define M(field) offsetof(Config, model.field)
#define TR(field) offsetof(Config, train.field)
#define DA(field) offsetof(Config, data.field)
#define OU(field) offsetof(Config, outer.field)
#define CK(field) offsetof(Config, checkpoint.field)
#define STRSZ(field) sizeof(((Config *)0)->field)

/* The public configuration keys. Names are a stable interface:
 * add freely, rename never. docs/configuration.md documents each one and a
 * test checks that it lists all of them, with the defaults `config --keys`
 * prints. Fields: section, key, type, offset, size, min, max, min_exclusive,
 * choices, default, then .help (one line, at most 90 characters) and, where
 * needed, .dflt_words and .type_words. */
static const KeySpec schema[] = {
    {"model", "layers", KEY_INT, M(layers), 0, 1, 1024, 0, NULL, "2", .help = "L, transformer blocks"},
    {"model", "dim", KEY_INT, M(dim), 0, 2, 65536, 0, NULL, "64", .help = "D, model width; divisible by heads, with an even head dim D/H"},
    {"model", "heads", KEY_INT, M(heads), 0, 1, 1024, 0, NULL, "2", .help = "H, attention heads"},
    {"model", "experts", KEY_INT, M(experts), 0, 1, 4096, 0, NULL, "4", .help = "E, experts per MoE layer"},
    {"model", "top_k", KEY_INT, M(top_k), 0, 1, 4096, 0, NULL, "2", .help = "k, experts per token (at most experts); sparsity is E/k"},
    {"model", "ffn", KEY_INT, M(ffn), 0, 1, 1 << 20, 0, NULL, "128", .help = "F, hidden width of one SwiGLU expert"},
    {"model", "context", KEY_INT, M(context), 0, 1, 1 << 20, 0, NULL, "64", .help = "T, tokens per training and eval window (bytes for byte data)"},
    {"model", "vocab", KEY_INT, M(vocab), 0, 2, 1 << 24, 0, NULL, "256", .help = "V, vocabulary size: 256 for bytes, else the tokenizer's size"},
    {"model", "capacity_factor", KEY_REAL, M(capacity_factor), 0, 0, 1e6, 1, NULL, "1.25", .help = "expert capacity per micro-step = ceil(cf * tokens * k / E); training only"},
    {"model", "aux_loss", KEY_REAL, M(aux_loss), 0, 0, 1e6, 0, NULL, "0.01", .help = "coefficient of the Switch load-balancing loss"},
    {"model", "z_loss", KEY_REAL, M(z_loss), 0, 0, 1e6, 0, NULL, "0.001", .help = "coefficient of the router z-loss mean(logsumexp^2)"},
    {"model", "init_seed", KEY_U64, M(init_seed), 0, 0, 0, 0, NULL, "1234", .help = "seed of the N(0, 0.02) parameter initialisation"},

    {"train", "steps", KEY_INT, TR(steps), 0, 0, INT_MAX, 0, NULL, "100", .help = "optimiser steps"},
    {"train", "micro_batch", KEY_INT, TR(micro_batch), 0, 1, 1 << 20, 0, NULL, "8", .help = "sequences per rank per micro-step"},
    {"train", "grad_accum", KEY_INT, TR(grad_accum), 0, 1, 1 << 20, 0, NULL, "1", .help = "micro-steps accumulated per optimiser step"},
    {"train", "lr", KEY_REAL, TR(lr), 0, 0, 10, 1, NULL, "0.001", .help = "peak learning rate"},
    {"train", "min_lr", KEY_REAL, TR(min_lr), 0, 0, 10, 0, NULL, "0.0001", .help = "learning rate at the end of the cosine decay (at most lr)"},
    {"train", "warmup", KEY_INT, TR(warmup), 0, 0, INT_MAX, 0, NULL, "10", .help = "linear warm-up steps, then cosine decay to min_lr at steps"},
    {"train", "weight_decay", KEY_REAL, TR(weight_decay), 0, 0, 10, 0, NULL, "0.1", .help = "decoupled weight decay, applied to matrices only (never norm gains)"},
    {"train", "clip", KEY_REAL, TR(clip), 0, 0, 1e9, 0, NULL, "1.0", .help = "global gradient-norm clip; 0 disables"},
    {"train", "optimizer", KEY_ENUM, TR(optimizer), STRSZ(train.optimizer), 0, 0, 0, "adamw|sgd|shampoo|muon", "adamw", .help = "inner optimiser; shampoo and muon precondition the matrices"},
    {"train", "precond_block", KEY_INT, TR(precond_block), 0, 2, 8192, 0, NULL, "128", .help = "shampoo: side of a preconditioned block; must divide model.dim and model.ffn"},
    {"train", "precond_every", KEY_INT, TR(precond_every), 0, 1, 1 << 24, 0, NULL, "20", .help = "shampoo: updates between two computations of the inverse roots"},
    {"train", "precond_stats_every", KEY_INT, TR(precond_stats_every), 0, 1, 1 << 24, 0, NULL, "1", .help = "shampoo: updates between two updates of the statistics (at most precond_every)"},
    {"train", "precond_eps", KEY_REAL, TR(precond_eps), 0, 1e-12, 1, 0, NULL, "1e-6", .help = "shampoo: added to each eigenvalue before the root, times the largest one"},
    {"train", "precond_beta2", KEY_REAL, TR(precond_beta2), 0, 0, 0.999999, 0, NULL, "0.99", .help = "shampoo: decay of the statistics L and R"},
    {"train", "backend", KEY_ENUM, TR(backend), STRSZ(train.backend), 0, 0, 0, "auto|cpu|cuda", "auto", .help = "cpu, cuda (one GPU per rank), or auto: cuda when built in and every rank gets a GPU"},
    {"train", "precision", KEY_ENUM, TR(precision), STRSZ(train.precision), 0, 0, 0, "fp32|bf16", "fp32", .help = "matrix products in fp32, or bf16 tensor cores with fp32 accumulation (CUDA only)"},
    {"train", "recompute", KEY_ENUM, TR(recompute), STRSZ(train.recompute), 0, 0, 0, "none|attention|layer", "none", .help = "backward recomputes: attention = the probabilities, layer = each layer from its input"},
    {"train", "gpu_share", KEY_INT, TR(gpu_share), 0, 0, 1, 0, NULL, "0", .help = "1 lets several ranks of one host share a GPU (tests on a one-GPU machine)"},
    {"train", "threads", KEY_INT, TR(threads), 0, 0, 4096, 0, NULL, "0", .help = "OpenMP and OpenBLAS threads per rank; 0 = OMP_NUM_THREADS, else all cores"},
    {"train", "seed", KEY_U64, TR(seed), 0, 0, 0, 0, NULL, "42", .help = "seed of the training-window sampler"},
    {"train", "eval_every", KEY_INT, TR(eval_every), 0, 0, INT_MAX, 0, NULL, "0", .help = "evaluate every eval set at step 0 and every N steps; 0 = only at the end"},
    {"train", "sample_every", KEY_INT, TR(sample_every), 0, 0, INT_MAX, 0, NULL, "0", .help = "print a text sample every N steps and at the end; 0 = never"},
    {"train", "sample_tokens", KEY_INT, TR(sample_tokens), 0, 1, 1 << 16, 0, NULL, "64", .help = "tokens per sample"},
    {"train", "log_every", KEY_INT, TR(log_every), 0, 1, INT_MAX, 0, NULL, "1", .help = "print a step line every N steps"},
    {"train", "check_replicas", KEY_INT, TR(check_replicas), 0, 0, INT_MAX, 0, NULL, "0", .help = "every N steps verify that all learners hold identical models; 0 = off"},
    {"train", "mpi_piece_bytes", KEY_LONG, TR(mpi_piece_bytes), 0, 1024, INT_MAX, 0, NULL, "1073741824", .help = "largest single MPI transfer in bytes; larger messages go in pieces"},
    {"train", "out_dir", KEY_STR, TR(out_dir), STRSZ(train.out_dir), 0, 0, 0, NULL, "run", .help = "run directory: metrics.jsonl and model.h5"},

    {"data", "dir", KEY_STR, DA(dir), STRSZ(data.dir), 0, 0, 0, NULL, ISTHMUS_DATADIR, .help = "directory of eval_prose.txt, eval_tech.txt and train.txt"},
    {"data", "train", KEY_STR, DA(train), STRSZ(data.train), 0, 0, 0, NULL, "", .help = "training files (spaces or commas, globs, ${NAME}), relative to data.dir", .dflt_words = "(empty: data.dir/train.txt)"},
    {"data", "tokenizer", KEY_STR, DA(tokenizer), STRSZ(data.tokenizer), 0, 0, 0, NULL, "", .help = "sentencepiece model of token data, to decode samples and generate's output", .dflt_words = "(empty: none)"},
    {"data", "eval_bytes", KEY_LONG, DA(eval_bytes), 0, 0, (double)LONG_MAX, 0, NULL, "0", .help = "evaluate only the first N bytes of each byte eval file; 0 = whole files"},

    {"outer", "mode", KEY_ENUM, OU(mode), STRSZ(outer.mode), 0, 0, 0, "sync|diloco|streaming|butterfly", "sync", .help = "sync (gradients every step), diloco, streaming (fragments) or butterfly (pairwise)"},
    {"outer", "inner_steps", KEY_INT, OU(inner_steps), 0, 1, 1 << 24, 0, NULL, "50", .help = "H: inner steps between two outer steps of a fragment (butterfly: mixing rounds)"},
    {"outer", "lr", KEY_REAL, OU(lr), 0, -1, 100, 0, NULL, "-1", .help = "outer learning rate", .dflt_words = "by mode: diloco 0.7, streaming 0.4, else 1; codec topk 1", .type_words = "real (0, 100]"},
    {"outer", "momentum", KEY_REAL, OU(momentum), 0, -1, 0.999999, 0, NULL, "-1", .help = "outer Nesterov momentum", .dflt_words = "by mode: 0.9, butterfly 0; codec topk 0", .type_words = "real [0, 0.999999]"},
    {"outer", "fragments", KEY_INT, OU(fragments), 0, 0, 1 << 20, 0, NULL, "0", .help = "P: fragments strided over layers (streaming, butterfly); at most layers, inner_steps", .dflt_words = "by mode: 1, streaming = layers", .type_words = "int 1..1048576"},
    {"outer", "overlap", KEY_INT, OU(overlap), 0, 1, 1 << 24, 0, NULL, "1", .help = "tau: inner steps an exchange overlaps with training; less than inner_steps"},
    {"outer", "merge_alpha", KEY_REAL, OU(merge_alpha), 0, 0, 1, 0, NULL, "0.5", .help = "streaming merge: theta = alpha * local + (1 - alpha) * outer"},
    {"outer", "codec", KEY_ENUM, OU(codec), STRSZ(outer.codec), 0, 0, 0, "none|bf16|int8|fp4|topk", "none", .help = "encoding of inter-site payloads: float32, bf16, int8, fp4 (E2M1) or sparse topk"},
    {"outer", "codec_block", KEY_INT, OU(codec_block), 0, 1, 1 << 24, 0, NULL, "128", .help = "values per scale (int8, fp4)"},
    {"outer", "topk_chunk", KEY_INT, OU(topk_chunk), 0, 2, 1 << 24, 0, NULL, "4096", .help = "topk: values per run; each run sends its topk_k largest"},
    {"outer", "topk_k", KEY_INT, OU(topk_k), 0, 1, 1 << 24, 0, NULL, "64", .help = "topk: values sent per run (at most topk_chunk)"},
    {"outer", "topk_bits", KEY_INT, OU(topk_bits), 0, 1, 8, 0, NULL, "2", .help = "topk: bits per value sent"},
    {"outer", "topk_mean", KEY_ENUM, OU(topk_mean), STRSZ(outer.topk_mean), 0, 0, 0, "senders|all", "senders", .help = "topk: average the sparse values over all sites (unsent = 0) or only the senders"},
    {"outer", "error_feedback", KEY_ENUM, OU(error_feedback), STRSZ(outer.error_feedback), 0, 0, 0, "on|off", "on", .help = "keep what the codec dropped and add it to the next payload"},
    {"outer", "ef_decay", KEY_REAL, OU(ef_decay), 0, -1, 1, 0, NULL, "-1", .help = "error feedback: the kept residual is multiplied by this before it is resent", .dflt_words = "by codec: topk 0.95, else 1", .type_words = "real [0, 1]"},
    {"outer", "timeout", KEY_REAL, OU(timeout), 0, 0, 1e7, 1, NULL, "600", .help = "deadline (s) of an inter-site exchange, then exit 1 or go on without the silent site"},
    {"outer", "run_id", KEY_STR, OU(run_id), STRSZ(outer.run_id), 0, 0, 0, NULL, "", .help = "federated launch: the name the sites meet under in ompi-server", .dflt_words = "(empty: the config's fingerprint)"},
    {"outer", "key_file", KEY_STR, OU(key_file), STRSZ(outer.key_file), 0, 0, 0, NULL, "", .help = "the run's shared secret (isthmus keygen FILE makes one)", .dflt_words = "(empty: <out_dir>/run.key)"},
    {"outer", "encrypt", KEY_ENUM, OU(encrypt), STRSZ(outer.encrypt), 0, 0, 0, "on|off", "on", .help = "encrypt the link's payloads (off still authenticates every frame)"},
    {"outer", "join_timeout", KEY_REAL, OU(join_timeout), 0, 0, 1e7, 0, NULL, "120", .help = "federated launch: seconds the sites wait for each other at start; 0 = until stopped"},
    {"outer", "progress", KEY_ENUM, OU(progress), STRSZ(outer.progress), 0, 0, 0, "step|poll|thread", "poll", .help = "when messages in flight move on: after each step, also between layers, or by a thread"},
    {"outer", "piece_bytes", KEY_LONG, OU(piece_bytes), 0, 4096, INT_MAX, 0, NULL, "262144", .help = "the link's largest MPI message in bytes (at most train.mpi_piece_bytes)"},
    {"outer", "pace", KEY_ENUM, OU(pace), STRSZ(outer.pace), 0, 0, 0, "on|off", "on", .help = "streaming: spread a payload's pieces over its overlap window"},
    {"outer", "transport", KEY_ENUM, OU(transport), STRSZ(outer.transport), 0, 0, 0, "tcp|mpi", "tcp", .help = "what carries frames between sites: isthmus's own TCP, or Open MPI point-to-point"},
    {"outer", "streams", KEY_INT, OU(streams), 0, 1, 16, 0, NULL, "4", .help = "tcp: connections per pair of ranks of different sites"},
    {"outer", "socket_buffer", KEY_LONG, OU(socket_buffer), 0, 0, INT_MAX, 0, NULL, "0", .help = "tcp: SO_SNDBUF and SO_RCVBUF of each connection in bytes; 0 = Linux autotuning"},
    {"outer", "ports", KEY_STR, OU(ports), STRSZ(outer.ports), 0, 0, 0, NULL, "0", .help = "tcp: the listening port: 0 = any free port, N, or the first free one of LO-HI"},
    {"outer", "interface", KEY_STR, OU(interface), STRSZ(outer.interface), 0, 0, 0, NULL, "", .help = "tcp: the interface whose IPv4 address a rank gives the other sites", .dflt_words = "(empty: the first non-loopback interface)"},
    {"outer", "experts", KEY_ENUM, OU(experts), STRSZ(outer.experts), 0, 0, 0, "replicated|split", "replicated", .help = "split: each site trains its own experts, only the dense part crosses sites"},
    {"outer", "expert_routing", KEY_ENUM, OU(expert_routing), STRSZ(outer.expert_routing), 0, 0, 0, "local|drop", "local", .help = "split: the router over the site's experts, or the full one, others' copies dropped"},
    {"outer", "expert_replicas", KEY_INT, OU(expert_replicas), 0, -1, CONFIG_MAX_SITES, 0, NULL, "-1", .help = "split: r, the sites holding each expert (its owner and r - 1 copies)", .dflt_words = "2 (1 with one site)", .type_words = "int 1..64"},
    {"outer", "expert_refresh", KEY_INT, OU(expert_refresh), 0, 1, 1 << 24, 0, NULL, "32", .help = "split: outer periods (of inner_steps) between refreshes of the copies"},
    {"outer", "router_steps", KEY_INT, OU(router_steps), 0, -1, 1 << 24, 0, NULL, "-1", .help = "split: steps training the whole model's router alone at the end (0 = none)", .dflt_words = "200 (split), else 0", .type_words = "int 0..16777216"},
    {"outer", "router_lr", KEY_REAL, OU(router_lr), 0, 0, 10, 0, NULL, "0", .help = "split: the router phase's learning rate", .dflt_words = "0 ([train] lr)"},

    {"checkpoint", "dir", KEY_STR, CK(dir), STRSZ(checkpoint.dir), 0, 0, 0, NULL, "", .help = "checkpoint directory; each site writes <dir>/<site>/ckpt-<step>.h5", .dflt_words = "(empty: <out_dir>/checkpoints)"},
    {"checkpoint", "every", KEY_INT, CK(every), 0, 0, INT_MAX, 0, NULL, "0", .help = "write a checkpoint every N steps; 0 = only at the end and on SIGTERM/SIGUSR1"},
    {"checkpoint", "keep", KEY_INT, CK(keep), 0, 1, 1000000, 0, NULL, "3", .help = "newest checkpoints kept per site"},
    {"checkpoint", "timeout", KEY_REAL, CK(timeout), 0, 0, 1e7, 1, NULL, "3600", .help = "deadline (s) of a checkpoint write or load; past it a watchdog ends the job"},
};
#define N_KEYS (sizeof schema / sizeof schema[0])


/* Keys of a [site.NAME] section (offsets into SiteConfig). "-1" defaults
 * mean "inherit" (resolved after all sections are read). */
#define SI(field) offsetof(SiteConfig, field)
static const KeySpec site_schema[] = {
    {"site.*", "ranks", KEY_INT, SI(ranks), 0, 1, 1 << 24, 0, NULL, NULL, .help = "ranks (GPUs) of this site", .dflt_words = "required"},
    {"site.*", "learner_ranks", KEY_INT, SI(learner_ranks), 0, 1, 1 << 24, 0, NULL, "-1", .help = "ranks per learner (expert-parallel degree); divides ranks and the learner's experts", .dflt_words = "ranks"},
    {"site.*", "micro_batch", KEY_INT, SI(micro_batch), 0, 1, 1 << 20, 0, NULL, "-1", .help = "sequences per rank per micro-step", .dflt_words = "[train] micro_batch"},
    {"site.*", "grad_accum", KEY_INT, SI(grad_accum), 0, 1, 1 << 20, 0, NULL, "-1", .help = "micro-steps per optimiser step", .dflt_words = "[train] grad_accum"},
    {"site.*", "speed", KEY_REAL, SI(speed), 0, 0, 1e6, 1, NULL, "1", .help = "relative speed of the site's GPUs, for your records (nothing computes with it)"},
    {"site.*", "experts", KEY_STR, SI(experts), sizeof(((SiteConfig *)0)->experts), 0, 0, 0, NULL, "", .help = "split: the experts this site trains, LO-HI (every site's, or none)", .dflt_words = "(empty: by the site's share of the tokens per step)"},
};
#define N_SITE_KEYS (sizeof site_schema / sizeof site_schema[0])

/* Keys of an [eval.NAME] section (offsets into EvalConfig). */
#define EV(field) offsetof(EvalConfig, field)
static const KeySpec eval_schema[] = {
    {"eval.*", "path", KEY_STR, EV(path), sizeof(((EvalConfig *)0)->path), 0, 0, 0, NULL, NULL, .help = "the set's file: raw bytes or an llm.c token shard; relative to data.dir", .dflt_words = "required"},
    {"eval.*", "bytes", KEY_LONG, EV(bytes), 0, 0, (double)LONG_MAX, 0, NULL, "0", .help = "token shard: bytes of text its tokens stand for (bits per byte); 0 for bytes"},
};
#define N_EVAL_KEYS (sizeof eval_schema / sizeof eval_schema[0])

const KeySpec *config_schema_find(const char *section, const char *key)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(schema[i].section, section) && !strcmp(schema[i].key, key)) return &schema[i];
    return NULL;
}

int config_section_known(const char *section)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(schema[i].section, section)) return 1;
    return 0;
}

/* A range bound as the user would write it (LONG_MAX exactly, not rounded). */
static const char *bound_text(char *buf, size_t cap, double v, int integer)
{
    if (integer && v >= (double)LONG_MAX) snprintf(buf, cap, "%ld", LONG_MAX);
    else if (integer) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%g", v);
    return buf;
}

/* "is out of range [lo, hi]" — or, for keys whose -1 means "unset" (the
 * mode decides), the rule without the sentinel */
static int out_of_range(const KeySpec *s, const char *section, const char *where, const char *value)
{
    char lo[32], hi[32];
    const int integer = s->type != KEY_REAL;
    bound_text(lo, sizeof lo, s->min, integer);
    bound_text(hi, sizeof hi, s->max, integer);
    if (s->dflt && !strcmp(s->dflt, "-1") && s->min == -1)
        return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = %s is out of range: at most %s, and not negative "
                         "(leave the key out for the mode's default)", where, section, s->key, value, hi);
    return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = %s is out of range %s%s, %s]", where, section, s->key,
                     value, s->min_exclusive ? "(" : "[", lo, hi);
}

int config_apply_value_in(void *base, const KeySpec *s, const char *section, const char *value,
                          const char *where)
{
    char *field = (char *)base + s->offset;
    char *end;
    errno = 0;
    switch (s->type) {
    case KEY_INT:
    case KEY_LONG: {
        long v = strtol(value, &end, 10);
        if (!*value || *end || (errno && errno != ERANGE))
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = '%s' is not an integer", where,
                             section, s->key, value);
        if (errno == ERANGE || v < s->min || v > s->max) return out_of_range(s, section, where, value);
        if (s->type == KEY_LONG) *(long *)field = v;
        else *(int *)field = (int)v;
        break;
    }
    case KEY_REAL: {
        double v = strtod(value, &end);
        if (errno == ERANGE && fabs(v) < 1.0) errno = 0; /* underflow: a tiny number is still a number */
        if (!*value || *end || (errno && errno != ERANGE) || isnan(v))
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = '%s' is not a number", where,
                             section, s->key, value);
        if (errno == ERANGE || !isfinite(v) || (s->min_exclusive ? v <= s->min : v < s->min) || v > s->max)
            return out_of_range(s, section, where, value);
        *(double *)field = v;
        break;
    }
    case KEY_U64: {
        if (*value == '-')
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = '%s' must be a non-negative integer",
                             where, section, s->key, value);
        unsigned long long v = strtoull(value, &end, 10);
        if (errno == ERANGE)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = %s is out of range [0, %llu]", where, section, s->key,
                             value, (unsigned long long)UINT64_MAX);
        if (!*value || *end || errno)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = '%s' is not an unsigned integer",
                             where, section, s->key, value);
        *(uint64_t *)field = (uint64_t)v;
        break;
    }
    case KEY_STR:
        if (strlen(value) >= s->size)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s is longer than %zu characters", where,
                             section, s->key, s->size - 1);
        strcpy(field, value);
        break;
    case KEY_ENUM: {
        size_t n = strlen(value);
        const char *c = s->choices;
        int found = 0;
        while (*c) {
            const char *bar = strchr(c, '|');
            size_t len = bar ? (size_t)(bar - c) : strlen(c);
            if (len == n && n > 0 && !strncmp(c, value, n)) found = 1;
            c += len + (bar ? 1 : 0);
        }
        if (!found)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s = '%s' is not one of %s", where,
                             section, s->key, value, s->choices);
        strcpy(field, value);
        break;
    }
    }
    return ISTH_OK;
}

int config_apply_value(Config *cfg, const KeySpec *s, const char *value, const char *where)
{
    return config_apply_value_in(cfg, s, s->section, value, where);
}

const KeySpec *config_site_key_find(const char *key)
{
    const KeySpec *spec = NULL;
    for (size_t k = 0; k < N_SITE_KEYS; k++)
        if (!strcmp(site_schema[k].key, key)) spec = &site_schema[k];
    return spec;
}

const KeySpec *config_eval_key_find(const char *key)
{
    const KeySpec *spec = NULL;
    for (size_t k = 0; k < N_EVAL_KEYS; k++)
        if (!strcmp(eval_schema[k].key, key)) spec = &eval_schema[k];
    return spec;
}

int config_apply_defaults(Config *cfg)
{
    for (size_t i = 0; i < N_KEYS; i++) CHECK(config_apply_value(cfg, &schema[i], schema[i].dflt, "(default)"));
    return ISTH_OK;
}

/* --- the resolved text ----------------------------------------------------------------------- */

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return;
        }
        size_t cap2 = (*cap ? *cap * 2 : 1024) + (size_t)n;
        char *b = isth_realloc(*buf, cap2);
        if (!b) return;
        *buf = b;
        *cap = cap2;
    }
}

char *config_to_text(const Config *cfg)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    const char *section = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const KeySpec *s = &schema[i];
        const char *field = (const char *)cfg + s->offset;
        if (strcmp(section, s->section)) {
            append(&buf, &len, &cap, "%s[%s]\n", len ? "\n" : "", s->section);
            section = s->section;
        }
        if (s->type == KEY_LONG) {
            append(&buf, &len, &cap, "%s = %ld\n", s->key, *(const long *)field);
            continue;
        }
        switch (s->type) {
        case KEY_INT: append(&buf, &len, &cap, "%s = %d\n", s->key, *(const int *)field); break;
        case KEY_REAL: {
            /* shortest text that reads back as the same double */
            double v = *(const double *)field;
            char num[40];
            for (int prec = 6; prec <= 17; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, v);
                if (strtod(num, NULL) == v) break;
            }
            append(&buf, &len, &cap, "%s = %s\n", s->key, num);
            break;
        }
        case KEY_U64:
            append(&buf, &len, &cap, "%s = %llu\n", s->key,
                   (unsigned long long)*(const uint64_t *)field);
            break;
        case KEY_STR:
        case KEY_ENUM: append(&buf, &len, &cap, "%s = %s\n", s->key, field); break;
        case KEY_LONG: break; /* handled with KEY_INT */
        }
    }
    for (int i = 0; i < cfg->n_sites; i++) {
        const SiteConfig *st = &cfg->sites[i];
        char num[40];
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(num, sizeof num, "%.*g", prec, st->speed);
            if (strtod(num, NULL) == st->speed) break;
        }
        append(&buf, &len, &cap,
               "\n[site.%s]\nranks = %d\nlearner_ranks = %d\nmicro_batch = %d\ngrad_accum = %d\nspeed = %s\n",
               st->name, st->ranks, st->learner_ranks, st->micro_batch, st->grad_accum, num);
        if (st->experts[0]) append(&buf, &len, &cap, "experts = %s\n", st->experts); /* only when given: old texts stay */
    }
    for (int i = 0; i < cfg->n_evals; i++) /* none written for the implicit prose and tech: old texts stay as they were */
        append(&buf, &len, &cap, "\n[eval.%s]\npath = %s\nbytes = %ld\n", cfg->evals[i].name, cfg->evals[i].path,
               cfg->evals[i].bytes);
    return buf;
}

/* --- config --keys --------------------------------------------------------------------------- */

/* The type column of `config --keys`: "int 1..1024", "real (0, 10]", "enum a|b" ... */
static void key_type_text(const KeySpec *s, char *buf, size_t cap)
{
    char lo[32], hi[32];
    if (s->type_words) {
        snprintf(buf, cap, "%s", s->type_words);
        return;
    }
    switch (s->type) {
    case KEY_INT:
    case KEY_LONG: {
        const char *name = s->type == KEY_LONG ? "long" : "int";
        bound_text(lo, sizeof lo, s->min, 1);
        if (s->max >= (s->type == KEY_LONG ? (double)LONG_MAX : (double)INT_MAX)) /* no bound but the type's */
            snprintf(buf, cap, "%s >= %s", name, lo);
        else
            snprintf(buf, cap, "%s %s..%s", name, lo, bound_text(hi, sizeof hi, s->max, 1));
        break;
    }
    case KEY_REAL:
        snprintf(buf, cap, "real %s%s, %s]", s->min_exclusive ? "(" : "[", bound_text(lo, sizeof lo, s->min, 0),
                 bound_text(hi, sizeof hi, s->max, 0));
        break;
    case KEY_U64: snprintf(buf, cap, "u64"); break;
    case KEY_STR: snprintf(buf, cap, "string"); break;
    case KEY_ENUM: snprintf(buf, cap, "enum %s", s->choices); break;
    }
}

static const char *key_default_text(const KeySpec *s)
{
    return s->dflt_words ? s->dflt_words : s->dflt && *s->dflt ? s->dflt : "(empty)";
}

/* One line per key: "[section] key", its type, "default X" and its meaning,
 * columns separated by at least two spaces (no field holds two in a row). */
void config_print_keys(void)
{
    const KeySpec *all[N_KEYS + N_SITE_KEYS + N_EVAL_KEYS];
    size_t n = 0;
    for (size_t i = 0; i < N_KEYS; i++) all[n++] = &schema[i];
    for (size_t i = 0; i < N_SITE_KEYS; i++) all[n++] = &site_schema[i];
    for (size_t i = 0; i < N_EVAL_KEYS; i++) all[n++] = &eval_schema[i];
    int w_name = 0, w_type = 0, w_dflt = 0;
    char type[128], name[128];
    for (size_t i = 0; i < n; i++) {
        const int len_name = snprintf(name, sizeof name, "[%s] %s", all[i]->section, all[i]->key);
        key_type_text(all[i], type, sizeof type);
        const int len_type = (int)strlen(type), len_dflt = (int)strlen(key_default_text(all[i]));
        if (len_name > w_name) w_name = len_name;
        if (len_type > w_type) w_type = len_type;
        if (len_dflt > w_dflt && len_dflt <= 12) w_dflt = len_dflt; /* longer ones overflow their column */
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "[%s] %s", all[i]->section, all[i]->key);
        key_type_text(all[i], type, sizeof type);
        printf("%-*s  %-*s  default %-*s  %s\n", w_name, name, w_type, type, w_dflt, key_default_text(all[i]),
               all[i]->help);
    }
}
