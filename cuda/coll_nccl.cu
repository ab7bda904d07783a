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
    for (int p = 0; p < m->size; p++) {
        const size_t ns = (size_t)send_counts[p] * row, nr = (size_t)recv_counts[p] * row;
        if (ns) CHECK_NCCL(ncclSend(send + s, ns, ncclFloat, p, c->comm, stream));
        if (nr) CHECK_NCCL(ncclRecv(recv + r, nr, ncclFloat, p, c->comm, stream));
        if (p != m->rank) {
            m->bytes_sent += (double)ns * sizeof(float);
            m->bytes_recv += (double)nr * sizeof(float);
        }
        s += ns;
        r += nr;
    }
    CHECK_NCCL(ncclGroupEnd());
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
    for (int i = 0; i < n; i++)
        if (len[i]) CHECK_NCCL(ncclBroadcast(v + off[i], v + off[i], len[i], ncclFloat, owner[i], c->comm, stream));
    CHECK_NCCL(ncclGroupEnd());
    return ISTH_OK;
}
