/* cmd_model.h — the commands that use a trained model file: `eval`, `generate`, `export`: their entry points (the arguments after the command's
 * name; a status code), named by main.c's table of commands.
 * Owns: those commands (cmd_model.c).
 * Must not: start or end MPI (main.c does).
 */
#ifndef ISTHMUS_CMD_MODEL_H
#define ISTHMUS_CMD_MODEL_H

int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tune_router(int argc, char **argv);
int cmd_export(int argc, char **argv);

#endif
