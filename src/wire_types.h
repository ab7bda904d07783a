/* wire_types.h — what the wire's API and its private modules share: the
 * options a caller sets, the limits, and the opaque handles (defined in
 * wire_state.h).
 * Owns: those types and limits.
 * Must not: hold behaviour.
 */
#ifndef ISTHMUS_WIRE_TYPES_H
#define ISTHMUS_WIRE_TYPES_H

#include <stddef.h>

#define WIRE_MAX_STREAMS 16
#define WIRE_MAX_SITES 64

typedef struct {
    int streams;             /* TCP connections per pair of ranks (1..WIRE_MAX_STREAMS) */
    size_t chunk_bytes;      /* largest chunk (striping unit) */
    long socket_buffer;      /* SO_SNDBUF/SO_RCVBUF bytes; 0 = the kernel's autotuning */
    int port_lo, port_hi;    /* listening ports tried in order; 0, 0 = any free port */
    char interface[32];      /* the address advertised: an interface's IPv4 address ("" = first up non-loopback) */
    size_t unexpected_max;   /* bytes kept for messages whose receive is not posted yet */
    int port_shift;          /* test hook (ISTHMUS_WIRE_PORT_SHIFT): connect to a peer's port + this (a proxy) */
    double hello_timeout_s;  /* an accepted connection must say who it is within this (0: 600 s) */
} WireOptions;

typedef struct Wire Wire;
typedef struct WireOp WireOp;

#endif
