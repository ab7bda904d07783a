/* coll_nccl.cu — see coll_nccl.h. */
#include "coll_nccl.h"
#include "check.h"

#include <string.h>

extern "C" int cuda_coll_init(CudaColl *c, Coll *mpi)
{
    memset(c, 0, sizeof *c);
    c->mpi = mpi;
    ncclUniqueId id;
    if (mpi->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi->comm));
    CHECK_NCCL(ncclCommInitRank(&c->comm, mpi->size, id, mpi->rank));
    return ISTH_OK;
}

extern "C" void cuda_coll_destroy(CudaColl *c)
{
    if (c->comm) ncclCommDestroy(c->comm);
    c->comm = NULL;
}

/* Close a group whatever happened inside it (NCCL's group must end, or the
 * next call on this thread joins a group that never completes), then
 * report the first failure: the call inside, or the group's end. */
static int group_end(ncclResult_t inside, const char *what)
{
    const ncclResult_t end = ncclGroupEnd();
    if (inside != ncclSuccess)
        return isth_fail(ISTH_ERUNTIME, "nccl: %s failed inside a group: %s", what ? what : "a call",
                         ncclGetErrorString(inside));
    if (end != ncclSuccess) return isth_fail(ISTH_ERUNTIME, "nccl: ncclGroupEnd failed: %s", ncclGetErrorString(end));
    return ISTH_OK;
}

extern "C" int cuda_coll_alltoallv_rows(CudaColl *c, const float *send, const int *send_counts, float *recv,
                                        const int *recv_counts, int width, cudaStream_t stream)
{
    Coll *m = c->mpi;
    const size_t row = (size_t)width;
    if (m->size == 1) {
        if (send_counts[0] && send != recv)
            CHECK_CUDA(cudaMemcpyAsync(recv, send, sizeof(float) * row * send_counts[0], cudaMemcpyDeviceToDevice,
                                       stream));
        return ISTH_OK;
    }
    size_t s = 0, r = 0;
    CHECK_NCCL(ncclGroupStart());
    ncclResult_t bad = ncclSuccess; /* the first failure inside the group: the group is closed before returning */
    const char *what = NULL;
    for (int p = 0; p < m->size && bad == ncclSuccess; p++) {
        const size_t ns = (size_t)send_counts[p] * row, nr = (size_t)recv_counts[p] * row;
        if (ns && (bad = ncclSend(send + s, ns, ncclFloat, p, c->comm, stream)) != ncclSuccess) what = "ncclSend";
        if (bad == ncclSuccess && nr && (bad = ncclRecv(recv + r, nr, ncclFloat, p, c->comm, stream)) != ncclSuccess)
            what = "ncclRecv";
        if (p != m->rank) {
            m->bytes_sent += (double)ns * sizeof(float);
            m->bytes_recv += (double)nr * sizeof(float);
        }
        s += ns;
        r += nr;
    }
    return group_end(bad, what);
}

extern "C" int cuda_coll_allgather_int(CudaColl *c, const int *mine, int n, int *all, cudaStream_t stream)
{
    Coll *m = c->mpi;
    if (m->size == 1) {
        if (n && all != mine)
            CHECK_CUDA(cudaMemcpyAsync(all, mine, sizeof(int) * (size_t)n, cudaMemcpyDeviceToDevice, stream));
        return ISTH_OK;
    }
    if (n) CHECK_NCCL(ncclAllGather(mine, all, (size_t)n, ncclInt32, c->comm, stream));
    m->bytes_sent += (double)(m->size - 1) * n * sizeof(int);
    m->bytes_recv += (double)(m->size - 1) * n * sizeof(int);
    return ISTH_OK;
}

extern "C" int cuda_coll_allreduce_sum(CudaColl *c, float *v, size_t n, cudaStream_t stream)
{
    if (c->mpi->size > 1 && n) CHECK_NCCL(ncclAllReduce(v, v, n, ncclFloat, ncclSum, c->comm, stream));
    return ISTH_OK;
}

extern "C" int cuda_coll_share(CudaColl *c, float *v, const size_t *off, const size_t *len, const int *owner, int n,
                               cudaStream_t stream)
{
    if (c->mpi->size == 1 || !n) return ISTH_OK;
    CHECK_NCCL(ncclGroupStart());
    ncclResult_t bad = ncclSuccess;
    for (int i = 0; i < n && bad == ncclSuccess; i++)
        if (len[i]) bad = ncclBroadcast(v + off[i], v + off[i], len[i], ncclFloat, owner[i], c->comm, stream);
    return group_end(bad, "ncclBroadcast");
}
