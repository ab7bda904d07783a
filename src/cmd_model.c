/* cmd_model.c — the commands that use a trained model file: `isthmus
 * eval` (bits per byte on the eval sets, over all ranks of the job),
 * `isthmus tune-router` (the router alone trained over every expert),
 * `isthmus generate` (sampling, one process) and `isthmus export`
 * (safetensors for PyTorch, over the ranks of the job, each its share of
 * the experts).
 *
 * Owns: their --help texts and options, the --set keys evaluation may
 * change, and the order of their steps (file, backend, tokenizer, output).
 * Must not: read the model file (modelfile.c), compute, or write a file
 * format (export.c).
 */
#include "cmd_model.h"

#include "cli.h"

#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "alloc.h"
#include "backend.h"
#include "backend_choose.h"
#include "clock.h"
#include "coll.h"
#include "config.h"
#include "decoder.h"
#include "eval.h"
#include "export.h"
#include "federation.h"
#include "metrics.h"
#include "modelfile.h"
#include "router_tune.h"
#include "sample.h"
#include "status.h"
#include "tokenizer.h"

static const char *const usage_eval =
    "usage: isthmus eval --model FILE [--set section.key=value]...\n"
    "\n"
    "Computes bits per byte (and loss per token) of the model in FILE (written by\n"
    "'isthmus train') on its eval sets ([eval.NAME] sections, or data.dir's\n"
    "eval_prose.txt and eval_tech.txt): consecutive windows of context+1 tokens\n"
    "overlapping by one, no token dropping. The model's stored configuration is\n"
    "used; results are appended to [train] out_dir's metrics.jsonl. Unless --set\n"
    "says otherwise it runs on the best backend here (train.backend = auto) in fp32.\n"
    "--set may change only these keys:\n";
static const char *const usage_eval_tail =
    "Exit status: 0 success, 1 runtime failure, 2 bad file or configuration.\n";
/* What --set may change for evaluation, the help and the refusal both
 * printed from here; "eval.NAME.*": any key of an [eval.NAME] section. */
static const char *const eval_keys[] = {"data.dir", "data.eval_bytes", "eval.NAME.path", "eval.NAME.bytes",
                                        "train.micro_batch", "train.threads", "train.out_dir", "train.backend",
                                        "train.precision", "train.gpu_share"};
#define N_EVAL_KEYS ((int)(sizeof eval_keys / sizeof *eval_keys))

static int eval_key_allowed(const char *assignment)
{
    if (!strncmp(assignment, "eval.", 5)) return 1; /* the sets to evaluate on */
    for (int k = 0; k < N_EVAL_KEYS; k++) {
        const size_t n = strlen(eval_keys[k]);
        if (strncmp(eval_keys[k], "eval.", 5) && !strncmp(assignment, eval_keys[k], n) && assignment[n] == '=')
            return 1;
    }
    return 0;
}

/* The keys, separated by `sep`, into buf. */
static void eval_keys_list(char *buf, size_t cap, const char *sep)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int k = 0; k < N_EVAL_KEYS && o < cap; k++) {
        const int n = snprintf(buf + o, cap - o, "%s%s", k ? sep : "", eval_keys[k]);
        if (n < 0) break;
        o += (size_t)n;
    }
}

/* The model file's config (with --set) for a job whose ranks form one
 * learner, the experts sharded over them (eval, tune-router): *rank, *size;
 * a rank count that does not divide the experts is bad input. */
static int model_job(const char *cmd, const char *path, const char *const *overrides, int n_over, Config *cfg,
                     char *origin, size_t origin_size, int *rank, int *size)
{
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    CHECK(modelfile_config(path, overrides, n_over, cfg, origin, origin_size, MPI_COMM_WORLD));
    if (cfg->model.experts % *size)
        return isth_fail(ISTH_EINPUT, "%s: %d ranks cannot share %d experts evenly; use a rank count that divides it",
                         cmd, *size, cfg->model.experts);
    return ISTH_OK;
}

int cmd_eval(int argc, char **argv)
{
    char keys[512];
    if (cli_wants_help(argc, argv)) {
        eval_keys_list(keys, sizeof keys, "\n  ");
        printf("%s  %s\n%s", usage_eval, keys, usage_eval_tail);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL;
    const CliOption opts[] = {{"--model", 1, &model_path}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 1));
    if (!model_path && n_pos == 1) model_path = pos[0];
    else if (n_pos) return isth_fail(ISTH_EINPUT, "eval: unexpected argument '%s'", pos[0]);
    if (!model_path) return isth_fail(ISTH_EINPUT, "eval: missing --model FILE (see isthmus eval --help)");
    for (int i = 0; i < n_over; i++)
        if (!eval_key_allowed(overrides[i])) {
            eval_keys_list(keys, sizeof keys, ", ");
            return isth_fail(ISTH_EINPUT, "eval: --set %s: only %s can change for evaluation", overrides[i], keys);
        }
    int rank, size;
    Config cfg;
    char origin[CONFIG_FILE_PATH_MAX + 64];
    /* evaluation ignores the training layout: all ranks of this job form one
     * learner, experts sharded over them */
    CHECK(model_job("eval", model_path, overrides, n_over, &cfg, origin, sizeof origin, &rank, &size));
    /* the machine that evaluates need not be the one that trained: unless
     * --set says otherwise, the best backend here, in fp32 */
    int chose_backend = 0, chose_precision = 0;
    for (int i = 0; i < n_over; i++) {
        chose_backend |= !strncmp(overrides[i], "train.backend=", 14);
        chose_precision |= !strncmp(overrides[i], "train.precision=", 16);
    }
    if (!chose_backend) snprintf(cfg.train.backend, sizeof cfg.train.backend, "auto");
    if (!chose_precision) snprintf(cfg.train.precision, sizeof cfg.train.precision, "fp32");
    Coll ep;
    CHECK(coll_init(&ep, MPI_COMM_WORLD));
    Backend *be = NULL;
    EvalSet sets[CONFIG_MAX_EVALS];
    int n_sets = 0;
    Metrics mt = {0};
    const int El = cfg.model.experts / size;
    CHECK(backend_create(&be, &cfg, cfg.train.micro_batch, rank * El, El, &ep));
    H5Meta meta;
    int rc = modelfile_read_backend(model_path, be, &meta, MPI_COMM_WORLD);
    /* the bundled sets are bytes: a model of another vocabulary names its own */
    if (rc == ISTH_OK && !cfg.n_evals && cfg.model.vocab != 256)
        rc = isth_fail(ISTH_EINPUT, "eval: %s has a vocabulary of %d, not bytes: name its eval sets "
                       "(--set eval.NAME.path=FILE --set eval.NAME.bytes=N)", model_path, cfg.model.vocab);
    /* the sets must be of the data the model was trained on (its file records the kind) */
    if (rc == ISTH_OK) rc = eval_sets_open(sets, &n_sets, &cfg, meta.data_width);
    if (rc == ISTH_OK && rank == 0) {
        char run_id[CONFIG_PATH_MAX];
        federation_run_id(&cfg, run_id, sizeof run_id);
        const MetricsStart st = {"eval", origin, (unsigned long long)federation_fingerprint(&cfg), run_id, NULL, size, -1};
        rc = metrics_open(&mt, cfg.train.out_dir, &st);
    }
    if (rc == ISTH_OK && rank == 0)
        printf("isthmus eval: %s (step %ld, %.0f tokens trained)\n", model_path, meta.step, meta.tokens);
    for (int i = 0; i < n_sets && rc == ISTH_OK; i++) {
        EvalResult r;
        rc = eval_set(be, &ep, cfg.train.micro_batch, cfg.model.context, &sets[i], (size_t)cfg.data.eval_bytes,
                      cfg.model.vocab, &r);
        if (rc == ISTH_OK && rank == 0)
            rc = metrics_eval(&mt, sets[i].cfg.name, sets[i].file.width == 1, meta.step, r.bpb, r.loss, r.predicted,
                              r.bytes, r.seconds, meta.experts_whole ? "whole" : NULL);
    }
    const int closed = metrics_close(&mt);
    if (rc == ISTH_OK) rc = closed;
    backend_destroy(be);
    eval_sets_close(sets, n_sets);
    return rc;
}

static const char *const usage_tune_router =
    "usage: isthmus tune-router --model FILE -o OUT --steps N [--lr LR] [--all] [--set section.key=value]...\n"
    "\n"
    "Trains only the router of the model in FILE for N steps, every expert routed and\n"
    "every other weight frozen, on its training data (the windows of the steps after\n"
    "the model's own, [train] seed), then writes the model to OUT (never over FILE).\n"
    "For a split run's whole model ([outer] experts = split), whose sites' router\n"
    "halves were each trained over their own experts only: [outer] router_steps does\n"
    "the same at the end of training. The inner optimiser of the model's config, its\n"
    "moments from zero, at LR (default [train] lr) after a warm-up of N / 10\n"
    "steps; the ranks of the job share the experts as in isthmus eval. --all trains\n"
    "every weight instead (a joint phase of the whole model).\n"
    "--set may change the keys isthmus eval allows and data.train, train.seed.\n"
    "Exit status: 0 success, 1 runtime failure, 2 bad file or configuration.\n";

int cmd_tune_router(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("%s", usage_tune_router);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL, *out_path = NULL, *steps_text = NULL, *lr_text = NULL, *all = NULL;
    const CliOption opts[] = {{"--model", 1, &model_path}, {"-o", 1, &out_path}, {"--steps", 1, &steps_text},
                              {"--lr", 1, &lr_text}, {"--all", 0, &all}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 0, &n_pos, opts, sizeof opts / sizeof *opts));
    if (!model_path) return isth_fail(ISTH_EINPUT, "tune-router: missing --model FILE (see isthmus tune-router --help)");
    if (!out_path) return isth_fail(ISTH_EINPUT, "tune-router: missing -o OUT (the tuned model's file)");
    if (!steps_text) return isth_fail(ISTH_EINPUT, "tune-router: missing --steps N");
    if (!strcmp(out_path, model_path))
        return isth_fail(ISTH_EINPUT, "tune-router: -o %s is the model itself: write the tuned model elsewhere", out_path);
    double steps, lr = -1.0;
    CHECK(cli_number("--steps", steps_text, 1, 1 << 30, 1, &steps));
    if (lr_text) CHECK(cli_number("--lr", lr_text, 1e-12, 10, 0, &lr));
    for (int i = 0; i < n_over; i++)
        if (!eval_key_allowed(overrides[i]) && strncmp(overrides[i], "data.train=", 11) &&
            strncmp(overrides[i], "train.seed=", 11)) {
            char keys[512];
            eval_keys_list(keys, sizeof keys, ", ");
            return isth_fail(ISTH_EINPUT, "tune-router: --set %s: only %s, data.train, train.seed can change",
                             overrides[i], keys);
        }
    int rank, size;
    Config cfg;
    char origin[CONFIG_FILE_PATH_MAX + 64];
    CHECK(model_job("tune-router", model_path, overrides, n_over, &cfg, origin, sizeof origin, &rank, &size));
    if (lr < 0) lr = cfg.train.lr;
    char *config_text = NULL;
    CHECK(h5model_read_config(model_path, &config_text, NULL, MPI_COMM_WORLD));
    Coll ep;
    CHECK(coll_init(&ep, MPI_COMM_WORLD));
    Backend *be = NULL;
    Dataset d = {0};
    const int El = cfg.model.experts / size, B = cfg.train.micro_batch;
    int rc = backend_create(&be, &cfg, B, rank * El, El, &ep);
    H5Meta meta;
    if (rc == ISTH_OK) rc = modelfile_read_backend(model_path, be, &meta, MPI_COMM_WORLD);
    if (rc == ISTH_OK) rc = dataset_open(&d, cfg.data.train, cfg.data.dir, cfg.model.context);
    if (rc == ISTH_OK) rc = dataset_check_kind(&d, cfg.model.vocab);
    RouterTuneReport rep;
    if (rc == ISTH_OK) { /* the windows of the steps after the model's own */
        DataCursor cur = {cfg.train.seed, (uint64_t)meta.step};
        rc = router_tune(be, &ep, &cfg, &d, &cur, 0, B, (int)steps, lr, all != NULL, &rep);
    }
    if (rc == ISTH_OK) rc = modelfile_write_backend(out_path, be, config_text, &meta, MPI_COMM_WORLD);
    if (rc == ISTH_OK && rank == 0)
        printf("tune-router: %s: %s, %d steps at lr %g (%d windows of %d a step): training loss %.4f in "
               "the first tenth, %.4f in the last; %.1f s; wrote %s\n", model_path,
               all ? "every weight (--all)" : "the router alone", rep.steps, lr, B * size,
               cfg.model.context, rep.first_loss, rep.last_loss, rep.seconds, out_path);
    dataset_close(&d);
    backend_destroy(be);
    isth_free(config_text);
    return rc;
}

static const char *const usage_generate =
    "usage: isthmus generate --model FILE [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
    "                        [--seed S] [--tokenizer FILE] [--ids] [--threads N]\n"
    "\n"
    "Sample N tokens (default 256) after the prompt from a model file of 'isthmus train'\n"
    "(or a checkpoint), on this process's CPU with a KV cache. Temperature 0 is greedy;\n"
    "otherwise the logits / T, cut to the K most likely (0 = all, the default), give\n"
    "the distribution, and the draws are a function of --seed (default 1): the same\n"
    "seed gives the same text. Default temperature 1.\n"
    "Text: a byte model (vocab 256) reads and writes bytes; a token model uses its\n"
    "sentencepiece tokenizer ([data] tokenizer in its config, or --tokenizer FILE),\n"
    "and without one (or in a build without libsentencepiece) the prompt and the\n"
    "sample are token ids separated by spaces. --ids prints ids in every case. The\n"
    "default prompt is a newline for a byte model; a token model needs --prompt.\n"
    "The prompt and the sample go to stdout, a summary line to stderr. When the\n"
    "context fills, generation goes on from the last half of it. --threads: compute\n"
    "threads (default 1: one token at a time is matrix-vector work).\n";

/* generate: one process, the model file whole in host memory, and the
 * tokenizer's path (--tokenizer, else the model's [data] tokenizer). */
static int open_model_alone(const char *cmd, const char *model_path, const char *tok_path, Config *cfg, Model *m,
                            H5Meta *meta, char *tpath, size_t cap)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 1) return isth_fail(ISTH_EINPUT, "%s runs as one process (not under mpirun with %d ranks)", cmd, size);
    CHECK(modelfile_load(model_path, NULL, 0, cfg, m, meta));
    const int rc = tok_path ? (snprintf(tpath, cap, "%s", tok_path), ISTH_OK)
                            : tokenizer_resolve(cfg->data.tokenizer, cfg->data.dir, tpath, cap);
    if (rc != ISTH_OK) model_destroy(m);
    return rc;
}

static const char *const usage_export =
    "usage: isthmus export --model FILE -o DIR [--dtype f32|bf16] [--max-shard-size SIZE]\n"
    "                      [--tokenizer FILE]\n"
    "\n"
    "Write the model of a model file (or checkpoint) as safetensors in DIR, with\n"
    "DIR/config.json, plus DIR/tokenizer.model when the model has a sentencepiece\n"
    "tokenizer ([data] tokenizer, or --tokenizer). python/isthmus_model.py loads DIR\n"
    "into PyTorch. Names and shapes: docs/architecture.md.\n"
    "  --dtype f32|bf16      the values' type (default f32; bf16: rounded to nearest,\n"
    "                        ties to even: half the bytes)\n"
    "  --max-shard-size SIZE sharded: DIR/model-00001-of-0000N.safetensors ... and\n"
    "                        DIR/model.safetensors.index.json (its weight_map: the\n"
    "                        layout PyTorch and Hugging Face loaders read), each file\n"
    "                        at most SIZE bytes (5GB, 500MB, 2GiB, or a number of\n"
    "                        bytes; a tensor larger than SIZE alone), the tensors\n"
    "                        split by layer (layers.L.NAME). Without it, one file:\n"
    "                        DIR/model.safetensors, every tensor whole.\n"
    "Under mpirun with R ranks (R dividing the experts) each rank reads and writes\n"
    "its share of the experts (1/R of the memory; DIR on a filesystem every rank\n"
    "sees); the files are the same, byte for byte, whatever R. Files of the other\n"
    "layout left in DIR by an earlier export are removed.\n";

/* "5GB", "500MB", "2GiB", "1048576": bytes (decimal units are powers of 1000,
 * binary ones of 1024, as Hugging Face's max_shard_size). */
static int parse_size(const char *text, double *bytes)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"KiB", 1024.0},
                 {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    const double v = strtod(text, &end);
    for (size_t u = 0; end != text && u < sizeof units / sizeof *units; u++)
        if (!strcasecmp(end, units[u].unit) && v * units[u].scale >= 1 && v * units[u].scale < 1e18) {
            *bytes = floor(v * units[u].scale);
            return ISTH_OK;
        }
    return isth_fail(ISTH_EINPUT, "export: --max-shard-size '%s': expected a size such as 5GB, 500MB, 2GiB or a "
                     "number of bytes (at least 1)", text);
}

int cmd_export(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_export, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL, *dir = NULL, *tok_path = NULL, *dtype = "f32", *shard = NULL;
    const CliOption opts[] = {{"--model", 1, &model_path}, {"-o", 1, &dir}, {"--tokenizer", 1, &tok_path},
                              {"--dtype", 1, &dtype}, {"--max-shard-size", 1, &shard}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, sizeof opts / sizeof *opts));
    if (n_pos) return isth_fail(ISTH_EINPUT, "export: unexpected argument '%s'", pos[0]);
    if (n_over) return isth_fail(ISTH_EINPUT, "export: --set does not apply (the model file holds the config)");
    if (!model_path || !dir) return isth_fail(ISTH_EINPUT, "export: needs --model FILE and -o DIR (see isthmus export --help)");
    ExportOptions eo = {EXPORT_F32, 0};
    if (!strcmp(dtype, "bf16") || !strcmp(dtype, "bfloat16")) eo.dtype = EXPORT_BF16;
    else if (strcmp(dtype, "f32") && strcmp(dtype, "float32"))
        return isth_fail(ISTH_EINPUT, "export: --dtype '%s': f32 or bf16", dtype);
    if (shard) CHECK(parse_size(shard, &eo.max_shard_bytes));
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Config cfg;
    Model m;
    H5Meta meta;
    /* every rank its share of the experts */
    CHECK(modelfile_load_shard(model_path, &cfg, &m, &meta, MPI_COMM_WORLD, "export"));
    char tpath[2 * CONFIG_FILE_PATH_MAX + 2];
    int rc = tok_path ? (snprintf(tpath, sizeof tpath, "%s", tok_path), ISTH_OK)
                      : tokenizer_resolve(cfg.data.tokenizer, cfg.data.dir, tpath, sizeof tpath);
    /* the tokenizer must be this model's before it is shipped with it (a build without
     * sentencepiece cannot check it: copied as it is, said so) */
    Tokenizer tok = {0};
    if (rc == ISTH_OK && rank == 0 && tpath[0] && tokenizer_have_sentencepiece()) rc = tokenizer_open(&tok, tpath, cfg.model.vocab);
    else if (rc == ISTH_OK && rank == 0 && tpath[0])
        fprintf(stderr, "isthmus export: this build has no libsentencepiece: %s is copied unchecked\n", tpath);
    tokenizer_close(&tok);
    if (!coll_all_ok(MPI_COMM_WORLD, rc == ISTH_OK)) rc = rc != ISTH_OK ? rc : ISTH_EINPUT;
    ExportResult res = {0};
    if (rc == ISTH_OK) rc = export_model(dir, &m, &meta, rank == 0 ? tpath : "", &eo, MPI_COMM_WORLD, &res);
    if (rc == ISTH_OK && rank == 0) {
        const char *t = eo.dtype == EXPORT_BF16 ? "bf16" : "f32";
        if (eo.max_shard_bytes > 0)
            printf("isthmus export: %s (step %ld) -> %s/model-*-of-%05d.safetensors (%d file(s), %.0f bytes of %s "
                   "tensors), %s/model.safetensors.index.json, %s/config.json%s%s%s\n", model_path, meta.step, dir,
                   res.files, res.files, res.bytes, t, dir, dir, tpath[0] ? ", " : "", tpath[0] ? dir : "",
                   tpath[0] ? "/tokenizer.model" : "");
        else
            printf("isthmus export: %s (step %ld) -> %s/model.safetensors (%.0f bytes of %s tensors), %s/config.json%s%s%s\n",
                   model_path, meta.step, dir, res.bytes, t, dir, tpath[0] ? ", " : "", tpath[0] ? dir : "",
                   tpath[0] ? "/tokenizer.model" : "");
    }
    model_destroy(&m);
    return rc;
}

static void emit_id(void *ctx, int token)
{
    printf(" %d", token);
    fflush(stdout);
}

static void emit_byte(void *ctx, int token)
{
    putchar(token);
    fflush(stdout);
}

int cmd_generate(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_generate, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL, *prompt = NULL, *tokens_text = "256", *temp_text = "1", *topk_text = "0",
               *seed_text = "1", *tok_path = NULL, *ids_flag = NULL, *threads_text = "1";
    const CliOption opts[] = {{"--model", 1, &model_path},     {"--prompt", 1, &prompt}, {"--tokens", 1, &tokens_text},
                           {"--temperature", 1, &temp_text}, {"--top-k", 1, &topk_text}, {"--seed", 1, &seed_text},
                           {"--tokenizer", 1, &tok_path},   {"--ids", 0, &ids_flag}, {"--threads", 1, &threads_text}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, sizeof opts / sizeof *opts));
    if (n_pos) return isth_fail(ISTH_EINPUT, "generate: unexpected argument '%s'", pos[0]);
    if (n_over) return isth_fail(ISTH_EINPUT, "generate: --set does not apply (the model file holds the config)");
    if (!model_path) return isth_fail(ISTH_EINPUT, "generate: missing --model FILE (see isthmus generate --help)");
    double count, temperature, top_k, seed;
    CHECK(cli_number("--tokens", tokens_text, 0, 1 << 30, 1, &count));
    CHECK(cli_number("--temperature", temp_text, 0, 1e6, 0, &temperature));
    CHECK(cli_number("--top-k", topk_text, 0, 1 << 30, 1, &top_k));
    CHECK(cli_number("--seed", seed_text, 0, 9007199254740992.0, 1, &seed));
    double threads;
    CHECK(cli_number("--threads", threads_text, 1, 4096, 1, &threads));
    /* one token at a time is matrix-vector work: one thread is the fastest on small models */
    omp_set_num_threads((int)threads);
    openblas_set_num_threads((int)threads);
    Config cfg;
    Model m;
    H5Meta meta;
    char tpath[2 * CONFIG_FILE_PATH_MAX + 2];
    CHECK(open_model_alone("generate", model_path, tok_path, &cfg, &m, &meta, tpath, sizeof tpath));
    int rc = ISTH_OK;
    /* the model's own tokenizer in a build without sentencepiece: ids, said plainly (an
     * explicit --tokenizer is refused by tokenizer_open, naming why) */
    if (rc == ISTH_OK && !tok_path && tpath[0] && !tokenizer_have_sentencepiece()) {
        fprintf(stderr, "isthmus generate: this build has no libsentencepiece: the prompt and the sample are "
                        "token ids, not text (the model's tokenizer %s is not used)\n", tpath);
        tpath[0] = '\0';
    }
    Tokenizer tok = {0};
    if (rc == ISTH_OK) rc = tokenizer_open(&tok, tpath, cfg.model.vocab);
    if (rc == ISTH_OK && !prompt && tok.kind != TOKENIZER_BYTES && cfg.model.vocab != 256)
        rc = isth_fail(ISTH_EINPUT, "generate: a token model needs --prompt (text, or token ids without its tokenizer)");
    int *ids = NULL, *out = NULL;
    size_t n_ids = 0;
    if (rc == ISTH_OK) rc = tokenizer_encode(&tok, prompt ? prompt : "\n", &ids, &n_ids);
    if (rc == ISTH_OK && n_ids == 0) rc = isth_fail(ISTH_EINPUT, "generate: the prompt is no tokens");
    Decoder d = {0};
    if (rc == ISTH_OK) rc = decoder_create(&d, &m);
    if (rc == ISTH_OK && !(out = isth_malloc(((size_t)count + 1) * sizeof(int))))
        rc = isth_fail(ISTH_ERUNTIME, "out of memory for %.0f tokens", count);
    if (rc == ISTH_OK) {
        const int as_ids = ids_flag || tok.kind == TOKENIZER_IDS;
        char *text = NULL;
        size_t len = 0;
        if (as_ids) {
            for (size_t i = 0; i < n_ids; i++) printf("%s%d", i ? " " : "", ids[i]);
        } else if ((rc = tokenizer_decode(&tok, ids, n_ids, &text, &len)) == ISTH_OK) {
            fwrite(text, 1, len, stdout);
        }
        isth_free(text);
        fflush(stdout);
        const SampleRule rule = {temperature, (int)top_k, (uint64_t)seed};
        const double t0 = now_s();
        /* bytes and ids appear as they are drawn; sentencepiece text at the end */
        if (rc == ISTH_OK)
            rc = sample_generate(&d, ids, n_ids, (int)count, &rule, out,
                                 as_ids ? emit_id : tok.kind == TOKENIZER_BYTES ? emit_byte : NULL, NULL);
        const double secs = now_s() - t0;
        if (rc == ISTH_OK && !as_ids && tok.kind == TOKENIZER_SENTENCEPIECE) {
            /* the continuation decoded after the prompt's tokens (a piece's space depends on its neighbours) */
            int *all = isth_malloc((n_ids + (size_t)count) * sizeof(int));
            char *full = NULL, *head = NULL;
            size_t full_len = 0, head_len = 0;
            if (!all) rc = isth_fail(ISTH_ERUNTIME, "out of memory for the sample");
            if (rc == ISTH_OK) {
                memcpy(all, ids, n_ids * sizeof(int));
                memcpy(all + n_ids, out, (size_t)count * sizeof(int));
                rc = tokenizer_decode(&tok, all, n_ids + (size_t)count, &full, &full_len);
            }
            if (rc == ISTH_OK) rc = tokenizer_decode(&tok, ids, n_ids, &head, &head_len);
            /* the continuation is what follows the prompt's own text; a tokenizer for which it
             * does not (decoding is not a prefix): the whole text after a newline */
            if (rc == ISTH_OK && full_len >= head_len && !memcmp(full, head, head_len))
                fwrite(full + head_len, 1, full_len - head_len, stdout);
            else if (rc == ISTH_OK) {
                putchar('\n');
                fwrite(full, 1, full_len, stdout);
            }
            isth_free(all);
            isth_free(full);
            isth_free(head);
        }
        putchar('\n');
        fflush(stdout);
        if (rc == ISTH_OK)
            fprintf(stderr, "isthmus generate: %s (step %ld), %zu prompt + %.0f sampled tokens, %s, temperature %g, "
                    "top-k %d, seed %.0f: %.1f tokens/s\n", model_path, meta.step, n_ids, count,
                    tok.kind == TOKENIZER_BYTES ? "bytes" : tok.kind == TOKENIZER_SENTENCEPIECE ? "sentencepiece"
                                                                                            : "token ids",
                    temperature, (int)top_k, seed, secs > 0 ? count / secs : 0.0);
    }
    decoder_destroy(&d);
    isth_free(ids);
    isth_free(out);
    tokenizer_close(&tok);
    model_destroy(&m);
    return rc;
}
