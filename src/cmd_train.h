/* cmd_train.h — the commands that train: `isthmus train` and `isthmus bench`: their entry points (the arguments after the command's
 * name; a status code), named by main.c's table of commands.
 * Owns: those commands (cmd_train.c).
 * Must not: start or end MPI (main.c does).
 */
#ifndef ISTHMUS_CMD_TRAIN_H
#define ISTHMUS_CMD_TRAIN_H

int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
