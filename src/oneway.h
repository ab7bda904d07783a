/* oneway.h — framed blocks sent one way through the link, many at once,
 * awaited together within the link's deadline: the split experts' whole
 * model (assemble.c) and the refresh of their copies (expert_copies.c).
 *
 * A OneWay is one frame's buffer (the link's header room, then the
 * payload) and its message, for one peer, either sent or received; a late
 * one (the federated launch, link_survive) names its site in late[] and
 * is not an error.
 * Owns: the buffers it allocates (unless the caller keeps one) and the
 * wait.
 * Must not: choose what goes where, or fill, seal or check a frame (the
 * callers, through link_frame and link_check).
 */
#ifndef ISTHMUS_ONEWAY_H
#define ISTHMUS_ONEWAY_H

#include <stddef.h>

#include "link.h"

#define ONEWAY_ROOM sizeof(LinkHeader) /* the link's header in front of each payload, sealed in place */

typedef struct {
    LinkMsg m;
    unsigned char *buf;   /* ONEWAY_ROOM + bytes */
    size_t values, bytes; /* what the payload holds: values, encoded in bytes */
    int site;             /* the peer's site */
    int kept;             /* a received buffer the caller took (not freed by oneway_release) */
} OneWay;

/* A buffer for `bytes` of payload (`values` values) to or from a rank of
 * `site`; `what` names the operation in the one-line failure. */
int oneway_alloc(OneWay *f, size_t values, size_t bytes, int site, const char *what);
/* The message: a send of the (framed) buffer to `peer`, or a receive from
 * it, posted. */
void oneway_send(OneWay *f, int peer, int tag);
int oneway_recv(Link *l, OneWay *f, int peer, int tag);
/* Wait for n of them within the deadline; a late one's site gets late[] = 1
 * and *waited the longest wait. */
int oneway_await(Link *l, OneWay *fr, int n, const char *what, unsigned char *late, double *waited);
/* Free the buffers MPI no longer holds and nobody kept (after a failure
 * or a late frame MPI may still use one: leaked, failure rule 6). */
void oneway_release(OneWay *fr, int n);

#endif
