/* stateview.c — see stateview.h. */
#include "stateview.h"

#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

static int tensor_end(const ChunkTable *ct, int t) { return t + 1 < N_TENSORS ? ct->first[t + 1] : ct->n_chunks; }

size_t state_view_need(const ChunkTable *ct, StateSelect select, const void *ctx)
{
    size_t most = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        size_t k = 0;
        for (int c = ct->first[t]; c < tensor_end(ct, t); c++)
            if (select(ctx, c)) k += ct->chunks[c].size;
        if (k > most) most = k;
    }
    return most;
}

int state_view_create(StateView *v, const ChunkTable *ct, size_t need)
{
    memset(v, 0, sizeof *v);
    v->ct = ct;
    v->tensor = -1;
    const size_t n = (size_t)ct->n_chunks + 1;
    v->spos = isth_malloc(sizeof(size_t) * n);
    v->off = isth_malloc(sizeof(size_t) * n);
    v->len = isth_malloc(sizeof(size_t) * n);
    const AllocCategory was = alloc_category(ALLOC_STAGING);
    v->stage = isth_malloc(sizeof(float) * (need + 1));
    alloc_category(was);
    if (!v->spos || !v->off || !v->len || !v->stage) {
        state_view_destroy(v);
        return isth_fail(ISTH_ERUNTIME, "out of memory for a view of the training state (%zu values of staging)", need);
    }
    v->cap = need;
    for (int c = 0; c < ct->n_chunks; c++) v->spos[c] = SIZE_MAX;
    return ISTH_OK;
}

void state_view_destroy(StateView *v)
{
    isth_free(v->stage);
    isth_free(v->spos);
    isth_free(v->off);
    isth_free(v->len);
    v->stage = NULL;
    v->spos = v->off = v->len = NULL;
    v->cap = 0;
}

void state_view_begin(StateView *v, Backend *be, StateKind which, const size_t *state_pos, StateSelect select,
                      const void *select_ctx, int reading)
{
    v->be = be;
    v->which = which;
    v->state_pos = state_pos;
    v->select = select;
    v->select_ctx = select_ctx;
    v->reading = reading;
    v->tensor = -1;
    v->n_runs = 0;
    v->rc = ISTH_OK;
}

/* Put the staged tensor back (reading, keep) and forget it. */
static void release(StateView *v, int keep)
{
    if (v->tensor < 0) return;
    if (keep && v->reading && v->n_runs && v->rc == ISTH_OK)
        v->rc = v->be->ops->put(v->be, v->which, v->off, v->len, v->n_runs, v->stage);
    for (int c = v->ct->first[v->tensor]; c < tensor_end(v->ct, v->tensor); c++) v->spos[c] = SIZE_MAX;
    v->tensor = -1;
    v->n_runs = 0;
}

static void stage(StateView *v, int t)
{
    release(v, 1);
    v->tensor = t;
    size_t k = 0;
    for (int c = v->ct->first[t]; c < tensor_end(v->ct, t); c++) {
        if (!v->select(v->select_ctx, c)) continue;
        const size_t size = v->ct->chunks[c].size;
        if (size > v->cap - k) { /* more than state_view_need allowed: a caller's mistake */
            if (v->rc == ISTH_OK)
                v->rc = isth_fail(ISTH_ERUNTIME, "state view: tensor %d needs more than its %zu values of staging", t,
                                  v->cap);
            break;
        }
        v->spos[c] = k;
        v->off[v->n_runs] = v->state_pos ? v->state_pos[c] : chunk_offset(v->ct, c);
        v->len[v->n_runs++] = size;
        k += size;
    }
    if (!v->reading && v->n_runs && v->rc == ISTH_OK)
        v->rc = v->be->ops->get(v->be, v->which, v->off, v->len, v->n_runs, v->stage);
}

float *state_view_at(void *view, int tensor, int layer, int expert)
{
    StateView *v = view;
    if (tensor != v->tensor) stage(v, tensor);
    const int c = chunk_index(v->ct, tensor, layer, expert < 0 ? 0 : expert);
    return v->spos[c] != SIZE_MAX && v->rc == ISTH_OK ? v->stage + v->spos[c] : NULL;
}

int state_view_end(StateView *v, int keep)
{
    release(v, keep);
    return v->rc;
}
