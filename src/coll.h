/* coll.h — collectives inside a learner (the expert-parallel group), behind
 * one narrow interface: the CPU backend implements it with MPI, the CUDA
 * backend will implement it with NCCL.
 *
 * Owns: moving rows of floats between the ranks of one communicator
 * (variable all-to-all), small sum-reductions, and counting the bytes this
 * rank sent and received through it.
 * Must not: know what the rows mean; cross sites (learners never span sites).
 */
#ifndef ISTHMUS_COLL_H
#define ISTHMUS_COLL_H

#include <mpi.h>

typedef struct {
    MPI_Comm comm;
    int rank, size;
    double bytes_sent, bytes_recv; /* payload bytes to/from other ranks */
} Coll;

int coll_init(Coll *c, MPI_Comm comm);

/* Rows of `width` floats: send_counts[d] consecutive rows of `send` go to
 * rank d (in rank order); recv gets recv_counts[s] rows from each s, in
 * rank order. With one rank, recv may be send (nothing moves). */
int coll_alltoallv_rows(Coll *c, const float *send, const int *send_counts, float *recv,
                        const int *recv_counts, int width);
/* Same for rows of `width` ints. */
int coll_alltoallv_int_rows(Coll *c, const int *send, const int *send_counts, int *recv,
                            const int *recv_counts, int width);
/* recv[s] = what rank s put in send[me]: one int per rank. */
int coll_alltoall_int(Coll *c, const int *send, int *recv);
/* In-place sums over the communicator. */
int coll_allreduce_sum_int(Coll *c, int *v, int n);
int coll_allreduce_sum_double(Coll *c, double *v, int n);

#endif
