/* stateview.h — the backend's state seen one tensor at a time in host
 * staging, for the code that reads and writes it chunk by chunk
 * (checkpoints, the model file, evaluation's load, the replica check).
 *
 * A view answers h5io's ChunkAt: where chunk (tensor, layer, expert) lies
 * in host memory. On the first chunk of a tensor it takes that tensor's
 * selected chunks from the backend (get) into its staging buffer, in
 * canonical order, so a tensor's chunks lie one after the other as h5io
 * transfers them in place; a reading view writes the previous tensor back
 * (put) when the next begins, and the last one at state_view_end. Callers
 * visit tensors in table order, every chunk of one before the next.
 *
 * The staging is allocated once, at state_view_create, for the largest
 * tensor a selection can stage (state_view_need): a view in use allocates
 * nothing, so it can be created (and the creation agreed over the ranks)
 * before a file is opened.
 *
 * Owns: the staging buffer and which tensor it holds.
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
    const ChunkTable *ct;
    float *stage;            /* (cap) the staged tensor's selected chunks, canonical order */
    size_t cap;
    size_t *spos;            /* (n_chunks) position of a staged chunk in stage, SIZE_MAX not staged */
    size_t *off, *len;       /* (n_chunks) the staged tensor's runs in the state */
    int n_runs;
    /* the transfer in progress (state_view_begin .. state_view_end) */
    Backend *be;
    StateKind which;
    const size_t *state_pos; /* (n_chunks) each chunk's offset in the state; NULL: the model table's */
    StateSelect select;
    const void *select_ctx;
    int reading;             /* values are written back with put */
    int tensor;              /* the tensor staged, -1 none */
    int rc;                  /* first failure of a get or put */
} StateView;

/* The most values one tensor's selected chunks hold (the staging a view
 * needs for that selection). */
size_t state_view_need(const ChunkTable *ct, StateSelect select, const void *ctx);
/* Allocate a view staging up to `need` values (this rank only; callers
 * agree on the result across the ranks that go on together). */
int state_view_create(StateView *v, const ChunkTable *ct, size_t need);
void state_view_destroy(StateView *v);
/* Start a transfer of `which`; no allocation. */
void state_view_begin(StateView *v, Backend *be, StateKind which, const size_t *state_pos, StateSelect select,
                      const void *select_ctx, int reading);
/* A ChunkAt (h5io.h) over a StateView. */
float *state_view_at(void *view, int tensor, int layer, int expert);
/* End the transfer: a reading view writes back what it holds (keep: the
 * file transfer succeeded; otherwise the state keeps its values for the
 * tensor in staging). Returns the first failure of its gets and puts. */
int state_view_end(StateView *v, int keep);

#endif
