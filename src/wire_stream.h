/* wire_stream.h — the wire's chunks on one stream (a TCP connection to a
 * peer): written from the peer's send queue, read into the message they
 * belong to.
 *
 * A message is cut into chunks of at most chunk_bytes, each behind a
 * ChunkHeader (wire_state.h); a stream with room takes the oldest queued
 * message's next chunk, so a stream with a small window carries less
 * instead of holding up the rest. A chunk read is matched to its receive by
 * (tag, sequence number); one that comes before its receive is kept in a
 * buffer of its own while the bytes kept stay within unexpected_max, else
 * the stream stalls (its input unwatched) until a receive or room comes. A
 * chunk that does not parse, repeats one, or disagrees with the receive's
 * size fails the peer.
 * Owns: the chunk header on a stream, writing until the socket would
 * block, reading into the right message, completing messages, stalling and
 * waking streams, and a cancelled send's half-written chunk.
 * Must not: make or accept connections (wire_conn.c), post or free a
 * caller's op (wire.c), or know what a message means.
 */
#ifndef ISTHMUS_WIRE_STREAM_H
#define ISTHMUS_WIRE_STREAM_H

#include "wire_state.h"

/* The chunks a message of len bytes is cut into (an empty one: one). */
static inline size_t n_chunks(const Wire *w, size_t len)
{
    return len ? (len + w->o.chunk_bytes - 1) / w->o.chunk_bytes : 1;
}

/* Write what this stream has, until the socket would block. */
void wire_send_pump(Wire *w, Conn *c);
/* Read what this stream has, until the socket would block or the stream
 * stalls. */
void wire_recv_pump(Wire *w, Conn *c);
/* A receive has all its bytes: an unexpected one is kept for its receive,
 * a claimed one copied to the caller, a cancelled one freed. */
void wire_recv_complete(Wire *w, Peer *p, WireOp *op);
/* Room again (a receive posted, early bytes let go): the peer's stalled
 * streams read again. */
void wire_unstall(Wire *w, Peer *p);
/* A send cancelled: off the peer's queue and every stream; a chunk half
 * written goes on from a copy, so the stream stays in step. The op is the
 * caller's to free. */
void wire_stream_cancel_send(Wire *w, Peer *p, WireOp *op);

#endif
