/* devices.c — see devices.h. */
#include "devices.h"

#include <string.h>

#include "alloc.h"
#include "status.h"

#include <stdio.h>

int device_assign(const VisibleDevices *seen, int local_size, int allow_shared, int *device_of, char *why,
                  size_t why_size)
{
    for (int r = 0; r < local_size; r++) {
        device_of[r] = -1;
        if (seen[r].n <= 0)
            return snprintf(why, why_size, "devices: local rank %d of this host sees no GPU (CUDA_VISIBLE_DEVICES, "
                            "the job's GPU request, the driver); use [train] backend = cpu", r), -1;
    }
    /* ranks with fewer choices first (local-rank order among equals): all
     * see all, or one each, reduce to local-rank order; a rank that sees
     * one GPU another also sees gets it, and the other takes a different one */
    for (int placed = 0; placed < local_size; placed++) {
        int r = -1;
        for (int q = 0; q < local_size; q++)
            if (device_of[q] < 0 && (r < 0 || seen[q].n < seen[r].n)) r = q;
        for (int d = 0; d < seen[r].n && device_of[r] < 0; d++) {
            int taken = 0;
            for (int q = 0; q < local_size && !taken; q++)
                taken = q != r && device_of[q] >= 0 && !strncmp(seen[q].id[device_of[q]], seen[r].id[d], DEVICE_ID_BYTES);
            if (!taken) device_of[r] = d;
        }
        if (device_of[r] >= 0) continue;
        if (allow_shared) {
            device_of[r] = r % seen[r].n;
            continue;
        }
        /* how many distinct GPUs the host's ranks see between them */
        int distinct = 0;
        for (int q = 0; q < local_size; q++)
            for (int d = 0; d < seen[q].n; d++) {
                int before = 0;
                for (int p = 0; p <= q && !before; p++)
                    for (int e = 0; e < (p == q ? d : seen[p].n) && !before; e++)
                        before = !strncmp(seen[p].id[e], seen[q].id[d], DEVICE_ID_BYTES);
                distinct += !before;
            }
        snprintf(why, why_size, "devices: %d ranks on this host but %d GPU(s) among them (local rank %d finds none "
                 "of its %d free): one rank per GPU — start %d ranks per host, or let each rank see the host's GPUs "
                 "(sbatch --gpus-per-node=N with N ranks per node; under mpirun, --gpus-per-task=1 can leave the "
                 "ranks of a node one GPU: jobs/README.md); [train] gpu_share = 1 lets ranks share (tests)",
                 local_size, distinct, r, seen[r].n, distinct);
        return -1;
    }
    return 0;
}

int device_gather(MPI_Comm comm, const VisibleDevices *mine, VisibleDevices **all, int *local_rank, int *local_size)
{
    *all = NULL;
    MPI_Comm host;
    CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
    int rc = MPI_Comm_rank(host, local_rank) == MPI_SUCCESS && MPI_Comm_size(host, local_size) == MPI_SUCCESS
                 ? ISTH_OK
                 : isth_fail(ISTH_ERUNTIME, "devices: cannot query the host's communicator");
    if (rc == ISTH_OK) {
        /* every rank of the host reaches the gather, or none does */
        *all = isth_malloc(sizeof(VisibleDevices) * (size_t)*local_size);
        int ok = *all != NULL, all_ok = 0;
        if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, host) != MPI_SUCCESS || !all_ok)
            rc = isth_fail(ISTH_ERUNTIME, "devices: out of memory for the host's GPU lists");
        else if (MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, *all, (int)sizeof *mine, MPI_BYTE, host) !=
                 MPI_SUCCESS)
            rc = isth_fail(ISTH_ERUNTIME, "devices: cannot exchange the visible GPUs within the host");
    }
    MPI_Comm_free(&host);
    if (rc != ISTH_OK) {
        isth_free(*all);
        *all = NULL;
    }
    return rc;
}
