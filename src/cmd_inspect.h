/* cmd_inspect.h — the commands that look at what a run wrote: `inspect`, `plot`: their entry points (the arguments after the command's
 * name; a status code), named by main.c's table of commands.
 * Owns: those commands (cmd_inspect.c).
 * Must not: start or end MPI (main.c does).
 */
#ifndef ISTHMUS_CMD_INSPECT_H
#define ISTHMUS_CMD_INSPECT_H

int cmd_inspect(int argc, char **argv);
int cmd_plot(int argc, char **argv);

#endif
