/* run.c — see run.h. */
#include "run.h"

#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "ckpt.h"
#include "ckpt_files.h"
#include "ckpt_load.h"
#include "ckpt_share.h"
#include "clock.h"
#include "fault.h"
#include "federation.h"
#include "memory.h"
#include "norms.h"
#include "coll.h"
#include "stateview.h"
#include "status.h"
#include "stop.h"

/* The state replicas must agree on, each chunk from its owner: the anchor
 * in the outer modes, the weights (through host staging) in sync. */
typedef struct {
    const Trainer *tr;
    StateView weights;
} ReplicaView;

static const float *replica_view(void *ctx, int t, int l, int e)
{
    ReplicaView *v = ctx;
    if (v->tr->mode != MODE_SYNC) return outer_view(&v->tr->outer, OUTER_ANCHOR, t, l, e);
    return state_view_at(&v->weights, t, l, e);
}

/* In sync mode every learner must hold the same model; a mismatch means a
 * bug or a hardware fault, and training on would silently mix models. */
static int check_replicas(Trainer *tr)
{
    uint64_t fp, fpx;
    /* outer modes: learners differ between outer steps; the anchor (global
     * model) must agree: every chunk inside a site, across sites the chunks
     * that cross (split experts stay at their site) */
    const Topology *t = &tr->topo;
    ReplicaView view = {.tr = tr};
    const int sync = tr->mode == MODE_SYNC;
    const size_t need = sync ? state_view_need(&tr->shard.table, trainer_owns_chunk, &tr->shard) : 0;
    const int made = state_view_create(&view.weights, &tr->shard.table, need) == ISTH_OK;
    if (!coll_all_ok(t->learner_comm, made)) {
        state_view_destroy(&view.weights);
        return ISTH_ERUNTIME;
    }
    state_view_begin(&view.weights, tr->be, STATE_PARAMS, NULL, trainer_owns_chunk, &tr->shard, 0);
    int frc = model_fingerprint(&tr->shard.table, replica_view, &view, t->learner_comm, &fp, &fpx);
    const int vrc = state_view_end(&view.weights, 0);
    state_view_destroy(&view.weights);
    CHECK(frc);
    if (!coll_all_ok(t->learner_comm, vrc == ISTH_OK)) return vrc != ISTH_OK ? vrc : ISTH_ERUNTIME;
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
    if (rc == ISTH_OK) rc = trainer_control(tr, &fpx, sizeof fpx, all, "replica check");
    int ref = 0; /* the first site still present */
    while (ref < t->n_sites - 1 && link_is_lost(&tr->link, ref)) ref++;
    all[0] = all[ref];
    for (int s = 0; rc == ISTH_OK && s < t->n_sites; s++)
        if (!link_is_lost(&tr->link, s) && all[s] != all[0]) {
            rc = site_rank == 0 && t->site == 0
                     ? isth_fail(ISTH_ERUNTIME, "step %ld: replicas diverged: site %s fingerprint %016llx, site %s %016llx",
                                 tr->step, t->sites[s].name, (unsigned long long)all[s], t->sites[0].name,
                                 (unsigned long long)all[0])
                     : ISTH_ERUNTIME;
        }
    isth_free(all);
    CHECK(rc);
    if (tr->log && !t->experts_split)
        printf("replicas identical at step %ld: %d learner(s), fingerprint %016llx\n", tr->step,
               tr->topo.n_learners, (unsigned long long)fp);
    else if (tr->log)
        printf("replicas identical at step %ld: %d learner(s); the site's fingerprint %016llx, the dense part's "
               "(every site) %016llx\n", tr->step, tr->topo.n_learners, (unsigned long long)fp,
               (unsigned long long)fpx);
    return ISTH_OK;
}

/* The sites this one trains with, itself included: bit s for site s. */
static uint64_t live_mask(const Trainer *tr)
{
    uint64_t m = 0;
    for (int s = 0; s < tr->topo.n_sites; s++)
        if (s == tr->topo.site || !link_is_lost(&tr->link, s)) m |= (uint64_t)1 << s;
    return m;
}

/* Which of two sides of a split goes on: the one with more sites, and of
 * two as large the one holding the lower-numbered site. Both sides compute
 * it alike from the two sets (each notice carries its sender's). Sets that
 * share a site are no split: a notice sent before its sender lost that
 * site too (a newer one follows), or a link cut between two sites that
 * both still reach a third; nobody stops on it. */
static int other_side_goes_on(uint64_t mine, uint64_t theirs)
{
    if (mine & theirs) return 0;
    const int a = __builtin_popcountll(mine), b = __builtin_popcountll(theirs);
    if (a != b) return b > a;
    return __builtin_ctzll(theirs) < __builtin_ctzll(mine);
}

/* After a loss, every step: has a lost site told us that it dropped us?
 * Two sides that lost each other (a cut link, a stall on either side) both
 * send that notice, with the sites each trains on; the larger side goes on
 * (of two as large, the one with the lower-numbered site) and the other
 * stops, so one run never splits into two. A site dropped this way stops
 * with one line; started again it rejoins the live run. */
static int check_dropped(Trainer *tr)
{
    const Topology *t = &tr->topo;
    int site_rank, dropped_by = -1;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    if (site_rank == 0) {
        const uint64_t mine = live_mask(tr);
        for (int s = 0; s < t->n_sites; s++) {
            if (!link_is_lost(&tr->link, s)) continue;
            uint64_t theirs = 0, newer; /* the newest of its notices */
            while ((newer = link_was_dropped(&tr->link, tr->site_leaders[s])) != 0) theirs = newer;
            if (theirs && dropped_by < 0 && other_side_goes_on(mine, theirs)) dropped_by = s;
        }
    }
    CHECK_MPI(MPI_Bcast(&dropped_by, 1, MPI_INT, 0, t->site_comm));
    if (dropped_by >= 0)
        return isth_fail(ISTH_EDROPPED, "site %s was dropped from the run by site %s by step %ld (one of them missed "
                         "the other's deadline; the side with more sites, or the lower-numbered site, goes on); exit 3: "
                         "start it again (--resume auto) and it rejoins the live run",
                         t->sites[t->site].name, t->sites[dropped_by].name, tr->step);
    return ISTH_OK;
}

/* The step at which each site was last lost (the host counts the tokens
 * it did not train when it rejoins). */
static long lost_at_step[CONFIG_MAX_SITES];
/* How often each site was lost (missed a deadline) in this run: the step
 * line shows it (the count outlives a rejoin's new trainer). */
static int lost_count[CONFIG_MAX_SITES];

/* Sites the link found lost during this step: they are told, and one line
 * and one metrics record each come from every site's logging rank. */
static int report_lost_sites(Trainer *tr)
{
    const Topology *t = &tr->topo;
    unsigned char gone[LINK_MAX_SITES];
    if (!link_take_lost(&tr->link, gone, t->n_sites)) return ISTH_OK;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    /* every site out hears of each loss, with the sites this one trains on
     * now (a side that shrank says so to those it dropped before) */
    if (site_rank == 0)
        for (int s = 0; s < t->n_sites; s++)
            if (s != t->site && link_is_lost(&tr->link, s))
                link_notify_dropped(&tr->link, tr->site_leaders[s], t->site, live_mask(tr));
    spread_stop(&tr->outer.spread); /* it samples every learner, or none */
    if (!tr->log) return ISTH_OK;
    int left = 0;
    for (int s = 0; s < t->n_sites; s++) left += !link_is_lost(&tr->link, s);
    for (int s = 0; s < t->n_sites; s++)
        if (gone[s]) lost_at_step[s] = tr->step, lost_count[s]++;
    for (int s = 0; s < t->n_sites; s++) {
        if (!gone[s]) continue;
        double after_s;
        const char *what = link_lost_what(&tr->link, s, &after_s);
        if (link_has_left(&tr->link, s))
            printf("site %s left at step %ld: its job stopped on a signal (all sites checkpointed this step); "
                   "training on with %d site(s); started again, it rejoins\n", t->sites[s].name, tr->step, left);
        else
            printf("site %s lost at step %ld: nothing from it in the %s within %.1f s; training on with %d site(s)\n",
                   t->sites[s].name, tr->step, what, after_s, left);
        fflush(stdout);
        CHECK(metrics_site_lost(&tr->metrics, t->sites[s].name, tr->step, what, after_s, left));
    }
    fflush(stdout);
    return metrics_flush(&tr->metrics);
}

/* Inter-site bytes of the steps this process ran (after first_step: the
 * link counters are not checkpointed, so a resumed run reports its own
 * part, and says from which step), and what `sync` would have moved in them.
 * Each site counts from its own first step (a site that rejoined a federated
 * run counts from its rejoin), so sync's bytes are summed site by site; a
 * site lost for good reports neither (what the others exchanged with it
 * stays in theirs). */
static int traffic_summary(Trainer *tr, long first_step)
{
    const Topology *t = &tr->topo;
    const int S = t->n_sites;
    enum { BYTES, AUTH, ASSEMBLY, REFRESH, PEERS, FROM, N_FIELDS };
    const LinkCounters lc = link_counters(&tr->link);
    /* split experts: the whole model's assembly ran before (trainer_assemble)
     * and the copies' refreshes during training, each counted apart */
    double v[N_FIELDS] = {lc.bytes_sent + lc.bytes_recv + tr->outer.spread.inter_site_bytes - tr->whole.bytes -
                              tr->copies.bytes,
                          lc.auth_failures, tr->whole.bytes, tr->copies.bytes, (double)tr->shard.max_peer_learners, 0.0};
    CHECK(coll_allreduce_comm(t->site_comm, &v[BYTES], 4, MPI_DOUBLE, sizeof(double), MPI_SUM));
    CHECK(coll_allreduce_comm(t->site_comm, &v[PEERS], 1, MPI_DOUBLE, sizeof(double), MPI_MAX));
    v[FROM] = (double)first_step + 1.0; /* 0: a lost site's empty slot */
    double *all = isth_malloc(sizeof v * (size_t)S);
    CHECK_ALLOC(all);
    const int rc = trainer_control(tr, v, sizeof v, all, "traffic summary");
    /* sync: every step each site sends its summed gradient (float32, all
     * canonical parameters) to every other site and receives theirs */
    const double per_site_step = 2.0 * (S - 1) * 4.0 * (double)shard_canonical_params(&tr->shard);
    double bytes = 0.0, sync_bytes = 0.0, auth = 0.0, assembly = 0.0, refresh = 0.0;
    int peers = 0, same_start = 1;
    for (int s = 0; s < S; s++) {
        const double *site = &all[(size_t)s * N_FIELDS];
        if (site[FROM] == 0.0) continue;
        const long from = (long)site[FROM] - 1;
        bytes += site[BYTES];
        auth += site[AUTH];
        assembly += site[ASSEMBLY];
        refresh += site[REFRESH];
        sync_bytes += (double)(tr->step - from) * per_site_step;
        if (site[PEERS] > peers) peers = (int)site[PEERS];
        if (from != first_step) same_start = 0;
    }
    isth_free(all);
    CHECK(rc);
    if (S < 2 || !tr->log) return ISTH_OK;
    const long steps = tr->step - first_step;
    printf("inter-site traffic: %.0f bytes in %ld steps after step %ld%s (sent + received, all ranks); sync would move "
           "%.0f: %.1fx less; an exchange waited on at most %d other learner(s)\n", bytes, steps, first_step,
           same_start ? "" : " (here; other sites from their own first step)", sync_bytes,
           bytes > 0 ? sync_bytes / bytes : 0.0, peers);
    if (t->experts_split)
        printf("assembly bytes: %.0f through the link for the whole model (the other sites' experts to site %s's "
               "first learner, which writes it; sent + received, all ranks; not in the traffic above)%s\n", assembly,
               t->sites[trainer_lead_site(tr)].name, tr->whole.whole ? "" : "; not assembled: a site was lost");
    if (tr->copies.on)
        printf("refresh bytes: %.0f through the link for the experts' copies (%d refresh(es) every %ld steps after "
               "step %ld, codec %s; sent + received, all ranks; not in the traffic above)\n", refresh,
               tr->copies.refreshes - tr->copies.refreshes_loaded, tr->copies.every, first_step,
               codec_name(tr->copies.codec));
    if (auth > 0)
        printf("link: %.0f frame(s) rejected: failed authentication, or not the frame expected (each logged where it "
               "arrived)\n", auth);
    fflush(stdout);
    return metrics_summary_traffic(&tr->metrics, steps, first_step, bytes, sync_bytes,
                                   bytes > 0 ? sync_bytes / bytes : 0.0, same_start, peers, auth,
                                   t->experts_split ? assembly : -1.0, tr->copies.on ? refresh : -1.0);
}

/* This site's compute utilisation over the training this process ran (the
 * steps after first_step): the time its first rank spent in the inner steps'
 * own work against the training's wall time (evaluations and checkpoints
 * taken out). What the link costs shows as the rest: waits for it, and outer
 * steps. */
static int utilisation_summary(Trainer *tr, long first_step, double wall_s, double compute_s, double wait_s,
                               double paused_s, double final_s)
{
    if (!tr->log || wall_s <= 0) return ISTH_OK;
    /* the final outer step is once per run: a longer run spreads it thinner */
    const double steady = wall_s > final_s ? compute_s / (wall_s - final_s) : 0.0;
    printf("compute utilisation: %.1f%% over steps %ld-%ld (inner steps %.1f s of %.1f s of training; link wait %.1f s; "
           "evaluations and checkpoints, %.1f s, not counted); %.1f%% before the final outer step (%.1f s)\n",
           100.0 * compute_s / wall_s, first_step + 1, tr->step, compute_s, wall_s, wait_s, paused_s, 100.0 * steady, final_s);
    fflush(stdout);
    return metrics_summary_compute(&tr->metrics, tr->step - first_step, first_step, wall_s, compute_s,
                                   compute_s / wall_s, wait_s, paused_s, final_s, steady);
}

/* The other sites' summaries the exchanges brought since the last step
 * (progress.h): one line and one `site_step` record each. */
static int report_sites(Trainer *tr)
{
    SiteProgress p;
    int s;
    while ((s = progress_news(&tr->progress, &p)) >= 0)
        CHECK(metrics_site_step(&tr->metrics, tr->topo.sites[s].name, p.step, tr->cfg.train.steps, p.steps, p.loss,
                                p.tokens_per_s, p.ms_per_step, tr->step));
    return ISTH_OK;
}

/* Which sites are out of the run (lost or left); returns how many. */
static int sites_out(const Trainer *tr, unsigned char *out)
{
    int n = 0;
    for (int s = 0; s < tr->topo.n_sites; s++) n += out[s] = (unsigned char)link_is_lost(&tr->link, s);
    return n;
}

/* A site was found lost (or left): it is reported, and the host (a lost
 * host's place taken by the first live site) publishes its port under the
 * run's name again, so that the lost one, started again, finds it. */
static int after_loss(Trainer *tr, Federation *fed, const Config *cfg)
{
    CHECK(report_lost_sites(tr));
    CHECK(check_dropped(tr)); /* a site the other dropped stops here, before it hosts */
    if (!fed->federated) return ISTH_OK;
    unsigned char out[CONFIG_MAX_SITES];
    sites_out(tr, out);
    return federation_host(fed, cfg, out);
}

/* Open this start's metrics.jsonl (the log's rank): the start record, with
 * the checkpoint step it resumed from (< 0: none), then the run's shape,
 * what tools that read the file alone label it with (isthmus plot). */
static int open_log(Trainer *tr, const Config *cfg, long resumed_from)
{
    if (!tr->log) return ISTH_OK;
    const Topology *t = &tr->topo;
    char run_id[CONFIG_PATH_MAX];
    federation_run_id(cfg, run_id, sizeof run_id);
    const MetricsStart st = {"train", cfg->source, (unsigned long long)federation_fingerprint(cfg), run_id,
                             t->sites[t->site].name, t->world_size, resumed_from};
    CHECK(metrics_open(&tr->metrics, tr->metrics_dir, &st));
    return metrics_run(&tr->metrics, t->sites[t->site].name, cfg->outer.mode, cfg->outer.codec, t->n_sites,
                       t->n_learners, cfg->train.steps);
}

/* Create the trainer and check its outputs: world collectives, the same
 * on every site in the same order (a rejoin repeats them on both sides). */
static int trainer_start(Trainer *tr, const Config *cfg, MPI_Comm world, const unsigned char *link_master,
                         int federated, int banner)
{
    /* world-wide collectives (communicator splits): a site that fails in
     * them must not leave the others waiting without a deadline; past it,
     * exit 3 (as a broken join: federation.h) starts the site again */
    if (federated)
        fault_watchdog_arm_exit(federation_setup_s(cfg), "setting up the federated run", FAULT_HINT_NET,
                                ISTH_EDROPPED);
    int rc = trainer_create(tr, cfg, 1, world, link_master);
    if (federated) fault_watchdog_disarm();
    if (rc == ISTH_OK && tr->log && banner) {
        printf("isthmus train: resolved configuration (%s)\n%s\n", cfg->source, tr->config_text);
        topology_print(&tr->topo, cfg);
        printf("model: %.3fM parameters, %.3fM active matrix parameters per token; %d threads per rank\n",
               model_total_params(&cfg->model) / 1e6, model_active_matrix_params(&cfg->model) / 1e6,
               tr->be ? tr->be->threads : 0);
        const Dataset *d = &tr->train;
        printf("data: %d file(s) of %s, %.0f tokens (%s%s)%s\n", d->n_files,
               corpus_kind(d->width),
               (double)dataset_tokens(d), d->files[0].path, d->n_files > 1 ? ", ..." : "",
               tr->n_evals ? "" : "; no evaluation: the bundled eval files are bytes (name token sets in [eval.*])");
        fflush(stdout);
    }
    if (rc == ISTH_OK) rc = ckpt_check_outputs(tr);
    return rc;
}

/* Every live site, at the same step, when the one site out knocks (the
 * host saw the knock): everything in flight completes and the state goes
 * to a checkpoint of this step; if the handshake succeeds, every live
 * site and the joiner build a new world, each live site's trainer is made
 * again over it (its state from its own checkpoint, bit for bit) and the
 * joiner's learners take copies of the host's. *stop: the site's pending
 * stop vote said stop. */
static int take_back(Trainer *tr, Federation *fed, const Config *cfg, uint64_t take, const unsigned char *out,
                     StopVote *vote, int *stop)
{
    if (vote->pending) { /* the site communicator goes with the trainer */
        CHECK_MPI(MPI_Wait(&vote->req, MPI_STATUS_IGNORE));
        vote->pending = 0;
        if (vote->recv > *stop) *stop = vote->recv;
    }
    if (tr->mode != MODE_SYNC) CHECK(outer_drain(&tr->outer));
    CHECK(ckpt_write(tr));
    const double t0 = now_s();
    const long step = tr->step;
    double tokens[CONFIG_MAX_SITES] = {0};
    unsigned char to[CONFIG_MAX_SITES] = {0};
    for (int s = 0; s < cfg->n_sites; s++)
        if ((to[s] = take >> s & 1))
            tokens[s] = (double)(step - lost_at_step[s]) * tr->topo.sites[s].tokens_per_step * tr->topo.sites[s].learners;
    int joined = 0;
    MPI_Comm old = MPI_COMM_NULL;
    CHECK(federation_rejoin(fed, cfg, out, take, step, &joined, &old));
    if (!joined) return ISTH_OK; /* it gave up or was refused: train on without it */
    /* the run's traffic so far stays counted (the summary is of the whole run) */
    const LinkCounters counted = link_counters(&tr->link);
    const double probes = tr->outer.spread.inter_site_bytes;
    /* and so do the compute utilisation's parts (the link's wait among them) */
    const double compute = tr->compute_s, total = tr->inter_site_total;
    const long pin = tr->ckpt_every_site;
    const double copies_bytes = tr->copies.bytes, copies_s = tr->copies.seconds; /* refreshes' traffic, too */
    const int copies_loaded = tr->copies.refreshes_loaded;
    const StopBallot ballot = tr->ballot; /* a stop agreed with the take goes on after it */
    Progress progress = tr->progress; /* the recent steps and what the log wrote of the others go on too */
    tr->progress.loss = tr->progress.seconds = NULL;
    trainer_destroy(tr);
    federation_free_world(&old);
    const int started = trainer_start(tr, cfg, fed->world, fed->link_master, 1, 0);
    if (started != ISTH_OK) progress_destroy(&progress);
    CHECK(started);
    tr->ballot = ballot;
    progress_destroy(&tr->progress);
    tr->progress = progress;
    link_counters_add(&tr->link, counted);
    tr->outer.spread.inter_site_bytes += probes;
    tr->compute_s += compute;
    tr->inter_site_total += total;
    char path[CONFIG_FILE_PATH_MAX + 64];
    CHECK(ckpt_share(tr, fed->host_site, to, step, path, sizeof path));
    int damaged = 0;
    CHECK(ckpt_load(tr, path, 0, &damaged));
    tr->ckpt_every_site = pin; /* the joiner keeps no file of this step: the pin stays the step all have */
    tr->copies.bytes = copies_bytes;
    tr->copies.seconds = copies_s;
    tr->copies.refreshes_loaded = copies_loaded;
    CHECK(open_log(tr, cfg, step)); /* the trainer was made again: its log opens again */
    static double tokens_lost_total;
    for (int site = 0; site < cfg->n_sites; site++) {
        if (!to[site]) continue;
        tokens_lost_total += tokens[site];
        if (!tr->log) continue;
        printf("site %s rejoined at step %ld (lost at step %ld): %.0f of its tokens not trained (%.0f in all), "
               "%.1f s from its knock to training\n", cfg->sites[site].name, step, lost_at_step[site], tokens[site],
               tokens_lost_total, now_s() - t0);
        fflush(stdout);
        CHECK(metrics_site_rejoined(&tr->metrics, cfg->sites[site].name, step, lost_at_step[site], tokens[site],
                                    tokens_lost_total, now_s() - t0));
    }
    return ISTH_OK;
}

/* Butterfly's verdicts are pairwise: no exchange reaches every live site
 * at one step. With three sites or more the live sites therefore meet in
 * a control exchange at the end of every round (every H steps, whether a
 * site is out or not: the same steps on every site, whatever each has
 * seen), where the host's ask to take a site back, and each site's view
 * of who is out, reach every live site. One small round trip per round. */
static int butterfly_meets(const Trainer *tr, const Config *cfg)
{
    return tr->mode == MODE_BUTTERFLY && cfg->n_sites > 2 && link_survives(&tr->link) &&
           tr->step % cfg->outer.inner_steps == 0;
}

static int butterfly_meeting(Trainer *tr, const Config *cfg, unsigned char *out, int *site, int *now)
{
    StopBallot *b = &tr->ballot;
    const int S = cfg->n_sites;
    unsigned char mine[2 + CONFIG_MAX_SITES] = {0}, *all = isth_calloc((size_t)S, sizeof mine);
    CHECK_ALLOC(all);
    mine[0] = (unsigned char)b->take; /* the host's ask (site + 1), 0 elsewhere */
    mine[1] = b->agreed || b->round >= 0; /* a stop on its way: the joiner would miss it */
    for (int s = 0; s < S; s++) mine[2 + s] = (unsigned char)link_is_lost(&tr->link, s);
    /* a site whose partner just died reaches the meeting up to one deadline
     * late (its pair wait): two, as a site verdict's wait (reduce.c) */
    const double deadline = link_set_timeout(&tr->link, 2 * link_timeout(&tr->link));
    const int rc = trainer_control(tr, mine, sizeof mine, all, "butterfly's meeting of the live sites");
    link_set_timeout(&tr->link, deadline);
    int ask = 0, stopping = 0, n_out = 0;
    memset(out, 0, CONFIG_MAX_SITES); /* the caller's: CONFIG_MAX_SITES bytes */
    for (int k = 0; rc == ISTH_OK && k < S; k++) { /* a lost site's slot is zero */
        const unsigned char *v = all + (size_t)k * sizeof mine;
        if (v[0]) ask = v[0];
        stopping |= v[1];
        for (int s = 0; s < S; s++) out[s] |= v[2 + s];
    }
    isth_free(all);
    CHECK(rc);
    for (int s = 0; s < S; s++) n_out += out[s] != 0;
    b->take = 0;
    *site = ask - 1;
    *now = ask && !stopping && n_out == 1 && out[ask - 1]; /* the same on every live site */
    return ISTH_OK;
}

/* Experts split: the host's checkpoint holds none of a joiner's experts
 * but its copies of them, and the joiner's copies come from the host's
 * mirrors; a site out is taken back live only when the host holds a copy
 * of its experts it was live through a refresh for, and every site whose
 * experts it holds copies of is the host. Otherwise (expert_replicas = 1,
 * no refresh yet, three sites' other holders) it comes back at the run's
 * next restart, every site from the newest step all of them hold
 * (ckpt_files.c): its knock goes unanswered until its join_timeout ends
 * it. Every site judges alike: the host's index, counters every site keeps. */
static int split_takeable(const Trainer *tr, const Federation *fed, const unsigned char *out)
{
    const Topology *t = &tr->topo;
    const ExpertCopies *x = &tr->copies;
    for (int s = 0; t->experts_split && s < t->n_sites; s++) {
        if (!out[s]) continue;
        if (!x->on || fed->host_site < 0 || !copies_holds(t, x->replicas, fed->host_site, s) || x->live_refreshes[s] <= 0)
            return 0;
        for (int u = 0; u < t->n_sites; u++)
            if (u != s && u != fed->host_site && copies_holds(t, x->replicas, s, u)) return 0;
    }
    return 1;
}

/* After each step, while sites are out: the host answers their knocks
 * ("busy") and takes one back — at once when it trains alone, else at the
 * step every live site learns of it, from the verdicts of the exchange
 * that carried the host's ask (ballot.take), on the set of sites out they
 * agreed on there (butterfly: at the live sites' next meeting). With two
 * or more sites out, a host left alone takes them back together once
 * every one of them knocks (a live site's wait for a dead one can make a
 * third site find it lost too: one fault, two sites out); with other live
 * sites beside it none rejoins live (the new world would lack one): they
 * rejoin at the next restart. */
static int knocks(Trainer *tr, Federation *fed, const Config *cfg, StopVote *vote, double *paused_s)
{
    StopBallot *b = &tr->ballot;
    unsigned char out[CONFIG_MAX_SITES];
    int n_out = sites_out(tr, out), site = -1, now = 0;
    if (!split_takeable(tr, fed, out)) return ISTH_OK; /* its knock unanswered: it gives up at its join_timeout */
    uint64_t take = 0; /* an alone host's: every site out (bit s) */
    if (b->take_agreed) { /* every live site, at the same step, on the set of sites out they agreed on */
        site = b->take_agreed - 1;
        memcpy(out, b->take_out, sizeof out);
        n_out = 0;
        for (int s = 0; s < cfg->n_sites; s++) n_out += out[s] != 0;
        now = n_out == 1 && out[site] && !b->agreed; /* a stop agreed with it goes first (the joiner would miss it) */
        b->take_agreed = b->take = 0;
    } else if (fed->hosting && fed->host_site == fed->site && !b->take) {
        /* every site out has its knock answered ("busy") at once, also one
         * that cannot come back live now: a restarted first site that found
         * the run's name must learn that the run is live, not host it */
        const int alone = n_out == cfg->n_sites - 1;
        uint64_t knocking = 0, all_out = 0;
        for (int s = 0; s < cfg->n_sites; s++) {
            if (!out[s]) continue;
            all_out |= 1ull << s;
            if (federation_knocking(fed, s)) knocking |= 1ull << s, site = s;
        }
        if (n_out == 1 && knocking) {
            if (alone) now = 1;       /* at once */
            else b->take = site + 1;  /* rides the next verdicts (butterfly: the next meeting) */
        } else if (n_out > 1 && alone && knocking == all_out) {
            now = 1; /* every site out knocks: all of them at once */
            take = all_out;
        } /* else at the run's next restart, or once every site out knocks */
    }
    if (!now && butterfly_meets(tr, cfg)) CHECK(butterfly_meeting(tr, cfg, out, &site, &now));
    /* a site found lost in the exchange that agreed the take (its verdict,
     * its slot at the meeting, never came) is not in the agreed set: no take */
    for (int s = 0; s < cfg->n_sites && now; s++)
        if (link_is_lost(&tr->link, s) && !out[s]) now = 0;
    if (!now) return ISTH_OK;
    /* the host as the agreed set says (a site that saw the old host lost
     * only there learns who hosts now) */
    CHECK(federation_host(fed, cfg, out));
    int stop = 0;
    const double t_back = now_s(); /* the knock and the handover are no training */
    CHECK(take_back(tr, fed, cfg, take ? take : 1ull << site, out, vote, &stop));
    *paused_s += now_s() - t_back;
    if (stop > tr->ballot.request) tr->ballot.request = stop;
    return ISTH_OK;
}

/* The joiner of a live run: the host's checkpoint of the step it names
 * becomes this site's state (the file goes once loaded: this site's own
 * checkpoints follow). */
static int rejoin_live(Trainer *tr, int host, uint64_t joiners, long step, double started)
{
    char path[CONFIG_FILE_PATH_MAX + 64];
    unsigned char to[CONFIG_MAX_SITES] = {0};
    for (int s = 0; s < tr->topo.n_sites; s++) to[s] = joiners >> s & 1;
    CHECK(ckpt_share(tr, host, to, step, path, sizeof path));
    CHECK(ckpt_load_copy(tr, path, host));
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(tr->topo.site_comm, &site_rank));
    if (site_rank == 0) unlink(path);
    if (tr->log) {
        printf("rejoined the live run at step %ld, %.1f s after start\n", step, now_s() - started);
        fflush(stdout);
    }
    return ISTH_OK;
}

/* --resume: the sites agree on what each loads (ckpt_find); a site behind
 * the one ahead receives its file through the link and loads it as a copy,
 * as in a live rejoin. A step whose values a load finds damaged is passed
 * over (auto) and the sites agree again; the chosen file is read once
 * (find checks structure and attributes, the load every value).
 * *complete: the run had ended and written its model (nothing to do);
 * *loaded: the step loaded (< 0 none). */
static int resume_run(Trainer *tr, const char *resume, int *complete, long *loaded)
{
    long skip[CKPT_MAX_SKIP];
    int n_skip = 0, damaged = 0, rc, site_rank;
    const int fallback = !strcmp(resume, "auto");
    CHECK_MPI(MPI_Comm_rank(tr->topo.site_comm, &site_rank));
    static CkptPlan plan; /* large (a path, a flag per site) */
    do {
        damaged = 0;
        rc = ckpt_find(tr, resume, &plan, skip, n_skip);
        if (rc != ISTH_OK || plan.complete) break;
        char path[CONFIG_FILE_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s", plan.path);
        const int fetch = plan.any_fetch && plan.fetch[tr->topo.site];
        if (plan.any_fetch) rc = ckpt_share_to(tr, plan.source, plan.step, plan.fetch, path, sizeof path);
        if (rc == ISTH_OK && plan.step >= 0) rc = ckpt_load_from(tr, path, fetch ? plan.source : -1, fallback, &damaged);
        if (fetch && site_rank == 0) unlink(path); /* a copy: this site's own checkpoint of the step follows */
        if (rc != ISTH_OK && fallback && damaged) skip[n_skip++] = plan.step;
    } while (rc != ISTH_OK && fallback && damaged && n_skip < CKPT_MAX_SKIP);
    *complete = rc == ISTH_OK && plan.complete;
    if (*complete) return ISTH_OK;
    /* a failed attempt may have loaded part of a file: no fresh start from that */
    if (n_skip && ((rc == ISTH_OK && plan.step < 0) || (rc != ISTH_OK && damaged)))
        return isth_fail(ISTH_EINPUT, "resume: %d checkpoint step(s) with damaged values passed over and no valid "
                         "one left; remove them (isthmus inspect names them) or start without --resume", n_skip);
    CHECK(rc);
    if (plan.step < 0) {
        if (tr->log) printf("resume: no valid checkpoint found; starting from step 0\n");
        return ISTH_OK;
    }
    *loaded = tr->step;
    /* after a fetch every site writes the step at once, so that each holds
     * a file of the step the sites share from now on */
    if (plan.any_fetch) CHECK(ckpt_write(tr));
    return ckpt_set_aside_newer(tr);
}

int train_run(const Config *cfg, const char *resume, const char *site)
{
    const double started = now_s();
    /* the federated launch joins the sites first: the world spans them */
    static Federation fed; /* static: the world outlives a failed run's frame (fault_end_job) */
    federation_joint(&fed);
    /* federated: a stop signal from here on is a request, also while the
     * sites wait for each other (a job's time limit: exit 0, and the job
     * requeues); every launch installs the handlers below in any case */
    if (site) stop_handlers();
    char marker[CONFIG_FILE_PATH_MAX + 80]; /* a pause marker of an earlier start is stale */
    stop_marker_path(cfg, site, marker, sizeof marker);
    int world_rank;
    CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    if (world_rank == 0) unlink(marker);
    if (site) CHECK(federation_join(&fed, cfg, site, stop_flag()));
    else if (cfg->n_sites > 1) CHECK(federation_joint_keys(&fed, cfg));
    if (fed.stopped) { /* the sites never met: nothing to train or report; a pause comes back */
        federation_destroy(&fed);
        return stop_ended() ? ISTH_OK : stop_mark_paused(cfg, site, 0, "stopped by the time-limit signal while the sites met");
    }
    Trainer tr;
    int rc = trainer_start(&tr, cfg, fed.world, fed.link_master, site != NULL, 1);
    int complete = 0;
    long resumed_from = -1; /* the checkpoint step this start loaded, for the log's start record */
    if (rc == ISTH_OK && fed.rejoin_step >= 0) {
        rc = rejoin_live(&tr, fed.host_site, fed.rejoiners, fed.rejoin_step, started);
        resumed_from = fed.rejoin_step;
    } else if (rc == ISTH_OK && resume) {
        rc = resume_run(&tr, resume, &complete, &resumed_from);
    }
    if (rc == ISTH_OK && complete) { /* every site said so (ckpt_find): nothing to train or write */
        trainer_destroy(&tr);
        federation_destroy(&fed);
        return ISTH_OK;
    }
    if (rc == ISTH_OK) rc = open_log(&tr, cfg, resumed_from);
    const TrainConfig *tc = &cfg->train;
    /* test hook: behave as if signalled at step N: "N" a pause (USR1), "N:end" an end (TERM) */
    const char *hook = getenv("ISTHMUS_STOP_AT_STEP");
    const long stop_at = hook ? atol(hook) : -1;
    const int stop_at_intent = hook && strstr(hook, ":end") ? STOP_END : STOP_PAUSE;
    stop_handlers();
    /* static: an all-reduce still posted when an error ends the job must
     * not write into a stack frame that is gone */
    static StopVote vote;
    memset(&vote, 0, sizeof vote);
    int stopping = 0, ckpt_due = 0, site_intent = STOP_NONE;
    fault_set_step(tr.step);
    if (rc == ISTH_OK && tc->eval_every > 0 && tr.step == 0) rc = trainer_eval(&tr);
    /* the training's wall time, less the evaluations and checkpoints in it
     * (paused_s): what compute utilisation is measured against */
    const double loop_start = now_s(), compute_start = tr.compute_s, wait_start = link_counters(&tr.link).wait_s;
    const long first_step = tr.step; /* the summaries cover the steps from here */
    double paused_s = 0.0;
    while (rc == ISTH_OK && tr.step < tc->steps) {
        StepLog s;
        rc = trainer_step(&tr, &s);
        if (rc != ISTH_OK) break;
        if (link_lost_news(&tr.link)) rc = after_loss(&tr, &fed, cfg); /* checks for a drop notice too */
        else if (link_survives(&tr.link) && link_any_lost(&tr.link, tr.topo.n_sites)) rc = check_dropped(&tr);
        /* split experts: the copies brought up to date, before a take-back's
         * checkpoint of this step (which then holds them) */
        if (rc == ISTH_OK) rc = copies_after_step(&tr.copies, &tr.link, &tr.topo, &tr.shard.table, tr.be, tr.step,
                                                  tc->steps, tr.log);
        /* the host takes a lost site back when it knocks */
        if (rc == ISTH_OK && fed.federated && link_survives(&tr.link) && tr.step < tc->steps)
            rc = knocks(&tr, &fed, cfg, &vote, &paused_s);
        if (rc != ISTH_OK) break;
        for (int k = 0; k < cfg->n_sites; k++) s.misses[k] = lost_count[k], s.site_names[k] = cfg->sites[k].name;
        if (tr.log && (s.step % tc->log_every == 0 || s.step == tc->steps)) rc = metrics_step(&tr.metrics, &s);
        if (rc == ISTH_OK && tr.log) rc = report_sites(&tr);
        if (rc != ISTH_OK) break;
        /* butterfly learners agree only at the end */
        if (tc->check_replicas > 0 && tr.mode != MODE_BUTTERFLY &&
            (tr.step % tc->check_replicas == 0 || tr.step == tc->steps))
            rc = check_replicas(&tr);
        if (rc != ISTH_OK) break;
        int site_stop;
        const int local = stop_ended() ? STOP_END : *stop_flag() ? STOP_PAUSE : tr.step == stop_at ? stop_at_intent : STOP_NONE;
        rc = stop_vote(&vote, tr.topo.site_comm, local, &site_stop);
        if (rc != ISTH_OK) break;
        if (site_stop > site_intent) site_intent = site_stop;
        stopping |= stop_decided(&tr, site_stop) != 0;
        if (cfg->checkpoint.every > 0 && tr.step % cfg->checkpoint.every == 0) ckpt_due = 1;
        if ((ckpt_due || stopping) && tr.step < tc->steps) {
            /* exchanges in flight complete now; their results are applied at
             * their own step, after a restart too (saved in the checkpoint) */
            if (tr.mode != MODE_SYNC) rc = outer_drain(&tr.outer);
            if (rc == ISTH_OK && stopping && tr.mode != MODE_SYNC) rc = outer_drain_probes(&tr.outer, &tr.metrics);
            const double t_ckpt = now_s();
            if (rc == ISTH_OK) rc = ckpt_write(&tr);
            paused_s += now_s() - t_ckpt;
            ckpt_due = 0;
            if (rc != ISTH_OK) break;
            int alone = 0;
            if (stopping && stop_others_leave(&tr, &alone)) {
                stopping = 0;
                rc = after_loss(&tr, &fed, cfg);
                if (rc != ISTH_OK) break;
            } else if (stopping) {
                const int pause = stop_pauses(&tr, site_intent, alone);
                if (tr.log)
                    printf("stopping after step %ld on request (signal): %s; resume with --resume auto\n", tr.step,
                           !pause ? "an end (the job ends)"
                           : alone || tr.topo.n_sites == 1 ? "a pause (the job comes back)"
                                                           : "a pause of every site (every site's job comes back)");
                if (pause) rc = stop_mark_paused(cfg, site, tr.step, alone || tr.topo.n_sites == 1 ? "a pause" : "a pause of every site");
                break;
            }
        }
        if (tc->eval_every > 0 && tr.step % tc->eval_every == 0 && tr.step < tc->steps) {
            const double t_eval = now_s();
            rc = trainer_eval(&tr);
            paused_s += now_s() - t_eval;
        }
        if (rc == ISTH_OK && tc->sample_every > 0 && tr.step % tc->sample_every == 0 && tr.step < tc->steps) {
            const double t_sample = now_s();
            rc = trainer_sample(&tr);
            paused_s += now_s() - t_sample;
        }
    }
    /* on an error the job ends (fault_end_job); waiting here could hang */
    if (vote.pending && rc == ISTH_OK) rc = MPI_Wait(&vote.req, MPI_STATUS_IGNORE) == MPI_SUCCESS ? ISTH_OK : ISTH_ERUNTIME;
    const int finished = rc == ISTH_OK && tr.step >= tc->steps;
    const double t_final = now_s();
    if (finished && tr.mode != MODE_SYNC)
        rc = outer_finish(&tr.outer, tr.be, tr.step, &tr.metrics, tr.log);
    if (finished && rc == ISTH_OK && tr.log) rc = report_sites(&tr); /* what the final exchanges brought */
    if (finished && rc == ISTH_OK)
        rc = utilisation_summary(&tr, first_step, now_s() - loop_start - paused_s, tr.compute_s - compute_start,
                                 link_counters(&tr.link).wait_s - wait_start, paused_s, now_s() - t_final);
    if (finished && rc == ISTH_OK && tc->check_replicas > 0) rc = check_replicas(&tr);
    /* split experts: the other sites' experts to the model file's writer,
     * before the summary (which counts them apart) */
    if (finished && rc == ISTH_OK && tr.topo.experts_split) rc = trainer_assemble(&tr);
    if (finished && rc == ISTH_OK) rc = traffic_summary(&tr, first_step);
    if (finished && rc == ISTH_OK) rc = ckpt_write(&tr);
    /* the model file before the final evaluation and sample: a failure in
     * them must not cost the trained model (its line still comes last) */
    char path[CONFIG_FILE_PATH_MAX + 80];
    if (finished) trainer_model_path(&tr, path, sizeof path);
    int written = 0;
    const int wrote = finished && rc == ISTH_OK && (rc = trainer_write_model(&tr, path, &written)) == ISTH_OK;
    if (wrote) rc = trainer_eval(&tr);
    if (wrote && rc == ISTH_OK && tc->sample_every > 0) rc = trainer_sample(&tr);
    if (written && rc == ISTH_OK) rc = trainer_eval_whole(&tr, path); /* split experts: frees the training backend */
    if (written && tr.log && trainer_lead_site(&tr) == tr.topo.site) {
        printf("wrote %s (step %ld)%s%s\n", path, tr.step,
               tr.topo.experts_split ? ": the whole model, every site's experts" : "",
               rc == ISTH_OK ? "" : ", before the final evaluation failed");
        fflush(stdout);
    }
    /* the peaks of the whole run, file writes included: `isthmus config --memory` predicts them */
    if (rc == ISTH_OK && tr.rank == 0) memory_print_measured(0);
    const int closed = metrics_close(&tr.metrics);
    if (rc == ISTH_OK) rc = closed;
    /* a failed multi-rank run ends in MPI_Abort (fault_end_job): tearing
     * down first would only wait on requests a dead peer never completes */
    if (rc != ISTH_OK && tr.topo.world_size > 1) return rc;
    trainer_destroy(&tr);
    federation_destroy(&fed);
    return rc;
}
