# ISTHMUS_CHECK_HDF5
# ------------------
# Parallel HDF5: from --with-hdf5=DIR (DIR/include/hdf5.h and DIR/lib or
# DIR/lib64: a module's or Spack's prefix, linked with an rpath), else
# through pkg-config (Debian's hdf5-openmpi, else an hdf5.pc on
# PKG_CONFIG_PATH); checked to link and to have the MPI-IO driver. Sets and
# substitutes HDF5_CFLAGS and HDF5_LIBS (both may also be given on
# configure's command line); stops configure naming what is missing.
# CPPFLAGS and LIBS are restored.
AC_DEFUN([ISTHMUS_CHECK_HDF5], [
  AC_REQUIRE([PKG_PROG_PKG_CONFIG])
  AC_ARG_WITH([hdf5],
        [AS_HELP_STRING([--with-hdf5=DIR], [the parallel HDF5 installation: DIR/include/hdf5.h, DIR/lib(64)/libhdf5 (a module's or Spack's prefix; default: pkg-config hdf5-openmpi, then hdf5)])],
        [], [with_hdf5=default])
  AS_CASE([$with_hdf5],
    [no], [AC_MSG_ERROR([--without-hdf5: isthmus writes its checkpoints with parallel HDF5])],
    [yes|default],
      [AS_IF([test -z "$HDF5_CFLAGS$HDF5_LIBS"],
         [AS_IF([test -z "$PKG_CONFIG"],
                [AC_MSG_ERROR([pkg-config not found: install the Debian package pkg-config, or give parallel HDF5's prefix with --with-hdf5=DIR])])
          PKG_CHECK_MODULES([HDF5], [hdf5-openmpi], [],
            [PKG_CHECK_MODULES([HDF5], [hdf5], [],
              [AC_MSG_ERROR([parallel HDF5 not found (pkg-config hdf5-openmpi or hdf5): install the Debian package libhdf5-openmpi-dev, or give its prefix with --with-hdf5=DIR])])])])],
    [AS_IF([test -f "$with_hdf5/include/hdf5.h"], [],
           [AC_MSG_ERROR([--with-hdf5=$with_hdf5: no $with_hdf5/include/hdf5.h (give the prefix of a parallel HDF5 installation)])])
     isthmus_hdf5_lib=
     for d in "$with_hdf5/lib" "$with_hdf5/lib64"; do
       AS_IF([test -z "$isthmus_hdf5_lib" && ls "$d"/libhdf5.* > /dev/null 2>&1], [isthmus_hdf5_lib=$d])
     done
     AS_IF([test -z "$isthmus_hdf5_lib"],
           [AC_MSG_ERROR([--with-hdf5=$with_hdf5: no libhdf5 in $with_hdf5/lib or $with_hdf5/lib64])])
     HDF5_CFLAGS="-I$with_hdf5/include"
     HDF5_LIBS="-L$isthmus_hdf5_lib -Wl,-rpath,$isthmus_hdf5_lib -lhdf5"
     AC_SUBST([HDF5_CFLAGS])
     AC_SUBST([HDF5_LIBS])])
  isthmus_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $HDF5_CFLAGS"
  isthmus_save_LIBS=$LIBS; LIBS="$LIBS $HDF5_LIBS"
  AC_MSG_CHECKING([whether HDF5 links and was built with MPI-IO ($HDF5_LIBS)])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <hdf5.h>]],
        [[hid_t p = H5Pcreate(H5P_FILE_ACCESS); H5Pset_fapl_mpio(p, MPI_COMM_WORLD, MPI_INFO_NULL);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([HDF5 ($HDF5_LIBS) does not link with MPI-IO: a parallel HDF5 built with this MPI is needed (Debian: libhdf5-openmpi-dev; else --with-hdf5=DIR of one configured --enable-parallel)])])
  CPPFLAGS=$isthmus_save_CPPFLAGS; LIBS=$isthmus_save_LIBS
])
