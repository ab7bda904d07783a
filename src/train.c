/* train.c — see train.h. */
#include "train.h"
#include "alloc.h"

#include <math.h>
#include <signal.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

#include "ckpt.h"
#include "eval.h"
#include "fault.h"
#include "h5io.h"
#include "memory.h"
#include "clock.h"
#include "status.h"

double lr_at(const TrainConfig *tc, long step)
{
    if (tc->warmup > 0 && step < tc->warmup) return tc->lr * (double)(step + 1) / tc->warmup;
    long decay_steps = tc->steps - tc->warmup;
    if (decay_steps <= 0) return tc->lr;
    double progress = (double)(step - tc->warmup) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    return tc->min_lr + 0.5 * (tc->lr - tc->min_lr) * (1.0 + cos(M_PI * progress));
}

int trainer_create(Trainer *tr, const Config *cfg, int log)
{
    memset(tr, 0, sizeof *tr);
    tr->red.site_peers = MPI_COMM_NULL;
    tr->cfg = *cfg;
    MPI_Comm_rank(MPI_COMM_WORLD, &tr->rank);
    tr->log = log && tr->rank == 0;
    const ModelConfig *mc = &cfg->model;
    const TrainConfig *tc = &cfg->train;

    tr->config_text = config_to_text(cfg);
    CHECK_ALLOC(tr->config_text);
    CHECK(topology_create(&tr->topo, cfg, MPI_COMM_WORLD));
    tr->created = 1;
    const Topology *t = &tr->topo;
    fault_set_site(t->sites[t->site].name);
    const SiteInfo *site = &t->sites[t->site];
    tr->micro_batch = site->micro_batch;
    tr->grad_accum = site->grad_accum;
    tr->outer_mode = strcmp(cfg->outer.mode, "sync") != 0;
    /* sync: the update averages every rank's tokens; outer modes: each
     * learner averages its own */
    tr->loss_weight = tr->outer_mode ? 1.0 / site->learner_ranks
                                     : site->tokens_per_step / site->learner_ranks / t->total_tokens_per_step;
    for (int l = 0; l < t->learner; l++) {
        const SiteInfo *s = &t->sites[topology_site_of_learner(t, l)];
        tr->learner_first_window += (uint64_t)s->micro_batch * s->learner_ranks * s->grad_accum;
    }
    CHECK(coll_init(&tr->ep, t->learner_comm));
    coll_set_max_message((size_t)tc->mpi_piece_bytes);
    tr->site_leaders = isth_malloc(sizeof(int) * (size_t)t->n_sites);
    CHECK_ALLOC(tr->site_leaders);
    for (int s = 0; s < t->n_sites; s++) tr->site_leaders[s] = t->sites[s].first_rank;

    CHECK(corpus_open(&tr->train, cfg->data.dir, "train.txt"));
    CHECK(corpus_open(&tr->eval_prose, cfg->data.dir, "eval_prose.txt"));
    CHECK(corpus_open(&tr->eval_tech, cfg->data.dir, "eval_tech.txt"));
    CHECK(data_check_windows(&tr->train, mc->context));
    tr->cursor.seed = tc->seed;
    tr->cursor.step = 0;

    CHECK(backend_create(&tr->be, "cpu", cfg, tr->micro_batch, t->expert_begin, t->experts_local, &tr->ep));
    tr->model = tr->be->table;
    CHECK(reducer_create(&tr->red, t, &tr->model, cfg->outer.fragments, (Codec)codec_from_name(cfg->outer.codec),
                         cfg->outer.codec_block, !strcmp(cfg->outer.error_feedback, "on"), cfg->outer.timeout,
                         MPI_COMM_WORLD));
    if (tr->outer_mode)
        CHECK(outer_create(&tr->outer, &cfg->outer, &tr->red, backend_state(tr->be, STATE_PARAMS),
                           site->tokens_per_step / t->total_tokens_per_step));
    if (tr->outer_mode && tr->outer.butterfly) {
        const int N = t->n_learners;
        if (N < 2 || (N & (N - 1)))
            return isth_fail(ISTH_EINPUT,
                             "layout: [outer] mode = butterfly needs a power-of-two number of learners (2, 4, 8, ...); "
                             "the [site.*] sections give %d", N);
        double *w = isth_malloc(sizeof(double) * (size_t)N);
        CHECK_ALLOC(w);
        for (int l = 0; l < N; l++)
            w[l] = t->sites[topology_site_of_learner(t, l)].tokens_per_step / t->total_tokens_per_step;
        const int rc = outer_set_butterfly(&tr->outer, &tr->red, t->learner, N, w);
        isth_free(w);
        CHECK(rc);
    }
    const size_t n = (size_t)tr->micro_batch * mc->context;
    tr->tokens = isth_malloc(n * sizeof(int));
    tr->targets = isth_malloc(n * sizeof(int));
    CHECK_ALLOC(tr->tokens);
    CHECK_ALLOC(tr->targets);
    if (tr->log) CHECK(metrics_open(&tr->metrics, tc->out_dir));
    return ISTH_OK;
}

void trainer_destroy(Trainer *tr)
{
    metrics_close(&tr->metrics);
    isth_free(tr->tokens);
    isth_free(tr->targets);
    backend_destroy(tr->be);
    tr->be = NULL;
    if (tr->created) {
        outer_destroy(&tr->outer);
        reducer_destroy(&tr->red);
        topology_destroy(&tr->topo);
    }
    corpus_close(&tr->train);
    corpus_close(&tr->eval_prose);
    corpus_close(&tr->eval_tech);
    isth_free(tr->config_text);
    isth_free(tr->site_leaders);
    tr->config_text = NULL;
    tr->site_leaders = NULL;
    tr->created = 0;
}

int trainer_control(Trainer *tr, const void *mine, size_t bytes, void *all, const char *what)
{
    const Topology *t = &tr->topo;
    return link_control(&tr->red.link, mine, bytes, all, tr->site_leaders, t->n_sites, t->site, t->site_comm, what);
}

/* What a step adds up over ranks (doubles only: reduced as an array). */
typedef struct {
    double ce_sum, scored;       /* cross-entropy (nats) and targets scored */
    double aux, z;               /* this rank's share of its learner's aux and z losses */
    double dropped;              /* routed copies dropped for capacity */
    double a2a_bytes;            /* expert all-to-all inside the learner */
    double inter_site_bytes;     /* through the link */
} StepSums;

#define STEP_SUMS (sizeof(StepSums) / sizeof(double))

/* Step statistics: sums over this site, then (sync: every site's, added in
 * site order through the link) over the sites; `wait` is a maximum. */
static int step_stats(Trainer *tr, StepSums *step, double *wait)
{
    const int n = (int)STEP_SUMS;
    double *sums = (double *)step;
    const Topology *t = &tr->topo;
    CHECK(coll_allreduce_comm(t->site_comm, sums, (size_t)n, MPI_DOUBLE, sizeof(double), MPI_SUM));
    CHECK(coll_allreduce_comm(t->site_comm, wait, 1, MPI_DOUBLE, sizeof(double), MPI_MAX));
    if (tr->outer_mode || t->n_sites == 1) return ISTH_OK; /* outer modes: rank 0's site */
    double mine[STEP_SUMS + 1], *all = isth_malloc(sizeof mine * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    memcpy(mine, sums, sizeof(double) * (size_t)n);
    mine[n] = *wait;
    const int rc = trainer_control(tr, mine, sizeof mine, all, "step statistics");
    if (rc == ISTH_OK) {
        for (int i = 0; i < n; i++) sums[i] = 0.0;
        for (int s = 0; s < t->n_sites; s++) { /* site order: the same sum on every site */
            const double *site = all + (size_t)s * (STEP_SUMS + 1);
            for (int i = 0; i < n; i++) sums[i] += site[i];
            if (site[n] > *wait) *wait = site[n];
        }
    }
    isth_free(all);
    return rc;
}

int trainer_step(Trainer *tr, StepLog *out)
{
    const TrainConfig *tc = &tr->cfg.train;
    const ModelConfig *mc = &tr->cfg.model;
    const Topology *t = &tr->topo;
    Backend *be = tr->be;
    const double t0 = now_s();
    fault_set_step(tr->step + 1);
    const int B = tr->micro_batch, T = mc->context, M = tr->grad_accum, G = t->learner_size;
    be->ops->zero_grads(be);
    const double a2a0 = tr->ep.bytes_sent + tr->ep.bytes_recv;
    const double link0 = tr->red.link.bytes_sent + tr->red.link.bytes_recv, wait0 = tr->red.link.wait_s;
    /* summed over every site (sync) or this site (outer modes: no per-step
     * traffic between sites), see step_stats */
    StepSums sums = {0};
    for (int micro = 0; micro < M; micro++) {
        const uint64_t first = tr->learner_first_window + (uint64_t)micro * B * G +
                               (uint64_t)t->learner_rank * B;
        CHECK(data_fill(&tr->cursor, &tr->train, first, tr->tokens, tr->targets, B, T));
        ForwardStats st;
        CHECK(be->ops->train_micro(be, tr->tokens, tr->targets, B, T, (float)(tr->loss_weight / M), &st));
        sums.ce_sum += st.ce_sum;
        sums.scored += (double)st.n_targets;
        sums.aux += st.aux_loss / M; /* this rank's share of its learner's value */
        sums.z += st.z_loss / M;
        sums.dropped += (double)st.dropped;
    }
    tr->cursor.step++;
    float *grads = backend_state(be, STATE_GRADS);
    be->ops->to_host(be);
    if (tr->outer_mode) {
        CHECK(reduce_learner_sum(&tr->red, grads));
    } else {
        ReduceReport rep;
        CHECK(reduce_start(&tr->red, 0, grads, REDUCE_GRADS));
        CHECK(reduce_finish(&tr->red, 0, grads, &rep));
    }
    be->ops->from_host(be);
    sums.a2a_bytes = tr->ep.bytes_sent + tr->ep.bytes_recv - a2a0;
    /* learner means of aux and z: divide each rank's share by its G; learners
     * are weighted equally in the reported value */
    const int stat_learners = tr->outer_mode ? t->sites[t->site].learners : t->n_learners;
    sums.aux /= (double)G * stat_learners;
    sums.z /= (double)G * stat_learners;

    double norm2;
    CHECK(grad_norm_sq_learner(be, t->learner_comm, &norm2));
    const double norm = sqrt(norm2);
    if (tc->clip > 0 && norm > tc->clip) be->ops->scale_grads(be, (float)(tc->clip / norm));
    const double lr = lr_at(tc, tr->step);
    be->ops->optimizer_step(be, lr);
    tr->step++;
    tr->tokens_seen += t->total_tokens_per_step;
    if (tr->outer_mode) {
        be->ops->to_host(be);
        CHECK(outer_after_step(&tr->outer, &tr->red, backend_state(be, STATE_PARAMS), tr->step, &tr->metrics,
                               tr->log));
        be->ops->from_host(be);
    }
    sums.inter_site_bytes = tr->red.link.bytes_sent + tr->red.link.bytes_recv - link0;
    if (fault_nan_now()) sums.ce_sum = NAN; /* test hook: this site diverges */
    double wait = tr->red.link.wait_s - wait0;
    CHECK(step_stats(tr, &sums, &wait));
    const double loss = sums.ce_sum / sums.scored;
    if (!isfinite(loss)) { /* every rank of the site sees it: its first rank says so */
        int site_rank;
        CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
        if (site_rank != 0) return ISTH_ERUNTIME;
        return isth_fail(ISTH_ERUNTIME, "step %ld: loss is %g (diverged); lower [train] lr", tr->step, loss);
    }

    const double dt = now_s() - t0;
    memset(out, 0, sizeof *out);
    out->step = tr->step;
    out->steps = tc->steps;
    out->loss = loss;
    out->aux_loss = sums.aux;
    out->z_loss = sums.z;
    out->lr = lr;
    out->grad_norm = norm;
    out->ms_per_step = 1e3 * dt;
    out->tokens_per_s = t->total_tokens_per_step / dt;
    out->tokens = tr->tokens_seen;
    out->dropped_frac = sums.dropped / (sums.scored * mc->top_k * mc->layers);
    out->a2a_bytes = sums.a2a_bytes;
    out->inter_site_bytes = sums.inter_site_bytes;
    out->link_wait_s = wait;
    return ISTH_OK;
}

int trainer_eval(Trainer *tr, double *bpb_prose, double *bpb_tech)
{
    /* every learner holds the global model (sync) or its anchor (outer
     * modes): learner 0 evaluates, its ranks splitting the windows; the
     * others go on to their next step */
    if (tr->topo.learner != 0) return ISTH_OK;
    const int anchor = tr->outer_mode && !tr->outer.butterfly; /* butterfly: learner 0's own */
    Backend *be = tr->be;
    if (anchor) {
        be->ops->to_host(be);
        CHECK(outer_view_anchor(&tr->outer, &tr->red, backend_state(be, STATE_PARAMS), backend_state(be, STATE_GRADS),
                                tr->model.n_params));
        be->ops->from_host(be);
    }
    const Corpus *sets[2] = {&tr->eval_prose, &tr->eval_tech};
    const char *names[2] = {"prose", "tech"};
    double *outs[2] = {bpb_prose, bpb_tech};
    int rc = ISTH_OK;
    for (int i = 0; i < 2 && rc == ISTH_OK; i++) {
        EvalResult r;
        rc = eval_corpus(be, &tr->ep, tr->micro_batch, tr->cfg.model.context, sets[i], (size_t)tr->cfg.data.eval_bytes,
                         &r);
        if (rc != ISTH_OK) break;
        if (tr->log) rc = metrics_eval(&tr->metrics, names[i], tr->step, r.bpb, r.predicted, r.seconds);
        if (outs[i]) *outs[i] = r.bpb;
    }
    if (anchor) {
        be->ops->to_host(be);
        outer_view_end(backend_state(be, STATE_PARAMS), backend_state(be, STATE_GRADS), tr->model.n_params);
        be->ops->from_host(be);
    }
    return rc;
}

int trainer_write_model(Trainer *tr, const char *path)
{
    if (tr->topo.learner != 0) return ISTH_OK;
    H5Meta meta = {tr->step, tr->tokens_seen};
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, "writing the model file");
    tr->be->ops->to_host(tr->be);
    const int rc = h5model_write(path, &tr->model, backend_state(tr->be, STATE_PARAMS), tr->config_text, &meta,
                                 tr->topo.learner_comm, tr->topo.learner_rank == 0);
    fault_watchdog_disarm();
    return rc;
}

/* The state replicas must agree on: each chunk from its owner. */
static const float *replica_view(const void *ctx, int t, int l, int e)
{
    const Trainer *tr = ctx;
    if (tr->outer_mode) return outer_view(&tr->outer, &tr->red, OUTER_ANCHOR, t, l, e);
    const int c = chunk_index(&tr->red.table, t, l, e < 0 ? 0 : e);
    return tr->red.owned_pos[c] != SIZE_MAX ? backend_state(tr->be, STATE_PARAMS) + chunk_offset(&tr->red.table, c)
                                            : NULL;
}

/* In sync mode every learner must hold the same model; a mismatch means a
 * bug or a hardware fault, and training on would silently mix models. */
static int check_replicas(Trainer *tr)
{
    uint64_t fp;
    /* outer modes: learners differ between outer steps; the anchor (global
     * model) must agree */
    const Topology *t = &tr->topo;
    tr->be->ops->to_host(tr->be);
    CHECK(model_fingerprint(&tr->red, replica_view, tr, t->learner_comm, &fp));
    /* inside the site first, then the sites' first ranks through the link */
    int site_size, site_rank;
    CHECK_MPI(MPI_Comm_size(t->site_comm, &site_size));
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    const size_t n = (size_t)(site_size > t->n_sites ? site_size : t->n_sites);
    uint64_t *all = isth_malloc(sizeof(uint64_t) * n);
    CHECK_ALLOC(all);
    int rc = ISTH_OK;
    if (MPI_Allgather(&fp, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, t->site_comm) != MPI_SUCCESS)
        rc = isth_fail(ISTH_ERUNTIME, "replica check: MPI_Allgather failed");
    for (int r = 0; rc == ISTH_OK && r < site_size; r++)
        if (all[r] != all[0])
            rc = isth_fail(ISTH_ERUNTIME, "step %ld: replicas diverged: rank %d fingerprint %016llx, rank %d %016llx",
                           tr->step, t->sites[t->site].first_rank + r, (unsigned long long)all[r],
                           t->sites[t->site].first_rank, (unsigned long long)all[0]);
    if (rc == ISTH_OK) rc = trainer_control(tr, &fp, sizeof fp, all, "replica check");
    for (int s = 0; rc == ISTH_OK && s < t->n_sites; s++)
        if (all[s] != all[0]) {
            rc = site_rank == 0 && t->site == 0
                     ? isth_fail(ISTH_ERUNTIME, "step %ld: replicas diverged: site %s fingerprint %016llx, site %s %016llx",
                                 tr->step, t->sites[s].name, (unsigned long long)all[s], t->sites[0].name,
                                 (unsigned long long)all[0])
                     : ISTH_ERUNTIME;
        }
    isth_free(all);
    CHECK(rc);
    if (tr->log)
        printf("replicas identical at step %ld: %d learner(s), fingerprint %016llx\n", tr->step,
               tr->topo.n_learners, (unsigned long long)fp);
    return ISTH_OK;
}

/* Total inter-site bytes of the run, and what `sync` would have moved. */
static int traffic_summary(Trainer *tr)
{
    const Topology *t = &tr->topo;
    const int S = t->n_sites;
    double v[2] = {tr->red.link.bytes_sent + tr->red.link.bytes_recv + tr->outer.spread.inter_site_bytes,
                   (double)tr->red.max_peer_learners};
    CHECK(coll_allreduce_comm(t->site_comm, &v[0], 1, MPI_DOUBLE, sizeof(double), MPI_SUM));
    CHECK(coll_allreduce_comm(t->site_comm, &v[1], 1, MPI_DOUBLE, sizeof(double), MPI_MAX));
    double *all = isth_malloc(sizeof v * (size_t)S);
    CHECK_ALLOC(all);
    const int rc = trainer_control(tr, v, sizeof v, all, "traffic summary");
    double bytes = 0.0;
    int peers = 0;
    for (int s = 0; s < S; s++) {
        bytes += all[2 * s];
        if (all[2 * s + 1] > peers) peers = (int)all[2 * s + 1];
    }
    isth_free(all);
    CHECK(rc);
    if (S < 2 || !tr->log) return ISTH_OK;
    /* sync: every step each site sends its summed gradient (float32, all
     * canonical parameters) to every other site; sent + received */
    const double sync_bytes = (double)tr->step * 2.0 * S * (S - 1) * 4.0 * (double)reduce_canonical_params(&tr->red);
    printf("inter-site traffic: %.0f bytes in %ld steps (sent + received, all ranks); sync would move %.0f: "
           "%.1fx less; an exchange waited on at most %d other learner(s)\n", bytes, tr->step, sync_bytes,
           bytes > 0 ? sync_bytes / bytes : 0.0, peers);
    if (tr->metrics.f) {
        fprintf(tr->metrics.f, "{\"summary\":\"traffic\",\"steps\":%ld,\"inter_site_bytes\":%.0f,"
                "\"sync_equivalent_bytes\":%.0f,\"reduction\":%.3f,\"max_peer_learners\":%d}\n",
                tr->step, bytes, sync_bytes, bytes > 0 ? sync_bytes / bytes : 0.0, peers);
    }
    return metrics_flush(&tr->metrics);
}

/* SIGTERM / SIGUSR1 (what Slurm sends before the time limit): finish the
 * step, checkpoint, exit 0. The handler only raises a flag; a second signal
 * during the checkpoint changes nothing (the file is renamed when complete). */
static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) { stop_signal = sig; }

/* Every rank must stop after the same step. Inside a site the flags are
 * combined with a non-blocking all-reduce on the site communicator, started
 * after step t and completed after step t+1 (the site's decision lags one
 * step). Between sites the site's decision rides on the verdicts of the next
 * exchange that finishes (reduce.c), so the vote adds no message and no wait
 * on the link; every site learns it when that exchange finishes, at the same
 * step. The bound on the lag is in docs/architecture.md. */
typedef struct {
    MPI_Request req;
    int send, recv, pending;
} StopVote;

static int stop_vote(StopVote *v, MPI_Comm site_comm, int local, int *site_agreed)
{
    *site_agreed = 0;
    if (v->pending) {
        CHECK_MPI(MPI_Wait(&v->req, MPI_STATUS_IGNORE));
        *site_agreed = v->recv;
        v->pending = 0;
    }
    v->send = local;
    CHECK_MPI(MPI_Iallreduce(&v->send, &v->recv, 1, MPI_INT, MPI_MAX, site_comm, &v->req));
    v->pending = 1;
    return ISTH_OK;
}

/* Has every site agreed to stop after this step? */
static int stop_decided(Trainer *tr, int site_agreed)
{
    if (tr->topo.n_sites == 1) return site_agreed;
    if (site_agreed) tr->red.stop_request = 1; /* goes out with the next verdicts */
    return tr->red.stop_agreed;
}

int train_run(const Config *cfg, const char *resume)
{
    Trainer tr;
    int rc = trainer_create(&tr, cfg, 1);
    if (rc == ISTH_OK && tr.rank == 0) {
        printf("isthmus train: resolved configuration (%s)\n%s\n", cfg->source, tr.config_text);
        topology_print(&tr.topo, cfg);
        printf("model: %.3fM parameters, %.3fM active matrix parameters per token; %d threads per rank\n",
               model_total_params(&cfg->model) / 1e6, model_active_matrix_params(&cfg->model) / 1e6,
               tr.be ? tr.be->threads : 0);
        fflush(stdout);
    }
    if (rc == ISTH_OK) rc = ckpt_check_outputs(&tr);
    if (rc == ISTH_OK && resume) {
        char path[1200];
        rc = ckpt_find(&tr, resume, path, sizeof path);
        if (rc == ISTH_OK && path[0]) rc = ckpt_load(&tr, path);
        else if (rc == ISTH_OK && tr.log) printf("resume: no valid checkpoint found; starting from step 0\n");
    }
    const TrainConfig *tc = &cfg->train;
    const char *hook = getenv("ISTHMUS_STOP_AT_STEP"); /* test hook: behave as if signalled */
    const long stop_at = hook ? atol(hook) : -1;
    signal(SIGTERM, on_stop_signal);
    signal(SIGUSR1, on_stop_signal);
    /* static: an all-reduce still posted when an error ends the job must
     * not write into a stack frame that is gone */
    static StopVote vote;
    memset(&vote, 0, sizeof vote);
    int stopping = 0, ckpt_due = 0;
    fault_set_step(tr.step);
    if (rc == ISTH_OK && tc->eval_every > 0 && tr.step == 0) rc = trainer_eval(&tr, NULL, NULL);
    while (rc == ISTH_OK && tr.step < tc->steps) {
        StepLog s;
        rc = trainer_step(&tr, &s);
        if (rc != ISTH_OK) break;
        if (tr.log && (s.step % tc->log_every == 0 || s.step == tc->steps)) rc = metrics_step(&tr.metrics, &s);
        if (rc != ISTH_OK) break;
        /* butterfly learners agree only at the end */
        if (tc->check_replicas > 0 && !tr.outer.butterfly && (tr.step % tc->check_replicas == 0 || tr.step == tc->steps))
            rc = check_replicas(&tr);
        if (rc != ISTH_OK) break;
        int site_stop;
        rc = stop_vote(&vote, tr.topo.site_comm, stop_signal != 0 || tr.step == stop_at, &site_stop);
        if (rc != ISTH_OK) break;
        stopping |= stop_decided(&tr, site_stop);
        if (cfg->checkpoint.every > 0 && tr.step % cfg->checkpoint.every == 0) ckpt_due = 1;
        if ((ckpt_due || stopping) && tr.step < tc->steps) {
            /* exchanges in flight complete now; their results are applied at
             * their own step, after a restart too (saved in the checkpoint) */
            if (tr.outer_mode) rc = outer_drain(&tr.outer, &tr.red);
            if (rc == ISTH_OK && stopping && tr.outer_mode) rc = outer_drain_probes(&tr.outer, &tr.metrics);
            if (rc == ISTH_OK) rc = ckpt_write(&tr);
            ckpt_due = 0;
            if (rc != ISTH_OK) break;
            if (stopping) {
                if (tr.log) printf("stopping after step %ld on request (signal); resume with --resume auto\n", tr.step);
                break;
            }
        }
        if (tc->eval_every > 0 && tr.step % tc->eval_every == 0 && tr.step < tc->steps)
            rc = trainer_eval(&tr, NULL, NULL);
    }
    /* on an error the job ends (fault_end_job); waiting here could hang */
    if (vote.pending && rc == ISTH_OK) rc = MPI_Wait(&vote.req, MPI_STATUS_IGNORE) == MPI_SUCCESS ? ISTH_OK : ISTH_ERUNTIME;
    const int finished = rc == ISTH_OK && tr.step >= tc->steps;
    if (rc == ISTH_OK && tr.rank == 0) memory_print_measured(0); /* `isthmus config --memory` predicts it */
    if (finished && tr.outer_mode)
        rc = outer_finish(&tr.outer, &tr.red, backend_state(tr.be, STATE_PARAMS), tr.step, &tr.metrics, tr.log);
    if (finished && rc == ISTH_OK && tc->check_replicas > 0) rc = check_replicas(&tr);
    if (finished && rc == ISTH_OK) rc = traffic_summary(&tr);
    if (finished && rc == ISTH_OK) rc = ckpt_write(&tr);
    if (finished && rc == ISTH_OK) rc = trainer_eval(&tr, NULL, NULL);
    if (finished && rc == ISTH_OK) {
        char path[1100];
        snprintf(path, sizeof path, "%s/model.h5", tc->out_dir);
        rc = trainer_write_model(&tr, path);
        if (rc == ISTH_OK && tr.rank == 0) printf("wrote %s (step %ld)\n", path, tr.step);
    }
    const int closed = metrics_close(&tr.metrics);
    if (rc == ISTH_OK) rc = closed;
    /* a failed multi-rank run ends in MPI_Abort (fault_end_job): tearing
     * down first would only wait on requests a dead peer never completes */
    if (rc != ISTH_OK && tr.topo.world_size > 1) return rc;
    trainer_destroy(&tr);
    return rc;
}
