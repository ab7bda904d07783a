/* nameserver.h — whether the name service (ompi-server) that this site's
 * mpirun was given is still there, so that a site never calls one that is
 * gone.
 *
 * Open MPI 4.1.4, measured (jobs/README.md, "When ompi-server restarts"):
 * once joined, the sites train without the name service; they call it again
 * only to take a site back, and the host unpublishes the run's name at its
 * end. With ompi-server gone, that call waits forever (the host trains no
 * more, or never exits); with ompi-server started again at the same address
 * it has another process name (Open MPI derives it from the host and the
 * pid), and the mpirun that knew the old one ends at the call (exit 1,
 * "received unexpected process identifier"). So the first rank of each site
 * holds a TCP connection to the server's address (ISTHMUS_NAME_SERVER =
 * ADDR:PORT, which scripts/federated.sh sets; unset: no watch, the calls go
 * ahead as before). ompi-server keeps such an idle connection open until it
 * ends, so the connection's end means that the server this mpirun knows is
 * gone for good, whatever has started at that address since; from then on
 * the site leaves the name service alone.
 *
 * Owns: the connection, its verdict and the one line that reports it.
 * Must not: call MPI, or decide what a site does without the name service
 * (federation.c does).
 */
#ifndef ISTHMUS_NAMESERVER_H
#define ISTHMUS_NAMESERVER_H

/* Opens the connection to ISTHMUS_NAME_SERVER (once; a server that does
 * not answer counts as gone). A no-op when the variable is unset. */
void nameserver_watch(void);

/* 1 once the server watched is gone (its connection ended, or it did not
 * answer), reported in one line the first time; 0 while it is there or
 * when nothing is watched. Costs one poll(2), never waits. */
int nameserver_gone(void);

#endif
