/* train.c — see train.h. */
#include "train.h"

#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval.h"
#include "h5io.h"
#include "status.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

void set_threads(int threads)
{
    if (threads <= 0) return;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int trainer_create(Trainer *tr, const Config *cfg, int log)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = *cfg;
    tr->log = log;
    MPI_Comm_rank(MPI_COMM_WORLD, &tr->rank);
    set_threads(cfg->train.threads);
    const ModelConfig *mc = &cfg->model;
    const TrainConfig *tc = &cfg->train;

    tr->config_text = config_to_text(cfg);
    CHECK_ALLOC(tr->config_text);
    CHECK(corpus_open(&tr->train, cfg->data.dir, "train.txt"));
    CHECK(corpus_open(&tr->eval_prose, cfg->data.dir, "eval_prose.txt"));
    CHECK(corpus_open(&tr->eval_tech, cfg->data.dir, "eval_tech.txt"));
    CHECK(data_cursor_init(&tr->cursor, &tr->train, tc->seed, 0, 1, mc->context));

    CHECK(model_create(&tr->model, mc, 0, mc->experts));
    model_init(&tr->model);
    CHECK(adamw_create(&tr->opt, tr->model.n_params));
    CHECK(acts_create(&tr->acts, mc, tc->micro_batch, mc->context));
    const size_t n = (size_t)tc->micro_batch * mc->context;
    tr->tokens = malloc(n * sizeof(int));
    tr->targets = malloc(n * sizeof(int));
    CHECK_ALLOC(tr->tokens);
    CHECK_ALLOC(tr->targets);
    if (log) CHECK(metrics_open(&tr->metrics, tc->out_dir));
    return ISTH_OK;
}

void trainer_destroy(Trainer *tr)
{
    metrics_close(&tr->metrics);
    free(tr->tokens);
    free(tr->targets);
    acts_destroy(&tr->acts);
    adamw_destroy(&tr->opt);
    model_destroy(&tr->model);
    corpus_close(&tr->train);
    corpus_close(&tr->eval_prose);
    corpus_close(&tr->eval_tech);
    free(tr->config_text);
    tr->config_text = NULL;
}

int trainer_step(Trainer *tr, StepLog *out)
{
    const TrainConfig *tc = &tr->cfg.train;
    const ModelConfig *mc = &tr->cfg.model;
    const double t0 = now_s();
    const int B = tc->micro_batch, T = mc->context, M = tc->grad_accum;
    memset(tr->model.grads, 0, tr->model.n_params * sizeof(float));
    double ce = 0.0, aux = 0.0, z = 0.0, dropped = 0.0;
    size_t scored = 0;
    for (int micro = 0; micro < M; micro++) {
        data_next_batch(&tr->cursor, &tr->train, tr->tokens, tr->targets, B, T);
        ForwardStats st;
        CHECK(transformer_forward(&tr->model, &tr->acts, tr->tokens, tr->targets, B, T, 1, &st));
        transformer_backward(&tr->model, &tr->acts, tr->tokens, tr->targets, 1.0f / (float)M);
        ce += st.ce_sum;
        scored += st.n_targets;
        aux += st.aux_loss / M;
        z += st.z_loss / M;
        dropped += (double)st.dropped;
    }
    const double loss = ce / (double)scored;
    if (!isfinite(loss))
        return isth_fail(ISTH_ERUNTIME, "step %ld: loss is %g (diverged); lower [train] lr", tr->step + 1, loss);

    const double norm = sqrt(grad_sumsq(&tr->model, 0, 0));
    if (tc->clip > 0 && norm > tc->clip) grad_scale(&tr->model, (float)(tc->clip / norm));
    const double lr = lr_at(tc, tr->step);
    adamw_step(&tr->opt, &tr->model, lr, tc->weight_decay);
    tr->step++;
    tr->tokens_seen += (double)B * T * M;

    const double dt = now_s() - t0;
    memset(out, 0, sizeof *out);
    out->step = tr->step;
    out->steps = tc->steps;
    out->loss = loss;
    out->aux_loss = aux;
    out->z_loss = z;
    out->lr = lr;
    out->grad_norm = norm;
    out->ms_per_step = 1e3 * dt;
    out->tokens_per_s = (double)B * T * M / dt;
    out->tokens = tr->tokens_seen;
    out->dropped_frac = dropped / ((double)B * T * M * mc->top_k * mc->layers);
    return ISTH_OK;
}

int trainer_eval(Trainer *tr, double *bpb_prose, double *bpb_tech)
{
    const Corpus *sets[2] = {&tr->eval_prose, &tr->eval_tech};
    const char *names[2] = {"prose", "tech"};
    double *outs[2] = {bpb_prose, bpb_tech};
    for (int i = 0; i < 2; i++) {
        EvalResult r;
        CHECK(eval_corpus(&tr->model, &tr->acts, sets[i], (size_t)tr->cfg.data.eval_bytes, &r));
        if (tr->log) metrics_eval(&tr->metrics, names[i], tr->step, r.bpb, r.predicted, r.seconds);
        if (outs[i]) *outs[i] = r.bpb;
    }
    return ISTH_OK;
}

int train_run(const Config *cfg)
{
    Trainer tr;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = trainer_create(&tr, cfg, rank == 0);
    if (rc == ISTH_OK && rank == 0) {
        printf("isthmus train: resolved configuration (%s)\n%s\n", cfg->source, tr.config_text);
        printf("model: %.3fM parameters, %.3fM active matrix parameters per token; %d threads\n",
               model_total_params(&cfg->model) / 1e6, model_active_matrix_params(&cfg->model) / 1e6,
               omp_get_max_threads());
        fflush(stdout);
    }
    const TrainConfig *tc = &cfg->train;
    if (rc == ISTH_OK && tc->eval_every > 0) rc = trainer_eval(&tr, NULL, NULL);
    while (rc == ISTH_OK && tr.step < tc->steps) {
        StepLog s;
        rc = trainer_step(&tr, &s);
        if (rc != ISTH_OK) break;
        if (rank == 0 && (s.step % tc->log_every == 0 || s.step == tc->steps))
            metrics_step(&tr.metrics, &s);
        if (tc->eval_every > 0 && tr.step % tc->eval_every == 0 && tr.step < tc->steps)
            rc = trainer_eval(&tr, NULL, NULL);
    }
    if (rc == ISTH_OK) rc = trainer_eval(&tr, NULL, NULL);
    if (rc == ISTH_OK) {
        char path[1100];
        snprintf(path, sizeof path, "%s/model.h5", tc->out_dir);
        H5Meta meta = {tr.step, tr.tokens_seen};
        rc = h5model_write(path, &tr.model, tr.config_text, &meta, MPI_COMM_WORLD, rank == 0);
        if (rc == ISTH_OK && rank == 0) printf("wrote %s (step %ld)\n", path, tr.step);
    }
    trainer_destroy(&tr);
    return rc;
}
