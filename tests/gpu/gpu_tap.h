/* gpu_tap.h — what every GPU test starts with: find a device, or print
 * TAP's "1..0 # SKIP" with the reason (never a pass without one). */
#ifndef ISTHMUS_GPU_TAP_H
#define ISTHMUS_GPU_TAP_H

#include <stdio.h>

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

#endif
