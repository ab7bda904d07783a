/* h5io.h — HDF5 files of model-shaped tensors, written and read with
 * parallel HDF5 (MPI-IO), one collective file per call sequence.
 *
 * Owns: the on-disk layout. A "model-shaped group" (e.g. /model,
 * /inner/m, /outer/momentum) holds one float32 dataset per tensor of the
 * model table with its canonical (layout-independent) shape — layers
 * stacked on axis 0, all experts on axis 1 of the expert tensors — chunked
 * per layer (and per expert) with the fletcher32 checksum filter, so a
 * damaged chunk is detected when read. Each rank writes and reads only the
 * canonical chunks a selection function gives it; a reader with a different
 * layout simply selects other chunks. Files are written under
 * "<path>.tmp" and renamed when every rank has closed them.
 * Must not: decide what to write or when.
 */
#ifndef ISTHMUS_H5IO_H
#define ISTHMUS_H5IO_H

#include <hdf5.h>
#include <mpi.h>

#include "config.h"
#include "model.h"

#define H5IO_FORMAT_VERSION 3

/* About how many bytes a file of `groups` model-shaped groups of `params`
 * float32 values takes: the values, fletcher32 and chunk indexes (~2%), and
 * 256 kB of attributes and metadata. */
#define H5IO_FILE_BYTES(params, groups) ((double)(params) * 4.0 * (groups) * 1.02 + 256e3)

typedef struct {
    hid_t file, xfer;
    MPI_Comm comm;
    int rank;
    char path[CONFIG_FILE_PATH_MAX], tmp[CONFIG_FILE_PATH_MAX + 16];
    int failed;
    const char *label;  /* set by the reader ("checkpoint"): damaged values read as "LABEL PATH: invalid: ..." */
    int damaged;        /* a value read failed its checksum or was not finite */
} H5File;

/* NULL when path is a regular file this process can open, else why not
 * (checked without blocking: a FIFO is refused, not waited on). */
const char *h5_not_readable(const char *path);

/* Create "<path>.tmp" collectively. `expect_bytes`: about how large the
 * file will be; when the disk has less free space than that, nothing is
 * created and the error names both (a write that runs out of space inside
 * parallel HDF5 cannot be recovered from on every rank). */
int h5_create(H5File *f, const char *path, double expect_bytes, MPI_Comm comm);
/* Close; when every rank succeeded, rank 0 renames to the final path. */
int h5_commit(H5File *f);
/* Close without renaming and remove the temporary file. */
void h5_abandon(H5File *f);
/* Open an existing file collectively (read-only). */
int h5_open(H5File *f, const char *path, MPI_Comm comm);
void h5_close(H5File *f);

/* Root (or group) attributes. */
int h5_attr_write_string(H5File *f, const char *obj, const char *name, const char *value);
int h5_attr_write_double(H5File *f, const char *obj, const char *name, double value);
int h5_attr_write_long(H5File *f, const char *obj, const char *name, long long value);
int h5_attr_read_long(H5File *f, const char *obj, const char *name, long long *value);
int h5_attr_read_double(H5File *f, const char *obj, const char *name, double *value);
/* malloc'd string */
int h5_attr_read_string(H5File *f, const char *obj, const char *name, char **value);

/* Collective over comm: a small dataset of doubles (n), written by rank 0. */
int h5_write_doubles(H5File *f, const char *name, const double *v, int n);
int h5_read_doubles(H5File *f, const char *name, double *v, int n);

/* Collective: create group `group` with every tensor and write (read) the
 * chunks through a view: where chunk (tensor, layer, expert; expert -1 for
 * a dense chunk, layer 0 for embed and final_norm) is on this rank, NULL
 * when another rank transfers it (any layout: packed owned chunks, a
 * staged tensor). Reading: missing datasets, shape mismatches and checksum
 * failures are ISTH_EINPUT naming the file and dataset. Staging is one layer's chunks at most,
 * none when a layer's chunks lie one after the other. */
typedef float *(*ChunkAt)(void *ctx, int tensor, int layer, int expert);
int h5_write_chunks(H5File *f, const char *group, const Model *m, ChunkAt at, void *ctx);
int h5_read_chunks(H5File *f, const char *group, const Model *m, ChunkAt at, void *ctx);

/* --- the model file of `isthmus train` (/model + config) ------------------ */
typedef struct {
    long step;
    double tokens;
    int data_width;  /* bytes per token of the training data: 1 raw bytes, 2 or 4 a shard; 0 not recorded */
    int experts_whole; /* a split run's model file holding every site's experts (attribute experts_whole = 1) */
} H5Meta;

/* Collective over comm: create the model file at `path` (temporary name
 * until h5_commit) with the config and meta; the caller writes /model
 * with h5_write_chunks (every chunk from exactly one rank of comm) and
 * commits (marking it failed first removes it). On an error nothing is
 * left to commit. */
int h5model_create(H5File *f, const char *path, const Model *m, const char *config_text, const H5Meta *meta,
                   MPI_Comm comm);
/* The resolved config text stored in a model or checkpoint file, and
 * (experts_whole, may be NULL) whether it is a model file (no checkpoint's
 * `mode`) marked experts_whole = 1: a split run's whole model. */
int h5model_read_config(const char *path, char **config_text, int *experts_whole, MPI_Comm comm);
/* /model through the view `at` (each rank the chunks it holds: every
 * dense chunk and its experts'). */
int h5model_read(const char *path, const Model *m, ChunkAt at, void *ctx, H5Meta *meta, MPI_Comm comm);

#endif
