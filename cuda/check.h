/* check.h (cuda/) — CUDA, cuBLAS, cuSOLVER and NCCL calls that must succeed, in the
 * style of status.h's CHECK_MPI: the failure is printed as
 * "file:line: call failed: <the library's message>" (with the error's
 * name for CUDA and cuBLAS, e.g. cudaErrorIllegalAddress: what
 * compute-sanitizer and NVIDIA's documentation call it) and ISTH_ERUNTIME is
 * returned to the caller (never exit: the run ends through its error path,
 * which agrees with the other ranks first).
 * Owns: nothing but the macros.
 * Must not: exit, abort, or retry a call. */
#ifndef ISTHMUS_CUDA_CHECK_H
#define ISTHMUS_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolver_common.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h"
#ifdef __cplusplus
}
#endif

#define CHECK_CUDA(call)                                                                          \
    do {                                                                                          \
        cudaError_t check_e_ = (call);                                                            \
        if (check_e_ != cudaSuccess)                                                              \
            return isth_fail(ISTH_ERUNTIME, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #call, \
                             cudaGetErrorName(check_e_), cudaGetErrorString(check_e_));           \
    } while (0)

#define CHECK_CUBLAS(call)                                                                        \
    do {                                                                                          \
        cublasStatus_t check_s_ = (call);                                                         \
        if (check_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            return isth_fail(ISTH_ERUNTIME, "%s:%d: %s failed: cuBLAS status %d (%s)", __FILE__, __LINE__, \
                             #call, (int)check_s_, cublasGetStatusName(check_s_));                \
    } while (0)

/* cuSOLVER has no message for its statuses: the number (cusolver_common.h) */
#define CHECK_CUSOLVER(call)                                                                      \
    do {                                                                                          \
        cusolverStatus_t check_s_ = (call);                                                       \
        if (check_s_ != CUSOLVER_STATUS_SUCCESS)                                                  \
            return isth_fail(ISTH_ERUNTIME, "%s:%d: %s failed: cuSOLVER status %d", __FILE__, __LINE__, #call, \
                             (int)check_s_);                                                      \
    } while (0)

#define CHECK_NCCL(call)                                                                          \
    do {                                                                                          \
        ncclResult_t check_r_ = (call);                                                           \
        if (check_r_ != ncclSuccess)                                                              \
            return isth_fail(ISTH_ERUNTIME, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,     \
                             ncclGetErrorString(check_r_));                                       \
    } while (0)

#endif
