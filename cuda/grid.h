/* grid.h (cuda/) — the launch shape every element-wise kernel uses: at most
 * 4096 blocks of 256 threads, each thread striding over the rest, so one
 * launch covers any n and the same n always gets the same grid.
 * Owns: nothing but the helper and the loop macro.
 * Must not: depend on the device (the same n gets the same grid anywhere). */
#ifndef ISTHMUS_CUDA_GRID_H
#define ISTHMUS_CUDA_GRID_H

#include <stddef.h>

static inline unsigned blocks_for(size_t n) { return (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#endif
