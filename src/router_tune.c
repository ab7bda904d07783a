/* router_tune.c — see router_tune.h. */
#include "router_tune.h"

#include <math.h>
#include <mpi.h>

#include "alloc.h"
#include "clock.h"
#include "status.h"

int router_tune(Backend *be, Coll *ep, const Config *cfg, Dataset *d, DataCursor *cur, uint64_t first, int B,
                int steps, double lr, int all, RouterTuneReport *rep)
{
    const double t0 = now_s();
    const Model *m = &be->table;
    const int T = cfg->model.context, G = ep->size;
    const Tensor *router = &m->tensors[T_ROUTER];
    const size_t off = all ? 0 : router->offset, len = all ? m->dense_end : router->numel; /* summed over the learner */
    const size_t run_len = all ? m->n_params : len;
    rep->steps = steps;
    rep->first_loss = rep->last_loss = 0.0;
    CHECK(be->ops->optimizer_shard(be, &off, &run_len, 1)); /* the optimiser's one run: the router (or all) */
    int *tokens = isth_malloc(sizeof(int) * (size_t)B * (size_t)T);
    int *targets = isth_malloc(sizeof(int) * (size_t)B * (size_t)T);
    float *g = isth_malloc(sizeof(float) * run_len);
    int rc = tokens && targets && g ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "router phase: out of memory");
    const int warmup = steps / 10, tenth = steps / 10 > 0 ? steps / 10 : 1;
    double first_sum = 0.0, last_sum = 0.0;
    for (int s = 0; s < steps && rc == ISTH_OK; s++) {
        rc = be->ops->zero_grads(be);
        if (rc == ISTH_OK)
            rc = data_fill(cur, d, first + (uint64_t)ep->rank * (uint64_t)B, tokens, targets, B, T, cfg->model.vocab);
        ForwardStats st = {0};
        if (rc == ISTH_OK) rc = be->ops->train_micro(be, tokens, targets, B, T, 1.0f / (float)G, &st);
        cur->step++;
        /* the router's gradient over the learner (the other weights' are never applied) */
        if (rc == ISTH_OK) rc = be->ops->sum_runs(be, STATE_GRADS, &off, &len, 1);
        if (rc == ISTH_OK) rc = be->ops->get(be, STATE_GRADS, &off, &run_len, 1, g);
        /* the norm: the summed part (the same on every rank) once, each rank's experts' own */
        double dense2 = 0.0, sums[3] = {st.ce_sum, (double)st.n_targets, 0.0};
        for (size_t i = 0; rc == ISTH_OK && i < len; i++) dense2 += (double)g[i] * g[i];
        for (size_t i = len; rc == ISTH_OK && i < run_len; i++) sums[2] += (double)g[i] * g[i];
        if (rc == ISTH_OK) rc = coll_allreduce_comm(ep->comm, sums, 3, MPI_DOUBLE, sizeof(double), MPI_SUM);
        const double norm = sqrt(dense2 + sums[2]), clip = cfg->train.clip;
        const double loss[2] = {sums[0], sums[1]};
        if (rc == ISTH_OK && clip > 0 && norm > clip) rc = be->ops->scale_grads(be, (float)(clip / norm));
        const double at = warmup > 0 && s < warmup ? lr * (s + 1) / warmup : lr;
        if (rc == ISTH_OK) rc = be->ops->optimizer_step(be, at);
        const double l = loss[1] > 0 ? loss[0] / loss[1] : 0.0;
        if (s < tenth) first_sum += l;
        if (s >= steps - tenth) last_sum += l;
    }
    rep->first_loss = first_sum / tenth;
    rep->last_loss = last_sum / tenth;
    rep->seconds = now_s() - t0;
    isth_free(tokens);
    isth_free(targets);
    isth_free(g);
    return rc;
}
