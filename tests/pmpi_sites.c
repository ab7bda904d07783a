/* pmpi_sites.c — a PMPI shim (LD_PRELOAD) that counts the MPI calls of a
 * run that start communication between two sites: point-to-point calls
 * whose peer is in another site, and collectives on a communicator that
 * spans sites. Sites are consecutive world ranks, sizes in
 * ISTHMUS_PMPI_SITES ("2,2"); at MPI_Finalize each rank writes
 * "<function> <count>" lines to $ISTHMUS_PMPI_OUT.<rank>.
 * tests/cli_faults.sh uses it to check that a two-site diloco run makes no
 * inter-site MPI call between outer steps. A test helper, not part of isthmus. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SITES 16
enum { F_SEND, F_ISEND, F_RECV, F_IRECV, F_ALLREDUCE, F_IALLREDUCE, F_BCAST, F_ALLGATHER, F_BARRIER,
       F_ALLTOALL, F_ALLTOALLV, F_GATHER, F_REDUCE, F_ALLGATHERV, F_IBARRIER, F_IBCAST, N_F };
static const char *const names[N_F] = {"MPI_Send", "MPI_Isend", "MPI_Recv", "MPI_Irecv", "MPI_Allreduce",
                                       "MPI_Iallreduce", "MPI_Bcast", "MPI_Allgather", "MPI_Barrier",
                                       "MPI_Alltoall", "MPI_Alltoallv", "MPI_Gather", "MPI_Reduce",
                                       "MPI_Allgatherv", "MPI_Ibarrier", "MPI_Ibcast"};
static long counts[N_F];
static int site_end[MAX_SITES], n_sites;

static int site_of(int world_rank)
{
    for (int s = 0; s < n_sites; s++)
        if (world_rank < site_end[s]) return s;
    return -1;
}

static void load_sites(void)
{
    if (n_sites) return;
    const char *v = getenv("ISTHMUS_PMPI_SITES");
    int end = 0;
    while (v && *v && n_sites < MAX_SITES) {
        end += atoi(v);
        site_end[n_sites++] = end;
        v = strchr(v, ',');
        if (v) v++;
    }
}

static int world_of(MPI_Comm comm, int rank)
{
    MPI_Group g, w;
    int out = MPI_UNDEFINED;
    PMPI_Comm_group(comm, &g);
    PMPI_Comm_group(MPI_COMM_WORLD, &w);
    PMPI_Group_translate_ranks(g, 1, &rank, w, &out);
    PMPI_Group_free(&g);
    PMPI_Group_free(&w);
    return out;
}

static int me(void)
{
    int r;
    PMPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static void p2p(int f, MPI_Comm comm, int peer)
{
    load_sites();
    if (peer < 0) return; /* MPI_PROC_NULL, MPI_ANY_SOURCE */
    if (site_of(world_of(comm, peer)) != site_of(me())) counts[f]++;
}

static void coll(int f, MPI_Comm comm)
{
    load_sites();
    int size;
    PMPI_Comm_size(comm, &size);
    const int first = site_of(world_of(comm, 0));
    for (int i = 1; i < size; i++)
        if (site_of(world_of(comm, i)) != first) {
            counts[f]++;
            return;
        }
}

int MPI_Send(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c)
{
    p2p(F_SEND, c, d);
    return PMPI_Send(b, n, t, d, tag, c);
}
int MPI_Isend(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c, MPI_Request *r)
{
    p2p(F_ISEND, c, d);
    return PMPI_Isend(b, n, t, d, tag, c, r);
}
int MPI_Recv(void *b, int n, MPI_Datatype t, int s, int tag, MPI_Comm c, MPI_Status *st)
{
    p2p(F_RECV, c, s);
    return PMPI_Recv(b, n, t, s, tag, c, st);
}
int MPI_Irecv(void *b, int n, MPI_Datatype t, int s, int tag, MPI_Comm c, MPI_Request *r)
{
    p2p(F_IRECV, c, s);
    return PMPI_Irecv(b, n, t, s, tag, c, r);
}
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c)
{
    coll(F_ALLREDUCE, c);
    return PMPI_Allreduce(s, r, n, t, o, c);
}
int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, MPI_Request *q)
{
    coll(F_IALLREDUCE, c);
    return PMPI_Iallreduce(s, r, n, t, o, c, q);
}
int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{
    coll(F_BCAST, c);
    return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Ibcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request *q)
{
    coll(F_IBCAST, c);
    return PMPI_Ibcast(b, n, t, root, c, q);
}
int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c)
{
    coll(F_ALLGATHER, c);
    return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}
int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *d, MPI_Datatype rt,
                   MPI_Comm c)
{
    coll(F_ALLGATHERV, c);
    return PMPI_Allgatherv(s, sn, st, r, rn, d, rt, c);
}
int MPI_Barrier(MPI_Comm c)
{
    coll(F_BARRIER, c);
    return PMPI_Barrier(c);
}
int MPI_Ibarrier(MPI_Comm c, MPI_Request *q)
{
    coll(F_IBARRIER, c);
    return PMPI_Ibarrier(c, q);
}
int MPI_Alltoall(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c)
{
    coll(F_ALLTOALL, c);
    return PMPI_Alltoall(s, sn, st, r, rn, rt, c);
}
int MPI_Alltoallv(const void *s, const int *sn, const int *sd, MPI_Datatype st, void *r, const int *rn,
                  const int *rd, MPI_Datatype rt, MPI_Comm c)
{
    coll(F_ALLTOALLV, c);
    return PMPI_Alltoallv(s, sn, sd, st, r, rn, rd, rt, c);
}
int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c)
{
    coll(F_GATHER, c);
    return PMPI_Gather(s, sn, st, r, rn, rt, root, c);
}
int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, int root, MPI_Comm c)
{
    coll(F_REDUCE, c);
    return PMPI_Reduce(s, r, n, t, o, root, c);
}

int MPI_Finalize(void)
{
    const char *out = getenv("ISTHMUS_PMPI_OUT");
    if (out) {
        char path[1024];
        snprintf(path, sizeof path, "%s.%d", out, me());
        FILE *f = fopen(path, "w");
        for (int i = 0; f && i < N_F; i++) fprintf(f, "%s %ld\n", names[i], counts[i]);
        if (f) fclose(f);
    }
    return PMPI_Finalize();
}
