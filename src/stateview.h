/* stateview.h — the backend's state seen one tensor at a time in host
 * staging, for the code that reads and writes it chunk by chunk
 * (checkpoints, the model file, the replica check).
 *
 * A view answers h5io's ChunkAt: where chunk (tensor, layer, expert) lies
 * in host memory. On the first chunk of a tensor it takes that tensor's
 * selected chunks from the backend (get) into one staging buffer, in
 * canonical order, so a tensor's chunks lie one after the other as h5io
 * transfers them in place; a reading view writes the previous tensor back
 * (put) when the next begins, and the last one at state_view_finish.
 * Callers visit tensors in table order, every chunk of one before the next.
 *
 * Owns: the staging buffer (the largest tensor's selected chunks) and
 * which tensor it holds.
 * Must not: choose the chunks (the caller's select), do I/O, or touch the
 * backend's memory other than through get and put.
 */
#ifndef ISTHMUS_STATEVIEW_H
#define ISTHMUS_STATEVIEW_H

#include <stddef.h>

#include "backend.h"
#include "plan.h"

/* Is chunk c transferred by this rank? */
typedef int (*StateSelect)(const void *ctx, int chunk);

typedef struct {
    Backend *be;
    StateKind which;
    const ChunkTable *ct;
    const size_t *state_pos; /* (n_chunks) each chunk's offset in the state; NULL: the model table's */
    StateSelect select;
    const void *select_ctx;
    int reading;             /* values are written back with put */
    int tensor;              /* the tensor staged, -1 none */
    float *stage;            /* (cap) its selected chunks, canonical order */
    size_t cap;
    size_t *spos;            /* (n_chunks) position of a staged chunk in stage, SIZE_MAX not staged */
    size_t *off, *len;       /* (n_chunks) the staged tensor's runs in the state */
    int n_runs;
    int rc;                  /* first failure of a get or put */
} StateView;

int state_view_init(StateView *v, Backend *be, StateKind which, const ChunkTable *ct, const size_t *state_pos,
                    StateSelect select, const void *select_ctx, int reading);
/* A ChunkAt (h5io.h) over a StateView. */
float *state_view_at(void *view, int tensor, int layer, int expert);
/* Write back what a reading view holds (keep: the transfer succeeded; a
 * failed read leaves the state as it was for the tensor in staging), free
 * the staging; returns the first failure of the view's gets and puts. */
int state_view_finish(StateView *v, int keep);

#endif
