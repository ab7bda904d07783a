/* devices.h — which GPU each rank drives: one GPU per rank, chosen by the
 * rank's place among the ranks of its host.
 *
 * Owns: the rule (local rank r of L ranks on a host with D visible devices
 * drives device r; more ranks than devices is an error naming the counts,
 * unless sharing is allowed explicitly — for tests that put several ranks
 * on one GPU — in which case rank r drives device r mod D), and finding
 * the local rank (MPI_Comm_split_type over the shared-memory domain).
 * Must not: call CUDA (the backend asks the driver for D and sets the
 * device); decide which backend runs.
 */
#ifndef ISTHMUS_DEVICES_H
#define ISTHMUS_DEVICES_H

#include <mpi.h>

/* The device for local rank `local_rank` of `local_size` ranks on a host
 * with `devices` visible GPUs, into *device; a one-line error (exit 2)
 * when the host has too few GPUs and sharing is not allowed. */
int device_for_rank(int local_rank, int local_size, int devices, int allow_shared, int *device);

/* This rank's place among the ranks of `comm` on its host. Collective. */
int device_local_rank(MPI_Comm comm, int *local_rank, int *local_size);

#endif
