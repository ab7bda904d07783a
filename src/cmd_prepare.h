/* cmd_prepare.h — the commands before a run: `config`, `plan`, `keygen`: their entry points (the arguments after the command's
 * name; a status code), named by main.c's table of commands.
 * Owns: those commands (cmd_prepare.c).
 * Must not: start or end MPI (main.c does).
 */
#ifndef ISTHMUS_CMD_PREPARE_H
#define ISTHMUS_CMD_PREPARE_H

int cmd_config(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_keygen(int argc, char **argv);

#endif
