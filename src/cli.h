/* cli.h — what the subcommands of `isthmus` share: the grammar of their
 * arguments (main.c's table of commands names their entry points, each
 * declared by its cmd_*.h).
 *
 * Owns: parsing a command's arguments (--set overrides, the command's own
 * options, positional arguments, --help anywhere) and the one-line
 * messages that refuse them (exit status 2).
 * Must not: start MPI, or know what a command does with its arguments.
 */
#ifndef ISTHMUS_CLI_H
#define ISTHMUS_CLI_H

/* The most --set options one command takes (a fixed array on its stack). */
#define CLI_MAX_OVERRIDES 256

/* A command's own option: `--name VALUE`, `--name=VALUE`, or a flag. */
typedef struct {
    const char *name;
    int takes_value;
    const char **value; /* set to the value, or "1" for a flag */
} CliOption;

/* Is --help or -h among the arguments? */
int cli_wants_help(int argc, char **argv);

/* Collect --set options into overrides (at most CLI_MAX_OVERRIDES) and the
 * command's own options; positional arguments (at most max_pos) into pos.
 * An unknown option or one positional argument too many: ISTH_EINPUT. */
int cli_parse(int argc, char **argv, const char **overrides, int *n_overrides, const char **pos, int max_pos,
              int *n_pos, const CliOption *opts, int n_opts);

/* The one FILE argument of `cmd` (no --set): *path, or NULL when --help
 * was asked for (usage printed). */
int cli_one_file(int argc, char **argv, const char *cmd, const char *usage, const char **path);

/* A number option: the whole text a number in [lo, hi] (integer: whole). */
int cli_number(const char *name, const char *text, double lo, double hi, int integer, double *out);

#endif
