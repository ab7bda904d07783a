/* coll_nccl.h (cuda/) — the learner's collectives on device memory over NCCL,
 * mirroring src/coll.h: the CUDA backend's implementation of the same
 * operations (variable all-to-all of rows for the expert dispatch, sums,
 * and the owners' copies), counted into the same Coll byte counters so the
 * logs read the same whichever backend ran.
 *
 * Owns: the NCCL communicator of one learner, made from the learner's MPI
 * communicator (rank 0's unique id broadcast over MPI).
 * Must not: cross sites (learners never span sites; the link stays MPI on
 * host buffers), or know what the rows mean.
 */
#ifndef ISTHMUS_CUDA_COLL_NCCL_H
#define ISTHMUS_CUDA_COLL_NCCL_H

#include <stddef.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "coll.h"

typedef struct {
    ncclComm_t comm;
    Coll *mpi; /* the same ranks over MPI: small host messages, byte counters */
} CudaColl;

/* Collective over mpi's ranks (the current device must be set). */
int cuda_coll_init(CudaColl *c, Coll *mpi);
void cuda_coll_destroy(CudaColl *c);

/* As coll_alltoallv_rows, on device rows, queued on `stream` (grouped
 * ncclSend/ncclRecv). With one rank, recv may be send. */
int cuda_coll_alltoallv_rows(CudaColl *c, const float *send, const int *send_counts, float *recv,
                             const int *recv_counts, int width, cudaStream_t stream);
/* all[s * n + i] = rank s's mine[i]: n ints from every rank (ncclAllGather). */
int cuda_coll_allgather_int(CudaColl *c, const int *mine, int n, int *all, cudaStream_t stream);
/* v (n) summed over the learner in place (ncclAllReduce). */
int cuda_coll_allreduce_sum(CudaColl *c, float *v, size_t n, cudaStream_t stream);
/* n runs (off[i], len[i]) of v copied from rank owner[i] to every rank
 * (one NCCL group of broadcasts: exact copies). */
int cuda_coll_share(CudaColl *c, float *v, const size_t *off, const size_t *len, const int *owner, int n,
                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
