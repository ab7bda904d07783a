/* gpu_tap.h — what every GPU test starts with: find a device, or print
 * TAP's "1..0 # SKIP" with the reason (never a pass without one); and the
 * check of every CUDA runtime call the tests make themselves.
 * Owns: nothing but these inline helpers.
 * Must not: retry a call, or go on after one failed (a fault would then be
 * reported as a wrong value). */
#ifndef ISTHMUS_GPU_TAP_H
#define ISTHMUS_GPU_TAP_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

/* 1 when a CUDA device is visible; otherwise prints the skip line, 0. */
static inline int gpu_present_or_skip(void)
{
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e == cudaSuccess && devices > 0) return 1;
    printf("1..0 # SKIP no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    return 0;
}

/* A CUDA runtime call that must succeed, as nccl-tests' CUDACHECK: on failure
 * TAP's "Bail out!" with file:line, the call, the error's name and message
 * (an earlier kernel's fault surfaces at the next copy or synchronisation:
 * cudaErrorIllegalAddress there, never a wrong value or "allocation
 * failed"), and exit 1: after a fault the context is lost and every later
 * check would only repeat it. */
static inline void gpu_check_(cudaError_t e, const char *call, const char *file, int line)
{
    if (e == cudaSuccess) return;
    fflush(stdout);
    printf("Bail out! %s:%d: %s failed: %s (%s)\n", file, line, call, cudaGetErrorName(e), cudaGetErrorString(e));
    fflush(stdout);
    exit(1);
}
#define GPU_CHECK(call) gpu_check_((call), #call, __FILE__, __LINE__)

#endif
