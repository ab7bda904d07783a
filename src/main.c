/* main.c — the `isthmus` command line: the table of subcommands and the
 * process around them.
 *
 * Owns: the table of commands (name, entry point, the line of the main
 * usage), the main --help and --version, MPI start-up and shutdown, the
 * process settings made before MPI starts (heap thresholds, Open MPI
 * defaults, SIGPIPE), and the mapping from status codes to exit codes
 * (0 ok, 1 runtime failure, 2 bad input, 3 a federated site dropped from
 * a live run).
 * Must not: parse a command's arguments (cli.c) or contain training,
 * evaluation or file-format logic (the cmd_*.c modules call into them).
 */
#include <malloc.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autoconf.h"
#include "cli.h"
#include "cmd_inspect.h"
#include "cmd_model.h"
#include "cmd_prepare.h"
#include "cmd_train.h"
#include "cpu/blas_select.h"
#include "fault.h"
#include "link.h"
#include "status.h"
#include "tokenizer.h"
#include "version.h"

/* One subcommand: `isthmus NAME ARGS...` calls run(argc, argv) with the
 * arguments after NAME. `synopsis` and `help` are its line in the main
 * usage; `threads` the MPI thread support it needs (training may move the
 * link's exchanges from a thread of its own, [outer] progress = thread:
 * MPI must allow calls from two threads). */
typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *synopsis, *help;
    int threads;
} Command;

static const Command commands[] = {
    {"train", cmd_train, "CONFIG [--set section.key=value]...", "train, evaluate, write <out_dir>/model.h5",
     MPI_THREAD_MULTIPLE},
    {"eval", cmd_eval, "--model FILE [--set ...]...", "bits per byte and loss per token on the eval sets", MPI_THREAD_SINGLE},
    {"tune-router", cmd_tune_router, "--model FILE -o OUT --steps N", "train the router alone over every expert",
     MPI_THREAD_SINGLE},
    {"generate", cmd_generate, "--model FILE [--prompt TEXT]", "sample a continuation (KV cache, this process)",
     MPI_THREAD_SINGLE},
    {"export", cmd_export, "--model FILE -o DIR", "model.safetensors + config.json (PyTorch: python/)",
     MPI_THREAD_SINGLE},
    {"bench", cmd_bench, "CONFIG [--threads 1,2] [--steps N]", "training-step throughput and GFLOP/s",
     MPI_THREAD_SINGLE},
    {"config", cmd_config, "[CONFIG] [--set ...]... [--keys]", "print the resolved configuration", MPI_THREAD_SINGLE},
    {"inspect", cmd_inspect, "FILE", "attributes, datasets and validity of a checkpoint", MPI_THREAD_SINGLE},
    {"plan", cmd_plan, "CONFIG --site NAME:GPU:N... --link RATE,RTT", "what a run would achieve on those sites",
     MPI_THREAD_SINGLE},
    {"plot", cmd_plot, "RUN_DIR... -o FILE.png", "charts of runs' metrics (gnuplot)", MPI_THREAD_SINGLE},
    {"keygen", cmd_keygen, "FILE", "a new run key (mode 0600) for [outer] key_file", MPI_THREAD_SINGLE},
};
#define N_COMMANDS ((int)(sizeof commands / sizeof *commands))

/* The command named `name`, NULL when there is none. */
static const Command *find_command(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

/* The main usage: the table's lines between a head and a tail. */
static void print_usage(FILE *out)
{
    fputs("usage: isthmus <command> [options]\n"
          "\n"
          "Train a mixture-of-experts language model on bytes or token shards, on one site or\n"
          "several (CPU or CUDA backend; MPI program).\n"
          "\n"
          "commands:\n",
          out);
    for (int i = 0; i < N_COMMANDS; i++) {
        char line[128];
        snprintf(line, sizeof line, "%s %s", commands[i].name, commands[i].synopsis);
        fprintf(out, "  %-41s   %s\n", line, commands[i].help); /* at least three spaces before the help */
    }
    fputs("\n"
          "'isthmus --version' names the build (sites of one run must run the same).\n"
          "'isthmus <command> --help' describes a command. Configuration keys: docs/configuration.md\n",
          out);
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
     * this many seconds and is tried again (knock.c), where Open
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
    /* the thread support the command needs (Command.threads) */
    int provided;
    const Command *cmd = argc > 1 ? find_command(argv[1]) : NULL;
    MPI_Init_thread(&argc, &argv, cmd ? cmd->threads : MPI_THREAD_SINGLE, &provided);
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
        print_usage(stderr);
        rc = ISTH_EINPUT;
    } else if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (rank == 0)
            printf("isthmus %s\nconfigure:%s%s\nbackends: cpu%s; sentencepiece: %s\n", isthmus_build(),
                   isthmus_configure_args()[0] ? " " : " (no options)", isthmus_configure_args(),
                   HAVE_CUDA ? ", cuda" : "", tokenizer_have_sentencepiece() ? "yes" : "no (token ids)");
        rc = ISTH_OK;
    } else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (rank == 0) print_usage(stdout);
        rc = ISTH_OK;
    } else if (cmd) {
        rc = cmd->run(argc - 2, argv + 2);
    } else {
        rc = isth_fail(ISTH_EINPUT, "unknown command '%s' (try isthmus --help)", argv[1]);
    }
    /* a runtime failure on one rank must not leave the others waiting */
    rc = fault_end_job(rc);
    link_progress_stop();
    if (rc != ISTH_OK) fault_exit_within(FAULT_FINALIZE_S, rc);
    MPI_Finalize();
    return rc;
}
