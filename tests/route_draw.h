/* route_draw.h — skewed random routings for the dispatch-plan tests (the
 * host's test_model, the GPU's test_kernels_gpu): K distinct experts per
 * token, drawn as the smaller of two uniform picks so that the low experts
 * are crowded and capacity bites. A plain LCG: the same draws on any libc. */
#ifndef ISTHMUS_TESTS_ROUTE_DRAW_H
#define ISTHMUS_TESTS_ROUTE_DRAW_H

/* choice (N,K) of one rank; cnt (E) += its histogram. */
static inline void route_draw(int *choice, int *cnt, int N, int K, int E, unsigned *seed)
{
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) {
            int e, taken;
            do {
                *seed = *seed * 1103515245u + 12345u;
                const int a = (int)((*seed >> 16) % (unsigned)E);
                *seed = *seed * 1103515245u + 12345u;
                const int b = (int)((*seed >> 16) % (unsigned)E); /* two draws: any E up to 65536 */
                e = a < b ? a : b;
                taken = 0;
                for (int j = 0; j < k; j++) taken |= choice[t * K + j] == e;
            } while (taken);
            choice[t * K + k] = e;
            cnt[e]++;
        }
}

#endif
