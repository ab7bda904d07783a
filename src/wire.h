/* wire.h — the inter-site transport: TCP connections between ranks of
 * different sites, owned by isthmus so that no wait on another site can
 * outlive the caller's deadline.
 *
 * Why not MPI: Open MPI 4.1 has no fault tolerance; when a peer dies with
 * a large message in flight, its TCP transport can loop inside
 * MPI_Testall and never return to the caller's deadline check (3 of 4
 * trials with 986 KB payloads in scripts/fault_matrix.sh, docs/benchmarks.md).
 * Here every socket is non-blocking and nothing waits longer than the
 * caller asks: a dead peer's messages simply never complete.
 *
 * Shape: each rank listens on one TCP port (outer.ports) on the address of
 * outer.interface; the addresses are exchanged once through the MPI world
 * (wire_open, collective). Connections are made lazily, on the first
 * message to or from a peer: the rank with the lower rank connects
 * outer.streams sockets, each opened with a hello that carries a MAC under
 * the pair of sites' key (a connection from outside the run is refused and
 * counted). A message is cut into chunks of WIRE_CHUNK_BYTES (each with a
 * small header: tag, per-(peer, tag) sequence number, offset, length,
 * total) striped over the streams, so one rank pair can fill a long fat
 * pipe that a single TCP window cannot. Receives are matched by (peer, tag)
 * in posted order, as MPI's non-overtaking rule does; chunks that arrive
 * before their receive is posted are kept (at most unexpected_max bytes
 * over all peers; beyond that a stream is not read until a receive is
 * posted or room comes back). A peer whose socket fails or closes, or that
 * sends a chunk that does not parse or repeats one, is failed: nothing more
 * to or from it (its early arrivals are let go).
 * Owns: the sockets, their handshake, chunking, matching, buffering — in
 * parts: wire_conn.c (listening, connecting, accepting, the hello),
 * wire_stream.c (chunks written and read on a stream, matched to their
 * message, early arrivals kept), wire_state.c (a peer's state and its
 * failure), wire.c (opening and closing: the address exchange; the ops a
 * caller posts, and progress); wire_types.h the types they share.
 * Must not: block; know what a message means (link.c frames and seals
 * them: a byte from the wire is untrusted until link_check opens it).
 */
#ifndef ISTHMUS_WIRE_H
#define ISTHMUS_WIRE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "seal.h"
#include "wire_types.h"


/* Collective over comm (every rank, in the same order): listen, exchange
 * addresses. site_first[n_sites + 1]: site s's ranks are [site_first[s],
 * site_first[s + 1]). tx[s]/rx[s]: the keys of frames to and from site s
 * (the hello's MAC). On failure every rank returns an error. */
int wire_open(Wire **out, MPI_Comm comm, const int *site_first, int n_sites, int my_site,
              const unsigned char (*tx)[SEAL_KEY_BYTES], const unsigned char (*rx)[SEAL_KEY_BYTES],
              const WireOptions *o);
/* Close every socket, free what is left (buffers of cancelled receives
 * included: the wire never writes a caller's buffer after wire_cancel). */
void wire_close(Wire *w);

/* Post a send or receive of `len` bytes with `peer` (a rank of comm in
 * another site). The buffer stays the caller's concern until the op
 * completes or is cancelled. Fails only for a bad peer or no memory. */
int wire_isend(Wire *w, int peer, int tag, const void *buf, size_t len, WireOp **op);
int wire_irecv(Wire *w, int peer, int tag, void *buf, size_t len, WireOp **op);
/* Move data (waiting at most wait_ms for a socket to be ready). */
void wire_progress(Wire *w, int wait_ms);
/* 1 when the op completed (it is then freed and *op set to NULL). */
int wire_test(Wire *w, WireOp **op);
/* Give up an op: the wire never touches its buffer again; *op = NULL. */
void wire_cancel(Wire *w, WireOp **op);
/* A complete message from peer with tag waiting for a receive? */
int wire_probe(Wire *w, int peer, int tag);
/* Peer failed (socket closed or broken, bad chunk): why, or NULL. */
const char *wire_peer_failed(const Wire *w, int peer);
/* Connections refused (a hello that did not verify, or none in time). */
double wire_refused(const Wire *w);
/* One line per stream of `peer`: its state, queue and reading position
 * (diagnostics for tests). */
void wire_dump(const Wire *w, int peer, FILE *f);
/* Bytes held for messages that came before their receive (bounded by
 * unexpected_max; diagnostics and tests). */
size_t wire_held(const Wire *w);
/* This rank's listening port (tests). */
int wire_listen_port(const Wire *w);

/* "lo-hi" or "N" or "0" into a port range; 0 on success. */
int wire_parse_ports(const char *s, int *lo, int *hi);

#endif
