/* backend_state.c — see backend_state.h. */
#include "backend_state.h"

#include <string.h>

#include "status.h"

void state_book_init(StateBook *s, size_t n_params, float *params, float *grads,
                     int (*create)(void *, const size_t *, const size_t *, int, float *[STATE_KINDS]), void *backend)
{
    memset(s, 0, sizeof *s);
    s->n_params = n_params;
    s->view[STATE_PARAMS] = params;
    s->view[STATE_GRADS] = grads;
    s->create = create;
    s->backend = backend;
}

static int create(StateBook *s, const size_t *off, const size_t *len, int n)
{
    s->sharded = 0;
    size_t total = 0;
    for (int r = 0; r < n; r++) total += len[r];
    const int rc = s->create(s->backend, off, len, n, s->view);
    s->packed = total;
    s->sharded = rc == ISTH_OK;
    return rc;
}

int state_book_shard(StateBook *s, const size_t *off, const size_t *len, int n)
{
    for (int r = 0; r < n; r++)
        if (off[r] + len[r] > s->n_params)
            return isth_fail(ISTH_ERUNTIME, "optimizer: run %d [%zu, +%zu) is outside the %zu parameters", r, off[r],
                             len[r], s->n_params);
    return create(s, off, len, n);
}

/* Until the trainer says which runs this rank updates: all of them. */
int state_book_ensure(StateBook *s)
{
    if (s->sharded) return ISTH_OK;
    const size_t off = 0, len = s->n_params;
    return create(s, &off, &len, 1);
}

float *state_book_view(StateBook *s, StateKind which)
{
    if ((int)which < 0 || which >= STATE_KINDS) return NULL;
    if (state_is_packed(which) && state_book_ensure(s) != ISTH_OK) return NULL;
    return s->view[which];
}

/* `which`'s length in floats: the model table, or the packed runs. */
static size_t state_book_len(const StateBook *s, StateKind which)
{
    return state_is_packed(which) ? s->packed : s->n_params;
}

int state_book_check_runs(StateBook *s, StateKind which, const size_t *off, const size_t *len, int n,
                          const char *verb)
{
    if (!state_book_view(s, which))
        return isth_fail(ISTH_ERUNTIME, "backend: %s of an unknown state (%d)", verb, (int)which);
    const size_t total = state_book_len(s, which);
    for (int i = 0; i < n; i++)
        if (off[i] > total || len[i] > total - off[i])
            return isth_fail(ISTH_ERUNTIME, "backend: %s run %d [%zu, +%zu) is outside the state's %zu floats", verb, i,
                             off[i], len[i], total);
    return ISTH_OK;
}
