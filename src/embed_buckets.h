/* embed_buckets.h — the embedding's backward as buckets of positions per
 * token id, so that a GPU sums each id's rows in parallel over ids and
 * columns and still adds them in the CPU's order: plain C, and
 * __host__ __device__ under nvcc for the per-bucket sum.
 *
 * The CPU's encoder_backward (cpu/layers.c) adds dout's row t into
 * dembed's row tokens[t] for t = 0, 1, ..., N−1, so each element of a row
 * receives its id's rows in position order. A bucket is one id's positions
 * in that order; summing a bucket from the element's old value adds the
 * same floats in the same order: the same bits.
 *
 * Owns: the bucketing (on the host, which holds the tokens before they are
 * uploaded: a stable counting sort, O(N + V)) and one bucket column's sum.
 * Must not: allocate, or know where the arrays live.
 */
#ifndef ISTHMUS_EMBED_BUCKETS_H
#define ISTHMUS_EMBED_BUCKETS_H

#include <stddef.h>
#include <string.h>

#ifdef __CUDACC__
#define EMBED_FN static inline __host__ __device__
#else
#define EMBED_FN static inline
#endif

/* tokens[0..N), each in [0, V) (−1 otherwise). count: V ints of scratch.
 * Fills ids[0..n) (the distinct ids, ascending), start[0..n] (bucket b is
 * order[start[b] .. start[b+1])) and order[0..N) (the positions, grouped by
 * id, each group ascending); returns n. */
static inline int embed_buckets(const int *tokens, size_t N, int V, int *count, int *ids, int *start, int *order)
{
    memset(count, 0, (size_t)V * sizeof(int));
    for (size_t t = 0; t < N; t++) {
        if (tokens[t] < 0 || tokens[t] >= V) return -1;
        count[tokens[t]]++;
    }
    int n = 0, at = 0;
    for (int v = 0; v < V; v++) {
        if (!count[v]) continue;
        ids[n] = v;
        start[n++] = at;
        const int c = count[v];
        count[v] = at; /* from here on: the next free place of v's bucket */
        at += c;
    }
    start[n] = at;
    for (size_t t = 0; t < N; t++) order[count[tokens[t]]++] = (int)t;
    return n;
}

/* Column c of bucket b: dembed[ids[b]][c] += dout[t][c] for the bucket's
 * positions t in order. */
EMBED_FN void embed_bucket_column(float *dembed, const float *dout, const int *ids, const int *start,
                                  const int *order, int b, int c, int D)
{
    float *dst = dembed + (size_t)ids[b] * D + c;
    float acc = *dst;
    for (int i = start[b]; i < start[b + 1]; i++) acc += dout[(size_t)order[i] * D + c];
    *dst = acc;
}

#endif
