/* ckpt_state.c — see ckpt_state.h. */
#include "ckpt_state.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "coll.h"
#include "status.h"

/* h5io's view of the host buffers (the outer state, the residuals): where
 * chunk (t, l, e) lies, NULL where this rank does not transfer it. The
 * backend's state goes through the scratch's StateView instead. */
typedef enum { VIEW_OUTER, VIEW_RESIDUAL } ViewKind;

typedef struct {
    const Trainer *tr;
    ViewKind kind;
    OuterState which;   /* VIEW_OUTER */
    int active;         /* this rank takes part */
    int reading;        /* a load: idle fragments' pending values are not read */
} HostView;

static float *host_at(void *ctx, int t, int l, int e)
{
    const HostView *v = ctx;
    if (!v->active || (v->reading && v->tr->load_dense_only && e >= 0)) return NULL;
    const Shard *sh = &v->tr->shard;
    const int c = chunk_index(&sh->table, t, l, e < 0 ? 0 : e);
    switch (v->kind) {
    case VIEW_OUTER:
        if (v->reading && v->which == OUTER_PENDING && !shard_result(sh, sh->table.chunks[c].fragment)) return NULL;
        return outer_view(&v->tr->outer, v->which, t, l, e);
    case VIEW_RESIDUAL: return shard_residual_at(sh, t, l, e);
    }
    return NULL;
}

int ckpt_scratch_alloc(const Trainer *tr, CkptScratch *sc)
{
    memset(&sc->view, 0, sizeof sc->view);
    sc->frag = isth_calloc((size_t)2 * tr->cfg.outer.fragments + 1, sizeof(double));
    int ok = sc->frag != NULL;
    if (!ok) isth_fail(ISTH_ERUNTIME, "checkpoint: out of memory for the fragment table");
    const size_t need = state_view_need(&tr->shard.table, trainer_owns_chunk, &tr->shard);
    if (ok && state_view_create(&sc->view, &tr->shard.table, need) != ISTH_OK) ok = 0;
    if (!coll_all_ok(tr->topo.site_comm, ok)) {
        state_view_destroy(&sc->view);
        isth_free(sc->frag);
        return ISTH_ERUNTIME;
    }
    return ISTH_OK;
}

void ckpt_scratch_free(CkptScratch *sc)
{
    state_view_destroy(&sc->view);
    isth_free(sc->frag);
}

static int no_chunk(const void *shard, int c) { (void)shard; (void)c; return 0; }

/* A StateSelect: the dense chunks this rank owns (Trainer.load_dense_only). */
static int owns_dense(const void *shard, int c)
{
    return ((const Shard *)shard)->table.chunks[c].expert < 0 && trainer_owns_chunk(shard, c);
}

/* A failed get or put is agreed over the file's ranks, so nobody goes on
 * into the next collective alone. */
int ckpt_transfer_state(H5File *f, const Trainer *tr, CkptScratch *sc, const char *group, StateKind which,
                        int active, int reading)
{
    const int moments = state_is_packed(which);
    StateView *v = &sc->view;
    const StateSelect select = !active ? no_chunk : reading && tr->load_dense_only ? owns_dense : trainer_owns_chunk;
    state_view_begin(v, tr->be, which, moments ? tr->shard.run_pos : NULL, select, &tr->shard, reading);
    const int rc = reading ? h5_read_chunks(f, group, &tr->model, state_view_at, v)
                           : h5_write_chunks(f, group, &tr->model, state_view_at, v);
    const int vrc = state_view_end(v, rc == ISTH_OK);
    if (rc != ISTH_OK) return rc; /* h5io agreed on it */
    if (!coll_all_ok(f->comm, vrc == ISTH_OK)) {
        f->failed = 1;
        return vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
    }
    return ISTH_OK;
}

/* A ChunkAt over another that skips the dense chunks. */
typedef struct {
    ChunkAt at;
    void *ctx;
} ExpertsOnly;

static float *experts_only_at(void *ctx, int t, int l, int e)
{
    const ExpertsOnly *x = ctx;
    return e < 0 ? NULL : x->at(x->ctx, t, l, e);
}

int ckpt_read_experts(H5File *f, Trainer *tr, CkptScratch *sc, const char *group, OuterState which)
{
    StateView *v = &sc->view;
    state_view_begin(v, tr->be, STATE_PARAMS, NULL, trainer_owns_chunk, &tr->shard, 1);
    ExpertsOnly params = {state_view_at, v};
    const int rc = h5_read_chunks(f, group, &tr->model, experts_only_at, &params);
    const int vrc = state_view_end(v, rc == ISTH_OK);
    if (rc != ISTH_OK) return rc;
    if (!coll_all_ok(f->comm, vrc == ISTH_OK)) return vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
    HostView hv = {tr, VIEW_OUTER, which, 1, 1};
    ExpertsOnly outer = {host_at, &hv};
    return h5_read_chunks(f, group, &tr->model, experts_only_at, &outer);
}

int ckpt_write_outer(H5File *f, const Trainer *tr, const char *group, OuterState which, int active)
{
    HostView v = {tr, VIEW_OUTER, which, active, 0};
    return h5_write_chunks(f, group, &tr->model, host_at, &v);
}

int ckpt_write_residual(H5File *f, const Trainer *tr, const char *group, int active)
{
    HostView v = {tr, VIEW_RESIDUAL, OUTER_ANCHOR, active && shard_has_residual(&tr->shard), 0};
    return h5_write_chunks(f, group, &tr->model, host_at, &v);
}

int ckpt_read_outer(H5File *f, Trainer *tr, const char *group, OuterState which)
{
    HostView v = {tr, VIEW_OUTER, which, 1, 1};
    return h5_read_chunks(f, group, &tr->model, host_at, &v);
}

int ckpt_read_residual(H5File *f, Trainer *tr, const char *group)
{
    HostView v = {tr, VIEW_RESIDUAL, OUTER_ANCHOR, shard_has_residual(&tr->shard), 1};
    return h5_read_chunks(f, group, &tr->model, host_at, &v);
}

/* Shampoo's groups under a prefix: shampoo_l, shampoo_r, shampoo_lroot,
 * shampoo_rroot (CKPT_SHAMPOO_GROUPS of them). */
static const struct {
    const char *name;
    StateKind kind;
} shampoo_groups[] = {{"shampoo_l", STATE_SHAMPOO_L}, {"shampoo_r", STATE_SHAMPOO_R},
                      {"shampoo_lroot", STATE_SHAMPOO_LROOT}, {"shampoo_rroot", STATE_SHAMPOO_RROOT}};

int ckpt_uses_shampoo(const Trainer *tr) { return !strcmp(tr->cfg.train.optimizer, "shampoo"); }

int ckpt_transfer_shampoo(H5File *f, Trainer *tr, CkptScratch *sc, const char *prefix, int active, int reading)
{
    for (int i = 0; i < CKPT_SHAMPOO_GROUPS && ckpt_uses_shampoo(tr); i++) {
        char g[96];
        snprintf(g, sizeof g, "%s/%s", prefix, shampoo_groups[i].name);
        CHECK(ckpt_transfer_state(f, tr, sc, g, shampoo_groups[i].kind, active, reading));
    }
    return ISTH_OK;
}
