/* phases.h (cuda/) — where a GPU step's time goes, from CUDA events: the
 * backend marks the start of each phase on its compute stream; an
 * interval between two marks belongs to the phase the first one opened;
 * `isthmus bench --backend cuda` prints the totals (docs/benchmarks.md).
 *
 * Owns: the events and the per-phase totals. Off (the default) a mark
 * costs one branch. Must not: synchronise except in phase_collect.
 */
#ifndef ISTHMUS_CUDA_PHASES_H
#define ISTHMUS_CUDA_PHASES_H

#include <cuda_runtime_api.h>

typedef enum {
    PHASE_ATTENTION,   /* the attention kernels, forward and backward */
    PHASE_EXPERTS,     /* the experts' products and SwiGLU */
    PHASE_DISPATCH,    /* the rows to the owners and back, gathers, combine, scatter */
    PHASE_ROUTER,      /* router product, softmax, top-k, the dispatch plan and its header */
    PHASE_DENSE,       /* q, k, v, o products and the tied head */
    PHASE_ELEMENTWISE, /* norms, rotary, residuals, embedding, cross-entropy */
    PHASE_OPTIMISER,   /* the optimiser's step */
    PHASE_HOST_WAIT,   /* the GPU idle while the host reads a MoE layer's dispatch header */
    PHASE_OTHER,       /* anything between marks that none of the above opened */
    PHASE_COUNT
} Phase;

#define PHASE_EVENTS 65536 /* marks per step: ~12 per layer and pass (moe-32b, 8 micro-batches: ~10,000) */

typedef struct {
    int on;
    cudaStream_t stream;
    cudaEvent_t ev[PHASE_EVENTS];
    unsigned char phase[PHASE_EVENTS];
    int n, overflow;
    double ms[PHASE_COUNT]; /* totals since phase_start */
} PhaseClock;

#ifdef __cplusplus
extern "C" {
#endif

/* Events created, totals zeroed, marks recorded from now on. */
int phase_start(PhaseClock *c, cudaStream_t stream);
/* Phase p starts now on the stream (nothing when off; past PHASE_EVENTS
 * marks since the last collect, the rest of the step counts as the phase
 * in progress). */
void phase_mark(PhaseClock *c, Phase p);
/* Waits for the last mark and adds the intervals to the totals (call at
 * the end of a step: the marks start again). */
int phase_collect(PhaseClock *c);
void phase_stop(PhaseClock *c);
const char *phase_name(Phase p);

#ifdef __cplusplus
}
#endif

#endif
