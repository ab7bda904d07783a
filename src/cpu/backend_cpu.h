/* backend_cpu.h — the CPU backend's constructor (backend_cpu.c), named for
 * the chooser above the backends (src/backend_choose.c) and nobody else:
 * the trainer creates a backend through backend_choose.h's backend_create.
 *
 * Owns: the constructor's signature. Must not: be included by the seam's
 * generic part (backend.c) or by code below the chooser (the seam and
 * this backend would include each other).
 */
#ifndef ISTHMUS_BACKEND_CPU_H
#define ISTHMUS_BACKEND_CPU_H

#include "backend.h"

/* As backend_create, for backend = cpu (precision fp32, checked by the
 * chooser). */
int cpu_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);

#endif
