/* wire_conn.h — the wire's connections: each rank listens on one TCP
 * port, the addresses are exchanged once through the MPI world
 * (wire_open), and a pair of ranks connects lazily, the first time either
 * end has something for the other: the lower rank opens outer.streams
 * sockets, each starting with a hello MAC'd under the pair of sites' key.
 * A connection that comes in waits (at most MAX_PENDING of them) until its
 * hello is read whole and verified; one that does not verify, or says
 * nothing within hello_timeout_s, is refused and counted.
 * Owns: the listening socket and its port, the check that a port range
 * holds a port for every rank of a host that listens on it, the
 * advertised address, connecting, accepting, the hello, socket options
 * (wire.c's wire_open exchanges the addresses and wire_close closes
 * everything).
 * Must not: read or write a chunk (wire_stream.c), or block (but in the
 * setup collective wire_open calls, wire_conn_ports_enough).
 */
#ifndef ISTHMUS_WIRE_CONN_H
#define ISTHMUS_WIRE_CONN_H

#include <mpi.h>

#include "wire_state.h"

/* The lower rank of a pair connects, the first time either end has
 * something for the other (the higher waits for it); once per peer. */
void wire_peer_start(Wire *w, int peer, Peer *p);
/* Take every connection waiting on the listening socket (to wait for its
 * hello). */
void wire_accept_all(Wire *w);
/* Read a waiting connection's hello: verified, it becomes the stream it
 * names (and is pumped); else it is refused. */
void wire_pending_read(Wire *w, Pending *q);
/* Close and forget a connection waiting for its hello. */
void wire_pending_drop(Wire *w, Pending *q);
/* The IPv4 address other sites reach this rank at ([outer] interface, or
 * the first non-loopback interface up; loopback when there is none). -1
 * when a named interface has none. */
int wire_conn_local_address(const char *interface, uint32_t *addr);
/* Collective over comm, every rank whatever failed before it: do the
 * ranks of each host that share a port range (MPI_COMM_TYPE_SHARED, the
 * same [outer] ports) number at most its ports? ISTH_OK, or on every rank
 * ISTH_EINPUT after one line from the lowest rank of the first host short
 * of ports, naming the range, the host and its ranks (so the line does not
 * depend on which rank would lose the race for a port). */
int wire_conn_ports_enough(MPI_Comm comm, const WireOptions *o);
/* Listen on the first free port of [outer] ports (w->lfd, *port); -1 and
 * why when none. */
int wire_conn_listen(Wire *w, uint16_t *port, char *why, size_t why_len);

#endif
