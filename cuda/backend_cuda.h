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
/* Sets this rank's GPU as the backend does (devices.h; collective over the
 * world): what `config --devices` shows without creating a backend. */
int cuda_select_device(const Config *cfg, int *device);
/* The current GPU in words: its index among those visible, their number,
 * its PCI bus id and name, and CUDA_VISIBLE_DEVICES. */
void cuda_describe_device(char *out, size_t size);

#ifdef __cplusplus
}
#endif

#endif
