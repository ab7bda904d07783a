/* train.c — see train.h. */
#include "backend_choose.h"
#include "train.h"
#include "alloc.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

#include "eval.h"
#include "sample.h"
#include "fault.h"
#include "h5io.h"
#include "modelfile.h"
#include "router_tune.h"
#include "clock.h"
#include "coll.h"
#include "config_keys.h"
#include "norms.h"
#include "stateview.h"
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

/* This rank's training files, eval sets and tokenizer (no collective).
 * `training`: a token model never trains on bytes, refused here, before
 * the model is allocated (a 33B one takes minutes, or more memory than a
 * CPU build has); a benchmark (`bench`) times the steps on any data. */
static int data_open(Trainer *tr, const Config *cfg, int say, int training)
{
    const ModelConfig *mc = &cfg->model;
    CHECK(dataset_open(&tr->train, cfg->data.train, cfg->data.dir, mc->context));
    if (training && !cfg->data.train[0] && !data_kind_fits(tr->train.width, mc->vocab))
        return isth_fail(ISTH_EINPUT, "config %s: [model] vocab = %d reads token shards only, and [data] train is "
                         "empty: the bundled corpus %s is raw bytes (model.vocab = 256); set data.train to the "
                         "shards (scripts/prepare_data.py, docs/tokens.md)", cfg->source, mc->vocab,
                         tr->train.files[0].path);
    if (training) CHECK(dataset_check_kind(&tr->train, mc->vocab));
    CHECK(eval_sets_open(tr->evals, &tr->n_evals, cfg, tr->train.width));
    if (tr->train.width == 1 && mc->vocab < 256)
        return isth_fail(ISTH_EINPUT, "model.vocab = %d: the training data (%s) are raw bytes, which need 256",
                         mc->vocab, tr->train.files[0].path);
    /* the tokenizer must be the model's (its vocabulary); a build without
     * sentencepiece shows samples as ids rather than refusing to train */
    if (cfg->data.tokenizer[0] && !tokenizer_have_sentencepiece()) {
        if (say)
            printf("data: [data] tokenizer %s is not used: this isthmus was built without libsentencepiece "
                   "(samples are token ids)\n", cfg->data.tokenizer);
        return tokenizer_open(&tr->tokenizer, "", mc->vocab);
    }
    char tpath[2 * CONFIG_FILE_PATH_MAX + 2];
    CHECK(tokenizer_resolve(cfg->data.tokenizer, cfg->data.dir, tpath, sizeof tpath));
    return tokenizer_open(&tr->tokenizer, tpath, mc->vocab);
}

int trainer_create(Trainer *tr, const Config *cfg, int log, MPI_Comm world, const unsigned char *link_master)
{
    memset(tr, 0, sizeof *tr);
    tr->ckpt_every_site = -1;
    tr->red.site_peers = MPI_COMM_NULL; /* reducer_destroy frees it only when it was made */
    stop_ballot_init(&tr->ballot);
    tr->cfg = *cfg;
    MPI_Comm_rank(world, &tr->rank);
    const ModelConfig *mc = &cfg->model;
    const TrainConfig *tc = &cfg->train;

    tr->config_text = config_to_text(cfg);
    CHECK_ALLOC(tr->config_text);
    CHECK(topology_create(&tr->topo, cfg, world));
    tr->created = 1;
    const Topology *t = &tr->topo;
    /* the world's first rank logs; in the federated launch each other
     * site's first rank too, into its own folder (its own mpirun's output) */
    const int federated = world != MPI_COMM_WORLD;
    tr->log = log && (tr->rank == 0 || (federated && t->world_rank == t->sites[t->site].first_rank));
    if (tr->log && tr->rank != 0)
        snprintf(tr->metrics_dir, sizeof tr->metrics_dir, "%s/site-%s", cfg->train.out_dir, t->sites[t->site].name);
    else
        snprintf(tr->metrics_dir, sizeof tr->metrics_dir, "%s", cfg->train.out_dir);
    fault_set_site(t->sites[t->site].name);
    const SiteInfo *site = &t->sites[t->site];
    tr->micro_batch = site->micro_batch;
    tr->grad_accum = site->grad_accum;
    tr->mode = cfg->outer.mode_id;
    /* sync: the update averages every rank's tokens; outer modes: each
     * learner averages its own */
    tr->loss_weight = tr->mode != MODE_SYNC ? 1.0 / site->learner_ranks
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

    /* [data] is site-local: what one site finds wrong with its files the
     * others learn from the agreement below, so no rank waits for one that
     * returned (the failing rank printed why; the others return its code) */
    int rc = data_open(tr, cfg, t->world_rank == 0, log);
    uint64_t mine[2] = {(uint64_t)rc, 0};
    if (rc == ISTH_OK) rc = dataset_identity(&tr->train, &mine[1]);
    mine[0] = (uint64_t)rc;
    uint64_t *all = isth_malloc(2 * sizeof(uint64_t) * (size_t)t->world_size);
    CHECK_ALLOC(all);
    if (MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, world) != MPI_SUCCESS) {
        isth_free(all);
        return isth_fail(ISTH_ERUNTIME, "data: the ranks could not agree on their training data (MPI)");
    }
    int first_failed = -1;
    for (int r = 0; r < t->world_size && first_failed < 0; r++)
        if (all[2 * r] != ISTH_OK) first_failed = r;
    /* rank 0 printed its own reason; else the first failing rank prints the
     * one quiet mode held back (an input only its site saw) */
    if (first_failed > 0 && t->world_rank == first_failed && status_has_suppressed()) status_print_suppressed();
    if (first_failed >= 0 && rc == ISTH_OK) rc = (int)all[2 * first_failed];
    /* every site reads its own copy: the copies must be the same data (the
     * vocabulary is in [model], checked with the config) */
    for (int r = 1; r < t->world_size && rc == ISTH_OK; r++)
        if (all[2 * r + 1] != all[1]) {
            const int s = topology_site_of(t, r);
            rc = isth_fail(ISTH_EINPUT, "data: world rank %d (site %s) reads other training data than world rank 0 "
                           "(site %s): identity %016llx against %016llx (the number of files, each one's size and "
                           "first %d bytes, in order, must match; the paths may differ)", r, cfg->sites[s].name,
                           cfg->sites[topology_site_of(t, 0)].name, (unsigned long long)all[2 * r + 1],
                           (unsigned long long)all[1], DATA_IDENTITY_BLOCK);
        }
    isth_free(all);
    CHECK(rc);
    tr->cursor.seed = tc->seed;
    tr->cursor.step = 0;

    CHECK(backend_create(&tr->be, cfg, tr->micro_batch, t->expert_begin, t->experts_local, &tr->ep));
    CHECK(backend_print_devices(cfg, tr->be)); /* each rank's GPU: the launcher's binding, checked at a glance */
    if (t->experts_split) /* the learner holds its site's experts: the router chooses among them, or drops the rest */
        CHECK(tr->be->ops->set_route(tr->be, strcmp(cfg->outer.expert_routing, "drop") ? ROUTE_LOCAL : ROUTE_DROP,
                                     t->sites[t->site].expert_begin));
    tr->model = tr->be->table;
    link_init(&tr->link, world, cfg->outer.timeout, t->sites[t->site].name);
    {
        PayloadCodec pc;
        payload_codec_init(&pc, (Codec)codec_from_name(cfg->outer.codec), config_codec_params(&cfg->outer),
                           !strcmp(cfg->outer.error_feedback, "on"), !strcmp(cfg->outer.topk_mean, "senders"));
        payload_encode_on(&pc, tr->be);
        CHECK(shard_create(&tr->shard, t, &tr->model, cfg->outer.fragments, &pc));
    }
    /* split experts: the copies this rank keeps of other sites' experts, the mirrors of its own */
    CHECK(copies_create(&tr->copies, cfg, t, &tr->shard.table));
    /* the exchange between learners: the site reduction, or the butterfly's mixer */
    if (tr->mode != MODE_BUTTERFLY) CHECK(reducer_create(&tr->red, &tr->shard, &tr->link, &tr->ballot, world));
    /* the site's recent steps (the ETA; the outer modes' summary for the other sites) */
    CHECK(progress_create(&tr->progress, cfg->outer.inner_steps, tc->steps, t->n_sites, t->site,
                          site->tokens_per_step * site->learners));
    if (tr->mode != MODE_BUTTERFLY && tr->mode != MODE_SYNC) reduce_watch(&tr->red, &tr->progress);
    { /* the frames' keys: one per ordered pair of sites (seal.h) */
        static const unsigned char public_key[SEAL_KEY_BYTES];
        int first[CONFIG_MAX_SITES + 1];
        for (int s = 0; s < t->n_sites; s++) first[s] = t->sites[s].first_rank;
        first[t->n_sites] = t->world_size;
        link_set_keys(&tr->link, link_master ? link_master : public_key, !strcmp(cfg->outer.encrypt, "on"),
                      t->site, first, t->n_sites);
    }
    /* one mpirun per site: losing a site is survivable (the joint launch's
     * mpirun ends the whole job instead) */
    link_survive(&tr->link, federated);
    if (t->n_sites > 1 && !strcmp(cfg->outer.transport, "tcp")) { /* collective: every rank of every site */
        WireOptions wo = {.streams = cfg->outer.streams, .socket_buffer = cfg->outer.socket_buffer,
                          .unexpected_max = (size_t)256 << 20,
                          .port_shift = (int)fault_hook_for("ISTHMUS_WIRE_PORT_SHIFT", t->sites[t->site].name),
                          /* a connection is made when a pair first talks; the connecting rank
                           * writes its hello at its next poll, which may be a step away */
                          .hello_timeout_s = cfg->outer.timeout};
        snprintf(wo.interface, sizeof wo.interface, "%s", cfg->outer.interface);
        (void)wire_parse_ports(cfg->outer.ports, &wo.port_lo, &wo.port_hi); /* checked by config_load */
        CHECK(link_open_wire(&tr->link, &wo));
    }
    /* how the link moves a payload (docs/configuration.md, [outer]) */
    link_set_piece_bytes(&tr->link, (size_t)cfg->outer.piece_bytes);
    if (tr->mode != MODE_BUTTERFLY) {
        reduce_set_window(&tr->red, cfg->outer.mode_id == MODE_STREAMING ? cfg->outer.overlap : 0,
                          !strcmp(cfg->outer.pace, "on"));
        reduce_log_to(&tr->red, tr->log, &tr->metrics);
    }
    if (t->n_sites > 1 && !strcmp(cfg->outer.progress, "thread")) CHECK(link_progress_start());
    if (t->n_sites > 1 && !strcmp(cfg->outer.progress, "poll")) {
        if (tr->be->ops->set_progress) { /* butterfly's pairs are polled after each step only */
            if (tr->mode != MODE_BUTTERFLY) tr->be->ops->set_progress(tr->be, reduce_progress, &tr->red);
        }
        else if (tr->log) /* poll is the default; such a backend still polls after each step */
            printf("link: the %s backend cannot poll between layers; [outer] progress = poll acts as step\n",
                   tr->be->ops->name);
    }
    { /* the optimiser's state only for the chunks this rank owns (ZeRO-1) */
        const size_t *off, *len;
        int n;
        shard_owned_runs(&tr->shard, &off, &len, &n);
        CHECK(tr->be->ops->optimizer_shard(tr->be, off, len, n));
    }
    /* the backend's scratch for learner sums is sized by its first use: one
     * share now (the weights are a function of the seed, the same on every
     * rank) so that nothing is allocated inside a later collective */
    CHECK(shard_share_params(&tr->shard, tr->be));
    if (tr->mode != MODE_SYNC) {
        CHECK(outer_create(&tr->outer, &cfg->outer, &tr->shard, tr->mode != MODE_BUTTERFLY ? &tr->red : NULL, tr->be,
                           site->tokens_per_step / t->total_tokens_per_step));
        tr->outer.spread.tolerant = federated; /* a lost site's samples stop the probe, not the run */
    }
    if (tr->mode == MODE_BUTTERFLY) {
        const int N = t->n_learners;
        if (N < 2 || (N & (N - 1)))
            return isth_fail(ISTH_EINPUT,
                             "layout: [outer] mode = butterfly needs a power-of-two number of learners (2, 4, 8, ...); "
                             "the [site.*] sections give %d", N);
        double *w = isth_malloc(sizeof(double) * (size_t)N);
        CHECK_ALLOC(w);
        for (int l = 0; l < N; l++)
            w[l] = t->sites[topology_site_of_learner(t, l)].tokens_per_step / t->total_tokens_per_step;
        int rc = mixer_create(&tr->mix, &tr->shard, &tr->link, &tr->ballot);
        mix_watch(&tr->mix, &tr->progress);
        if (rc == ISTH_OK) rc = outer_set_butterfly(&tr->outer, &tr->mix, &tr->link, t->learner, N, w);
        isth_free(w);
        CHECK(rc);
    }
    const size_t n = (size_t)tr->micro_batch * mc->context;
    tr->tokens = isth_malloc(n * sizeof(int));
    tr->targets = isth_malloc(n * sizeof(int));
    CHECK_ALLOC(tr->tokens);
    CHECK_ALLOC(tr->targets);
    /* metrics.jsonl opens once the start's step is known (train_run) */
    return ISTH_OK;
}

void trainer_destroy(Trainer *tr)
{
    link_progress_stop();
    metrics_close(&tr->metrics);
    isth_free(tr->tokens);
    isth_free(tr->targets);
    backend_destroy(tr->be);
    tr->be = NULL;
    assembly_free(&tr->whole);
    copies_destroy(&tr->copies);
    if (tr->created) {
        outer_destroy(&tr->outer);
        link_forget_keys(&tr->link);
        const int reducer_retired = reducer_destroy(&tr->red), mixer_retired = mixer_destroy(&tr->mix);
        shard_destroy(&tr->shard, !(reducer_retired && mixer_retired)); /* MPI may still write unretired staging */
        link_close_wire(&tr->link); /* after every message: nothing of the wire is held any more */
        topology_destroy(&tr->topo);
    }
    dataset_close(&tr->train);
    progress_destroy(&tr->progress);
    eval_sets_close(tr->evals, tr->n_evals);
    tokenizer_close(&tr->tokenizer);
    isth_free(tr->config_text);
    isth_free(tr->site_leaders);
    tr->config_text = NULL;
    tr->site_leaders = NULL;
    tr->created = 0;
}

int trainer_control(Trainer *tr, const void *mine, size_t bytes, void *all, const char *what)
{
    const Topology *t = &tr->topo;
    return link_control(&tr->link, mine, bytes, all, tr->site_leaders, t->n_sites, t->site, t->site_comm, what);
}

/* What a step adds up over ranks (doubles only: reduced as an array). */
typedef struct {
    double ce_sum, scored;       /* cross-entropy (nats) and targets scored */
    double aux, z;               /* this rank's share of its learner's aux and z losses */
    double dropped;              /* routed copies dropped for capacity */
    double remote;               /* routed copies to experts the learner does not hold (split experts) */
    double a2a_bytes;            /* expert all-to-all inside the learner */
    double inter_site_bytes;     /* through the link */
} StepSums;

#define STEP_SUMS (sizeof(StepSums) / sizeof(double))

/* Step statistics: sums over this site, then (sync: every site's, added in
 * site order through the link) over the sites; `wait` is a maximum, and so
 * is `took` (the step's time so far: the site's, its slowest rank's). */
static int step_stats(Trainer *tr, StepSums *step, double *wait, double *took)
{
    const int n = (int)STEP_SUMS;
    double *sums = (double *)step;
    const Topology *t = &tr->topo;
    CHECK(coll_allreduce_comm(t->site_comm, sums, (size_t)n, MPI_DOUBLE, sizeof(double), MPI_SUM));
    double most[2] = {*wait, *took};
    CHECK(coll_allreduce_comm(t->site_comm, most, 2, MPI_DOUBLE, sizeof(double), MPI_MAX));
    *wait = most[0];
    *took = most[1];
    if (tr->mode != MODE_SYNC || t->n_sites == 1) return ISTH_OK; /* outer modes: rank 0's site */
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
    CHECK(be->ops->zero_grads(be));
    coll_mark(&tr->ep); /* each module counts its own traffic from here */
    link_mark(&tr->link);
    /* summed over every site (sync) or this site (outer modes: no per-step
     * traffic between sites), see step_stats */
    StepSums sums = {0};
    for (int micro = 0; micro < M; micro++) {
        const uint64_t first = tr->learner_first_window + (uint64_t)micro * B * G +
                               (uint64_t)t->learner_rank * B;
        const double t_data = now_s();
        CHECK(data_fill(&tr->cursor, &tr->train, first, tr->tokens, tr->targets, B, T, mc->vocab));
        tr->data_s += now_s() - t_data;
        ForwardStats st;
        CHECK(be->ops->train_micro(be, tr->tokens, tr->targets, B, T, (float)(tr->loss_weight / M), &st));
        sums.ce_sum += st.ce_sum;
        sums.scored += (double)st.n_targets;
        sums.aux += st.aux_loss / M; /* this rank's share of its learner's value */
        sums.z += st.z_loss / M;
        sums.dropped += (double)st.dropped;
        sums.remote += (double)st.remote_dropped;
    }
    tr->cursor.step++;
    /* the inner step's own work (what a one-site run does too) is timed
     * apart from what waits on other sites: sync's reduction over every
     * site, the outer steps after the optimiser */
    double compute = 0.0;
    if (tr->mode != MODE_SYNC) {
        CHECK(shard_learner_sum(&tr->shard, be));
        compute += now_s() - t0;
    } else {
        compute += now_s() - t0;
        ExchangeReport rep;
        CHECK(reduce_start(&tr->red, be, 0, STATE_GRADS, REDUCE_GRADS));
        CHECK(reduce_finish(&tr->red, be, 0, STATE_GRADS, &rep));
    }
    const double t_update = now_s();
    sums.a2a_bytes = coll_since_mark(&tr->ep);
    /* learner means of aux and z: divide each rank's share by its G; learners
     * are weighted equally in the reported value */
    const int stat_learners = tr->mode != MODE_SYNC ? t->sites[t->site].learners : t->n_learners;
    sums.aux /= (double)G * stat_learners;
    sums.z /= (double)G * stat_learners;

    double norm2;
    CHECK(grad_norm_sq_learner(be, t->learner_comm, &norm2));
    const double norm = sqrt(norm2);
    if (tc->clip > 0 && norm > tc->clip) CHECK(be->ops->scale_grads(be, (float)(tc->clip / norm)));
    const double lr = lr_at(tc, tr->step);
    CHECK(be->ops->optimizer_step(be, lr));
    /* each owner updated its dense chunks: every rank needs them all */
    if (t->learner_size > 1) CHECK(shard_share_params(&tr->shard, be));
    tr->step++;
    tr->tokens_seen += t->total_tokens_per_step;
    compute += now_s() - t_update;
    tr->compute_s += compute;
    if (tr->mode != MODE_SYNC) CHECK(outer_after_step(&tr->outer, be, tr->step, &tr->metrics, tr->log));
    double wait;
    link_since_mark(&tr->link, &sums.inter_site_bytes, &wait);
    if (fault_nan_now()) sums.ce_sum = NAN; /* test hook: this site diverges */
    double took = now_s() - t0;
    CHECK(step_stats(tr, &sums, &wait, &took));
    const double loss = sums.ce_sum / sums.scored;
    if (!isfinite(loss)) { /* every rank of the site sees it: its first rank says so */
        int site_rank;
        CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
        if (site_rank != 0) return ISTH_ERUNTIME;
        return isth_fail(ISTH_ERUNTIME, "step %ld: loss is %g (diverged); lower [train] lr", tr->step, loss);
    }

    const double dt = now_s() - t0;
    /* the same on every rank of the site: what its summary and the ETA are made of */
    progress_step(&tr->progress, tr->step, loss, took);
    memset(out, 0, sizeof *out);
    out->step = tr->step;
    out->steps = tc->steps;
    out->loss = loss;
    out->aux_loss = sums.aux;
    out->z_loss = sums.z;
    out->lr = lr;
    out->grad_norm = norm;
    out->ms_per_step = 1e3 * dt;
    out->compute_s = compute;
    out->tokens_per_s = t->total_tokens_per_step / dt;
    out->tokens = tr->tokens_seen;
    out->dropped_frac = sums.dropped / (sums.scored * mc->top_k * mc->layers);
    out->remote_frac = sums.remote / (sums.scored * mc->top_k * mc->layers);
    out->a2a_bytes = sums.a2a_bytes;
    out->inter_site_bytes = sums.inter_site_bytes;
    tr->inter_site_total += sums.inter_site_bytes;
    out->inter_site_total = tr->inter_site_total;
    out->link_wait_s = wait;
    out->eta_s = progress_eta(&tr->progress);
    out->n_sites = t->n_sites;
    out->sites_present = t->n_sites;
    for (int s = 0; s < t->n_sites; s++) out->sites_present -= link_is_lost(&tr->link, s);
    return ISTH_OK;
}

int trainer_lead_site(const Trainer *tr)
{
    for (int s = 0; s < tr->topo.n_sites; s++)
        if (!link_is_lost(&tr->link, s)) return s;
    return tr->topo.site;
}

void trainer_model_path(const Trainer *tr, char *out, size_t cap)
{
    const int s = trainer_lead_site(tr);
    if (s == 0) snprintf(out, cap, "%s/model.h5", tr->cfg.train.out_dir);
    else snprintf(out, cap, "%s/site-%s/model.h5", tr->cfg.train.out_dir, tr->topo.sites[s].name);
}

int trainer_eval(Trainer *tr)
{
    /* every learner holds the global model (sync) or its anchor (outer
     * modes): learner 0 evaluates, its ranks splitting the windows; the
     * others go on to their next step */
    if (tr->topo.learner != tr->topo.sites[trainer_lead_site(tr)].first_learner || !tr->n_evals) return ISTH_OK;
    const int anchor = tr->mode == MODE_DILOCO || tr->mode == MODE_STREAMING; /* butterfly: learner 0's own */
    Backend *be = tr->be;
    if (anchor) CHECK(outer_view_anchor(&tr->outer, be));
    int rc = ISTH_OK;
    for (int i = 0; i < tr->n_evals && rc == ISTH_OK; i++) {
        EvalResult r;
        rc = eval_set(be, &tr->ep, tr->micro_batch, tr->cfg.model.context, &tr->evals[i], (size_t)tr->cfg.data.eval_bytes,
                      tr->cfg.model.vocab, &r);
        if (rc != ISTH_OK) break;
        if (tr->log)
            rc = metrics_eval(&tr->metrics, tr->evals[i].cfg.name, tr->evals[i].file.width == 1, tr->step, r.bpb,
                              r.loss, r.predicted, r.bytes, r.seconds, tr->topo.experts_split ? "site" : NULL);
    }
    if (anchor) {
        const int vrc = outer_view_end(be);
        if (rc == ISTH_OK) rc = vrc;
    }
    return rc;
}

/* Bytes in a valid UTF-8 sequence starting at s (n left), 0 if none. */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    const size_t len = s[0] < 0xc2 ? 0 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : s[0] < 0xf5 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

/* The sample's text on one line: newlines, control bytes and bytes that
 * are not UTF-8 escaped (a byte model draws any byte). */
static void print_sample(long step, const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    printf("sample step %ld | ", step);
    for (size_t i = 0; i < len;) {
        const size_t seq = s[i] >= 0x80 ? utf8_sequence(s + i, len - i) : 1;
        if (s[i] == '\n') fputs("\\n", stdout);
        else if (s[i] == '\\') fputs("\\\\", stdout);
        else if (s[i] < 0x20 || s[i] == 0x7f || !seq) printf("\\x%02x", s[i]);
        else fwrite(s + i, 1, seq, stdout);
        i += seq ? seq : 1;
    }
    putchar('\n');
    fflush(stdout);
}

int trainer_sample(Trainer *tr)
{
    if (tr->topo.learner != tr->topo.sites[trainer_lead_site(tr)].first_learner) return ISTH_OK;
    const ModelConfig *mc = &tr->cfg.model;
    const int T = mc->context, n = tr->cfg.train.sample_tokens, V = mc->vocab;
    /* the prompt: the first eighth of the first eval set's first window (a newline without one) */
    int prompt_n = tr->n_evals ? T / 8 : 1;
    if (prompt_n < 1) prompt_n = 1;
    if (tr->n_evals && (size_t)prompt_n > tr->evals[0].file.n_tokens) prompt_n = (int)tr->evals[0].file.n_tokens;
    int *window = isth_malloc((size_t)(T + n) * sizeof(int));
    float *probs = isth_malloc((size_t)V * sizeof(float));
    double *scratch = isth_malloc((size_t)V * sizeof(double));
    int rc = window && probs && scratch ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "out of memory for a sample");
    if (rc == ISTH_OK && tr->n_evals) rc = corpus_tokens(&tr->evals[0].file, 0, (size_t)prompt_n, window, V);
    else if (rc == ISTH_OK) window[0] = '\n' < V ? '\n' : 0;
    const int anchor = tr->mode == MODE_DILOCO || tr->mode == MODE_STREAMING;
    if (rc == ISTH_OK && anchor) rc = outer_view_anchor(&tr->outer, tr->be);
    /* temperature 1, every token: the model's own distribution, drawn from (seed, step) */
    const SampleRule rule = {1.0, 0, tr->cfg.train.seed ^ ((uint64_t)tr->step * 0x9e3779b97f4a7c15ull)};
    int len = prompt_n;
    for (int g = 0; g < n && rc == ISTH_OK; g++) {
        const int start = len > T ? len - T : 0; /* the last context's tokens */
        rc = tr->be->ops->predict(tr->be, window + start, len - start, probs);
        if (rc != ISTH_OK) break;
        for (int v = 0; v < V; v++) probs[v] = logf(probs[v]); /* log-probabilities are logits */
        int tok = sample_draw(probs, V, &rule, (uint64_t)g, scratch);
        /* the learner's ranks computed the same distribution; rank 0's draw is the one */
        rc = coll_bcast_bytes(tr->topo.learner_comm, &tok, sizeof tok, 0);
        window[len++] = tok;
    }
    if (anchor) {
        const int vrc = outer_view_end(tr->be);
        if (rc == ISTH_OK) rc = vrc;
    }
    if (rc == ISTH_OK && tr->log) {
        char *text = NULL;
        size_t text_len = 0;
        rc = tokenizer_decode(&tr->tokenizer, window + prompt_n, (size_t)n, &text, &text_len);
        if (rc == ISTH_OK) print_sample(tr->step, text, text_len);
        isth_free(text);
    }
    isth_free(window);
    isth_free(probs);
    isth_free(scratch);
    return rc;
}

int trainer_owns_chunk(const void *shard, int c) { return shard_owns(shard, c); }

int trainer_assemble(Trainer *tr)
{
    return assembly_gather(&tr->whole, &tr->link, &tr->topo, &tr->shard.table, tr->be, &tr->copies,
                           trainer_lead_site(tr));
}

/* The model file's chunks on a writer rank: those it owns from its
 * backend, and (split experts) the other sites' it received. */
typedef struct {
    StateView v;
    const Assembly *whole;
} ModelView;

static float *model_view_at(void *ctx, int tensor, int layer, int expert)
{
    ModelView *mv = ctx;
    float *mine = state_view_at(&mv->v, tensor, layer, expert);
    if (mine || expert < 0 || !mv->whole) return mine;
    return assembly_chunk(mv->whole, chunk_index(mv->v.ct, tensor, layer, expert));
}

int trainer_write_model(Trainer *tr, const char *path, int *written)
{
    const int split = tr->topo.experts_split;
    *written = 0;
    if (split && !tr->whole.whole) { /* a file of some sites' experts would read as a whole model */
        const int s = tr->whole.lost_site;
        if (tr->log && tr->whole.done && s >= 0)
            printf("%s: not written: site %s was lost%s, and the whole model needs every site's experts; each "
                   "site's checkpoint holds its own%s\n", path, tr->topo.sites[s].name,
                   tr->whole.lost_during ? " during the whole model's assembly" : "",
                   !tr->copies.on ? " (expert_replicas = 1: no copies)"
                   : tr->copies.live_refreshes[s] ? " (no live site holds a copy of them)"
                                          : " (their copies had not been refreshed yet)");
        fflush(stdout);
        return ISTH_OK;
    }
    const int lead = trainer_lead_site(tr);
    for (int s = 0; split && tr->log && s < tr->topo.n_sites; s++)
        if (tr->whole.from_copy[s]) {
            const long at = tr->whole.copy_step[s];
            char when[64] = "";
            if (at >= 0) snprintf(when, sizeof when, " from the refresh at step %ld", at);
            printf("%s: site %s was lost; its experts are their copy%s (held by site %s)\n", path,
                   tr->topo.sites[s].name, when, tr->topo.sites[tr->whole.src[tr->topo.sites[s].expert_begin]].name);
        }
    if (split && tr->log && tr->topo.site != lead) { /* this site's log: where its experts went */
        printf("model.h5: site %s's experts went to site %s, which writes the whole model\n",
               tr->topo.sites[tr->topo.site].name, tr->topo.sites[lead].name);
        fflush(stdout);
    }
    if (tr->topo.learner != tr->topo.sites[lead].first_learner) return ISTH_OK;
    H5Meta meta = {tr->step, tr->tokens_seen, tr->train.width, split};
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, "writing the model file", FAULT_HINT_IO);
    /* learner 0's ranks, each the chunks it owns, through host staging
     * (allocated and agreed before the file is created) */
    ModelView mv = {.whole = split ? &tr->whole : NULL};
    const size_t need = state_view_need(&tr->shard.table, trainer_owns_chunk, &tr->shard);
    const int made = state_view_create(&mv.v, &tr->shard.table, need) == ISTH_OK;
    int rc = coll_all_ok(tr->topo.learner_comm, made) ? ISTH_OK : ISTH_ERUNTIME;
    H5File f;
    if (rc == ISTH_OK) rc = h5model_create(&f, path, &tr->model, tr->config_text, &meta, tr->topo.learner_comm);
    if (rc == ISTH_OK) {
        state_view_begin(&mv.v, tr->be, STATE_PARAMS, NULL, trainer_owns_chunk, &tr->shard, 0);
        rc = h5_write_chunks(&f, "/model", &tr->model, model_view_at, &mv);
        const int vrc = state_view_end(&mv.v, rc == ISTH_OK);
        if (rc == ISTH_OK && !coll_all_ok(tr->topo.learner_comm, vrc == ISTH_OK)) rc = vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
        if (rc != ISTH_OK) f.failed = 1; /* removed, not renamed */
        const int crc = h5_commit(&f);
        if (rc == ISTH_OK) rc = crc;
    }
    state_view_destroy(&mv.v);
    assembly_free(&tr->whole); /* in the file now */
    fault_watchdog_disarm();
    *written = rc == ISTH_OK;
    return rc;
}

int trainer_eval_whole(Trainer *tr, const char *path)
{
    const Topology *t = &tr->topo;
    const int steps = tr->cfg.outer.router_steps;
    if (!t->experts_split || !tr->whole.whole || (!tr->n_evals && steps <= 0)) return ISTH_OK;
    if (t->learner != t->sites[trainer_lead_site(tr)].first_learner) return ISTH_OK;
    const int E = tr->cfg.model.experts, G = t->learner_size;
    if (E % G) {
        if (tr->log)
            printf("eval: the whole model is not %s here (%d ranks cannot share its %d experts); isthmus %s "
                   "--model %s on a rank count that divides them %s\n", steps > 0 ? "tuned or evaluated" : "evaluated",
                   G, E, steps > 0 ? "tune-router" : "eval", path, steps > 0 ? "does it" : "gives its bpb");
        return ISTH_OK;
    }
    /* the training backend's memory goes to the whole model's */
    backend_destroy(tr->be);
    tr->be = NULL;
    Backend *be = NULL;
    int rc = backend_create(&be, &tr->cfg, tr->micro_batch, t->learner_rank * (E / G), E / G, &tr->ep);
    H5Meta meta;
    if (rc == ISTH_OK) rc = modelfile_read_backend(path, be, &meta, t->learner_comm);
    if (rc == ISTH_OK && steps > 0) { /* the joint router phase: the windows of the steps after training */
        const double lr = tr->cfg.outer.router_lr > 0 ? tr->cfg.outer.router_lr : tr->cfg.train.lr;
        DataCursor cur = tr->cursor;
        RouterTuneReport rep;
        rc = router_tune(be, &tr->ep, &tr->cfg, &tr->train, &cur, tr->learner_first_window, tr->micro_batch, steps,
                         lr, 0, &rep);
        if (rc == ISTH_OK) rc = modelfile_write_backend(path, be, tr->config_text, &meta, t->learner_comm);
        if (rc == ISTH_OK && tr->log)
            printf("router phase: the whole model's router alone, %d steps at lr %g on site %s: training loss %.4f "
                   "in the first tenth, %.4f in the last; %.1f s; %s rewritten\n", rep.steps, lr,
                   t->sites[t->site].name, rep.first_loss, rep.last_loss, rep.seconds, path);
    }
    for (int i = 0; i < tr->n_evals && rc == ISTH_OK; i++) {
        EvalResult r;
        rc = eval_set(be, &tr->ep, tr->micro_batch, tr->cfg.model.context, &tr->evals[i],
                      (size_t)tr->cfg.data.eval_bytes, tr->cfg.model.vocab, &r);
        if (rc == ISTH_OK && tr->log)
            rc = metrics_eval(&tr->metrics, tr->evals[i].cfg.name, tr->evals[i].file.width == 1, meta.step, r.bpb,
                              r.loss, r.predicted, r.bytes, r.seconds, "whole");
    }
    backend_destroy(be);
    return rc;
}
