/* devices.h — which GPU each rank drives: one GPU per rank, however the
 * launcher made the GPUs visible.
 *
 * Launchers differ: `srun --gpus-per-task=1` (or a wrapper setting
 * CUDA_VISIBLE_DEVICES per task) shows each task one GPU of its own;
 * `--gpus-per-node` and plain mpirun show every rank all of the host's
 * GPUs; `--gpu-bind` shows each task a subset, in an order of its own. So
 * the rule works on identities, not counts: the ranks of a host exchange
 * the UUIDs of the GPUs each sees, and, rank by rank — those that see fewer
 * first, local-rank order among equals — each takes the first GPU it sees
 * that no rank placed before it took. (All GPUs visible to all: local rank
 * r drives the r-th; one each: each drives its own.) A rank left without a GPU of its own is an error naming
 * the counts and the remedies, unless sharing is allowed explicitly (for
 * tests that put several ranks on one GPU): it then drives its local rank
 * modulo the GPUs it sees.
 * Owns: the rule, the exchange within the host (MPI_Comm_split_type over
 * the shared-memory domain). Must not: call CUDA (the backend lists the
 * GPUs it sees and sets the device); decide which backend runs.
 */
#ifndef ISTHMUS_DEVICES_H
#define ISTHMUS_DEVICES_H

#include <mpi.h>
#include <stddef.h>

#define DEVICE_MAX_VISIBLE 64
#define DEVICE_ID_BYTES 48 /* "GPU-<32 hex digits>": a GPU's UUID (a MIG instance has its own) */

/* The GPUs one rank sees, in its own (CUDA's) order. */
typedef struct {
    int n;
    char id[DEVICE_MAX_VISIBLE][DEVICE_ID_BYTES];
} VisibleDevices;

/* The rule over a host: seen[r] is what local rank r sees (local_size
 * ranks); device_of[r] = the index into seen[r] of its GPU. 0, or -1 with
 * the one-line reason in why (naming the first rank left without a GPU;
 * the caller decides whether that is an error). Every rank of a host
 * computes the same answer from the same lists. */
int device_assign(const VisibleDevices *seen, int local_size, int allow_shared, int *device_of, char *why,
                  size_t why_size);

/* Collective over comm: this rank's place among the ranks of its host and
 * every local rank's list (*all: local_size entries, isth_free it). */
int device_gather(MPI_Comm comm, const VisibleDevices *mine, VisibleDevices **all, int *local_rank, int *local_size);

#endif
