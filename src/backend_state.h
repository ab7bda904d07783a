/* backend_state.h — the bookkeeping of a backend's state that is the same
 * on every backend (src/cpu/backend_cpu.c, cuda/backend_cuda.cu): which
 * runs the inner optimiser covers, where each StateKind lives and how long
 * it is, and the bounds check of the runs a verb is handed. The backend
 * embeds a StateBook and answers its verbs through it.
 *
 * Owns: the rule "until optimizer_shard, one run: every parameter" (the
 * optimiser's state is created at its first use), the run checks and
 * their messages, the packed states' length (the sum of the runs).
 * Must not: allocate, free, read or write the state: it holds the
 * backend's pointers (device memory on CUDA) and never dereferences them;
 * creating the optimiser's state is the backend's callback.
 */
#ifndef ISTHMUS_BACKEND_STATE_H
#define ISTHMUS_BACKEND_STATE_H

#include <stddef.h>

#include "backend.h" /* StateKind */

typedef struct {
    size_t n_params;          /* the model table's floats: params and grads */
    size_t packed;            /* the optimiser's runs, summed: the packed states' floats */
    float *view[STATE_KINDS]; /* the backend's pointer to each state; NULL: not held (shampoo's
                               * unless the optimiser is shampoo) */
    int sharded;              /* the optimiser's state exists (for optimizer_shard's runs, or all) */
    /* The backend's: drop any optimiser state, create it for the n runs
     * (the moments and a matrix optimiser's own) and set view[] of the
     * packed kinds. ISTH_OK or a failure (then nothing is sharded). */
    int (*create)(void *backend, const size_t *off, const size_t *len, int n, float *view[STATE_KINDS]);
    void *backend;
} StateBook;

/* A book for n_params floats of params and grads (the backend's buffers),
 * with no optimiser state yet. */
void state_book_init(StateBook *s, size_t n_params, float *params, float *grads,
                     int (*create)(void *, const size_t *, const size_t *, int, float *[STATE_KINDS]), void *backend);
/* The verb optimizer_shard: the runs checked against the table, then the
 * backend's create. */
int state_book_shard(StateBook *s, const size_t *off, const size_t *len, int n);
/* The optimiser's state, for every parameter if optimizer_shard has not
 * said which runs (the step and the packed views need it). */
int state_book_ensure(StateBook *s);
/* The backend's pointer to `which` (creating the optimiser's state for a
 * packed kind first); NULL for a kind not held or a failed creation. */
float *state_book_view(StateBook *s, StateKind which);
/* ISTH_OK when `which` is held and n runs (off, len) lie inside it; else a
 * failure naming the verb. */
int state_book_check_runs(StateBook *s, StateKind which, const size_t *off, const size_t *len, int n,
                          const char *verb);

#endif
