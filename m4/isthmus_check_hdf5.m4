# ISTHMUS_CHECK_HDF5
# ------------------
# Parallel HDF5 through pkg-config (hdf5-openmpi), checked to link and to
# have the MPI-IO driver. Sets and substitutes HDF5_CFLAGS and HDF5_LIBS;
# stops configure naming the Debian package when anything is missing.
# CPPFLAGS and LIBS are restored.
AC_DEFUN([ISTHMUS_CHECK_HDF5], [
  AC_REQUIRE([PKG_PROG_PKG_CONFIG])
  AS_IF([test -z "$PKG_CONFIG"],
        [AC_MSG_ERROR([pkg-config not found: install the Debian package pkg-config])])
  PKG_CHECK_MODULES([HDF5], [hdf5-openmpi], [],
        [AC_MSG_ERROR([parallel HDF5 (pkg-config hdf5-openmpi) not found: install the Debian package libhdf5-openmpi-dev])])
  isthmus_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $HDF5_CFLAGS"
  isthmus_save_LIBS=$LIBS; LIBS="$LIBS $HDF5_LIBS"
  AC_MSG_CHECKING([whether HDF5 was built with MPI-IO])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <hdf5.h>]],
        [[hid_t p = H5Pcreate(H5P_FILE_ACCESS); H5Pset_fapl_mpio(p, MPI_COMM_WORLD, MPI_INFO_NULL);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([HDF5 without MPI-IO: install the Debian package libhdf5-openmpi-dev])])
  CPPFLAGS=$isthmus_save_CPPFLAGS; LIBS=$isthmus_save_LIBS
])
