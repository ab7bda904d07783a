/* backend_choose.c — see backend_choose.h. */
#include "backend_choose.h"

#include "autoconf.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "cpu/backend_cpu.h"
#include "devices.h"
#include "status.h"
#if HAVE_CUDA
#include "../cuda/backend_cuda.h"
#endif

/* auto: the CUDA backend when this build has it and every rank of this
 * host can have a GPU of its own (devices.h); else the CPU one (said once,
 * by world rank 0, when GPUs are visible but too few). Collective over the
 * world. */
static int resolve_auto(const Config *cfg, const char **name)
{
    *name = "cpu";
#if HAVE_CUDA
    VisibleDevices mine, *all = NULL;
    cuda_visible_devices(&mine);
    int local = 0, local_size = 0;
    /* a failure here still reaches the world-wide agreement below: ranks
     * of other hosts wait in it */
    const int gathered = device_gather(MPI_COMM_WORLD, &mine, &all, &local, &local_size);
    int *device_of = gathered == ISTH_OK ? isth_malloc(sizeof(int) * (size_t)local_size) : NULL;
    int any = 0;
    for (int r = 0; all && r < local_size; r++) any |= all[r].n > 0;
    char why[512]; /* a refusal here means "use the CPU", not an error */
    const int fits = device_of && device_assign(all, local_size, cfg->train.gpu_share, device_of, why, sizeof why) == 0;
    isth_free(device_of);
    isth_free(all);
    /* one answer for the whole world: a CUDA rank's device selection is
     * collective, and hosts may differ */
    int every = fits;
    CHECK_MPI(MPI_Allreduce(&fits, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    CHECK(gathered);
    if (every) *name = "cuda";
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (any && !every && world_rank == 0)
        fprintf(stderr, "isthmus: backend = auto: not every rank has a GPU of its own: the CPU backend "
                "(backend = cuda says why; gpu_share = 1 lets ranks share)\n");
#else
    (void)cfg;
#endif
    return ISTH_OK;
}

#define DEVICE_LINE_BYTES 320

int backend_print_devices(const Config *cfg, const Backend *be)
{
    int rank, size, local = 0, local_size = 1, len = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm host;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
    MPI_Comm_rank(host, &local);
    MPI_Comm_size(host, &local_size);
    MPI_Comm_free(&host);
    char name[MPI_MAX_PROCESSOR_NAME] = "?", what[256] = "cpu";
    MPI_Get_processor_name(name, &len);
    const char *backend = be ? be->ops->name : cfg->train.backend;
    if (!be && !strcmp(backend, "auto")) CHECK(resolve_auto(cfg, &backend));
    int rc = ISTH_OK;
#if HAVE_CUDA
    if (!strcmp(backend, "cuda")) {
        int device;
        if (!be) rc = cuda_select_device(cfg, &device); /* the backend's choice, without the backend */
        if (rc == ISTH_OK) cuda_describe_device(what, sizeof what);
    }
#else
    if (strcmp(backend, "cpu"))
        rc = isth_fail(ISTH_EINPUT, "config: [train] backend = %s, but this isthmus was built without CUDA "
                       "(./configure --with-cuda); use backend = cpu or auto", backend);
#endif
    /* every rank reaches the gather: a rank that failed says so in its line */
    char line[DEVICE_LINE_BYTES];
    snprintf(line, sizeof line, "device: rank %d: host %s (local rank %d of %d), %s", rank, name, local, local_size,
             rc == ISTH_OK ? what : "no device (the error above)");
    char *all = rank == 0 ? isth_malloc((size_t)size * DEVICE_LINE_BYTES) : NULL;
    int ok = rank != 0 || all;
    if (MPI_Gather(line, DEVICE_LINE_BYTES, MPI_CHAR, all, DEVICE_LINE_BYTES, MPI_CHAR, 0, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        ok = 0;
    for (int r = 0; rank == 0 && all && ok && r < size; r++) printf("%s\n", all + (size_t)r * DEVICE_LINE_BYTES);
    fflush(stdout);
    isth_free(all);
    if (rc == ISTH_OK && !ok) rc = isth_fail(ISTH_ERUNTIME, "devices: cannot gather the ranks' device lines");
    return rc;
}

int backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep)
{
    *out = NULL;
    const char *name = cfg->train.backend;
    if (!strcmp(name, "auto")) CHECK(resolve_auto(cfg, &name));
    if (!strcmp(name, "cpu")) {
        if (!strcmp(cfg->train.precision, "bf16"))
            return isth_fail(ISTH_EINPUT, "config: [train] precision = bf16 needs the CUDA backend; the CPU backend "
                             "computes in fp32 (precision = fp32)");
        return cpu_backend_create(out, cfg, B, expert_begin, experts_local, ep);
    }
#if HAVE_CUDA
    return cuda_backend_create(out, cfg, B, expert_begin, experts_local, ep);
#else
    return isth_fail(ISTH_EINPUT, "config: [train] backend = %s, but this isthmus was built without CUDA "
                     "(./configure --with-cuda); use backend = cpu or auto", name);
#endif
}

