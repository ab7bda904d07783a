/* main.c — the `isthmus` command line: subcommands and their options.
 *
 * Owns: argument parsing, --help texts, MPI start-up and shutdown, and the
 * mapping from status codes to exit codes (0 ok, 1 runtime failure,
 * 2 bad input, 3 a federated site dropped from a live run).
 * Must not: contain training, evaluation or file-format logic.
 */
#include <cblas.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "bench.h"
#include "federation.h"
#include "backend.h"
#include "cpu/blas_select.h"
#include "ckpt_validate.h"
#include "clock.h"
#include "data.h"
#include "decoder.h"
#include "export.h"
#include "modelfile.h"
#include "sample.h"
#include "tokenizer.h"
#include "version.h"
#include "autoconf.h"
#include "coll.h"
#include "config.h"
#include "eval.h"
#include "fault.h"
#include "h5io.h"
#include "link.h"
#include "memory.h"
#include "metrics.h"
#include "plan.h"
#include "planner.h"
#include "plot.h"
#include "status.h"
#include "run.h"
#include "stateview.h"
#include "train.h"

#define MAX_OVERRIDES 256

/* A StateSelect: every chunk this rank holds (evaluation loads them all). */
static int held_chunk(const void *ct, int c) { return chunk_held(ct, c); }

static const char *const usage_main =
    "usage: isthmus <command> [options]\n"
    "\n"
    "Train a byte-level mixture-of-experts language model (CPU or CUDA backend; MPI program).\n"
    "\n"
    "commands:\n"
    "  train CONFIG [--set section.key=value]...   train, evaluate, write <out_dir>/model.h5\n"
    "  eval --model FILE [--set ...]...            bits per byte on both eval sets\n"
    "  generate --model FILE [--prompt TEXT]       sample a continuation (KV cache, this process)\n"
    "  export --model FILE -o DIR                  model.safetensors + config.json (PyTorch: python/)\n"
    "  bench CONFIG [--threads 1,2] [--steps N]    training-step throughput and GFLOP/s\n"
    "  config [CONFIG] [--set ...]... [--keys]     print the resolved configuration\n"
    "  inspect FILE                                attributes, datasets and validity of a checkpoint\n"
    "  plan CONFIG --site NAME:GPU:N... --link RATE,RTT   what a run would achieve on those sites\n"
    "  plot RUN_DIR... -o FILE.png                 charts of runs' metrics (gnuplot)\n"
    "  keygen FILE                                 a new run key (mode 0600) for [outer] key_file\n"
    "\n"
    "'isthmus --version' names the build (sites of one run must run the same).\n"
    "'isthmus <command> --help' describes a command. Configuration keys: docs/configuration.md\n";

static const char *const usage_train =
    "usage: isthmus train CONFIG.ini [--set section.key=value]... [--resume FILE|auto] [--site NAME]\n"
    "\n"
    "Trains the model described by CONFIG.ini ([model], [train], [data] sections).\n"
    "--set overrides or adds one key; it may be repeated. The resolved configuration\n"
    "is printed first. Rank 0 prints one line per step and appends JSON lines to\n"
    "<out_dir>/metrics.jsonl; both eval sets are scored every eval_every steps and at\n"
    "the end; the final weights go to <out_dir>/model.h5.\n"
    "Checkpoints ([checkpoint] dir/every/keep) hold the whole state, one HDF5 file per\n"
    "site; --resume auto continues from the newest checkpoint every site has (invalid\n"
    "files are reported and skipped), --resume FILE from that step. SIGTERM or SIGUSR1\n"
    "finishes the step, writes a checkpoint and exits 0.\n"
    "--site NAME: the federated launch, one mpirun per site (started with --ompi-server,\n"
    "see scripts/federated.sh): this mpirun is [site.NAME]; the first site hosts, the\n"
    "others join it with the run's key (outer.key_file) within outer.join_timeout\n"
    "(0: two sites wait for each other until a stop signal, then exit 0 with nothing written).\n"
    "Exit status: 0 success, 1 runtime failure, 2 bad configuration, data or checkpoint,\n"
    "3 this site was dropped from a live federated run (start it again and it rejoins).\n";

static const char *const usage_eval =
    "usage: isthmus eval --model FILE [--set section.key=value]...\n"
    "\n"
    "Computes bits per byte (and loss per token) of the model in FILE (written by\n"
    "'isthmus train') on its eval sets ([eval.NAME] sections, or data.dir's\n"
    "eval_prose.txt and eval_tech.txt): consecutive windows of context+1 tokens\n"
    "overlapping by one, no token dropping. The model's stored configuration is\n"
    "used; --set may change [data] dir, [data] eval_bytes, [eval.NAME] path and\n"
    "bytes, [train] micro_batch, [train] threads or [train] out_dir (results are\n"
    "appended to its metrics.jsonl).\n"
    "Exit status: 0 success, 1 runtime failure, 2 bad file or configuration.\n";

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

static const char *const usage_bench =
    "usage: isthmus bench CONFIG.ini [--threads LIST] [--steps N] [--warmup W] [--peak-tflops P]\n"
    "                     [--set section.key=value]...\n"
    "\n"
    "Times N training steps (default 5, after W untimed warm-up steps, default 1)\n"
    "for each thread count in LIST (default 1,2) and prints ms/step, the CPU time\n"
    "per step of rank 0's process (summed over its threads; at one thread it moves\n"
    "less than wall time with other jobs on a shared machine), tokens/s and model\n"
    "GFLOP/s (6 x active matrix parameters per token + causal attention), next to\n"
    "the GFLOP/s of a reference sgemm measured in the same run. --peak-tflops P adds\n"
    "MFU = model FLOP/s per rank / P (a GPU's datasheet peak for the precision run).\n"
    "Shampoo reaches its steady step (the preconditioned direction, roots every\n"
    "[train] precond_every) only after precond_every updates: time it with\n"
    "W > precond_every. (--warmup is not [train] warmup, the learning rate's.)\n";

static const char *const usage_config =
    "usage: isthmus config [CONFIG.ini] [--set section.key=value]... [--keys]\n"
    "                      [--memory [--ranks N] [--rank R]]\n"
    "\n"
    "Validates and prints the resolved configuration (every key, defaults filled in).\n"
    "--keys lists every configuration key instead, one a line: \"[section] key\", its\n"
    "type and accepted values, \"default X\" (in words where a mode or another key\n"
    "decides) and a one-line meaning (docs/configuration.md has the full text);\n"
    "columns are separated by two spaces or more.\n"
    "--memory prints what world rank R (default 0; max: the rank that holds the\n"
    "most) of an N-rank job (default: the [site.*] ranks) allocates, by category,\n"
    "computed from the layout without allocating the model; `isthmus train`\n"
    "prints the measured peak of rank 0.\n";

static const char *const usage_inspect =
    "usage: isthmus inspect FILE\n"
    "\n"
    "Prints the attributes (format version, step, tokens, site, mode, ...) and every\n"
    "dataset with its shape of a checkpoint or model file, then reads every dataset\n"
    "(fletcher32 checksums verified) and prints a verdict. Exit status 0 when valid,\n"
    "2 when the file is missing, truncated, corrupted or of another format version.\n";

static const char *const usage_plan =
    "usage: isthmus plan CONFIG.ini --site NAME:GPU:COUNT [--site ...] --link RATE,RTT\n"
    "                    [--mfu F] [--target U] [--set section.key=value]...\n"
    "\n"
    "Plans a run of CONFIG on the given sites without running it: one --site per\n"
    "[site.NAME] of the config (its layout with COUNT ranks, one per GPU), GPU a type\n"
    "below or a peak in TFLOP/s (e.g. a CPU's rate from `isthmus bench`, with --mfu 1);\n"
    "--link the rate and round trip between every pair of sites (e.g. 25Gbps,150ms).\n"
    "Prints the parameters (total, active per token), memory per GPU by category, the\n"
    "inner-step time of each site (tokens x FLOP per token / (GPUs x peak x MFU), MFU\n"
    "default 0.4), the outer payload per exchange after the codec and its transfer\n"
    "time, the compute utilisation of sync, diloco, streaming and butterfly with each\n"
    "site's idle time, and the smallest H reaching --target (default 0.95).\n"
    "docs/planner.md derives the model and compares it with measured runs.\n"
    "GPU types (dense peaks; a plan uses the one of the config's train.precision):\n";

static const char *const usage_plot =
    "usage: isthmus plot RUN_DIR... -o FILE.png [--size WIDTHxHEIGHT]\n"
    "\n"
    "Draws four panels from each RUN_DIR/metrics.jsonl (an out_dir of isthmus train):\n"
    "bits per byte on the first two eval sets (prose and tech unless [eval.NAME]\n"
    "sections name others) and training loss against tokens,\n"
    "and the cumulative inter-site bytes against steps (log scale), one line per run,\n"
    "labelled with the directory's name, mode and codec. Needs gnuplot (Debian's\n"
    "gnuplot-nox). Default size 1600x1000. The PNG is written under FILE.png.tmp and\n"
    "renamed when complete.\n";

static int wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

/* A command's own option: `--name VALUE`, `--name=VALUE`, or a flag. */
typedef struct {
    const char *name;
    int takes_value;
    const char **value; /* set to the value, or "1" for a flag */
} Option;

/* Collect --set options and the command's own options; positional
 * arguments into *pos. */
static int parse_common(int argc, char **argv, const char **overrides, int *n_overrides,
                        const char **pos, int max_pos, int *n_pos, const Option *opts, int n_opts)
{
    *n_overrides = 0;
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return isth_fail(ISTH_EINPUT, "--set needs section.key=value");
            if (*n_overrides == MAX_OVERRIDES) return isth_fail(ISTH_EINPUT, "too many --set options");
            overrides[(*n_overrides)++] = v;
            continue;
        }
        int matched = 0;
        for (int e = 0; e < n_opts && !matched; e++) {
            const size_t len = strlen(opts[e].name);
            if (strncmp(a, opts[e].name, len) || (a[len] != '\0' && a[len] != '=')) continue;
            matched = 1;
            if (!opts[e].takes_value) {
                *opts[e].value = "1";
                continue;
            }
            const char *v = a[len] == '=' ? a + len + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return isth_fail(ISTH_EINPUT, "%s needs a value", opts[e].name);
            *opts[e].value = v;
        }
        if (matched) continue;
        if (a[0] == '-' && a[1]) return isth_fail(ISTH_EINPUT, "unknown option '%s' (see --help)", a);
        if (*n_pos == max_pos) return isth_fail(ISTH_EINPUT, "unexpected argument '%s' (see --help)", a);
        pos[(*n_pos)++] = a;
    }
    return ISTH_OK;
}

static int cmd_train(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_train, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    const char *resume = NULL, *site = NULL;
    const Option opts[] = {{"--resume", 1, &resume}, {"--site", 1, &site}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 2));
    if (n_pos != 1) return isth_fail(ISTH_EINPUT, "train: missing CONFIG.ini (see isthmus train --help)");
    Config cfg;
    CHECK(config_load(&cfg, pos[0], overrides, n_over));
    return train_run(&cfg, resume, site);
}

static int cmd_eval(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_eval, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL;
    const Option opts[] = {{"--model", 1, &model_path}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 1));
    if (!model_path && n_pos == 1) model_path = pos[0];
    else if (n_pos) return isth_fail(ISTH_EINPUT, "eval: unexpected argument '%s'", pos[0]);
    if (!model_path) return isth_fail(ISTH_EINPUT, "eval: missing --model FILE (see isthmus eval --help)");
    for (int i = 0; i < n_over; i++) {
        static const char *const allowed[] = {"data.dir=", "data.eval_bytes=", "train.micro_batch=",
                                              "train.threads=", "train.out_dir=", "train.backend=",
                                              "train.precision=", "train.gpu_share="};
        int ok = !strncmp(overrides[i], "eval.", 5); /* the sets to evaluate on */
        for (size_t a = 0; a < sizeof allowed / sizeof *allowed; a++)
            ok |= !strncmp(overrides[i], allowed[a], strlen(allowed[a]));
        if (!ok)
            return isth_fail(ISTH_EINPUT, "eval: --set %s: only [data] dir/eval_bytes, [eval.*] and [train] "
                             "micro_batch/threads/out_dir/backend/precision/gpu_share can change for evaluation", overrides[i]);
    }
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* the same validation as inspect and --resume: one verdict per file */
    int rank0_rc = ISTH_OK;
    if (rank == 0) {
        char reason[512];
        if (ckpt_validate(model_path, reason, sizeof reason, NULL) != ISTH_OK)
            rank0_rc = isth_fail(ISTH_EINPUT, "model %s: invalid: %s", model_path, reason);
    }
    CHECK_MPI(MPI_Bcast(&rank0_rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    CHECK(rank0_rc);
    char *text = NULL;
    CHECK(h5model_read_config(model_path, &text, MPI_COMM_WORLD));
    Config cfg;
    char origin[CONFIG_FILE_PATH_MAX + 64];
    snprintf(origin, sizeof origin, "%s:/config", model_path);
    int rc = config_load_text(&cfg, text, origin, overrides, n_over);
    isth_free(text);
    CHECK(rc);
    /* the machine that evaluates need not be the one that trained: unless
     * --set says otherwise, the best backend here, in fp32 */
    int chose_backend = 0, chose_precision = 0;
    for (int i = 0; i < n_over; i++) {
        chose_backend |= !strncmp(overrides[i], "train.backend=", 14);
        chose_precision |= !strncmp(overrides[i], "train.precision=", 16);
    }
    if (!chose_backend) snprintf(cfg.train.backend, sizeof cfg.train.backend, "auto");
    if (!chose_precision) snprintf(cfg.train.precision, sizeof cfg.train.precision, "fp32");
    /* evaluation ignores the training layout: all ranks of this job form one
     * learner, experts sharded over them */
    if (cfg.model.experts % size)
        return isth_fail(ISTH_EINPUT, "eval: %d ranks cannot share %d experts evenly; use a rank count that divides it",
                         size, cfg.model.experts);
    Coll ep;
    CHECK(coll_init(&ep, MPI_COMM_WORLD));
    Backend *be = NULL;
    EvalSet sets[CONFIG_MAX_EVALS];
    int n_sets = 0;
    Metrics mt = {0};
    const int El = cfg.model.experts / size;
    CHECK(backend_create(&be, &cfg, cfg.train.micro_batch, rank * El, El, &ep));
    H5Meta meta;
    /* the file into the backend one tensor at a time (host staging) */
    ChunkTable ct;
    StateView view = {0};
    rc = chunk_table_create(&ct, &be->table, 1);
    const int made = rc == ISTH_OK && state_view_create(&view, &ct, state_view_need(&ct, held_chunk, &ct)) == ISTH_OK;
    rc = coll_all_ok(MPI_COMM_WORLD, made) ? ISTH_OK : ISTH_ERUNTIME;
    if (rc == ISTH_OK) {
        state_view_begin(&view, be, STATE_PARAMS, NULL, held_chunk, &ct, 1);
        rc = h5model_read(model_path, &be->table, state_view_at, &view, &meta, MPI_COMM_WORLD);
        const int vrc = state_view_end(&view, rc == ISTH_OK);
        if (rc == ISTH_OK && !coll_all_ok(MPI_COMM_WORLD, vrc == ISTH_OK)) rc = vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
    }
    state_view_destroy(&view);
    chunk_table_destroy(&ct);
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
                              r.bytes, r.seconds);
    }
    const int closed = metrics_close(&mt);
    if (rc == ISTH_OK) rc = closed;
    backend_destroy(be);
    eval_sets_close(sets, n_sets);
    return rc;
}

/* A number option: the whole text a number in [lo, hi]. */
static int number_option(const char *name, const char *text, double lo, double hi, int integer, double *out)
{
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    if (end == text || *end || errno || !(v >= lo && v <= hi) || (integer && v != floor(v)))
        return isth_fail(ISTH_EINPUT, "%s %s: expected %s in [%g, %g]", name, text, integer ? "an integer" : "a number",
                         lo, hi);
    *out = v;
    return ISTH_OK;
}

/* generate and export: one process, the model file whole in host memory,
 * and the tokenizer's path (--tokenizer, else the model's [data] tokenizer). */
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
    "usage: isthmus export --model FILE -o DIR [--tokenizer FILE]\n"
    "\n"
    "Write the model of a model file (or checkpoint) as DIR/model.safetensors (every\n"
    "tensor in float32 under its /model name, canonical shape) and DIR/config.json,\n"
    "plus DIR/tokenizer.model when the model has a sentencepiece tokenizer ([data]\n"
    "tokenizer, or --tokenizer). python/isthmus_model.py loads DIR into PyTorch.\n"
    "Names and shapes: docs/architecture.md.\n";

static int cmd_export(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_export, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL, *dir = NULL, *tok_path = NULL;
    const Option opts[] = {{"--model", 1, &model_path}, {"-o", 1, &dir}, {"--tokenizer", 1, &tok_path}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, sizeof opts / sizeof *opts));
    if (n_pos) return isth_fail(ISTH_EINPUT, "export: unexpected argument '%s'", pos[0]);
    if (n_over) return isth_fail(ISTH_EINPUT, "export: --set does not apply (the model file holds the config)");
    if (!model_path || !dir) return isth_fail(ISTH_EINPUT, "export: needs --model FILE and -o DIR (see isthmus export --help)");
    Config cfg;
    Model m;
    H5Meta meta;
    char tpath[2 * CONFIG_FILE_PATH_MAX + 2];
    CHECK(open_model_alone("export", model_path, tok_path, &cfg, &m, &meta, tpath, sizeof tpath));
    int rc = ISTH_OK;
    /* the tokenizer must be this model's before it is shipped with it (a build without
     * sentencepiece cannot check it: copied as it is, said so) */
    Tokenizer tok = {0};
    if (rc == ISTH_OK && tpath[0] && tokenizer_have_sentencepiece()) rc = tokenizer_open(&tok, tpath, cfg.model.vocab);
    else if (rc == ISTH_OK && tpath[0])
        fprintf(stderr, "isthmus export: this build has no libsentencepiece: %s is copied unchecked\n", tpath);
    tokenizer_close(&tok);
    if (rc == ISTH_OK) rc = export_model(dir, &m, &meta, tpath);
    if (rc == ISTH_OK)
        printf("isthmus export: %s (step %ld) -> %s/model.safetensors, %s/config.json%s%s%s\n", model_path, meta.step,
               dir, dir, tpath[0] ? ", " : "", tpath[0] ? dir : "", tpath[0] ? "/tokenizer.model" : "");
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

static int cmd_generate(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_generate, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    const char *model_path = NULL, *prompt = NULL, *tokens_text = "256", *temp_text = "1", *topk_text = "0",
               *seed_text = "1", *tok_path = NULL, *ids_flag = NULL, *threads_text = "1";
    const Option opts[] = {{"--model", 1, &model_path},     {"--prompt", 1, &prompt}, {"--tokens", 1, &tokens_text},
                           {"--temperature", 1, &temp_text}, {"--top-k", 1, &topk_text}, {"--seed", 1, &seed_text},
                           {"--tokenizer", 1, &tok_path},   {"--ids", 0, &ids_flag}, {"--threads", 1, &threads_text}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, sizeof opts / sizeof *opts));
    if (n_pos) return isth_fail(ISTH_EINPUT, "generate: unexpected argument '%s'", pos[0]);
    if (n_over) return isth_fail(ISTH_EINPUT, "generate: --set does not apply (the model file holds the config)");
    if (!model_path) return isth_fail(ISTH_EINPUT, "generate: missing --model FILE (see isthmus generate --help)");
    double count, temperature, top_k, seed;
    CHECK(number_option("--tokens", tokens_text, 0, 1 << 30, 1, &count));
    CHECK(number_option("--temperature", temp_text, 0, 1e6, 0, &temperature));
    CHECK(number_option("--top-k", topk_text, 0, 1 << 30, 1, &top_k));
    CHECK(number_option("--seed", seed_text, 0, 9007199254740992.0, 1, &seed));
    double threads;
    CHECK(number_option("--threads", threads_text, 1, 4096, 1, &threads));
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

static int cmd_bench(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_bench, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    const char *values[4] = {"1,2", "5", "0", "1"};
    const Option opts[] = {{"--threads", 1, &values[0]},
                           {"--steps", 1, &values[1]},
                           {"--peak-tflops", 1, &values[2]},
                           {"--warmup", 1, &values[3]}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 4));
    if (n_pos != 1) return isth_fail(ISTH_EINPUT, "bench: missing CONFIG.ini (see isthmus bench --help)");
    Config cfg;
    CHECK(config_load(&cfg, pos[0], overrides, n_over));
    int threads[64], n_threads = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", values[0]);
    /* strtok would pass over an empty count: refuse it here */
    const size_t vl = strlen(values[0]);
    if (strstr(values[0], ",,") || (vl && (values[0][0] == ',' || values[0][vl - 1] == ',')))
        return isth_fail(ISTH_EINPUT, "bench: --threads '%s': expected a list like 1,2 of counts 1..1024", values[0]);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        long t = strtol(tok, &end, 10);
        if (*end || t < 1 || t > 1024)
            return isth_fail(ISTH_EINPUT, "bench: --threads '%s': expected a list like 1,2 of counts 1..1024", values[0]);
        if (n_threads == (int)(sizeof threads / sizeof *threads))
            return isth_fail(ISTH_EINPUT, "bench: --threads '%s': at most %d thread counts", values[0],
                             (int)(sizeof threads / sizeof *threads));
        threads[n_threads++] = (int)t;
    }
    if (n_threads == 0)
        return isth_fail(ISTH_EINPUT, "bench: --threads '%s': expected a list like 1,2 of counts 1..1024", values[0]);
    char *end;
    long steps = strtol(values[1], &end, 10);
    if (*end || steps < 1 || steps > 100000)
        return isth_fail(ISTH_EINPUT, "bench: --steps '%s': expected a positive integer", values[1]);
    const double peak = strtod(values[2], &end);
    if (*end || !(peak >= 0 && peak <= 1e6))
        return isth_fail(ISTH_EINPUT, "bench: --peak-tflops '%s': expected the device's peak TFLOP/s (0: none)",
                         values[2]);
    const long warmup = strtol(values[3], &end, 10);
    if (*end || warmup < 1 || warmup > 100000)
        return isth_fail(ISTH_EINPUT, "bench: --warmup '%s': expected a positive integer", values[3]);
    return bench_run(&cfg, threads, n_threads, (int)warmup, (int)steps, peak);
}

static const char *const usage_keygen =
    "usage: isthmus keygen FILE\n"
    "\n"
    "Write a new run key to FILE: 32 random bytes in hex, mode 0600, missing directories made.\n"
    "An existing FILE is never overwritten. Make the key before submitting the sites' jobs, copy it\n"
    "to every site (scp; the same mode) and name it in [outer] key_file: the federated join proves\n"
    "it, and every frame between the sites is authenticated and encrypted under keys derived from\n"
    "it (docs/architecture.md). One rank only.\n";

/* The one FILE argument of `cmd` (no --set): *path, or NULL when --help
 * was asked for (usage printed). */
static int one_file(int argc, char **argv, const char *cmd, const char *usage, const char **path)
{
    *path = NULL;
    if (wants_help(argc, argv)) {
        fputs(usage, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, NULL, 0));
    if (n_pos != 1 || n_over)
        return isth_fail(ISTH_EINPUT, "%s: expected one FILE (see isthmus %s --help)", cmd, cmd);
    *path = pos[0];
    return ISTH_OK;
}

static int cmd_keygen(int argc, char **argv)
{
    const char *path;
    CHECK(one_file(argc, argv, "keygen", usage_keygen, &path));
    if (!path) return ISTH_OK;
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 1) return isth_fail(ISTH_EINPUT, "keygen: run it as one process, not under mpirun -np %d", size);
    return federation_keygen(path);
}

static int cmd_inspect(int argc, char **argv)
{
    const char *path;
    CHECK(one_file(argc, argv, "inspect", usage_inspect, &path));
    return path ? ckpt_inspect(path) : ISTH_OK;
}

static int cmd_config(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_config, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[1];
    const char *keys = NULL, *memory = NULL, *ranks = NULL, *rank = NULL;
    const Option opts[] = {{"--keys", 0, &keys}, {"--memory", 0, &memory}, {"--ranks", 1, &ranks}, {"--rank", 1, &rank}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 4));
    if (keys) {
        config_print_keys();
        return ISTH_OK;
    }
    Config cfg;
    CHECK(config_load(&cfg, n_pos ? pos[0] : NULL, overrides, n_over));
    if ((ranks || rank) && !memory) return isth_fail(ISTH_EINPUT, "--ranks and --rank go with --memory");
    if (memory) {
        char *end;
        const long n = ranks ? strtol(ranks, &end, 10) : 0;
        if (ranks && (*end || n < 1 || n > 1 << 24)) return isth_fail(ISTH_EINPUT, "--ranks %s: expected 1..16777216", ranks);
        const int largest = rank && !strcmp(rank, "max");
        long r = rank && !largest ? strtol(rank, &end, 10) : 0;
        if (rank && !largest && (*end || r < 0))
            return isth_fail(ISTH_EINPUT, "--rank %s: expected a rank number or max", rank);
        int world = (int)n;
        if (!world)
            for (int s = 0; s < cfg.n_sites; s++) world += cfg.sites[s].ranks;
        if (!world) world = 1;
        MemoryPlan plan;
        if (largest) /* the rank that holds the most: what a GPU must fit */
            CHECK(memory_plan_largest(&cfg, world, &plan, &r));
        else
            CHECK(memory_plan(&cfg, world, (int)r, &plan));
        memory_print(&plan, world, (int)r);
        return ISTH_OK;
    }
    char *text = config_to_text(&cfg);
    CHECK_ALLOC(text);
    fputs(text, stdout);
    isth_free(text);
    return ISTH_OK;
}

static int cmd_plan(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_plan, stdout);
        planner_print_gpus();
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *config = NULL, *link_text = NULL, *mfu_text = NULL, *target_text = NULL;
    PlanSite sites[PLAN_MAX_SITES];
    int n_over = 0, n_sites = 0;
    for (int i = 0; i < argc; i++) { /* --site repeats, so not parse_common */
        const char *a = argv[i], *eq = strchr(a, '=');
        const size_t name_len = a[0] == '-' && eq ? (size_t)(eq - a) : strlen(a);
        const char *v = a[0] == '-' && eq ? eq + 1 : NULL;
        static const char *const with_value[] = {"--site", "--link", "--mfu", "--target", "--set"};
        int known = -1;
        for (int k = 0; k < 5; k++)
            if (strlen(with_value[k]) == name_len && !strncmp(a, with_value[k], name_len)) known = k;
        if (a[0] == '-' && a[1] && known < 0) return isth_fail(ISTH_EINPUT, "plan: unknown option '%s' (see --help)", a);
        if (known < 0) {
            if (config) return isth_fail(ISTH_EINPUT, "plan: unexpected argument '%s' (see --help)", a);
            config = a;
            continue;
        }
        if (!v && i + 1 < argc) v = argv[++i];
        if (!v) return isth_fail(ISTH_EINPUT, "plan: %s needs a value", with_value[known]);
        if (known == 0) {
            if (n_sites == PLAN_MAX_SITES) return isth_fail(ISTH_EINPUT, "plan: more than %d --site", PLAN_MAX_SITES);
            CHECK(planner_parse_site(v, &sites[n_sites]));
            for (int j = 0; j < n_sites; j++)
                if (!strcmp(sites[j].name, sites[n_sites].name))
                    return isth_fail(ISTH_EINPUT, "plan: --site %s given twice", sites[j].name);
            n_sites++;
        } else if (known == 1) {
            link_text = v;
        } else if (known == 2) {
            mfu_text = v;
        } else if (known == 3) {
            target_text = v;
        } else {
            if (n_over == MAX_OVERRIDES) return isth_fail(ISTH_EINPUT, "too many --set options");
            overrides[n_over++] = v;
        }
    }
    if (!config) return isth_fail(ISTH_EINPUT, "plan: missing CONFIG.ini (see isthmus plan --help)");
    if (!n_sites) return isth_fail(ISTH_EINPUT, "plan: no --site NAME:GPU:COUNT (see isthmus plan --help)");
    if (!link_text) return isth_fail(ISTH_EINPUT, "plan: no --link RATE,RTT (e.g. --link 25Gbps,150ms)");
    PlanLink link;
    CHECK(planner_parse_link(link_text, &link));
    char *end;
    const double mfu = mfu_text ? strtod(mfu_text, &end) : 0.4;
    if (mfu_text && (*end || !(mfu > 0 && mfu <= 1)))
        return isth_fail(ISTH_EINPUT, "plan: --mfu '%s': a fraction in (0, 1]", mfu_text);
    const double target = target_text ? strtod(target_text, &end) : 0.95;
    if (target_text && (*end || !(target > 0 && target < 1)))
        return isth_fail(ISTH_EINPUT, "plan: --target '%s': a fraction in (0, 1)", target_text);
    Config cfg;
    CHECK(config_load(&cfg, config, overrides, n_over));
    /* the layout the --site counts give, validated as `train --set site.NAME.ranks=N` would be: a
     * plan for a layout training refuses is refused the same way (names the config lacks are
     * reported by the planner) */
    static char layout[PLAN_MAX_SITES][CONFIG_NAME_MAX + 40];
    int n_all = n_over;
    for (int i = 0; i < n_sites && n_all < MAX_OVERRIDES; i++) {
        int known = cfg.n_sites == 0 && n_sites == 1;
        for (int s = 0; s < cfg.n_sites; s++) known |= !strcmp(cfg.sites[s].name, sites[i].name);
        if (!known) continue;
        snprintf(layout[i], sizeof layout[i], "site.%.64s.ranks=%d", sites[i].name, sites[i].gpus);
        overrides[n_all++] = layout[i];
    }
    if (n_all > n_over) CHECK(config_load(&cfg, config, overrides, n_all));
    return planner_run(&cfg, sites, n_sites, link, mfu, target);
}

static int cmd_plot(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(usage_plot, stdout);
        return ISTH_OK;
    }
    const char *overrides[MAX_OVERRIDES], *pos[32], *out = NULL, *size = NULL;
    const Option opts[] = {{"-o", 1, &out}, {"--size", 1, &size}};
    int n_over, n_pos;
    CHECK(parse_common(argc, argv, overrides, &n_over, pos, 32, &n_pos, opts, 2));
    if (n_over) return isth_fail(ISTH_EINPUT, "plot: --set does not apply");
    if (!n_pos) return isth_fail(ISTH_EINPUT, "plot: no RUN_DIR given (see isthmus plot --help)");
    if (!out) return isth_fail(ISTH_EINPUT, "plot: no -o FILE.png given");
    int w = 1600, h = 1000;
    char tail;
    if (size && (sscanf(size, "%dx%d%c", &w, &h, &tail) != 2))
        return isth_fail(ISTH_EINPUT, "plot: --size '%s': WIDTHxHEIGHT in pixels", size);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank == 0 ? plot_runs(pos, n_pos, out, w, h) : ISTH_OK;
}

int main(int argc, char **argv)
{
    /* Blocks under 32 MiB (glibc's largest threshold on 64-bit) come from
     * the heap and are reused: HDF5 allocates and frees a buffer per chunk
     * it filters, and fresh mappings would be faulted in again for every
     * chunk. Setting it fixes the threshold (no dynamic adjustment), so the
     * heap's top is kept up to 128 MiB instead of trimmed after each chunk;
     * the model's own buffers are larger and still mapped. */
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) || !mallopt(M_TRIM_THRESHOLD, 128 << 20))
        fprintf(stderr, "isthmus: warning: mallopt refused the heap settings (checkpoints may be slower)\n");
    blas_select_reexec(argv);
    /* MPI-IO through ROMIO unless the user chose: OMPIO prints its own lines
     * on a failed write (a full disk), ROMIO returns the error to HDF5 */
    setenv("OMPI_MCA_io", "romio321", 0);
    /* the federated launch: a leader's accept or connect gives up after
     * this many seconds and is tried again (federation.c), where Open
     * MPI's default would wait forever (values under 3 are not honoured) */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--site")) setenv("OMPI_MCA_pmix_base_exchange_timeout", "3", 0);
    /* the link's pieces ([outer] piece_bytes, 256 KiB by default) go over
     * TCP at once into the receive posted for them: above the eager limit
     * (64 KiB by default) each would first wait a round trip of the link
     * and the receiver's next MPI call for its rendezvous (docs/planner.md,
     * measured in docs/results/the-wan.md). Every process of a run sets the same. */
    setenv("OMPI_MCA_btl_tcp_eager_limit", "524288", 0);
    setenv("OMPI_MCA_btl_tcp_rndv_eager_limit", "524288", 0);
    /* a write to the socket of a peer that died must come back as an error
     * to Open MPI's TCP transport, not kill this process (a lost site is
     * survivable in the federated launch; elsewhere the deadline reports it) */
    signal(SIGPIPE, SIG_IGN);
    /* training may move the link's exchanges from a thread of its own
     * ([outer] progress = thread): MPI must allow calls from two threads */
    int provided;
    MPI_Init_thread(&argc, &argv, argc > 1 && !strcmp(argv[1], "train") ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE,
                    &provided);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int world_size;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    status_set_quiet(rank != 0);
    status_set_rank(rank, world_size);
    int rc = fault_mpi_errors_return(MPI_COMM_WORLD);
    if (rc != ISTH_OK) {
        /* nothing runs unless MPI errors come back as codes */
    } else if (argc < 2) {
        fputs(usage_main, stderr);
        rc = ISTH_EINPUT;
    } else if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (rank == 0)
            printf("isthmus %s\nconfigure:%s%s\nbackends: cpu%s; sentencepiece: %s\n", isthmus_build(),
                   isthmus_configure_args()[0] ? " " : " (no options)", isthmus_configure_args(),
                   HAVE_CUDA ? ", cuda" : "", tokenizer_have_sentencepiece() ? "yes" : "no (token ids)");
        rc = ISTH_OK;
    } else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (rank == 0) fputs(usage_main, stdout);
        rc = ISTH_OK;
    } else if (!strcmp(argv[1], "train")) {
        rc = cmd_train(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "eval")) {
        rc = cmd_eval(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "generate")) {
        rc = cmd_generate(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "export")) {
        rc = cmd_export(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "bench")) {
        rc = cmd_bench(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "inspect")) {
        rc = cmd_inspect(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "config")) {
        rc = cmd_config(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "plan")) {
        rc = cmd_plan(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "plot")) {
        rc = cmd_plot(argc - 2, argv + 2);
    } else if (!strcmp(argv[1], "keygen")) {
        rc = cmd_keygen(argc - 2, argv + 2);
    } else {
        rc = isth_fail(ISTH_EINPUT, "unknown command '%s' (try isthmus --help)", argv[1]);
    }
    /* a runtime failure on one rank must not leave the others waiting */
    rc = fault_end_job(rc);
    link_progress_stop();
    MPI_Finalize();
    return rc;
}
