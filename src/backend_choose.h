/* backend_choose.h — which backend a rank gets: the one module that knows
 * both constructors (src/cpu/backend_cpu.h, cuda/backend_cuda.h). It sits
 * above them, so the seam (backend.h, backend.c) and the backends include
 * only downwards.
 * Owns: [train] backend = auto's resolution, the refusal of what this
 * build or backend cannot do (bf16 on the CPU, cuda without CUDA), and the
 * per-rank device lines (which GPU each rank drives: the check of a
 * launcher's GPU binding).
 * Must not: compute, or hold any state of its own.
 */
#ifndef ISTHMUS_BACKEND_CHOOSE_H
#define ISTHMUS_BACKEND_CHOOSE_H

#include "backend.h"
#include "coll.h"
#include "config.h"

/* The backend [train] backend names (auto: CUDA when this build has it and
 * the host has a GPU for each of its ranks, else the CPU; collective over
 * the world) for this rank: micro-batches of up to B
 * sequences of the model's context, experts [expert_begin,
 * expert_begin + experts_local), expert parallelism over `ep`. The weights
 * are initialised (model.h: a function of the seed, not of the layout). */
int backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);

/* One line per rank of this launch (MPI_COMM_WORLD: a federated site's own
 * mpirun), printed in rank order by its rank 0, naming the device the rank
 * computes on: "device: rank R: host H (local rank L of N), GPU D of V
 * visible (PCI bus id, name; CUDA_VISIBLE_DEVICES=...)" or "..., cpu".
 * With `be` the backend's own; without, [train] backend resolved and the
 * GPU chosen as backend_create would (`config --devices`). Collective over
 * MPI_COMM_WORLD. */
int backend_print_devices(const Config *cfg, const Backend *be);

#endif
