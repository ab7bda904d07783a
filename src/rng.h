/* rng.h — counter-based random numbers.
 *
 * Owns: every random number the program draws. Values are pure functions of
 * (seed, stream, counter), so a draw never depends on thread count, rank
 * count or the order in which elements are visited — the property that makes
 * initialisation independent of the sharding and data streams checkpointable
 * as a few integers.
 * Must not: keep hidden global state.
 */
#ifndef ISTHMUS_RNG_H
#define ISTHMUS_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t rng_mix64(uint64_t z)
{
    /* splitmix64 finaliser: a bijection with good avalanche */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 64 random bits for (seed, stream, counter). */
static inline uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t counter)
{
    return rng_mix64(rng_mix64(rng_mix64(seed) ^ stream) ^ counter);
}

/* Uniform in (0, 1), never exactly 0 or 1. */
static inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter)
{
    return ((double)(rng_bits(seed, stream, counter) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box–Muller on two counter-derived uniforms). */
static inline double rng_normal(uint64_t seed, uint64_t stream, uint64_t counter)
{
    double u1 = rng_uniform(seed, stream, 2 * counter);
    double u2 = rng_uniform(seed, stream, 2 * counter + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
