/* h5io.c — see h5io.h. */
#include "h5io.h"
#include "alloc.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "coll.h"
#include "fletcher.h"
#include "status.h"

/* MPI-IO hints. Each rank writes its own chunks independently, and the
 * chunks one rank writes in one call lie apart in the file: ROMIO's data
 * sieving would turn every such write into a read of the whole span (holes
 * read as zeros), a patch and a write back — measured as 40% of a rank's
 * checkpoint time. The hint is ignored by an MPI-IO without it. */
static hid_t fapl_for(MPI_Comm comm)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* errors are reported by us, by name */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "romio_ds_write", "disable");
    H5Pset_fapl_mpio(fapl, comm, info); /* HDF5 keeps its own copy */
    MPI_Info_free(&info);
    return fapl;
}

const char *h5_not_readable(const char *path)
{
    static __thread char why[256];
    /* O_NONBLOCK: a FIFO must not block; HDF5 reads only regular files */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot open: %s", strerror(errno));
        return why;
    }
    struct stat st;
    const int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
    return regular ? NULL : "not a regular file";
}

/* Free bytes on the file system holding `path`'s directory (-1: unknown). */
static double free_bytes(const char *path)
{
    char dir[CONFIG_FILE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    struct statvfs vs;
    if (statvfs(slash ? (dir[0] ? dir : "/") : ".", &vs) != 0) return -1.0;
    return (double)vs.f_bavail * (double)vs.f_frsize;
}

int h5_create(H5File *f, const char *path, double expect_bytes, MPI_Comm comm)
{
    memset(f, 0, sizeof *f);
    f->comm = comm;
    CHECK_MPI(MPI_Comm_rank(comm, &f->rank));
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path);
    int space_rc = ISTH_OK;
    if (f->rank == 0) {
        const double avail = free_bytes(path);
        if (avail >= 0 && avail < expect_bytes && !getenv("ISTHMUS_NO_SPACE_CHECK")) /* test hook */
            space_rc = isth_fail(ISTH_ERUNTIME, "file %s: needs about %.1f MB, only %.1f MB free there (disk full?); "
                                 "nothing written", path, expect_bytes / 1e6, avail / 1e6);
    }
    CHECK_MPI(MPI_Bcast(&space_rc, 1, MPI_INT, 0, comm));
    if (space_rc != ISTH_OK) return space_rc;
    fletcher_register(); /* the same checksums, faster; on failure HDF5's own filter stays */
    hid_t fapl = fapl_for(comm);
    f->file = H5Fcreate(f->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (!coll_all_ok(comm, f->file >= 0)) {
        if (f->file >= 0) H5Fclose(f->file);
        return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: cannot create (directory missing or not writable?)",
                                        f->tmp)
                            : ISTH_ERUNTIME;
    }
    f->xfer = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(f->xfer, H5FD_MPIO_COLLECTIVE); /* filtered datasets need collective I/O */
    H5Pset_dxpl_mpio_collective_opt(f->xfer, H5FD_MPIO_INDIVIDUAL_IO); /* but each rank writes its own chunks */
    return ISTH_OK;
}

/* fsync a file, or (dir) the directory holding it; 0 on success. */
static int sync_path(const char *path, int dir)
{
    char parent[CONFIG_FILE_PATH_MAX + 64];
    if (dir) {
        snprintf(parent, sizeof parent, "%s", path);
        char *slash = strrchr(parent, '/');
        if (slash) *(slash == parent ? slash + 1 : slash) = '\0';
        else snprintf(parent, sizeof parent, ".");
        path = parent;
    }
    const int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return -1;
    const int rc = fsync(fd);
    const int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

int h5_commit(H5File *f)
{
    /* flush first: a flush that fails (a full disk) leaves a file that can
     * still be abandoned cleanly, a close that fails does not */
    const int flushed = !f->failed && H5Fflush(f->file, H5F_SCOPE_LOCAL) >= 0;
    if (!coll_all_ok(f->comm, flushed)) {
        const int reported = f->failed; /* the failed write printed its line */
        h5_abandon(f);
        return reported || f->rank != 0
                   ? ISTH_ERUNTIME
                   : isth_fail(ISTH_ERUNTIME, "file %s: write failed (disk full?); the temporary file is removed", f->tmp);
    }
    H5Pclose(f->xfer);
    int ok = H5Fclose(f->file) >= 0;
    if (!coll_all_ok(f->comm, ok)) {
        if (f->rank == 0) unlink(f->tmp);
        return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: write failed (disk full?)", f->tmp) : ISTH_ERUNTIME;
    }
    /* durable before it is named: the data on disk (fsync), then the
     * rename, then the directory entry (fsync of the directory) */
    int rc = ISTH_OK;
    if (f->rank == 0 && sync_path(f->tmp, 0) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "file %s: fsync failed: %s", f->tmp, strerror(errno));
    if (f->rank == 0 && rc == ISTH_OK && rename(f->tmp, f->path) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "file %s: rename from %s failed: %s", f->path, f->tmp, strerror(errno));
    if (f->rank == 0 && rc == ISTH_OK && sync_path(f->path, 1) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "file %s: fsync of its directory failed: %s", f->path, strerror(errno));
    CHECK_MPI(MPI_Bcast(&rc, 1, MPI_INT, 0, f->comm));
    return rc;
}

void h5_abandon(H5File *f)
{
    /* A write failed, typically on a full disk. Closing flushes metadata;
     * if that fails too, HDF5 keeps the file registered and crashes when it
     * closes it again inside MPI_Finalize. So the space goes first: the
     * temporary file is truncated (its data is worthless now), and the close
     * then only needs the few kilobytes of metadata. */
    H5Pclose(f->xfer);
    MPI_Barrier(f->comm); /* nobody is writing any more */
    if (f->rank == 0) {
        const int truncated = truncate(f->tmp, 0); /* a failure leaves the close to try as it is */
        (void)truncated;
    }
    MPI_Barrier(f->comm);
    H5Fclose(f->file);
    MPI_Barrier(f->comm);
    if (f->rank == 0) unlink(f->tmp);
}

int h5_open(H5File *f, const char *path, MPI_Comm comm)
{
    memset(f, 0, sizeof *f);
    f->comm = comm;
    MPI_Comm_rank(comm, &f->rank);
    snprintf(f->path, sizeof f->path, "%s", path);
    const char *why = h5_not_readable(path);
    if (!coll_all_ok(comm, why == NULL)) /* agreed before the collective open */
        return why ? isth_fail(ISTH_EINPUT, "file %s: %s", path, why) : ISTH_EINPUT;
    fletcher_register();
    hid_t fapl = fapl_for(comm);
    f->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (!coll_all_ok(comm, f->file >= 0)) {
        if (f->file >= 0) H5Fclose(f->file);
        return isth_fail(ISTH_EINPUT, "file %s: not a readable HDF5 file (truncated or corrupt?)", path);
    }
    f->xfer = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(f->xfer, H5FD_MPIO_COLLECTIVE);
    return ISTH_OK;
}

void h5_close(H5File *f)
{
    if (f->xfer > 0) H5Pclose(f->xfer);
    if (f->file > 0) H5Fclose(f->file);
    f->file = f->xfer = 0;
}

static int write_attr(H5File *f, const char *obj, const char *name, hid_t type, const void *value)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate_by_name(f->file, obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t err = attr < 0 ? -1 : H5Awrite(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    if (!coll_all_ok(f->comm, err >= 0)) { /* agreed: no rank goes on into the next collective alone */
        f->failed = 1;
        return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: cannot write attribute %s of %s", f->tmp, name, obj)
                            : ISTH_ERUNTIME;
    }
    return ISTH_OK;
}

int h5_attr_write_string(H5File *f, const char *obj, const char *name, const char *value)
{
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(value) + 1);
    int rc = write_attr(f, obj, name, type, value);
    H5Tclose(type);
    return rc;
}

int h5_attr_write_double(H5File *f, const char *obj, const char *name, double value)
{
    return write_attr(f, obj, name, H5T_NATIVE_DOUBLE, &value);
}

int h5_attr_write_long(H5File *f, const char *obj, const char *name, long long value)
{
    return write_attr(f, obj, name, H5T_NATIVE_LLONG, &value);
}

static int read_attr(H5File *f, const char *obj, const char *name, hid_t type, void *value)
{
    hid_t attr = H5Aopen_by_name(f->file, obj, name, H5P_DEFAULT, H5P_DEFAULT);
    herr_t err = attr < 0 ? -1 : H5Aread(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    if (err < 0) return isth_fail(ISTH_EINPUT, "file %s: missing or unreadable attribute %s", f->path, name);
    return ISTH_OK;
}

int h5_attr_read_long(H5File *f, const char *obj, const char *name, long long *value)
{
    return read_attr(f, obj, name, H5T_NATIVE_LLONG, value);
}

int h5_attr_read_double(H5File *f, const char *obj, const char *name, double *value)
{
    return read_attr(f, obj, name, H5T_NATIVE_DOUBLE, value);
}

int h5_attr_read_string(H5File *f, const char *obj, const char *name, char **value)
{
    *value = NULL;
    hid_t attr = H5Aopen_by_name(f->file, obj, name, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0) return isth_fail(ISTH_EINPUT, "file %s: missing attribute %s", f->path, name);
    hid_t type = H5Aget_type(attr);
    size_t size = H5Tget_size(type);
    char *text = isth_calloc(size + 1, 1);
    herr_t err = text ? H5Aread(attr, type, text) : -1;
    H5Tclose(type);
    H5Aclose(attr);
    if (err < 0) {
        isth_free(text);
        return isth_fail(ISTH_EINPUT, "file %s: unreadable attribute %s", f->path, name);
    }
    *value = text;
    return ISTH_OK;
}

/* Chunks of tensor t in canonical order: (layer, expert). */
static int n_layers(const Model *m, const Tensor *t) { return (t->flags & PARAM_LAYERED) ? m->cfg.layers : 1; }

static void chunk_slab(const Tensor *t, int layer, int expert, hsize_t *start, hsize_t *count)
{
    for (int d = 0; d < t->ndim; d++) {
        start[d] = 0;
        count[d] = t->shape[d];
    }
    if (t->flags & PARAM_LAYERED) {
        start[0] = (hsize_t)layer;
        count[0] = 1;
    }
    if (t->flags & PARAM_EXPERT) {
        start[1] = (hsize_t)expert;
        count[1] = 1;
    }
}

static size_t chunk_elems(const Tensor *t)
{
    size_t n = tensor_canonical_numel(t);
    if (t->flags & PARAM_LAYERED) n /= t->shape[0];
    if (t->flags & PARAM_EXPERT) n /= t->shape[1];
    return n;
}

/* The chunks of layer `layer` of tensor t this rank transfers: the file
 * selection, and where the values are in memory. When the chunks lie one
 * after the other in memory (params-shaped and packed buffers alike) they
 * are transferred in place; otherwise through *tmp (grown as needed).
 * Returns the number of elements (0: none), or (size_t)-1 out of memory. */
static size_t select_layer(const Model *m, const Tensor *t, int layer, hid_t fspace, ChunkAt at, void *ctx,
                           float ***ptrs, float **mem, float **tmp, size_t *tmp_cap, hid_t *mspace)
{
    H5Sselect_none(fspace);
    const int experts = (t->flags & PARAM_EXPERT) ? m->cfg.experts : 0;
    const size_t per = chunk_elems(t);
    const int tid = (int)(t - m->tensors);
    size_t n = 0;
    int k = 0, contiguous = 1, first = -1, last = -2, gaps = 0;
    float **p = *ptrs;
    for (int e = experts ? 0 : -1; e < (experts ? experts : 0); e++) {
        float *where = at(ctx, tid, layer, e);
        if (!where) continue;
        if (first < 0) first = e;
        else if (e != last + 1) gaps = 1;
        last = e;
        if (k && where != p[k - 1] + per) contiguous = 0;
        p[k++] = where;
        n += per;
    }
    if (!n) return 0;
    hsize_t start[TENSOR_MAX_DIMS], count[TENSOR_MAX_DIMS];
    if (!gaps) {
        /* one hyperslab, and a memory space of the same shape: HDF5 then
         * maps whole chunks instead of iterating element by element */
        chunk_slab(t, layer, first, start, count);
        if (experts) count[1] = (hsize_t)(last - first + 1);
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
        *mspace = H5Screate_simple(t->ndim, count, NULL);
    } else {
        for (int i = 0, e = 0; i < k; e++) {
            if (!at(ctx, tid, layer, e)) continue;
            chunk_slab(t, layer, e, start, count);
            H5Sselect_hyperslab(fspace, H5S_SELECT_OR, start, NULL, count, NULL);
            i++;
        }
        hsize_t flat = n;
        *mspace = H5Screate_simple(1, &flat, NULL);
    }
    if (contiguous) {
        *mem = p[0];
        return n;
    }
    if (n > *tmp_cap) {
        float *grown = isth_realloc(*tmp, sizeof(float) * n);
        if (!grown) return (size_t)-1;
        *tmp = grown;
        *tmp_cap = n;
    }
    *mem = *tmp;
    return n;
}

/* An expert tensor whose selected chunks are every layer of one contiguous
 * range of experts, lying one after the other in memory in (layer, expert)
 * order (a params-shaped buffer; packed state with one fragment): one
 * hyperslab for the whole tensor and a memory space of its shape, in place.
 * Returns the elements selected (0: none), or (size_t)-1 when the
 * selection is not such a block. */
static size_t select_whole(const Model *m, const Tensor *t, hid_t fspace, ChunkAt at, void *ctx, float **mem,
                           hid_t *mspace)
{
    if (!(t->flags & PARAM_EXPERT) || !(t->flags & PARAM_LAYERED)) return (size_t)-1;
    const int E = m->cfg.experts, L = n_layers(m, t), tid = (int)(t - m->tensors);
    const size_t per = chunk_elems(t);
    int first = -1, count = 0;
    float *base = NULL;
    for (int l = 0; l < L; l++) {
        int in_layer = 0, layer_first = -1;
        for (int e = 0; e < E; e++) {
            float *where = at(ctx, tid, l, e);
            if (!where) continue;
            if (layer_first < 0) layer_first = e;
            if (e != layer_first + in_layer) return (size_t)-1; /* a gap */
            if (!base) base = where;
            /* expert k of the range in layer l sits at base + (l * count + k) * per */
            const size_t k = (size_t)in_layer, expect = l == 0 ? k * per : ((size_t)l * (size_t)count + k) * per;
            if (where != base + expect) return (size_t)-1;
            in_layer++;
        }
        if (l == 0) {
            first = layer_first;
            count = in_layer;
        } else if (in_layer != count || (count && layer_first != first)) {
            return (size_t)-1;
        }
    }
    H5Sselect_none(fspace);
    if (!count) return 0;
    hsize_t start[TENSOR_MAX_DIMS], cnt[TENSOR_MAX_DIMS];
    chunk_slab(t, 0, first, start, cnt);
    cnt[0] = (hsize_t)L;
    cnt[1] = (hsize_t)count;
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, cnt, NULL);
    *mspace = H5Screate_simple(t->ndim, cnt, NULL);
    *mem = base;
    return (size_t)L * (size_t)count * per;
}

/* Copy between the chunks and tmp (dir > 0: chunks -> tmp). */
static void pack_layer(float **ptrs, size_t n, size_t per, float *mem, int dir)
{
    if (mem == ptrs[0]) return; /* in place */
    for (size_t i = 0; i * per < n; i++) {
        if (dir > 0) memcpy(mem + i * per, ptrs[i], per * sizeof(float));
        else memcpy(ptrs[i], mem + i * per, per * sizeof(float));
    }
}

/* How a tensor's chunks move: one collective call for an expert tensor
 * held as one block (no staging), else one per layer (staging: one layer's
 * chunks). The choice is agreed over the file's ranks, so every rank makes
 * the same calls; the agreement is advisory (an MPI failure in it reads as
 * "per layer", and the collective transfers that follow report it). */
typedef struct {
    int calls, one_call;
    size_t whole;
    float *whole_mem;
    hid_t whole_space;
} TensorCalls;

static void plan_calls(H5File *f, const Model *m, const Tensor *t, hid_t fspace, ChunkAt at, void *ctx,
                       TensorCalls *c)
{
    c->whole_mem = NULL;
    c->whole_space = -1;
    c->whole = select_whole(m, t, fspace, at, ctx, &c->whole_mem, &c->whole_space);
    c->one_call = coll_all_ok(f->comm, c->whole != (size_t)-1);
    if (!c->one_call && c->whole_space >= 0) H5Sclose(c->whole_space);
    c->calls = c->one_call ? 1 : n_layers(m, t);
}

/* The selection of call l (layer l, or the whole tensor): elements (0: an
 * empty memory space, this rank transfers nothing), or (size_t)-1 out of
 * memory. */
static size_t select_call(const TensorCalls *c, int l, const Model *m, const Tensor *t, hid_t fspace, ChunkAt at,
                          void *ctx, float ***ptrs, float **mem, float **tmp, size_t *tmp_cap, hid_t *mspace)
{
    size_t n;
    if (c->one_call) {
        *mem = c->whole_mem;
        *mspace = c->whole_space;
        n = c->whole;
    } else {
        *mem = NULL;
        *mspace = -1;
        n = select_layer(m, t, l, fspace, at, ctx, ptrs, mem, tmp, tmp_cap, mspace);
    }
    if (n == 0) {
        hsize_t one = 1;
        *mspace = H5Screate_simple(1, &one, NULL);
        H5Sselect_none(*mspace);
    }
    return n;
}

/* Which way a transfer goes (the sign is pack_layer's direction). */
typedef enum { TO_FILE = 1, FROM_FILE = -1 } Direction;

/* Writing: tensor t's dataset created in group g (chunked per layer and
 * expert, fletcher32), and its file space. Agreed over the file's ranks:
 * nobody enters the collective write alone; on failure the file is marked
 * failed and its first rank says so. */
static int create_dataset(H5File *f, hid_t g, const char *name, const Tensor *t, hid_t *dset, hid_t *fspace)
{
    hsize_t dims[TENSOR_MAX_DIMS], chunk[TENSOR_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) dims[d] = chunk[d] = t->shape[d];
    if (t->flags & PARAM_LAYERED) chunk[0] = 1;
    if (t->flags & PARAM_EXPERT) chunk[1] = 1;
    *fspace = H5Screate_simple(t->ndim, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, t->ndim, chunk);
    H5Pset_fletcher32(dcpl);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER); /* every chunk is written: no fill pass */
    *dset = H5Dcreate2(g, t->name, H5T_NATIVE_FLOAT, *fspace, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    if (coll_all_ok(f->comm, *dset >= 0)) return ISTH_OK;
    if (*dset >= 0) H5Dclose(*dset);
    H5Sclose(*fspace);
    f->failed = 1;
    return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: cannot create %s (disk full?)", f->tmp, name)
                        : ISTH_ERUNTIME;
}

/* Reading: dataset `name` (GROUP/TENSOR) opened and its file space, agreed
 * over the file's ranks to exist with tensor t's canonical shape in
 * float32; otherwise ISTH_EINPUT naming the file and dataset. */
static int open_dataset(H5File *f, const char *group, const char *name, const Tensor *t, hid_t *dset, hid_t *fspace)
{
    *dset = H5Lexists(f->file, group, H5P_DEFAULT) > 0 && H5Lexists(f->file, name, H5P_DEFAULT) > 0
                ? H5Dopen2(f->file, name, H5P_DEFAULT)
                : -1;
    if (!coll_all_ok(f->comm, *dset >= 0)) {
        if (*dset >= 0) H5Dclose(*dset);
        return isth_fail(ISTH_EINPUT, "file %s: missing dataset %s", f->path, name);
    }
    *fspace = H5Dget_space(*dset);
    hsize_t dims[H5S_MAX_RANK];
    int nd = H5Sget_simple_extent_ndims(*fspace), match = nd == t->ndim;
    if (match) {
        H5Sget_simple_extent_dims(*fspace, dims, NULL);
        for (int d = 0; d < nd; d++) match &= dims[d] == t->shape[d];
    }
    if (!coll_all_ok(f->comm, match)) {
        H5Sclose(*fspace);
        H5Dclose(*dset);
        return isth_fail(ISTH_EINPUT, "file %s: dataset %s has a different shape than the configured model", f->path,
                         name);
    }
    /* the dtype is part of the format: float32, nothing converted */
    hid_t type = H5Dget_type(*dset);
    const int f32 = type >= 0 && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4;
    if (type >= 0) H5Tclose(type);
    if (!coll_all_ok(f->comm, f32)) {
        H5Sclose(*fspace);
        H5Dclose(*dset);
        return isth_fail(ISTH_EINPUT, "file %s: dataset %s is not float32", f->path, name);
    }
    return ISTH_OK;
}

/* The outcome of one collective transfer (err: HDF5's; mem: the n values
 * this rank moved), agreed over the file's ranks before the next call.
 * Writing: a failed write marks the file failed, its first rank says so.
 * Reading: a checksum failure, truncated data or a value not finite marks
 * the file damaged, each rank naming what it read. */
static int transferred(H5File *f, Direction dir, herr_t err, const float *mem, size_t n, const char *name)
{
    if (dir == TO_FILE) {
        if (coll_all_ok(f->comm, err >= 0)) return ISTH_OK;
        f->failed = 1;
        return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: writing %s failed (disk full?); the temporary file "
                                        "is removed", f->tmp, name)
                            : ISTH_ERUNTIME;
    }
    if (err < 0) {
        f->damaged = 1;
        if (f->label)
            isth_fail(ISTH_EINPUT, "%s %s: invalid: dataset %s: checksum mismatch or truncated data", f->label, f->path,
                      name);
        else
            isth_fail(ISTH_EINPUT, "file %s: reading %s failed (checksum mismatch or truncated data)", f->path, name);
    }
    if (!coll_all_ok(f->comm, err >= 0)) return ISTH_EINPUT;
    size_t bad = 0;
    while (bad < n && isfinite(mem[bad])) bad++;
    if (bad < n) f->damaged = 1;
    if (coll_all_ok(f->comm, bad == n)) return ISTH_OK;
    return bad == n   ? ISTH_EINPUT
           : f->label ? isth_fail(ISTH_EINPUT, "%s %s: invalid: dataset %s holds NaN or Inf", f->label, f->path, name)
                      : isth_fail(ISTH_EINPUT, "file %s: dataset %s holds NaN or Inf (a diverged or damaged model)",
                                  f->path, name);
}

/* Every tensor of group `group` between the file and the memory the view
 * `at` gives, one way: its dataset (created in g when writing, opened and
 * checked when reading), then the calls plan_calls chose, each staged
 * (select_call, pack_layer), transferred and agreed on. Collective. */
static int transfer_chunks(H5File *f, Direction dir, hid_t g, const char *group, const Model *m, ChunkAt at,
                           void *ctx)
{
    const char *verb = dir == TO_FILE ? "writing" : "reading";
    float **ptrs = isth_malloc(sizeof(float *) * (size_t)(m->cfg.experts + 1)), *tmp = NULL;
    size_t tmp_cap = 0;
    int rc = ptrs ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "out of memory %s %s", verb, group);
    if (!coll_all_ok(f->comm, rc == ISTH_OK)) rc = ISTH_ERUNTIME;
    for (int i = 0; i < N_TENSORS && rc == ISTH_OK; i++) {
        const Tensor *t = &m->tensors[i];
        char name[300];
        snprintf(name, sizeof name, "%s/%s", group, t->name);
        hid_t dset = -1, fspace = -1;
        rc = dir == TO_FILE ? create_dataset(f, g, name, t, &dset, &fspace)
                            : open_dataset(f, group, name, t, &dset, &fspace);
        if (rc != ISTH_OK) break;
        TensorCalls calls;
        plan_calls(f, m, t, fspace, at, ctx, &calls);
        for (int l = 0; l < calls.calls && rc == ISTH_OK; l++) {
            float *mem;
            hid_t mspace;
            const size_t n = select_call(&calls, l, m, t, fspace, at, ctx, &ptrs, &mem, &tmp, &tmp_cap, &mspace);
            const int staged = n != (size_t)-1;
            if (!coll_all_ok(f->comm, staged)) {
                if (mspace >= 0) H5Sclose(mspace);
                rc = staged ? ISTH_ERUNTIME : isth_fail(ISTH_ERUNTIME, "out of memory %s %s", verb, group);
                break;
            }
            /* chunks apart in memory go through tmp: packed before a write, unpacked after a read */
            const int packed = n && !calls.one_call;
            if (packed && dir == TO_FILE) pack_layer(ptrs, n, chunk_elems(t), mem, dir);
            float dummy = 0.0f; /* a rank with nothing to move still takes part in the call */
            const herr_t err = dir == TO_FILE
                                   ? H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, f->xfer, n ? mem : &dummy)
                                   : H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, f->xfer, n ? mem : &dummy);
            H5Sclose(mspace);
            rc = transferred(f, dir, err, mem, n, name);
            if (rc == ISTH_OK && packed && dir == FROM_FILE) pack_layer(ptrs, n, chunk_elems(t), mem, dir);
        }
        H5Sclose(fspace);
        H5Dclose(dset);
    }
    isth_free(tmp);
    isth_free(ptrs);
    return rc;
}

int h5_write_chunks(H5File *f, const char *group, const Model *m, ChunkAt at, void *ctx)
{
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t g = H5Gcreate2(f->file, group, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
    if (!coll_all_ok(f->comm, g >= 0)) {
        f->failed = 1;
        if (g >= 0) H5Gclose(g);
        return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: cannot create group %s", f->tmp, group) : ISTH_ERUNTIME;
    }
    const int rc = transfer_chunks(f, TO_FILE, g, group, m, at, ctx);
    H5Gclose(g);
    return rc;
}

int h5_read_chunks(H5File *f, const char *group, const Model *m, ChunkAt at, void *ctx)
{
    return transfer_chunks(f, FROM_FILE, -1, group, m, at, ctx);
}

int h5_write_doubles(H5File *f, const char *name, const double *v, int n)
{
    hsize_t dim = (hsize_t)n;
    hid_t space = H5Screate_simple(1, &dim, NULL);
    hid_t dset = H5Dcreate2(f->file, name, H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t mspace = H5Screate_simple(1, &dim, NULL);
    if (f->rank != 0) {
        H5Sselect_none(space);
        H5Sselect_none(mspace);
    }
    herr_t err = dset < 0 ? -1 : H5Dwrite(dset, H5T_NATIVE_DOUBLE, mspace, space, f->xfer, v);
    H5Sclose(mspace);
    H5Sclose(space);
    if (dset >= 0) H5Dclose(dset);
    if (!coll_all_ok(f->comm, err >= 0)) {
        f->failed = 1;
        return f->rank == 0 ? isth_fail(ISTH_ERUNTIME, "file %s: writing %s failed", f->tmp, name) : ISTH_ERUNTIME;
    }
    return ISTH_OK;
}

int h5_read_doubles(H5File *f, const char *name, double *v, int n)
{
    hid_t dset = H5Lexists(f->file, name, H5P_DEFAULT) > 0 ? H5Dopen2(f->file, name, H5P_DEFAULT) : -1;
    int ok = dset >= 0;
    if (ok) {
        hid_t space = H5Dget_space(dset);
        hsize_t dim = 0;
        H5Sget_simple_extent_dims(space, &dim, NULL);
        H5Sclose(space);
        ok = dim == (hsize_t)n;
        if (ok && H5Dread(dset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, f->xfer, v) < 0) ok = 0, f->damaged = 1;
        for (int i = 0; ok && i < n; i++)
            if (!isfinite(v[i])) ok = 0, f->damaged = 1;
        H5Dclose(dset);
    }
    if (!coll_all_ok(f->comm, ok))
        return f->label ? isth_fail(ISTH_EINPUT, "%s %s: invalid: dataset %s missing or damaged", f->label, f->path, name)
                        : isth_fail(ISTH_EINPUT, "file %s: missing or damaged dataset %s", f->path, name);
    return ISTH_OK;
}

/* ---- model file ---------------------------------------------------------- */

int h5model_create(H5File *f, const char *path, const Model *m, const char *config_text, const H5Meta *meta,
                   MPI_Comm comm)
{
    CHECK(h5_create(f, path, H5IO_FILE_BYTES(model_total_params(&m->cfg), 1), comm));
    int rc = h5_attr_write_long(f, "/", "format_version", H5IO_FORMAT_VERSION);
    if (rc == ISTH_OK) rc = h5_attr_write_string(f, "/", "config", config_text);
    if (rc == ISTH_OK) rc = h5_attr_write_long(f, "/", "step", meta->step);
    if (rc == ISTH_OK) rc = h5_attr_write_double(f, "/", "tokens", meta->tokens);
    if (rc == ISTH_OK && meta->data_width) rc = h5_attr_write_long(f, "/", "data_width", meta->data_width);
    if (rc == ISTH_OK && meta->experts_whole) rc = h5_attr_write_long(f, "/", "experts_whole", 1);
    if (rc != ISTH_OK) { /* the temporary file goes */
        f->failed = 1;
        h5_commit(f);
    }
    return rc;
}

static int check_version(H5File *f)
{
    long long version = 0;
    CHECK(h5_attr_read_long(f, "/", "format_version", &version));
    if (version != H5IO_FORMAT_VERSION)
        return isth_fail(ISTH_EINPUT, "file %s: format_version %lld, this build reads %d", f->path, version,
                         H5IO_FORMAT_VERSION);
    return ISTH_OK;
}

/* experts_whole = 1 on a file without a checkpoint's `mode` */
static int read_whole(H5File *f, int *whole)
{
    long long v = 0;
    *whole = 0;
    if (H5Aexists_by_name(f->file, "/", "mode", H5P_DEFAULT) > 0 ||
        H5Aexists_by_name(f->file, "/", "experts_whole", H5P_DEFAULT) <= 0)
        return ISTH_OK;
    CHECK(h5_attr_read_long(f, "/", "experts_whole", &v));
    *whole = v == 1;
    return ISTH_OK;
}

int h5model_read_config(const char *path, char **config_text, int *experts_whole, MPI_Comm comm)
{
    H5File f;
    CHECK(h5_open(&f, path, comm));
    int rc = check_version(&f);
    if (rc == ISTH_OK) rc = h5_attr_read_string(&f, "/", "config", config_text);
    if (rc == ISTH_OK && experts_whole) rc = read_whole(&f, experts_whole);
    h5_close(&f);
    return rc;
}

int h5model_read(const char *path, const Model *m, ChunkAt at, void *ctx, H5Meta *meta, MPI_Comm comm)
{
    H5File f;
    CHECK(h5_open(&f, path, comm));
    long long step = 0;
    int rc = check_version(&f);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "step", &step);
    meta->step = (long)step;
    meta->tokens = 0;
    if (rc == ISTH_OK) rc = h5_attr_read_double(&f, "/", "tokens", &meta->tokens);
    /* the training data's kind (files before it was recorded: not known) */
    long long width = 0;
    meta->data_width = 0;
    if (rc == ISTH_OK && H5Aexists_by_name(f.file, "/", "data_width", H5P_DEFAULT) > 0 &&
        (rc = h5_attr_read_long(&f, "/", "data_width", &width)) == ISTH_OK)
        meta->data_width = (int)width;
    if (rc == ISTH_OK) rc = read_whole(&f, &meta->experts_whole);
    if (rc == ISTH_OK) rc = h5_read_chunks(&f, "/model", m, at, ctx);
    h5_close(&f);
    return rc;
}
