/* operand.h (cuda/) — a kernel's stored operand element, fp32 or bf16: one
 * template of a kernel serves both precisions. bf16 is rounded and read as
 * codec_math.h's codec_to_bf16 / codec_from_bf16 (the bf16 path's stored
 * operands, the host's rounding bit for bit).
 *
 * Owns: put and get of one element. Must not: hold state, launch anything.
 * C++ (nvcc) only: overloads.
 */
#ifndef ISTHMUS_CUDA_OPERAND_H
#define ISTHMUS_CUDA_OPERAND_H

#include <stdint.h>

#include "codec_math.h"

__device__ static inline void put(float *p, float v) { *p = v; }
__device__ static inline void put(uint16_t *p, float v) { *p = codec_to_bf16(v); }
__device__ static inline float get(float v) { return v; }
__device__ static inline float get(uint16_t v) { return codec_from_bf16(v); }

#endif
