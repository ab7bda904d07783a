/* coll.c — see coll.h. MPI implementation (CPU backend). */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

int coll_init(Coll *c, MPI_Comm comm)
{
    memset(c, 0, sizeof *c);
    c->comm = comm;
    CHECK_MPI(MPI_Comm_rank(comm, &c->rank));
    CHECK_MPI(MPI_Comm_size(comm, &c->size));
    return ISTH_OK;
}

static int alltoallv_typed(Coll *c, const void *send, const int *send_counts, void *recv,
                           const int *recv_counts, int width, MPI_Datatype base, size_t elem)
{
    const size_t row_bytes = (size_t)width * elem;
    if (c->size == 1) { /* one rank: the exchange is a copy, or nothing when in place */
        if (send_counts[0] && send != recv) memcpy(recv, send, (size_t)send_counts[0] * row_bytes);
        return ISTH_OK;
    }
    int *sd = malloc(sizeof(int) * (size_t)c->size * 2), *rd = sd + c->size;
    CHECK_ALLOC(sd);
    int s = 0, r = 0;
    for (int i = 0; i < c->size; i++) {
        sd[i] = s;
        rd[i] = r;
        s += send_counts[i];
        r += recv_counts[i];
        if (i != c->rank) {
            c->bytes_sent += (double)send_counts[i] * row_bytes;
            c->bytes_recv += (double)recv_counts[i] * row_bytes;
        }
    }
    /* counts are in rows: a row type keeps them far from INT_MAX */
    MPI_Datatype row;
    MPI_Type_contiguous(width, base, &row);
    MPI_Type_commit(&row);
    int rc = MPI_Alltoallv(send, send_counts, sd, row, recv, recv_counts, rd, row, c->comm);
    MPI_Type_free(&row);
    free(sd);
    if (rc != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "coll: MPI_Alltoallv failed (%d)", rc);
    return ISTH_OK;
}

int coll_alltoallv_rows(Coll *c, const float *send, const int *send_counts, float *recv,
                        const int *recv_counts, int width)
{
    return alltoallv_typed(c, send, send_counts, recv, recv_counts, width, MPI_FLOAT, sizeof(float));
}

int coll_alltoallv_int_rows(Coll *c, const int *send, const int *send_counts, int *recv,
                            const int *recv_counts, int width)
{
    return alltoallv_typed(c, send, send_counts, recv, recv_counts, width, MPI_INT, sizeof(int));
}

int coll_alltoall_int(Coll *c, const int *send, int *recv)
{
    if (c->size == 1) {
        recv[0] = send[0];
        return ISTH_OK;
    }
    CHECK_MPI(MPI_Alltoall(send, 1, MPI_INT, recv, 1, MPI_INT, c->comm));
    c->bytes_sent += (double)(c->size - 1) * sizeof(int);
    c->bytes_recv += (double)(c->size - 1) * sizeof(int);
    return ISTH_OK;
}

int coll_allreduce_sum_int(Coll *c, int *v, int n)
{
    if (c->size == 1) return ISTH_OK;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT, MPI_SUM, c->comm));
    return ISTH_OK;
}

int coll_allreduce_sum_double(Coll *c, double *v, int n)
{
    if (c->size == 1) return ISTH_OK;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, c->comm));
    return ISTH_OK;
}
