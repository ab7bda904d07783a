/* route_softmax.h — the router's softmax of one token's E logits, and its
 * log-sum-exp (the z-loss and the backward read it). One definition for
 * both backends (cpu/moe.c's router_softmax_forward, cuda/moe.cu's kernel:
 * __host__ __device__ under nvcc, ROUTE_FN), so the GPU's probabilities are
 * the CPU's loop, operation for operation.
 *
 * Owns: that row's arithmetic (the max shift, the order of the sum).
 * Must not: loop over tokens (the callers' threads do), or choose experts
 * (route_topk.h).
 */
#ifndef ISTHMUS_ROUTE_SOFTMAX_H
#define ISTHMUS_ROUTE_SOFTMAX_H

#include <math.h>

#include "route_plan.h" /* ROUTE_FN */

/* p (E) = softmax(z (E)); returns log(sum(exp(z))), shifted by the max. */
ROUTE_FN float route_softmax_row(float *p, const float *z, int E)
{
    float mx = z[0];
    for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += expf(z[e] - mx);
    const float l = logf(sum) + mx;
    for (int e = 0; e < E; e++) p[e] = expf(z[e] - l);
    return l;
}

#endif
