/* coll.h — collectives inside a learner (the expert-parallel group), behind
 * one narrow interface: the CPU backend implements it with MPI, the CUDA
 * backend will implement it with NCCL.
 *
 * Owns: moving rows of floats between the ranks of one communicator
 * (variable all-to-all), sum-reductions, and counting the bytes this rank
 * sent and received through it; and the largest single MPI transfer
 * ([train] mpi_piece_bytes): every transfer here and in link.c goes in
 * pieces of at most that many bytes, so no MPI count overflows an int
 * however large the model. The *_comm helpers serve the reducer's site and
 * learner communicators with the same rule.
 * Must not: know what the rows mean; cross sites (learners never span sites).
 */
#ifndef ISTHMUS_COLL_H
#define ISTHMUS_COLL_H

#include <mpi.h>

typedef struct {
    MPI_Comm comm;
    int rank, size;
    double bytes_sent, bytes_recv; /* payload bytes to/from other ranks */
    double mark;                   /* their sum at coll_mark */
} Coll;

int coll_init(Coll *c, MPI_Comm comm);
/* Bytes this rank moved through c since the last coll_mark (a step's share). */
void coll_mark(Coll *c);
double coll_since_mark(const Coll *c);

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
/* all[s * n + i] = rank s's mine[i] (n ints from every rank). */
int coll_allgather_int(Coll *c, const int *mine, int n, int *all);
/* In-place sums over the communicator. */
int coll_allreduce_sum_int(Coll *c, int *v, size_t n);
int coll_allreduce_sum_double(Coll *c, double *v, size_t n);

/* The piece size (bytes, >= 1 KiB; default 1 GiB), process-wide. */
void coll_set_max_message(size_t bytes);
size_t coll_max_message(void);

/* Piecewise collectives on any communicator; results are identical to one
 * call (element-wise operations, pieces in order). */
int coll_allreduce_comm(MPI_Comm comm, void *buf, size_t n, MPI_Datatype type, size_t elem, MPI_Op op);
int coll_bcast_bytes(MPI_Comm comm, void *buf, size_t bytes, int root);
/* 1 when every rank of comm passed ok != 0 (0 also when MPI fails, said
 * in one line): the agreement before ranks go on into the next collective
 * together. */
int coll_all_ok(MPI_Comm comm, int ok);
/* all[r * n + i] = rank r's mine[i] */
int coll_allgather_floats(MPI_Comm comm, const float *mine, size_t n, float *all);

#endif
