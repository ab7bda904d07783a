/* phases.cu — see phases.h. */
#include "phases.h"
#include "check.h"

#include <stdio.h>
#include <string.h>

extern "C" const char *phase_name(Phase p)
{
    static const char *const names[PHASE_COUNT] = {"attention", "expert GEMMs", "dispatch/combine", "router",
                                                   "dense GEMMs", "norms and element-wise", "optimiser",
                                                   "host wait (MoE header)", "other"};
    return p >= 0 && p < PHASE_COUNT ? names[p] : "?";
}

extern "C" int phase_start(PhaseClock *c, cudaStream_t stream)
{
    if (!c->on)
        for (int i = 0; i < PHASE_EVENTS; i++)
            if (cudaEventCreate(&c->ev[i]) != cudaSuccess) {
                while (i-- > 0) cudaEventDestroy(c->ev[i]);
                return isth_fail(ISTH_ERUNTIME, "cuda: cannot create the phase clock's %d events", PHASE_EVENTS);
            }
    c->on = 1;
    c->stream = stream;
    c->n = c->overflow = 0;
    memset(c->ms, 0, sizeof c->ms);
    return ISTH_OK;
}

extern "C" void phase_mark(PhaseClock *c, Phase p)
{
    if (!c || !c->on) return;
    if (c->n == PHASE_EVENTS) {
        c->overflow = 1;
        return;
    }
    c->phase[c->n] = (unsigned char)p;
    cudaEventRecord(c->ev[c->n++], c->stream);
}

extern "C" int phase_collect(PhaseClock *c)
{
    if (!c->on || c->n == 0) return ISTH_OK;
    if (c->overflow) { /* a step of more marks than the clock holds: its tail went to the last phase */
        fprintf(stderr, "isthmus: warning: more than %d phase marks in a step; the rest counted as '%s'\n",
                PHASE_EVENTS, phase_name((Phase)c->phase[c->n - 1]));
        c->overflow = 0;
    }
    CHECK_CUDA(cudaEventSynchronize(c->ev[c->n - 1]));
    for (int i = 0; i + 1 < c->n; i++) {
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, c->ev[i], c->ev[i + 1]));
        c->ms[c->phase[i]] += ms;
    }
    /* the last mark opens the interval that goes on: it becomes the first */
    const int last = c->n - 1;
    cudaEvent_t keep = c->ev[last];
    c->ev[last] = c->ev[0];
    c->ev[0] = keep;
    c->phase[0] = c->phase[last];
    c->n = 1;
    return ISTH_OK;
}

extern "C" void phase_stop(PhaseClock *c)
{
    if (!c->on) return;
    for (int i = 0; i < PHASE_EVENTS; i++) cudaEventDestroy(c->ev[i]);
    c->on = 0;
}
