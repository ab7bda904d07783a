/* modelfile.c — see modelfile.h. */
#include "modelfile.h"

#include <stdio.h>

#include "alloc.h"
#include "ckpt_validate.h"
#include "coll.h"
#include "expert_split.h"
#include "plan.h"
#include "stateview.h"
#include "status.h"

/* h5io's ChunkAt over a host model: every dense chunk, and the experts it
 * holds (NULL for the others: another rank reads them). */
static float *host_chunk(void *ctx, int tensor, int layer, int expert)
{
    const Model *m = ctx;
    if (!(m->tensors[tensor].flags & PARAM_EXPERT)) return model_param(m, (TensorId)tensor, layer);
    const int e = expert - m->expert_begin;
    return e >= 0 && e < m->experts_local ? model_expert_param(m, (TensorId)tensor, layer, e) : NULL;
}

/* A StateSelect: every chunk this rank holds (evaluation loads them all). */
static int held_chunk(const void *ct, int c) { return chunk_held(ct, c); }

int modelfile_config(const char *path, const char *const *overrides, int n_overrides, Config *cfg, char *origin,
                     size_t cap, MPI_Comm comm)
{
    int rank;
    CHECK_MPI(MPI_Comm_rank(comm, &rank));
    /* the same validation as inspect and --resume: one verdict per file */
    int first_rc = ISTH_OK;
    if (rank == 0) {
        char reason[512];
        if (ckpt_validate(path, reason, sizeof reason, NULL) != ISTH_OK)
            first_rc = isth_fail(ISTH_EINPUT, "model %s: invalid: %s", path, reason);
    }
    CHECK_MPI(MPI_Bcast(&first_rc, 1, MPI_INT, 0, comm));
    CHECK(first_rc);
    char *text = NULL;
    int whole = 0;
    CHECK(h5model_read_config(path, &text, &whole, comm));
    char from[CONFIG_FILE_PATH_MAX + 64];
    snprintf(from, sizeof from, "%s:/config", path);
    if (origin) snprintf(origin, cap, "%s", from);
    const int rc = config_load_text(cfg, text, from, overrides, n_overrides);
    isth_free(text);
    /* a split run's model.h5 holds every site's experts (marked whole, it
     * reads as any model: every learner here holds all E, ROUTE_ALL); a
     * site's checkpoint holds that site's experts only (the others' values
     * are not in it): nothing here may read it as a model */
    if (rc == ISTH_OK && expert_split_on(cfg) && !whole)
        return isth_fail(ISTH_EINPUT, "model %s: the run split its experts across sites ([outer] experts = split): "
                         "a site's file holds that site's experts only; the run's model.h5 holds the whole model",
                         path);
    return rc;
}

/* /model into a host model of experts [begin, begin + count), read with the ranks of comm. */
static int load_part(const char *path, const Config *cfg, int begin, int count, Model *m, H5Meta *meta, MPI_Comm comm)
{
    const AllocCategory was = alloc_category(ALLOC_WEIGHTS);
    /* the weights alone: nothing here computes gradients */
    model_describe(m, &cfg->model, begin, count);
    m->params = isth_aligned_alloc(64, m->n_params * sizeof(float));
    alloc_category(was);
    const int made = coll_all_ok(comm, m->params != NULL);
    if (!m->params)
        return isth_fail(ISTH_ERUNTIME, "model %s: out of memory for its %zu parameters (%.1f GiB)", path,
                         m->n_params, m->n_params * 4.0 / (1 << 30));
    const int rc = made ? h5model_read(path, m, host_chunk, m, meta, comm) : ISTH_ERUNTIME;
    if (rc != ISTH_OK) model_destroy(m);
    return rc;
}

int modelfile_load(const char *path, const char *const *overrides, int n_overrides, Config *cfg, Model *m,
                   H5Meta *meta)
{
    CHECK(modelfile_config(path, overrides, n_overrides, cfg, NULL, 0, MPI_COMM_SELF));
    return load_part(path, cfg, 0, cfg->model.experts, m, meta, MPI_COMM_SELF);
}

int modelfile_load_shard(const char *path, Config *cfg, Model *m, H5Meta *meta, MPI_Comm comm, const char *cmd)
{
    int rank, size;
    CHECK_MPI(MPI_Comm_rank(comm, &rank));
    CHECK_MPI(MPI_Comm_size(comm, &size));
    CHECK(modelfile_config(path, NULL, 0, cfg, NULL, 0, comm));
    const int E = cfg->model.experts;
    if (E % size)
        return isth_fail(ISTH_EINPUT, "%s: %d ranks cannot share %d experts evenly; use a rank count that divides it",
                         cmd, size, E);
    return load_part(path, cfg, rank * (E / size), E / size, m, meta, comm);
}

int modelfile_read_backend(const char *path, Backend *be, H5Meta *meta, MPI_Comm comm)
{
    /* the file into the backend one tensor at a time (host staging) */
    ChunkTable ct;
    StateView view = {0};
    int rc = chunk_table_create(&ct, &be->table, 1);
    const int made = rc == ISTH_OK && state_view_create(&view, &ct, state_view_need(&ct, held_chunk, &ct)) == ISTH_OK;
    rc = coll_all_ok(comm, made) ? ISTH_OK : ISTH_ERUNTIME;
    if (rc == ISTH_OK) {
        state_view_begin(&view, be, STATE_PARAMS, NULL, held_chunk, &ct, 1);
        rc = h5model_read(path, &be->table, state_view_at, &view, meta, comm);
        const int vrc = state_view_end(&view, rc == ISTH_OK);
        if (rc == ISTH_OK && !coll_all_ok(comm, vrc == ISTH_OK)) rc = vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
    }
    state_view_destroy(&view);
    chunk_table_destroy(&ct);
    return rc;
}

/* A StateSelect for the writer: experts where held, dense chunks on rank 0. */
typedef struct {
    const ChunkTable *ct;
    int rank;
} WriteSelect;

static int written_here(const void *ctx, int c)
{
    const WriteSelect *w = ctx;
    return w->ct->chunks[c].expert >= 0 ? chunk_held(w->ct, c) : w->rank == 0;
}

int modelfile_write_backend(const char *path, Backend *be, const char *config_text, const H5Meta *meta,
                            MPI_Comm comm)
{
    ChunkTable ct;
    StateView view = {0};
    int rank;
    CHECK_MPI(MPI_Comm_rank(comm, &rank));
    int rc = chunk_table_create(&ct, &be->table, 1);
    WriteSelect sel = {&ct, rank};
    const int made = rc == ISTH_OK && state_view_create(&view, &ct, state_view_need(&ct, written_here, &sel)) == ISTH_OK;
    rc = coll_all_ok(comm, made) ? ISTH_OK : ISTH_ERUNTIME;
    H5File f;
    if (rc == ISTH_OK) rc = h5model_create(&f, path, &be->table, config_text, meta, comm);
    if (rc == ISTH_OK) {
        state_view_begin(&view, be, STATE_PARAMS, NULL, written_here, &sel, 0);
        rc = h5_write_chunks(&f, "/model", &be->table, state_view_at, &view);
        const int vrc = state_view_end(&view, rc == ISTH_OK);
        if (rc == ISTH_OK && !coll_all_ok(comm, vrc == ISTH_OK)) rc = vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
        if (rc != ISTH_OK) f.failed = 1; /* removed, not renamed */
        const int crc = h5_commit(&f);
        if (rc == ISTH_OK) rc = crc;
    }
    state_view_destroy(&view);
    chunk_table_destroy(&ct);
    return rc;
}
