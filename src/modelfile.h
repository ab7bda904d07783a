/* modelfile.h — a model file (`isthmus train`'s model.h5, or a checkpoint)
 * read whole into host memory, every expert on this process: what the
 * commands that use a trained model outside training (generate, export)
 * start from.
 * Owns: the order of validate, config, tensors.
 * Must not: compute, or choose what to do with the model.
 */
#ifndef ISTHMUS_MODELFILE_H
#define ISTHMUS_MODELFILE_H

#include "config.h"
#include "h5io.h"
#include "model.h"

/* Validate `path` (as isthmus inspect does), load its config (with the
 * given --set overrides applied), and read /model into *m (created here;
 * model_destroy frees it). This process alone (MPI_COMM_SELF). A bad file:
 * ISTH_EINPUT, one line naming it. */
int modelfile_load(const char *path, const char *const *overrides, int n_overrides, Config *cfg, Model *m,
                   H5Meta *meta);

#endif
