# ISTHMUS_CHECK_NCCL(DIR)
# -----------------------
# NCCL for the CUDA backend: nccl.h and libnccl under DIR (the toolkit's
# include and lib64, where these machines have it), version 2.18 or later
# (ncclCommInitRankConfig, grouped send/recv). Appends to CUDA_CFLAGS and
# CUDA_LIBS. Stops configure naming what is missing. CPPFLAGS and LIBS are
# restored.
AC_DEFUN([ISTHMUS_CHECK_NCCL], [
  isthmus_nccl_dir=$1
  isthmus_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $CUDA_CFLAGS -I$isthmus_nccl_dir/include"
  isthmus_save_LIBS=$LIBS; LIBS="-L$isthmus_nccl_dir/lib64 -lnccl $CUDA_LIBS $LIBS"
  AC_CHECK_HEADER([nccl.h], [], [AC_MSG_ERROR([--with-cuda: nccl.h not found in $isthmus_nccl_dir/include])])
  AC_MSG_CHECKING([for NCCL >= 2.18])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]],
        [[#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error too old
#endif]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([--with-cuda: NCCL in $isthmus_nccl_dir is older than 2.18])])
  AC_MSG_CHECKING([whether libnccl links])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[ncclUniqueId id; ncclGetUniqueId(&id);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([--with-cuda: cannot link libnccl from $isthmus_nccl_dir/lib64])])
  CPPFLAGS=$isthmus_save_CPPFLAGS; LIBS=$isthmus_save_LIBS
  AS_CASE([" $CUDA_CFLAGS "], [*" -I$isthmus_nccl_dir/include "*], [], [CUDA_CFLAGS="$CUDA_CFLAGS -I$isthmus_nccl_dir/include"])
  CUDA_LIBS="-L$isthmus_nccl_dir/lib64 -lnccl $CUDA_LIBS"
])
