/* h5tamper.c — damages an HDF5 file on purpose, for the checkpoint tests:
 *   h5tamper FILE delete DATASET        remove one dataset
 *   h5tamper FILE version N            set the format_version attribute
 * (Truncation and flipped bytes need no HDF5: the tests use head and dd.)
 */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: h5tamper FILE delete DATASET | FILE version N\n");
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
    } else {
        rc = 2;
    }
    H5Fclose(f);
    return rc;
}
