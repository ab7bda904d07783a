# ISTHMUS_CHECK_OPENBLAS
# ----------------------
# OpenBLAS with CBLAS, preferring its OpenMP build (inside isthmus's own
# OpenMP regions its sgemm then runs single-threaded instead of starting a
# second thread pool; the pthread build works, only slower there).
# --with-openblas-dir=DIR picks the directory holding libopenblas.so.
# Sets and substitutes BLAS_LIBS; stops configure naming the Debian package
# when cblas.h or the library is missing. LIBS is restored.
AC_DEFUN([ISTHMUS_CHECK_OPENBLAS], [
  AC_ARG_WITH([openblas-dir],
        [AS_HELP_STRING([--with-openblas-dir=DIR], [directory holding libopenblas.so (default: the OpenMP build if installed)])],
        [], [with_openblas_dir=auto])
  AS_IF([test "x$with_openblas_dir" = xauto],
        [for d in /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp; do
           AS_IF([test -f "$d/libopenblas.so"], [with_openblas_dir=$d; break])
         done])
  AS_IF([test "x$with_openblas_dir" != xauto],
        [BLAS_LIBS="-L$with_openblas_dir -Wl,-rpath,$with_openblas_dir -lopenblas"],
        [BLAS_LIBS="-lopenblas"])
  isthmus_save_LIBS=$LIBS; LIBS="$LIBS $BLAS_LIBS"
  AC_CHECK_HEADER([cblas.h], [],
        [AC_MSG_ERROR([cblas.h not found: install the Debian package libopenblas-dev])])
  AC_MSG_CHECKING([for cblas_sgemm in OpenBLAS])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cblas.h>]],
        [[cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1,1,1, 1.f, 0,1, 0,1, 0.f, 0,1); openblas_set_num_threads(1);]])],
        [AC_MSG_RESULT([yes ($BLAS_LIBS)])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([OpenBLAS with CBLAS not linkable: install the Debian package libopenblas-dev])])
  LIBS=$isthmus_save_LIBS
  AC_SUBST([BLAS_LIBS])
])
