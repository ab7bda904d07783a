/* route_topk.h — a token's routing decision: its K experts by repeated
 * argmax over the router's probabilities, ties to the lower index. One
 * definition for both backends (cpu/moe.c's router_topk, cuda/moe.cu's
 * kernel: __host__ __device__ under nvcc), so the GPU chooses as the CPU
 * does; test_model checks it against a sort on random, tie-heavy inputs.
 *
 * Owns: that choice for one token. Must not: loop over tokens (the
 * callers' threads do).
 */
#ifndef ISTHMUS_ROUTE_TOPK_H
#define ISTHMUS_ROUTE_TOPK_H

#include "route_plan.h" /* ROUTE_FN */

/* c (K) = the K largest of p (E), largest first; strict '>' keeps the
 * lower index on ties. K <= E. */
ROUTE_FN void route_topk_token(int *c, const float *p, int E, int K)
{
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= c[j] == e;
            if (taken) continue;
            if (best < 0 || p[e] > p[best]) best = e;
        }
        c[k] = best;
    }
}

#endif
