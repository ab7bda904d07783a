/* modelfile.h — reading a model file (`isthmus train`'s model.h5, or a
 * checkpoint) for the commands that use a trained model outside training:
 * whole into host memory, every expert on this process (generate), each
 * rank of a job its share of the experts in host memory (export), or into
 * a backend's parameters, each rank its experts (eval).
 * Owns: the order of validate, config, tensors.
 * Must not: compute, or choose what to do with the model.
 */
#ifndef ISTHMUS_MODELFILE_H
#define ISTHMUS_MODELFILE_H

#include <stddef.h>

#include <mpi.h>

#include "backend.h"
#include "config.h"
#include "h5io.h"
#include "model.h"

/* Collective over comm: the first rank validates `path` (as isthmus inspect
 * does: one verdict per file), then every rank loads its config with the
 * given --set overrides applied. `origin` (cap bytes; may be NULL) gets the
 * name messages give the config, "PATH:/config". A bad file: ISTH_EINPUT,
 * one line naming it; so is a file of a split run ([outer] experts =
 * split) unless it is the run's model.h5, marked whole (every site's
 * experts): it then reads as any model, every expert routed (ROUTE_ALL). */
int modelfile_config(const char *path, const char *const *overrides, int n_overrides, Config *cfg, char *origin,
                     size_t cap, MPI_Comm comm);

/* modelfile_config for this process alone (MPI_COMM_SELF), then /model
 * into *m (created here; model_destroy frees it). */
int modelfile_load(const char *path, const char *const *overrides, int n_overrides, Config *cfg, Model *m,
                   H5Meta *meta);

/* Collective over comm: modelfile_config (no overrides), then /model into
 * *m on each rank: every dense tensor and its share of the experts, rank r
 * of R experts [r E/R, (r+1) E/R) (export). A rank count that does not
 * divide the experts: ISTH_EINPUT, `cmd` naming the command. */
int modelfile_load_shard(const char *path, Config *cfg, Model *m, H5Meta *meta, MPI_Comm comm, const char *cmd);

/* Collective over comm (the ranks of the learner `be` belongs to): /model
 * into the backend's parameters, each rank the chunks it holds, through
 * host staging one tensor at a time (stateview). The file was checked by
 * modelfile_config and `be` made from its config. */
int modelfile_read_backend(const char *path, Backend *be, H5Meta *meta, MPI_Comm comm);
/* Collective over comm (the same learner): the backend's parameters as a
 * model file at `path` (written under a temporary name, renamed when
 * complete): the dense chunks from the learner's rank 0, each expert from
 * the rank holding it; `config_text` and `meta` as h5model_create. */
int modelfile_write_backend(const char *path, Backend *be, const char *config_text, const H5Meta *meta,
                            MPI_Comm comm);

#endif
