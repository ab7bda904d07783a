/* coll.c — see coll.h. MPI implementation (CPU backend). */
#include "coll.h"
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

int coll_all_ok(MPI_Comm comm, int ok)
{
    int all = ok != 0;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_LAND, comm);
    if (rc != MPI_SUCCESS) {
        isth_fail_mpi(__FILE__, __LINE__, "MPI_Allreduce (the ranks' agreement)", rc); /* says why */
        return 0;
    }
    return all;
}

void coll_mark(Coll *c) { c->mark = c->bytes_sent + c->bytes_recv; }

double coll_since_mark(const Coll *c) { return c->bytes_sent + c->bytes_recv - c->mark; }

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
    int *sd = isth_malloc(sizeof(int) * (size_t)c->size * 2);
    CHECK_ALLOC(sd);
    int *rd = sd + c->size;
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
    CHECK_MPI(MPI_Type_contiguous(width, base, &row));
    CHECK_MPI(MPI_Type_commit(&row));
    int rc = MPI_Alltoallv(send, send_counts, sd, row, recv, recv_counts, rd, row, c->comm);
    MPI_Type_free(&row);
    isth_free(sd);
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

int coll_allgather_int(Coll *c, const int *mine, int n, int *all)
{
    if (c->size == 1) {
        memcpy(all, mine, (size_t)n * sizeof(int));
        return ISTH_OK;
    }
    CHECK_MPI(MPI_Allgather(mine, n, MPI_INT, all, n, MPI_INT, c->comm));
    c->bytes_sent += (double)(c->size - 1) * n * sizeof(int);
    c->bytes_recv += (double)(c->size - 1) * n * sizeof(int);
    return ISTH_OK;
}

int coll_allreduce_sum_int(Coll *c, int *v, size_t n)
{
    if (c->size == 1) return ISTH_OK;
    return coll_allreduce_comm(c->comm, v, n, MPI_INT, sizeof(int), MPI_SUM);
}

int coll_allreduce_sum_double(Coll *c, double *v, size_t n)
{
    if (c->size == 1) return ISTH_OK;
    return coll_allreduce_comm(c->comm, v, n, MPI_DOUBLE, sizeof(double), MPI_SUM);
}

static size_t max_message = (size_t)1 << 30;

void coll_set_max_message(size_t bytes) { max_message = bytes < 1024 ? 1024 : bytes; }
size_t coll_max_message(void) { return max_message; }

/* elements of `elem` bytes per piece (at least one) */
static size_t piece_elems(size_t elem)
{
    const size_t n = max_message / elem;
    return n ? n : 1;
}

int coll_allreduce_comm(MPI_Comm comm, void *buf, size_t n, MPI_Datatype type, size_t elem, MPI_Op op)
{
    const size_t per = piece_elems(elem);
    for (size_t off = 0; off < n; off += per) {
        const size_t len = n - off < per ? n - off : per;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)len, type, op, comm));
    }
    return ISTH_OK;
}

int coll_bcast_bytes(MPI_Comm comm, void *buf, size_t bytes, int root)
{
    const size_t per = piece_elems(1);
    for (size_t off = 0; off < bytes; off += per) {
        const size_t len = bytes - off < per ? bytes - off : per;
        CHECK_MPI(MPI_Bcast((char *)buf + off, (int)len, MPI_BYTE, root, comm));
    }
    return ISTH_OK;
}

int coll_allgather_floats(MPI_Comm comm, const float *mine, size_t n, float *all)
{
    const size_t per = piece_elems(sizeof(float));
    for (size_t off = 0; off < n; off += per) {
        const size_t len = n - off < per ? n - off : per;
        /* a piece of every rank's block: `len` floats, placed n floats apart */
        MPI_Datatype piece, spaced;
        CHECK_MPI(MPI_Type_contiguous((int)len, MPI_FLOAT, &piece));
        int rc = MPI_Type_create_resized(piece, 0, (MPI_Aint)(n * sizeof(float)), &spaced);
        MPI_Type_free(&piece); /* the resized type keeps what it needs */
        if (rc != MPI_SUCCESS) return isth_fail_mpi(__FILE__, __LINE__, "MPI_Type_create_resized", rc);
        CHECK_MPI(MPI_Type_commit(&spaced));
        rc = MPI_Allgather(mine + off, (int)len, MPI_FLOAT, all + off, 1, spaced, comm);
        MPI_Type_free(&spaced);
        if (rc != MPI_SUCCESS) return isth_fail_mpi(__FILE__, __LINE__, "MPI_Allgather", rc);
    }
    return ISTH_OK;
}
