/* h5tamper.c — damages an HDF5 file on purpose, for the checkpoint tests:
 *   h5tamper FILE delete DATASET        remove one dataset
 *   h5tamper FILE version N            set the format_version attribute
 *   h5tamper FILE nan DATASET           set the first element of a float dataset to NaN
 *   h5tamper FILE int DATASET           replace a dataset by an int32 one of the same shape
 *   h5tamper FILE attr NAME VALUE       rewrite a root attribute (string, float or integer, as it is)
 *   h5tamper FILE nofilter DATASET      rewrite a float dataset without the fletcher32 filter
 *   h5tamper FILE shape DATASET         replace a dataset by a float one with one more row
 *   h5tamper FILE subst NAME OLD NEW    in a root string attribute, OLD (its first) replaced by NEW,
 *                                       the attribute made again at the new length
 * (Truncation and flipped bytes need no HDF5: the tests use head and dd.)
 */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A root string attribute with its first `from` replaced by `to`. */
static int subst(const char *path, const char *name, const char *from, const char *to)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = f >= 0 ? H5Aopen(f, name, H5P_DEFAULT) : -1;
    hid_t type = a >= 0 ? H5Aget_type(a) : -1;
    int rc = type < 0 || H5Tget_class(type) != H5T_STRING;
    const size_t n = rc ? 0 : H5Tget_size(type);
    char *old = calloc(n + 1, 1), *new = calloc(n + strlen(to) + 1, 1);
    if (!rc) rc = H5Aread(a, type, old) < 0;
    char *at = rc ? NULL : strstr(old, from);
    rc = rc || !at;
    if (!rc) {
        memcpy(new, old, (size_t)(at - old));
        strcat(new, to);
        strcat(new, at + strlen(from));
    }
    if (type >= 0) H5Tclose(type);
    if (a >= 0) H5Aclose(a);
    if (!rc) rc = H5Adelete(f, name) < 0;
    hid_t t2 = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    H5Tset_size(t2, strlen(new) + 1);
    hid_t a2 = rc ? -1 : H5Acreate2(f, name, t2, sp, H5P_DEFAULT, H5P_DEFAULT);
    rc = rc || a2 < 0 || H5Awrite(a2, t2, new) < 0;
    if (a2 >= 0) H5Aclose(a2);
    H5Sclose(sp);
    H5Tclose(t2);
    if (f >= 0) H5Fclose(f);
    free(old);
    free(new);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[2], "subst")) return subst(argv[1], argv[3], argv[4], argv[5]);
    if (argc == 5 && !strcmp(argv[2], "attr")) {
        hid_t f = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t a = f >= 0 ? H5Aopen(f, argv[3], H5P_DEFAULT) : -1;
        hid_t type = a >= 0 ? H5Aget_type(a) : -1;
        int rc = type < 0;
        if (!rc && H5Tget_class(type) == H5T_STRING) {
            /* same type and size as stored: pad or cut the value */
            size_t n = H5Tget_size(type);
            char *v = calloc(n + 1, 1);
            strncpy(v, argv[4], n);
            rc = H5Awrite(a, type, v) < 0;
            free(v);
        } else if (!rc && H5Tget_class(type) == H5T_FLOAT) {
            double v = strtod(argv[4], NULL); /* "nan" and "inf" too */
            rc = H5Awrite(a, H5T_NATIVE_DOUBLE, &v) < 0;
        } else if (!rc) {
            long long v = atoll(argv[4]);
            rc = H5Awrite(a, H5T_NATIVE_LLONG, &v) < 0;
        }
        if (type >= 0) H5Tclose(type);
        if (a >= 0) H5Aclose(a);
        if (f >= 0) H5Fclose(f);
        return rc;
    }
    if (argc != 4) {
        fprintf(stderr, "usage: h5tamper FILE delete|nan|int|nofilter|shape DATASET | FILE version N | FILE attr NAME VALUE | "
                        "FILE subst NAME OLD NEW\n");
        return 2;
    }
    hid_t f = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return 1;
    int rc = 0;
    if (!strcmp(argv[2], "delete")) {
        rc = H5Ldelete(f, argv[3], H5P_DEFAULT) < 0;
    } else if (!strcmp(argv[2], "version")) {
        long long v = atoll(argv[3]);
        hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
        rc = a < 0 || H5Awrite(a, H5T_NATIVE_LLONG, &v) < 0;
        if (a >= 0) H5Aclose(a);
    } else if (!strcmp(argv[2], "nan")) {
        hid_t d = H5Dopen2(f, argv[3], H5P_DEFAULT);
        hid_t space = d >= 0 ? H5Dget_space(d) : -1;
        hsize_t start[8] = {0}, one[8] = {1, 1, 1, 1, 1, 1, 1, 1}, m = 1;
        float v = NAN;
        rc = space < 0 || H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, one, NULL) < 0;
        hid_t ms = H5Screate_simple(1, &m, NULL);
        if (!rc) rc = H5Dwrite(d, H5T_NATIVE_FLOAT, ms, space, H5P_DEFAULT, &v) < 0;
        H5Sclose(ms);
        if (space >= 0) H5Sclose(space);
        if (d >= 0) H5Dclose(d);
    } else if (!strcmp(argv[2], "nofilter") || !strcmp(argv[2], "shape")) {
        const int grow = !strcmp(argv[2], "shape");
        hid_t d = H5Dopen2(f, argv[3], H5P_DEFAULT);
        hid_t space = d >= 0 ? H5Dget_space(d) : -1;
        hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : 0;
        float *v = calloc((size_t)(n > 0 ? n : 1) * 2, sizeof(float));
        rc = d < 0 || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0;
        hsize_t dims[8];
        const int nd = space >= 0 ? H5Sget_simple_extent_dims(space, dims, NULL) : 0;
        if (d >= 0) H5Dclose(d);
        if (grow && nd > 0) dims[0]++;
        hid_t s2 = H5Screate_simple(nd, dims, NULL);
        if (!rc) rc = H5Ldelete(f, argv[3], H5P_DEFAULT) < 0;
        hid_t d2 = rc ? -1 : H5Dcreate2(f, argv[3], H5T_IEEE_F32LE, s2, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (!grow && d2 >= 0) rc = H5Dwrite(d2, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0;
        rc = rc || d2 < 0;
        if (d2 >= 0) H5Dclose(d2);
        H5Sclose(s2);
        if (space >= 0) H5Sclose(space);
        free(v);
    } else if (!strcmp(argv[2], "int")) {
        hid_t d = H5Dopen2(f, argv[3], H5P_DEFAULT);
        hid_t space = d >= 0 ? H5Dget_space(d) : -1;
        if (d >= 0) H5Dclose(d);
        rc = space < 0 || H5Ldelete(f, argv[3], H5P_DEFAULT) < 0;
        hid_t n = rc ? -1 : H5Dcreate2(f, argv[3], H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        rc = rc || n < 0;
        if (n >= 0) H5Dclose(n);
        if (space >= 0) H5Sclose(space);
    } else {
        rc = 2;
    }
    H5Fclose(f);
    return rc;
}
