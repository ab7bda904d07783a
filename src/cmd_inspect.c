/* cmd_inspect.c — the commands that look at what a run wrote: `isthmus
 * inspect` (a checkpoint's or model file's contents and validity) and
 * `isthmus plot` (charts of runs' metrics).
 *
 * Owns: their --help texts and options.
 * Must not: read the files itself (ckpt_validate.c, plot.c).
 */
#include "cmd_inspect.h"

#include "cli.h"

#include <mpi.h>
#include <stdio.h>

#include "ckpt_validate.h"
#include "plot.h"
#include "status.h"

static const char *const usage_inspect =
    "usage: isthmus inspect FILE\n"
    "\n"
    "Prints the attributes (format version, step, tokens, site, mode, ...) and every\n"
    "dataset with its shape of a checkpoint or model file, then reads every dataset\n"
    "(fletcher32 checksums verified) and prints a verdict. Exit status 0 when valid,\n"
    "2 when the file is missing, truncated, corrupted or of another format version.\n";

int cmd_inspect(int argc, char **argv)
{
    const char *path;
    CHECK(cli_one_file(argc, argv, "inspect", usage_inspect, &path));
    return path ? ckpt_inspect(path) : ISTH_OK;
}

static const char *const usage_plot =
    "usage: isthmus plot RUN_DIR... -o FILE.png [--size WIDTHxHEIGHT]\n"
    "\n"
    "Draws four panels from each RUN_DIR/metrics.jsonl (an out_dir of isthmus train):\n"
    "bits per byte on the first two eval sets (prose and tech unless [eval.NAME]\n"
    "sections name others) and training loss against tokens,\n"
    "and the cumulative inter-site bytes against steps (log scale), one line per run,\n"
    "labelled with the directory's name, mode and codec; the training loss of the\n"
    "other sites of a multi-site run too, from their summaries (site_step records).\n"
    "Needs gnuplot (Debian's gnuplot-nox). Default size 1600x1000. The PNG is written\n"
    "under FILE.png.tmp and renamed when complete.\n";

int cmd_plot(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_plot, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[32], *out = NULL, *size = NULL;
    const CliOption opts[] = {{"-o", 1, &out}, {"--size", 1, &size}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 32, &n_pos, opts, 2));
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
