# ISTHMUS_CHECK_CUDA(DIR)
# -----------------------
# The CUDA toolkit under DIR: nvcc (DIR/bin), the runtime, cuBLAS and
# cuSOLVER headers and libraries (DIR/include, DIR/lib64; cuSOLVER's batched
# eigensolver for Shampoo's roots, cuda/precond.cu: cusolverDnXsyevBatched,
# which older 12.x toolkits lack; configure checks that it links), a
# runtime of version 12.0 or later, and nvcc able to build one fat binary
# for sm_90 (H100/H200),
# sm_100 (B200) and sm_103 (B300), or for CUDA_GENCODE when given. Sets and substitutes NVCC, CUDA_CFLAGS,
# CUDA_LIBS and CUDA_GENCODE (configure.ac defines HAVE_CUDA). Stops configure naming
# what is missing. CPPFLAGS, LDFLAGS and LIBS are restored.
AC_DEFUN([ISTHMUS_CHECK_CUDA], [
  isthmus_cuda_dir=$1
  AC_PATH_PROG([NVCC], [nvcc], [], [$isthmus_cuda_dir/bin])
  AS_IF([test -z "$NVCC"], [AC_MSG_ERROR([--with-cuda: nvcc not found in $isthmus_cuda_dir/bin])])
  CUDA_CFLAGS="-I$isthmus_cuda_dir/include"
  CUDA_LIBS="-L$isthmus_cuda_dir/lib64 -Wl,-rpath,$isthmus_cuda_dir/lib64 -lcusolver -lcublas -lcudart -lstdc++"
  isthmus_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $CUDA_CFLAGS"
  isthmus_save_LIBS=$LIBS; LIBS="$CUDA_LIBS $LIBS"
  AC_CHECK_HEADER([cuda_runtime_api.h], [],
        [AC_MSG_ERROR([--with-cuda: cuda_runtime_api.h not found in $isthmus_cuda_dir/include])])
  AC_CHECK_HEADER([cublas_v2.h], [],
        [AC_MSG_ERROR([--with-cuda: cublas_v2.h not found in $isthmus_cuda_dir/include])])
  AC_CHECK_HEADER([cusolverDn.h], [],
        [AC_MSG_ERROR([--with-cuda: cusolverDn.h not found in $isthmus_cuda_dir/include])])
  AC_MSG_CHECKING([for a CUDA runtime >= 12.0])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime_api.h>]],
        [[#if CUDART_VERSION < 12000
#error too old
#endif]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([--with-cuda: the CUDA runtime in $isthmus_cuda_dir is older than 12.0])])
  AC_MSG_CHECKING([whether the CUDA runtime, cuBLAS and cuSOLVER link])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <cusolverDn.h>]],
        [[int n = 0; cudaGetDeviceCount(&n); cublasHandle_t h; cublasCreate(&h);
cusolverDnHandle_t s; cusolverDnCreate(&s); cusolverDnXsyevBatched_bufferSize(s, 0, CUSOLVER_EIG_MODE_VECTOR,
CUBLAS_FILL_MODE_LOWER, 2, CUDA_R_32F, 0, 2, CUDA_R_32F, 0, CUDA_R_32F, 0, 0, 1);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([--with-cuda: cannot link libcudart, libcublas and libcusolver (with cusolverDnXsyevBatched, which older 12.x toolkits lack) from $isthmus_cuda_dir/lib64])])
  # the GPUs to build for: all three by default (one fat binary); a site
  # that has one kind builds in a third of the time with its own, e.g.
  # CUDA_GENCODE="-gencode arch=compute_90,code=sm_90"
  AS_IF([test -z "$CUDA_GENCODE"],
        [CUDA_GENCODE="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_100,code=sm_100 -gencode arch=compute_103,code=sm_103"])
  AC_MSG_CHECKING([whether nvcc builds for $CUDA_GENCODE])
  echo '__global__ void isthmus_probe(float *x) { x@<:@threadIdx.x@:>@ += 1.0f; }' > conftest.cu
  AS_IF([$NVCC $CUDA_GENCODE -c conftest.cu -o conftest.o >&AS_MESSAGE_LOG_FD 2>&1],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); AC_MSG_ERROR([--with-cuda: $NVCC cannot build with CUDA_GENCODE = $CUDA_GENCODE (see config.log)])])
  rm -f conftest.cu conftest.o
  CPPFLAGS=$isthmus_save_CPPFLAGS; LIBS=$isthmus_save_LIBS
  AC_SUBST([NVCC])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([CUDA_GENCODE])
])
