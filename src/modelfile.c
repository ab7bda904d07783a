/* modelfile.c — see modelfile.h. */
#include "modelfile.h"

#include <stdio.h>

#include "alloc.h"
#include "ckpt_validate.h"
#include "status.h"

/* h5io's ChunkAt over a host model holding every expert. */
static float *host_chunk(void *ctx, int tensor, int layer, int expert)
{
    const Model *m = ctx;
    return m->tensors[tensor].flags & PARAM_EXPERT ? model_expert_param(m, (TensorId)tensor, layer, expert)
                                                  : model_param(m, (TensorId)tensor, layer);
}

int modelfile_load(const char *path, const char *const *overrides, int n_overrides, Config *cfg, Model *m,
                   H5Meta *meta)
{
    char reason[512];
    if (ckpt_validate(path, reason, sizeof reason, NULL) != ISTH_OK)
        return isth_fail(ISTH_EINPUT, "model %s: invalid: %s", path, reason);
    char *text = NULL;
    CHECK(h5model_read_config(path, &text, MPI_COMM_SELF));
    char origin[CONFIG_FILE_PATH_MAX + 64];
    snprintf(origin, sizeof origin, "%s:/config", path);
    int rc = config_load_text(cfg, text, origin, overrides, n_overrides);
    isth_free(text);
    CHECK(rc);
    const AllocCategory was = alloc_category(ALLOC_WEIGHTS);
    /* the weights alone: nothing here computes gradients */
    model_describe(m, &cfg->model, 0, cfg->model.experts);
    m->params = isth_aligned_alloc(64, m->n_params * sizeof(float));
    alloc_category(was);
    if (!m->params)
        return isth_fail(ISTH_ERUNTIME, "model %s: out of memory for its %zu parameters (%.1f GiB)", path,
                         m->n_params, m->n_params * 4.0 / (1 << 30));
    rc = h5model_read(path, m, host_chunk, m, meta, MPI_COMM_SELF);
    if (rc != ISTH_OK) model_destroy(m);
    return rc;
}
