/* devices.c — see devices.h. */
#include "devices.h"

#include "status.h"

int device_for_rank(int local_rank, int local_size, int devices, int allow_shared, int *device)
{
    *device = -1;
    if (devices <= 0)
        return isth_fail(ISTH_EINPUT, "devices: no GPU is visible on this host (CUDA_VISIBLE_DEVICES, the driver); "
                         "use [train] backend = cpu");
    if (local_rank < 0 || local_rank >= local_size)
        return isth_fail(ISTH_ERUNTIME, "devices: local rank %d is not among %d ranks", local_rank, local_size);
    if (local_size > devices && !allow_shared)
        return isth_fail(ISTH_EINPUT, "devices: %d ranks on this host but %d GPU(s): one rank per GPU (start %d "
                         "ranks per host, or allow sharing for tests)", local_size, devices, devices);
    *device = local_rank % devices;
    return ISTH_OK;
}

int device_local_rank(MPI_Comm comm, int *local_rank, int *local_size)
{
    MPI_Comm host;
    CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
    int rc = MPI_Comm_rank(host, local_rank) == MPI_SUCCESS && MPI_Comm_size(host, local_size) == MPI_SUCCESS
                 ? ISTH_OK
                 : isth_fail(ISTH_ERUNTIME, "devices: cannot query the host's communicator");
    MPI_Comm_free(&host);
    return rc;
}
