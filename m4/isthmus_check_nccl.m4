# ISTHMUS_CHECK_NCCL(DIR, OPTION)
# -------------------------------
# NCCL for the CUDA backend (required by it: cuda/coll_nccl.cu): nccl.h in
# DIR/include and libnccl in DIR/lib64 or DIR/lib (the CUDA toolkit's
# directory where these machines have it, or NCCL's own module or Spack
# prefix given with --with-nccl=DIR), version 2.18 or later
# (ncclCommInitRankConfig, grouped send/recv). OPTION names the option that
# gave DIR in messages. Puts NCCL's flags first in CUDA_CFLAGS and CUDA_LIBS
# (before the toolkit's, which may hold another NCCL; with an rpath to the
# library's directory). Stops configure naming what is missing.
# CPPFLAGS and LIBS are restored.
AC_DEFUN([ISTHMUS_CHECK_NCCL], [
  isthmus_nccl_dir=$1
  isthmus_nccl_opt=$2
  isthmus_nccl_hint=
  AS_IF([test "x$isthmus_nccl_opt" = "x--with-cuda"],
        [isthmus_nccl_hint=" (the CUDA backend needs NCCL: give its own prefix with --with-nccl=DIR)"])
  # the files themselves: the toolkit's directories (in the flags after
  # NCCL's) may hold another NCCL, which the compile and link checks would find
  AC_MSG_CHECKING([for nccl.h in $isthmus_nccl_dir/include])
  AS_IF([test -f "$isthmus_nccl_dir/include/nccl.h"], [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([$isthmus_nccl_opt: nccl.h not found in $isthmus_nccl_dir/include$isthmus_nccl_hint])])
  AC_MSG_CHECKING([for libnccl in $isthmus_nccl_dir/lib64 or $isthmus_nccl_dir/lib])
  isthmus_nccl_lib=
  for isthmus_d in lib64 lib; do
    AS_IF([test -z "$isthmus_nccl_lib" && ls "$isthmus_nccl_dir/$isthmus_d"/libnccl.* > /dev/null 2>&1],
          [isthmus_nccl_lib=$isthmus_nccl_dir/$isthmus_d])
  done
  AS_IF([test -n "$isthmus_nccl_lib"], [AC_MSG_RESULT([$isthmus_nccl_lib])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([$isthmus_nccl_opt: no libnccl in $isthmus_nccl_dir/lib64 or $isthmus_nccl_dir/lib$isthmus_nccl_hint])])
  isthmus_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="-I$isthmus_nccl_dir/include $CUDA_CFLAGS $CPPFLAGS"
  isthmus_save_LIBS=$LIBS; LIBS="-L$isthmus_nccl_lib -lnccl $CUDA_LIBS $LIBS"
  AC_MSG_CHECKING([for NCCL >= 2.18])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]],
        [[#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error too old
#endif]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([$isthmus_nccl_opt: NCCL in $isthmus_nccl_dir is older than 2.18])])
  AC_MSG_CHECKING([whether libnccl links from $isthmus_nccl_lib])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[ncclUniqueId id; ncclGetUniqueId(&id);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([$isthmus_nccl_opt: cannot link libnccl from $isthmus_nccl_lib$isthmus_nccl_hint])])
  CPPFLAGS=$isthmus_save_CPPFLAGS; LIBS=$isthmus_save_LIBS
  AS_CASE([" $CUDA_CFLAGS "], [*" -I$isthmus_nccl_dir/include "*], [], [CUDA_CFLAGS="-I$isthmus_nccl_dir/include $CUDA_CFLAGS"])
  AS_CASE([" $CUDA_LIBS "], [*" -Wl,-rpath,$isthmus_nccl_lib "*],
        [CUDA_LIBS="-L$isthmus_nccl_lib -lnccl $CUDA_LIBS"],
        [CUDA_LIBS="-L$isthmus_nccl_lib -Wl,-rpath,$isthmus_nccl_lib -lnccl $CUDA_LIBS"])
])
