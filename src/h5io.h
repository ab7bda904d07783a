/* h5io.h — HDF5 files of model tensors, written and read with parallel HDF5.
 *
 * Owns: the on-disk layout. Every tensor of the model table is a float32
 * dataset with its canonical (layout-independent) shape — layers stacked on
 * axis 0, all experts on axis 1 of the expert tensors — chunked per layer
 * (and per expert) with the fletcher32 checksum filter. Each rank writes and
 * reads only its own hyperslab: its experts, and the replicated tensors if it
 * is the designated writer. Files are written under "<path>.tmp" and renamed
 * when complete, so a reader never sees a half-written file.
 * Must not: decide when to write or what the run does with what it reads.
 *
 * Root attributes: format_version (int), config (the resolved INI text),
 * step (int64), tokens (double).
 */
#ifndef ISTHMUS_H5IO_H
#define ISTHMUS_H5IO_H

#include <mpi.h>

#include "model.h"

#define H5IO_FORMAT_VERSION 1

typedef struct {
    long step;
    double tokens;
} H5Meta;

/* Collective over `comm`. `writes_replicated`: this rank writes the
 * replicated tensors (exactly one rank per file should). */
int h5model_write(const char *path, const Model *m, const char *config_text, const H5Meta *meta,
                  MPI_Comm comm, int writes_replicated);

/* Read the resolved config text stored in a model file (malloc'd). */
int h5model_read_config(const char *path, char **config_text, MPI_Comm comm);

/* Read all tensors into m (already created with the file's model shape):
 * each rank reads its experts and every replicated tensor. Shape mismatches
 * and checksum failures are ISTH_EINPUT naming the file and dataset. */
int h5model_read(const char *path, Model *m, H5Meta *meta, MPI_Comm comm);

#endif
