/* config.c — see config.h. */
#include "config.h"
#include "alloc.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status.h"
#include "wire.h"

#ifndef ISTHMUS_DATADIR
#define ISTHMUS_DATADIR "share/data"
#endif

typedef enum { KEY_INT, KEY_LONG, KEY_REAL, KEY_U64, KEY_STR, KEY_ENUM } KeyType;

typedef struct {
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
} KeySpec;

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
    {"site.*", "learner_ranks", KEY_INT, SI(learner_ranks), 0, 1, 1 << 24, 0, NULL, "-1", .help = "ranks per learner (expert-parallel degree); divides ranks and [model] experts", .dflt_words = "ranks"},
    {"site.*", "micro_batch", KEY_INT, SI(micro_batch), 0, 1, 1 << 20, 0, NULL, "-1", .help = "sequences per rank per micro-step", .dflt_words = "[train] micro_batch"},
    {"site.*", "grad_accum", KEY_INT, SI(grad_accum), 0, 1, 1 << 20, 0, NULL, "-1", .help = "micro-steps per optimiser step", .dflt_words = "[train] grad_accum"},
    {"site.*", "speed", KEY_REAL, SI(speed), 0, 0, 1e6, 1, NULL, "1", .help = "relative speed of the site's GPUs, for your records (nothing computes with it)"},
};
#define N_SITE_KEYS (sizeof site_schema / sizeof site_schema[0])

/* Keys of an [eval.NAME] section (offsets into EvalConfig). */
#define EV(field) offsetof(EvalConfig, field)
static const KeySpec eval_schema[] = {
    {"eval.*", "path", KEY_STR, EV(path), sizeof(((EvalConfig *)0)->path), 0, 0, 0, NULL, NULL, .help = "the set's file: raw bytes or an llm.c token shard; relative to data.dir", .dflt_words = "required"},
    {"eval.*", "bytes", KEY_LONG, EV(bytes), 0, 0, (double)LONG_MAX, 0, NULL, "0", .help = "token shard: bytes of text its tokens stand for (bits per byte); 0 for bytes"},
};
#define N_EVAL_KEYS (sizeof eval_schema / sizeof eval_schema[0])

typedef struct {
    char *section, *key, *value;
    char origin[CONFIG_PATH_MAX + 32];
} Entry;

typedef struct {
    Entry *v;
    int n, cap;
} EntryList;

static void entries_free(EntryList *l)
{
    for (int i = 0; i < l->n; i++) {
        isth_free(l->v[i].section);
        isth_free(l->v[i].key);
        isth_free(l->v[i].value);
    }
    isth_free(l->v);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static Entry *entries_find(EntryList *l, const char *section, const char *key)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].section, section) && !strcmp(l->v[i].key, key)) return &l->v[i];
    return NULL;
}

static int entries_put(EntryList *l, const char *section, const char *key, const char *value,
                       const char *origin, int allow_replace)
{
    Entry *e = entries_find(l, section, key);
    if (e) {
        if (!allow_replace)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s is set twice (first at %s)", origin,
                             section, key, e->origin);
        isth_free(e->value);
        e->value = strdup(value);
        snprintf(e->origin, sizeof e->origin, "%s", origin);
        return e->value ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "out of memory");
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        Entry *v = isth_realloc(l->v, (size_t)cap * sizeof *v);
        CHECK_ALLOC(v);
        l->v = v;
        l->cap = cap;
    }
    e = &l->v[l->n++];
    e->section = strdup(section);
    e->key = strdup(key);
    e->value = strdup(value);
    snprintf(e->origin, sizeof e->origin, "%s", origin);
    if (!e->section || !e->key || !e->value) return isth_fail(ISTH_ERUNTIME, "out of memory");
    return ISTH_OK;
}

static int valid_name(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.' && *s != '-') return 0;
    return 1;
}

static int parse_ini(EntryList *l, const char *text, const char *name)
{
    char section[256] = "";
    int lineno = 0;
    const char *p = text;
    if (!strncmp(p, "\xEF\xBB\xBF", 3)) p += 3; /* a UTF-8 byte-order mark, as some editors write */
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char buf[4096];
        lineno++;
        if (len >= sizeof buf)
            return isth_fail(ISTH_EINPUT, "config %s:%d: line too long", name, lineno);
        memcpy(buf, p, len);
        buf[len] = '\0';
        p = nl ? nl + 1 : p + len;

        char *hash = strpbrk(buf, "#;");
        if (hash) *hash = '\0';
        char *line = trim(buf);
        if (!*line) continue;
        char origin[CONFIG_PATH_MAX + 32];
        snprintf(origin, sizeof origin, "%s:%d", name, lineno);
        if (*line == '[') {
            char *close = strchr(line, ']');
            if (!close || close[1] != '\0')
                return isth_fail(ISTH_EINPUT, "config %s: malformed section header '%s'", origin, line);
            *close = '\0';
            char *s = trim(line + 1);
            if (!valid_name(s) || strlen(s) >= sizeof section)
                return isth_fail(ISTH_EINPUT, "config %s: bad section name '[%s]'", origin, s);
            strcpy(section, s);
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq)
            return isth_fail(ISTH_EINPUT, "config %s: expected 'key = value', got '%s'", origin, line);
        *eq = '\0';
        char *key = trim(line), *value = trim(eq + 1);
        if (!*section)
            return isth_fail(ISTH_EINPUT, "config %s: key '%s' outside any [section]", origin, key);
        if (!valid_name(key))
            return isth_fail(ISTH_EINPUT, "config %s: bad key name '%s'", origin, key);
        CHECK(entries_put(l, section, key, value, origin, 0));
    }
    return ISTH_OK;
}

static int parse_override(EntryList *l, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    char lhs[512];
    if (!eq || (size_t)(eq - assignment) >= sizeof lhs)
        return isth_fail(ISTH_EINPUT, "--set '%s': expected section.key=value", assignment);
    memcpy(lhs, assignment, (size_t)(eq - assignment));
    lhs[eq - assignment] = '\0';
    char *dot = strrchr(lhs, '.');
    if (!dot || dot == lhs || !dot[1])
        return isth_fail(ISTH_EINPUT, "--set '%s': expected section.key=value", assignment);
    *dot = '\0';
    char *section = trim(lhs), *key = trim(dot + 1);
    if (!valid_name(section) || !valid_name(key))
        return isth_fail(ISTH_EINPUT, "--set '%s': bad section or key name", assignment);
    char value[4096];
    snprintf(value, sizeof value, "%s", eq + 1);
    char origin[600];
    snprintf(origin, sizeof origin, "--set %s.%s", section, key);
    return entries_put(l, section, key, trim(value), origin, 1);
}

static const KeySpec *schema_find(const char *section, const char *key)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(schema[i].section, section) && !strcmp(schema[i].key, key)) return &schema[i];
    return NULL;
}

static int section_known(const char *section)
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

/* Parse one value into the struct at `base` according to its spec; `where`
 * names the origin and `section` the section as the user wrote it. */
static int apply_value_in(void *base, const KeySpec *s, const char *section, const char *value,
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

static int apply_value(Config *cfg, const KeySpec *s, const char *value, const char *where)
{
    return apply_value_in(cfg, s, s->section, value, where);
}

/* Rules that involve several keys. `origin_of` finds where a key was set so
 * that the message points at the line to fix. */
static const char *origin_of(EntryList *l, const char *section, const char *key)
{
    Entry *e = entries_find(l, section, key);
    return e ? e->origin : "(default)";
}

static int validate(const Config *c, EntryList *l)
{
    const ModelConfig *m = &c->model;
    if (m->dim % m->heads)
        return isth_fail(ISTH_EINPUT, "config %s: [model] heads = %d does not divide dim = %d",
                         origin_of(l, "model", "heads"), m->heads, m->dim);
    if (config_head_dim(m) % 2)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [model] head dim = dim/heads = %d must be even (rotary pairs)",
                         origin_of(l, "model", "heads"), config_head_dim(m));
    if (m->top_k > m->experts)
        return isth_fail(ISTH_EINPUT, "config %s: [model] top_k = %d exceeds experts = %d",
                         origin_of(l, "model", "top_k"), m->top_k, m->experts);
    if (c->train.min_lr > c->train.lr)
        return isth_fail(ISTH_EINPUT, "config %s: [train] min_lr = %g exceeds lr = %g",
                         origin_of(l, "train", "min_lr"), c->train.min_lr, c->train.lr);
    if (!strcmp(c->train.optimizer, "shampoo") &&
        (m->dim % c->train.precond_block || m->ffn % c->train.precond_block))
        return isth_fail(ISTH_EINPUT,
                         "config %s: [train] precond_block = %d must divide [model] dim = %d and ffn = %d "
                         "(Shampoo's blocks tile every matrix)", origin_of(l, "train", "precond_block"),
                         c->train.precond_block, m->dim, m->ffn);
    if (!strcmp(c->train.optimizer, "shampoo") && c->train.precond_stats_every > c->train.precond_every)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [train] precond_stats_every = %d exceeds precond_every = %d (every root needs "
                         "statistics newer than the last)", origin_of(l, "train", "precond_stats_every"),
                         c->train.precond_stats_every, c->train.precond_every);
    if (!c->train.out_dir[0])
        return isth_fail(ISTH_EINPUT, "config %s: [train] out_dir is empty",
                         origin_of(l, "train", "out_dir"));
    return ISTH_OK;
}

static SiteConfig *site_get(Config *cfg, const char *name, const char *origin, int *rc)
{
    for (int i = 0; i < cfg->n_sites; i++)
        if (!strcmp(cfg->sites[i].name, name)) return &cfg->sites[i];
    *rc = ISTH_OK;
    if (strlen(name) >= CONFIG_NAME_MAX || !*name) {
        *rc = isth_fail(ISTH_EINPUT, "config %s: site name '%s' is empty or longer than %d characters",
                        origin, name, CONFIG_NAME_MAX - 1);
        return NULL;
    }
    /* a site name becomes a directory name (checkpoints): no '/', '.', '..' */
    if (strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(name)) {
        *rc = isth_fail(ISTH_EINPUT, "config %s: site name '%s' may only hold letters, digits, '_' and '-'", origin,
                        name);
        return NULL;
    }
    if (cfg->n_sites == CONFIG_MAX_SITES) {
        *rc = isth_fail(ISTH_EINPUT, "config %s: more than %d [site.*] sections", origin, CONFIG_MAX_SITES);
        return NULL;
    }
    SiteConfig *site = &cfg->sites[cfg->n_sites++];
    memset(site, 0, sizeof *site);
    strcpy(site->name, name);
    site->learner_ranks = site->micro_batch = site->grad_accum = -1; /* inherit */
    site->speed = 1.0;
    return site;
}

static int apply_eval_key(Config *cfg, const Entry *e)
{
    const char *name = e->section + 5;
    const KeySpec *spec = NULL;
    for (size_t k = 0; k < N_EVAL_KEYS; k++)
        if (!strcmp(eval_schema[k].key, e->key)) spec = &eval_schema[k];
    if (!spec)
        return isth_fail(ISTH_EINPUT, "config %s: unknown key '%s' in [%s] (eval keys: path bytes)", e->origin, e->key,
                         e->section);
    EvalConfig *ev = NULL;
    for (int i = 0; i < cfg->n_evals; i++)
        if (!strcmp(cfg->evals[i].name, name)) ev = &cfg->evals[i];
    if (!ev) {
        /* a name becomes a metrics field and a plot's title: letters, digits, '_' and '-' */
        if (!*name || strlen(name) >= CONFIG_NAME_MAX ||
            strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(name))
            return isth_fail(ISTH_EINPUT, "config %s: eval set name '%s': 1 to %d letters, digits, '_' or '-'",
                             e->origin, name, CONFIG_NAME_MAX - 1);
        if (cfg->n_evals == CONFIG_MAX_EVALS)
            return isth_fail(ISTH_EINPUT, "config %s: more than %d [eval.*] sections", e->origin, CONFIG_MAX_EVALS);
        ev = &cfg->evals[cfg->n_evals++];
        memset(ev, 0, sizeof *ev);
        snprintf(ev->name, sizeof ev->name, "%s", name);
    }
    return apply_value_in(ev, spec, e->section, e->value, e->origin);
}

int config_eval_sets(const Config *cfg, EvalConfig out[CONFIG_MAX_EVALS])
{
    if (cfg->n_evals) {
        memcpy(out, cfg->evals, sizeof *out * (size_t)cfg->n_evals);
        return cfg->n_evals;
    }
    const char *names[2] = {"prose", "tech"}, *files[2] = {"eval_prose.txt", "eval_tech.txt"};
    for (int i = 0; i < 2; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", names[i]);
        snprintf(out[i].path, sizeof out[i].path, "%s", files[i]);
    }
    return 2;
}

static int apply_site_key(Config *cfg, const Entry *e)
{
    int rc = ISTH_OK;
    const char *name = e->section + 5;
    const KeySpec *spec = NULL;
    for (size_t k = 0; k < N_SITE_KEYS; k++)
        if (!strcmp(site_schema[k].key, e->key)) spec = &site_schema[k];
    if (!spec)
        return isth_fail(ISTH_EINPUT, "config %s: unknown key '%s' in [%s] (site keys: ranks "
                         "learner_ranks micro_batch grad_accum speed)", e->origin, e->key, e->section);
    SiteConfig *site = site_get(cfg, name, e->origin, &rc);
    if (!site) return rc;
    return apply_value_in(site, spec, e->section, e->value, e->origin);
}

/* [outer] values whose default depends on the mode, and rules between keys. */
static int validate_outer(Config *cfg, EntryList *l)
{
    OuterConfig *o = &cfg->outer;
    const int streaming = !strcmp(o->mode, "streaming"), butterfly = !strcmp(o->mode, "butterfly");
    o->mode_id = streaming ? MODE_STREAMING : butterfly ? MODE_BUTTERFLY : !strcmp(o->mode, "diloco") ? MODE_DILOCO
                                                                                                   : MODE_SYNC;
    /* topk (SparseLoCo): the decaying error-feedback buffer carries past
     * pseudo-gradients forward, so plain averaging (lr 1, no momentum) and
     * a decay of 0.95; outer momentum on top of it lost (docs/results/sparse-payloads.md) */
    const int topk = !strcmp(o->codec, "topk");
    if (o->lr < 0) {
        if (entries_find(l, "outer", "lr"))
            return isth_fail(ISTH_EINPUT, "config %s: [outer] lr = %g must be > 0", origin_of(l, "outer", "lr"), o->lr);
        o->lr = topk ? 1.0 : streaming ? 0.4 : !strcmp(o->mode, "diloco") ? 0.7 : 1.0;
    } else if (o->lr == 0) {
        return isth_fail(ISTH_EINPUT, "config %s: [outer] lr = 0 must be > 0", origin_of(l, "outer", "lr"));
    }
    if (o->momentum < 0) {
        if (entries_find(l, "outer", "momentum"))
            return isth_fail(ISTH_EINPUT, "config %s: [outer] momentum = %g must be in [0, 1)",
                             origin_of(l, "outer", "momentum"), o->momentum);
        o->momentum = butterfly || topk ? 0.0 : 0.9; /* butterfly: plain pairwise averaging unless asked */
    }
    if (o->ef_decay < 0) {
        if (entries_find(l, "outer", "ef_decay"))
            return isth_fail(ISTH_EINPUT, "config %s: [outer] ef_decay = %g must be in [0, 1]",
                             origin_of(l, "outer", "ef_decay"), o->ef_decay);
        o->ef_decay = topk ? 0.95 : 1.0;
    }
    if (cfg->data.eval_bytes == 1)
        return isth_fail(ISTH_EINPUT, "config %s: [data] eval_bytes = 1 leaves no byte to predict; use 0 (whole "
                         "files) or at least 2", origin_of(l, "data", "eval_bytes"));
    if (o->fragments == 0 && entries_find(l, "outer", "fragments"))
        return isth_fail(ISTH_EINPUT, "config %s: [outer] fragments = 0: at least 1 (leave the key out for the "
                         "mode's default)", origin_of(l, "outer", "fragments"));
    if (o->fragments == 0) o->fragments = streaming ? cfg->model.layers : 1;
    if (!streaming && !butterfly && o->fragments != 1)
        return isth_fail(ISTH_EINPUT, "config %s: [outer] fragments = %d needs mode = streaming or butterfly (mode is %s)",
                         origin_of(l, "outer", "fragments"), o->fragments, o->mode);
    if (butterfly && o->overlap >= o->inner_steps)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] overlap = %d must be less than inner_steps = %d (a round must finish "
                         "before the next one starts)",
                         origin_of(l, "outer", "overlap"), o->overlap, o->inner_steps);
    if (o->fragments > cfg->model.layers)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] fragments = %d exceeds [model] layers = %d (fragments are strided over layers)",
                         origin_of(l, "outer", "fragments"), o->fragments, cfg->model.layers);
    if (streaming && o->overlap >= o->inner_steps)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] overlap = %d must be less than inner_steps = %d (an exchange must "
                         "finish before the fragment's next one starts)",
                         origin_of(l, "outer", "overlap"), o->overlap, o->inner_steps);
    if (!strcmp(o->codec, "topk") && o->topk_k > o->topk_chunk)
        return isth_fail(ISTH_EINPUT, "config %s: [outer] topk_k = %d exceeds topk_chunk = %d (values sent per chunk)",
                         origin_of(l, "outer", "topk_k"), o->topk_k, o->topk_chunk);
    if (!strcmp(o->codec, "topk") && butterfly)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] codec = topk needs mode = diloco, streaming or sync (butterfly sends "
                         "parameter values, which a sparse payload cannot carry; use bf16, int8 or fp4)",
                         origin_of(l, "outer", "codec"));
    if (streaming && o->fragments > o->inner_steps)
        return isth_fail(ISTH_EINPUT, "config %s: [outer] fragments = %d exceeds inner_steps = %d (offsets would collide)",
                         origin_of(l, "outer", "fragments"), o->fragments, o->inner_steps);
    int lo, hi;
    if (wire_parse_ports(o->ports, &lo, &hi))
        return isth_fail(ISTH_EINPUT, "config %s: [outer] ports = %s: give 0 (any free port), a port, or a range "
                         "LO-HI within 1-65535", origin_of(l, "outer", "ports"), o->ports);
    return ISTH_OK;
}

static int validate_sites(Config *cfg, EntryList *l)
{
    for (int i = 0; i < cfg->n_sites; i++) {
        SiteConfig *s = &cfg->sites[i];
        char section[CONFIG_NAME_MAX + 8];
        snprintf(section, sizeof section, "site.%s", s->name);
        if (s->ranks <= 0)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] ranks is required", cfg->source, section);
        if (s->learner_ranks < 0) s->learner_ranks = s->ranks;
        if (s->micro_batch < 0) s->micro_batch = cfg->train.micro_batch;
        if (s->grad_accum < 0) s->grad_accum = cfg->train.grad_accum;
        if (s->ranks % s->learner_ranks)
            return isth_fail(ISTH_EINPUT,
                             "config %s: [%s] learner_ranks = %d does not divide ranks = %d",
                             origin_of(l, section, "learner_ranks"), section, s->learner_ranks, s->ranks);
        if (cfg->model.experts % s->learner_ranks)
            return isth_fail(ISTH_EINPUT,
                             "config %s: [%s] learner_ranks = %d does not divide [model] experts = %d "
                             "(experts are sharded evenly over a learner's ranks)",
                             origin_of(l, section, "learner_ranks"), section, s->learner_ranks,
                             cfg->model.experts);
    }
    return ISTH_OK;
}

static int load_entries(Config *cfg, EntryList *l, const char *const *overrides, int n_overrides)
{
    for (int i = 0; i < n_overrides; i++) CHECK(parse_override(l, overrides[i]));

    memset(&cfg->model, 0, sizeof cfg->model);
    memset(&cfg->train, 0, sizeof cfg->train);
    memset(&cfg->data, 0, sizeof cfg->data);
    memset(&cfg->outer, 0, sizeof cfg->outer);
    memset(&cfg->checkpoint, 0, sizeof cfg->checkpoint);
    cfg->n_sites = 0;
    cfg->n_evals = 0;
    for (size_t i = 0; i < N_KEYS; i++) CHECK(apply_value(cfg, &schema[i], schema[i].dflt, "(default)"));

    for (int i = 0; i < l->n; i++) {
        Entry *e = &l->v[i];
        const KeySpec *s = schema_find(e->section, e->key);
        if (s) {
            CHECK(apply_value(cfg, s, e->value, e->origin));
            continue;
        }
        if (!strncmp(e->section, "site.", 5)) {
            CHECK(apply_site_key(cfg, e));
            continue;
        }
        if (!strncmp(e->section, "eval.", 5)) {
            CHECK(apply_eval_key(cfg, e));
            continue;
        }
        if (!section_known(e->section))
            return isth_fail(ISTH_EINPUT, "config %s: unknown section [%s]", e->origin, e->section);
        return isth_fail(ISTH_EINPUT, "config %s: unknown key '%s' in [%s]", e->origin, e->key,
                         e->section);
    }
    CHECK(validate(cfg, l));
    CHECK(validate_outer(cfg, l));
    for (int i = 0; i < cfg->n_evals; i++)
        if (!cfg->evals[i].path[0])
            return isth_fail(ISTH_EINPUT, "config %s: [eval.%s] path is required", cfg->source, cfg->evals[i].name);
    return validate_sites(cfg, l);
}

CodecParams config_codec_params(const OuterConfig *o)
{
    const int topk = !strcmp(o->codec, "topk");
    return (CodecParams){topk ? o->topk_chunk : o->codec_block, o->topk_k, o->topk_bits, (float)o->ef_decay};
}

int config_load_text(Config *cfg, const char *text, const char *origin,
                     const char *const *overrides, int n_overrides)
{
    EntryList l = {0};
    snprintf(cfg->source, sizeof cfg->source, "%s", origin);
    int rc = text ? parse_ini(&l, text, origin) : ISTH_OK;
    if (rc == ISTH_OK) rc = load_entries(cfg, &l, overrides, n_overrides);
    entries_free(&l);
    return rc;
}

int config_load(Config *cfg, const char *path, const char *const *overrides, int n_overrides)
{
    if (!path) return config_load_text(cfg, NULL, "(defaults)", overrides, n_overrides);
    /* O_NONBLOCK: a FIFO must not block the open; only regular files are read */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return isth_fail(ISTH_EINPUT, "config %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "config %s: not a regular file", path);
    }
    if (st.st_size > (1 << 24)) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "config %s: %lld bytes, larger than 16 MiB (not a config file)", path,
                         (long long)st.st_size);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "config %s: cannot open: %s", path, strerror(errno));
    }
    const long size = (long)st.st_size;
    char *text = isth_malloc((size_t)size + 1);
    if (!text) {
        fclose(f);
        return isth_fail(ISTH_ERUNTIME, "out of memory reading %s", path);
    }
    size_t got = fread(text, 1, (size_t)size, f);
    fclose(f);
    text[got] = '\0';
    if (memchr(text, '\0', got)) {
        isth_free(text);
        return isth_fail(ISTH_EINPUT, "config %s: contains a NUL byte (not an INI text file)", path);
    }
    int rc = config_load_text(cfg, text, path, overrides, n_overrides);
    isth_free(text);
    return rc;
}

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
    }
    for (int i = 0; i < cfg->n_evals; i++) /* none written for the implicit prose and tech: old texts stay as they were */
        append(&buf, &len, &cap, "\n[eval.%s]\npath = %s\nbytes = %ld\n", cfg->evals[i].name, cfg->evals[i].path,
               cfg->evals[i].bytes);
    return buf;
}

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

Recompute config_recompute(const TrainConfig *t)
{
    if (!strcmp(t->recompute, "layer")) return RECOMPUTE_LAYER;
    return strcmp(t->recompute, "attention") ? RECOMPUTE_NONE : RECOMPUTE_ATTENTION;
}
