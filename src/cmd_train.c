/* cmd_train.c — the commands that train: `isthmus train` and `isthmus bench`.
 *
 * Owns: their --help texts and options, checked before anything runs.
 * Must not: train or time anything itself (run.c's train_run, bench.c).
 */
#include "cmd_train.h"

#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "config.h"
#include "run.h"
#include "status.h"

static const char *const usage_train =
    "usage: isthmus train CONFIG.ini [--set section.key=value]... [--resume FILE|auto] [--site NAME]\n"
    "\n"
    "Trains the model described by CONFIG.ini ([model], [train], [data] sections).\n"
    "--set overrides or adds one key; it may be repeated. The resolved configuration\n"
    "is printed first. Rank 0 prints one line per step and appends JSON lines to\n"
    "<out_dir>/metrics.jsonl; the eval sets ([eval.NAME], or the bundled prose and\n"
    "tech of a byte model) are scored every eval_every steps and at the end; the\n"
    "final weights go to <out_dir>/model.h5.\n"
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

int cmd_train(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_train, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *resume = NULL, *site = NULL;
    const CliOption opts[] = {{"--resume", 1, &resume}, {"--site", 1, &site}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 2));
    if (n_pos != 1) return isth_fail(ISTH_EINPUT, "train: missing CONFIG.ini (see isthmus train --help)");
    Config cfg;
    CHECK(config_load(&cfg, pos[0], overrides, n_over));
    return train_run(&cfg, resume, site);
}

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

int cmd_bench(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_bench, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *values[4] = {"1,2", "5", "0", "1"};
    const CliOption opts[] = {{"--threads", 1, &values[0]},
                           {"--steps", 1, &values[1]},
                           {"--peak-tflops", 1, &values[2]},
                           {"--warmup", 1, &values[3]}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 4));
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
