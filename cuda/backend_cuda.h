/* backend_cuda.h (cuda/) — the CUDA backend's constructor and device
 * census (backend_cuda.cu), mirroring src/cpu/backend_cpu.h: named for the
 * chooser above the backends (src/backend_choose.c). Plain C declarations,
 * included by the C chooser and by backend_cuda.cu itself.
 *
 * Owns: those signatures. Must not: be included by the seam's generic
 * part (backend.c) or by code below the chooser.
 */
#ifndef ISTHMUS_CUDA_BACKEND_CUDA_H
#define ISTHMUS_CUDA_BACKEND_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"
#include "devices.h"

/* As backend_create, for backend = cuda (or auto with a GPU per rank). */
int cuda_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);
/* GPUs this process sees (0 on any error). */
int cuda_device_count(void);
/* Their ids, in CUDA's order (devices.h). */
void cuda_visible_devices(VisibleDevices *v);

#ifdef __cplusplus
}
#endif

#endif
