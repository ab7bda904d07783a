/* h5io.c — see h5io.h. */
#include "h5io.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#define H5_TRY(expr, ...)                                                   \
    do {                                                                     \
        if ((expr) < 0) {                                                    \
            rc = isth_fail(ISTH_ERUNTIME, __VA_ARGS__);                      \
            goto done;                                                       \
        }                                                                    \
    } while (0)

static hid_t open_fapl(MPI_Comm comm)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* we report errors ourselves */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    return fapl;
}

/* Hyperslab of tensor t owned by this rank: expert tensors select this
 * rank's experts; replicated tensors everything (or nothing when `none`). */
static void rank_slab(const Model *m, const Tensor *t, hsize_t *start, hsize_t *count)
{
    for (int d = 0; d < t->ndim; d++) {
        start[d] = 0;
        count[d] = t->local[d];
    }
    if (t->flags & PARAM_EXPERT) start[1] = (hsize_t)m->expert_begin;
}

static int write_attr_string(hid_t obj, const char *name, const char *value)
{
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(value) + 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t err = attr < 0 ? -1 : H5Awrite(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
    return err < 0 ? -1 : 0;
}

static int write_attr_scalar(hid_t obj, const char *name, hid_t type, const void *value)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t err = attr < 0 ? -1 : H5Awrite(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return err < 0 ? -1 : 0;
}

int h5model_write(const char *path, const Model *m, const char *config_text, const H5Meta *meta,
                  MPI_Comm comm, int writes_replicated)
{
    int rc = ISTH_OK, rank;
    MPI_Comm_rank(comm, &rank);
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    hid_t fapl = open_fapl(comm), file = -1, group = -1, xfer = -1;
    file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5_TRY(file, "model file %s: cannot create", tmp);
    xfer = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE); /* filters need collective I/O */
    const int version = H5IO_FORMAT_VERSION;
    const long long step = meta->step;
    H5_TRY(write_attr_scalar(file, "format_version", H5T_NATIVE_INT, &version),
            "model file %s: cannot write attributes", tmp);
    H5_TRY(write_attr_string(file, "config", config_text), "model file %s: cannot write config", tmp);
    H5_TRY(write_attr_scalar(file, "step", H5T_NATIVE_LLONG, &step), "model file %s: attribute step", tmp);
    H5_TRY(write_attr_scalar(file, "tokens", H5T_NATIVE_DOUBLE, &meta->tokens),
            "model file %s: attribute tokens", tmp);
    group = H5Gcreate2(file, "/model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5_TRY(group, "model file %s: cannot create /model", tmp);

    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        hsize_t dims[TENSOR_MAX_DIMS], chunk[TENSOR_MAX_DIMS], start[TENSOR_MAX_DIMS],
            count[TENSOR_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) dims[d] = chunk[d] = t->shape[d];
        if (t->flags & PARAM_LAYERED) chunk[0] = 1;
        if (t->flags & PARAM_EXPERT) chunk[1] = 1;
        hid_t fspace = H5Screate_simple(t->ndim, dims, NULL);
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(dcpl, t->ndim, chunk);
        H5Pset_fletcher32(dcpl);
        hid_t dset = H5Dcreate2(group, t->name, H5T_NATIVE_FLOAT, fspace, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        H5Pclose(dcpl);
        if (dset < 0) {
            H5Sclose(fspace);
            H5_TRY(-1, "model file %s: cannot create /model/%s", tmp, t->name);
        }
        rank_slab(m, t, start, count);
        int writes = (t->flags & PARAM_EXPERT) || writes_replicated;
        hid_t mspace = H5Screate_simple(t->ndim, count, NULL);
        if (writes) {
            H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
        } else {
            H5Sselect_none(fspace);
            H5Sselect_none(mspace);
        }
        herr_t err = H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, xfer, m->params + t->offset);
        H5Sclose(mspace);
        H5Sclose(fspace);
        H5Dclose(dset);
        H5_TRY(err, "model file %s: writing /model/%s failed", tmp, t->name);
    }
done:
    if (group >= 0) H5Gclose(group);
    if (xfer >= 0) H5Pclose(xfer);
    if (file >= 0 && H5Fclose(file) < 0 && rc == ISTH_OK)
        rc = isth_fail(ISTH_ERUNTIME, "model file %s: close failed (disk full?)", tmp);
    H5Pclose(fapl);
    /* every rank must agree the file is complete before it gets its name */
    int ok = rc == ISTH_OK, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, comm);
    if (!all_ok) return rc ? rc : ISTH_ERUNTIME;
    if (rank == 0 && rename(tmp, path) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "model file %s: rename from %s failed: %s", path, tmp,
                       strerror(errno));
    MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
    return rc;
}

static hid_t open_file(const char *path, MPI_Comm comm, int *rc)
{
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        *rc = isth_fail(ISTH_EINPUT, "model file %s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    fclose(probe);
    hid_t fapl = open_fapl(comm);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (file < 0) *rc = isth_fail(ISTH_EINPUT, "model file %s: not a readable HDF5 file (truncated or corrupt?)", path);
    return file;
}

int h5model_read_config(const char *path, char **config_text, MPI_Comm comm)
{
    int rc = ISTH_OK;
    *config_text = NULL;
    hid_t file = open_file(path, comm, &rc), attr = -1, type = -1;
    if (file < 0) return rc;
    int version = 0;
    attr = H5Aopen(file, "format_version", H5P_DEFAULT);
    H5_TRY(attr, "model file %s: missing attribute format_version", path);
    H5_TRY(H5Aread(attr, H5T_NATIVE_INT, &version), "model file %s: bad format_version", path);
    H5Aclose(attr);
    attr = -1;
    if (version != H5IO_FORMAT_VERSION) {
        rc = isth_fail(ISTH_EINPUT, "model file %s: format_version %d, this build reads %d", path,
                       version, H5IO_FORMAT_VERSION);
        goto done;
    }
    attr = H5Aopen(file, "config", H5P_DEFAULT);
    H5_TRY(attr, "model file %s: missing attribute config", path);
    type = H5Aget_type(attr);
    size_t size = H5Tget_size(type);
    char *text = calloc(size + 1, 1);
    if (!text || H5Aread(attr, type, text) < 0) {
        free(text);
        H5_TRY(-1, "model file %s: cannot read attribute config", path);
    }
    *config_text = text;
done:
    if (rc != ISTH_OK && rc != ISTH_EINPUT) rc = ISTH_EINPUT;
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    H5Fclose(file);
    return rc;
}

int h5model_read(const char *path, Model *m, H5Meta *meta, MPI_Comm comm)
{
    int rc = ISTH_OK;
    hid_t file = open_file(path, comm, &rc), xfer = -1;
    if (file < 0) return rc;
    xfer = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE);
    long long step = 0;
    hid_t attr = H5Aopen(file, "step", H5P_DEFAULT);
    if (attr >= 0) {
        H5Aread(attr, H5T_NATIVE_LLONG, &step);
        H5Aclose(attr);
    }
    meta->step = (long)step;
    meta->tokens = 0;
    attr = H5Aopen(file, "tokens", H5P_DEFAULT);
    if (attr >= 0) {
        H5Aread(attr, H5T_NATIVE_DOUBLE, &meta->tokens);
        H5Aclose(attr);
    }
    for (int i = 0; i < N_TENSORS; i++) {
        const Tensor *t = &m->tensors[i];
        char name[256];
        snprintf(name, sizeof name, "/model/%s", t->name);
        hid_t dset = H5Dopen2(file, name, H5P_DEFAULT);
        if (dset < 0) {
            rc = isth_fail(ISTH_EINPUT, "model file %s: missing dataset %s", path, name);
            goto done;
        }
        hid_t fspace = H5Dget_space(dset);
        hsize_t dims[8], start[TENSOR_MAX_DIMS], count[TENSOR_MAX_DIMS];
        int nd = H5Sget_simple_extent_ndims(fspace);
        int match = nd == t->ndim;
        if (match) {
            H5Sget_simple_extent_dims(fspace, dims, NULL);
            for (int d = 0; d < nd; d++) match &= dims[d] == t->shape[d];
        }
        if (!match) {
            H5Sclose(fspace);
            H5Dclose(dset);
            rc = isth_fail(ISTH_EINPUT, "model file %s: dataset %s has a different shape than the configured model",
                           path, name);
            goto done;
        }
        rank_slab(m, t, start, count);
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
        hid_t mspace = H5Screate_simple(t->ndim, count, NULL);
        herr_t err = H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, xfer, m->params + t->offset);
        H5Sclose(mspace);
        H5Sclose(fspace);
        H5Dclose(dset);
        if (err < 0) {
            rc = isth_fail(ISTH_EINPUT, "model file %s: reading %s failed (checksum mismatch or truncated data)",
                           path, name);
            goto done;
        }
    }
done:
    if (xfer >= 0) H5Pclose(xfer);
    H5Fclose(file);
    return rc;
}
