/* precond_plan.h — the CUDA matrix optimisers' device memory as plain
 * arithmetic: the bytes of each piece of the one block cuda/precond.cu
 * allocates, in the order it carves them. Plain C (no CUDA): src/memory.c
 * includes it too, so a build without CUDA predicts the GPU's memory (as
 * cuda/acts_plan.h does for the activations).
 *
 * Owns: the sizes only. Must not: allocate, or know any pointer
 * (precond.cu pairs each size with its buffer, in this order).
 * Not counted: the workspaces cuBLAS and cuSOLVER size for themselves (the
 * solver's is asked of the library when the state is created).
 */
#ifndef ISTHMUS_CUDA_PRECOND_PLAN_H
#define ISTHMUS_CUDA_PRECOND_PLAN_H

#include <stddef.h>

#define CUDA_PRECOND_PIECES 15
/* the fixed partition of a sum of squares over a matrix (Muon's norms):
 * this many parts, each a fixed tree, added in a fixed tree */
#define CUDA_PRECOND_PARTS 256
/* per matrix: Shampoo's grafting scale, lr * scale and its decision; Muon's two norms */
#define CUDA_PRECOND_SCALARS 4
/* the device counters: roots kept, statistics reset, fallbacks */
#define CUDA_PRECOND_COUNTERS 3
/* the blocks' addresses of Shampoo's batched products: the gradient, the
 * first moment, the two roots, the direction, the scratch products */
#define CUDA_PRECOND_POINTER_ARRAYS 6

/* bytes[i] of each piece for `shampoo` (else muon) over `state` packed
 * values (the runs' total), the largest matrix (`largest` values, its
 * longest side at most `side`) and blocks of b x b; returns the block's
 * total (each piece 256-byte aligned). */
static inline size_t cuda_precond_pieces(size_t bytes[CUDA_PRECOND_PIECES], int shampoo, size_t state,
                                         size_t largest, size_t side, size_t b)
{
    const size_t f = sizeof(float), sh = shampoo ? 1 : 0, blocks = shampoo ? largest / (b * b) : 0;
    const size_t sums = 2 * blocks > CUDA_PRECOND_PARTS ? 2 * blocks : CUDA_PRECOND_PARTS;
    const size_t p[CUDA_PRECOND_PIECES] = {
        sh * (state + 1) * f /* l */, sh * (state + 1) * f /* r */,
        sh * (state + 1) * f /* lroot */, sh * (state + 1) * f /* rroot */,
        (largest + 1) * f /* dir */, (largest + 1) * f /* sdir */,
        (shampoo ? largest + 1 : 2 * side * side + 1) * f /* tmp */,
        sh * (largest + 1) * f /* vec: eigenvectors */, sh * (largest / (b ? b : 1) + 1) * f /* val: eigenvalues */,
        sh * (blocks + 1) * sizeof(int) /* info */, sh * (3 * blocks + 1) * sizeof(int) /* flags */,
        (sums + 1) * sizeof(double) /* sums */, CUDA_PRECOND_SCALARS * sizeof(double) /* scalars */,
        CUDA_PRECOND_COUNTERS * sizeof(long long) /* counters */,
        sh * (CUDA_PRECOND_POINTER_ARRAYS * blocks + 1) * sizeof(void *) /* ptrs */,
    };
    size_t total = 0;
    for (int i = 0; i < CUDA_PRECOND_PIECES; i++) {
        bytes[i] = p[i];
        total += (p[i] + 255) & ~(size_t)255;
    }
    return total;
}

#endif
