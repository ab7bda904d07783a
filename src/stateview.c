/* stateview.c — see stateview.h. */
#include "stateview.h"

#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "status.h"

int state_view_init(StateView *v, Backend *be, StateKind which, const ChunkTable *ct, const size_t *state_pos,
                    StateSelect select, const void *select_ctx, int reading)
{
    memset(v, 0, sizeof *v);
    v->be = be;
    v->which = which;
    v->ct = ct;
    v->state_pos = state_pos;
    v->select = select;
    v->select_ctx = select_ctx;
    v->reading = reading;
    v->tensor = -1;
    const size_t n = (size_t)ct->n_chunks + 1;
    v->spos = isth_malloc(sizeof(size_t) * n);
    v->off = isth_malloc(sizeof(size_t) * n);
    v->len = isth_malloc(sizeof(size_t) * n);
    if (!v->spos || !v->off || !v->len) {
        state_view_finish(v, 0);
        return isth_fail(ISTH_ERUNTIME, "out of memory for a view of the training state (%d chunks)", ct->n_chunks);
    }
    for (int c = 0; c < ct->n_chunks; c++) v->spos[c] = SIZE_MAX;
    return ISTH_OK;
}

static int tensor_end(const ChunkTable *ct, int t) { return t + 1 < N_TENSORS ? ct->first[t + 1] : ct->n_chunks; }

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
        v->spos[c] = k;
        v->off[v->n_runs] = v->state_pos ? v->state_pos[c] : chunk_offset(v->ct, c);
        v->len[v->n_runs++] = v->ct->chunks[c].size;
        k += v->ct->chunks[c].size;
    }
    if (k > v->cap) {
        const AllocCategory was = alloc_category(ALLOC_STAGING);
        isth_free(v->stage);
        v->stage = isth_malloc(sizeof(float) * k);
        alloc_category(was);
        v->cap = v->stage ? k : 0;
        if (!v->stage && v->rc == ISTH_OK)
            v->rc = isth_fail(ISTH_ERUNTIME, "out of memory staging tensor %d (%zu values)", t, k);
    }
    if (!v->stage) {
        v->n_runs = 0;
        for (int c = v->ct->first[t]; c < tensor_end(v->ct, t); c++) v->spos[c] = SIZE_MAX;
        return;
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

int state_view_finish(StateView *v, int keep)
{
    if (v->spos) release(v, keep);
    isth_free(v->stage);
    isth_free(v->spos);
    isth_free(v->off);
    isth_free(v->len);
    v->stage = NULL;
    v->spos = v->off = v->len = NULL;
    v->cap = 0;
    return v->rc;
}
