/* plan_ref.h — plan.h's rule for the owners of dense chunks, worked out
 * again for the tests that check tables and payloads against it
 * (test_split_plan, test_split_reduce): greedily by size in canonical
 * order, ties to the lower rank; experts owned by nobody here (-1).
 *
 * Owns: that reference. Must not: call plan.c's owner functions (it is
 * what they are checked against).
 */
#ifndef ISTHMUS_PLAN_REF_H
#define ISTHMUS_PLAN_REF_H

#include "plan.h"

static inline void greedy_dense(const ChunkTable *ct, int G, int *owner)
{
    double load[8] = {0};
    for (int c = 0; c < ct->n_chunks; c++) {
        owner[c] = -1;
        if (ct->chunks[c].expert >= 0) continue;
        int best = 0;
        for (int j = 1; j < G; j++)
            if (load[j] < load[best]) best = j;
        owner[c] = best;
        load[best] += (double)ct->chunks[c].size;
    }
}

#endif
