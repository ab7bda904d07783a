/* ckpt.c — see ckpt.h. */
#include "ckpt.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ckpt_files.h"
#include "ckpt_lineage.h"
#include "ckpt_state.h"
#include "clock.h"
#include "coll.h"
#include "fault.h"
#include "h5io.h"
#include "expert_copies.h"
#include "status.h"

static int write_state_of(H5File *f, const Trainer *tr, CkptScratch *sc, const char *group, StateKind which,
                          int active)
{
    return ckpt_transfer_state(f, tr, sc, group, which, active, 0);
}

/* Is an outer exchange in flight (drained, waiting for its step)? */
static int exchanges_in_flight(const Trainer *tr)
{
    for (int p = 0; tr->mode != MODE_SYNC && p < tr->cfg.outer.fragments; p++)
        if (tr->outer.started[p] >= 0) return 1;
    return 0;
}

static int write_state(Trainer *tr, H5File *f, CkptScratch *sc)
{
    const Topology *t = &tr->topo;
    const SiteInfo *site = &t->sites[t->site];
    const int first = t->learner == site->first_learner;
    Backend *be = tr->be;
    char stamp[64];
    time_t now = time(NULL);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    CHECK(h5_attr_write_long(f, "/", "format_version", H5IO_FORMAT_VERSION));
    CHECK(h5_attr_write_string(f, "/", "config", tr->config_text));
    CHECK(h5_attr_write_long(f, "/", "step", tr->step));
    CHECK(h5_attr_write_long(f, "/", "outer_steps", tr->outer.outer_steps));
    CHECK(h5_attr_write_double(f, "/", "tokens", tr->tokens_seen));
    CHECK(h5_attr_write_long(f, "/", "data_width", tr->train.width));
    CHECK(h5_attr_write_string(f, "/", "written", stamp));
    CHECK(h5_attr_write_string(f, "/", "site", site->name));
    CHECK(h5_attr_write_string(f, "/", "mode", tr->cfg.outer.mode));
    CHECK(h5_attr_write_long(f, "/", "first_learner", site->first_learner));
    CHECK(h5_attr_write_long(f, "/", "learners", site->learners));
    CHECK(h5_attr_write_long(f, "/", "exchanges", (long long)tr->shard.exchanges));
    CHECK(h5_attr_write_long(f, "/", "adam_t", be->optimizer_t));
    CHECK(h5_attr_write_long(f, "/", "data_step", (long long)tr->cursor.step));
    /* which sites' training this state holds since when (a cold restart
     * tells a site ahead from sites that diverged), and the step every site
     * shares that the writer keeps while a site is out (a rejoined site
     * takes it over: ckpt_load_copy) */
    CHECK(h5_attr_write_string(f, "/", "lineage", ckpt_lineage_for_write(tr)));
    CHECK(h5_attr_write_long(f, "/", "every_site", tr->ckpt_every_site));

    const int P = tr->cfg.outer.fragments, in_flight = exchanges_in_flight(tr);
    if (tr->mode == MODE_SYNC) {
        CHECK(write_state_of(f, tr, sc, "/model", STATE_PARAMS, first));
        CHECK(write_state_of(f, tr, sc, "/inner/m", STATE_ADAM_M, first));
        CHECK(write_state_of(f, tr, sc, "/inner/v", STATE_ADAM_V, first));
        CHECK(ckpt_transfer_shampoo(f, tr, sc, "/inner", first, 0));
        /* sync with a lossy codec: error feedback of the gradient sums */
        if (shard_any_residual(&tr->shard)) CHECK(ckpt_write_residual(f, tr, "/outer/residual", first));
    } else {
        const int bf = tr->mode == MODE_BUTTERFLY; /* butterfly: outer state per learner */
        if (bf) CHECK(write_state_of(f, tr, sc, "/model", STATE_PARAMS, first));
        else CHECK(ckpt_write_outer(f, tr, "/model", OUTER_ANCHOR, first));
        if (!bf) {
            CHECK(ckpt_write_outer(f, tr, "/outer/momentum", OUTER_MOMENTUM, first));
            CHECK(ckpt_write_residual(f, tr, "/outer/residual", first));
            /* fragments in flight (drained): their reduced pseudo-gradients, equal on every learner */
            if (in_flight) CHECK(ckpt_write_outer(f, tr, "/outer/pending", OUTER_PENDING, first));
        }
        for (int k = 0; k < site->learners; k++) {
            const int id = site->first_learner + k, mine = t->learner == id;
            char g[64];
            if (bf) {
                snprintf(g, sizeof g, "/learner_%d/outer/anchor", id);
                CHECK(ckpt_write_outer(f, tr, g, OUTER_ANCHOR, mine));
                snprintf(g, sizeof g, "/learner_%d/outer/momentum", id);
                CHECK(ckpt_write_outer(f, tr, g, OUTER_MOMENTUM, mine));
                snprintf(g, sizeof g, "/learner_%d/outer/residual", id);
                CHECK(ckpt_write_residual(f, tr, g, mine));
                /* a round in flight (drained): the mixed values and what was sent */
                snprintf(g, sizeof g, "/learner_%d/outer/pending", id);
                if (in_flight) CHECK(ckpt_write_outer(f, tr, g, OUTER_PENDING, mine));
                snprintf(g, sizeof g, "/learner_%d/outer/sent", id);
                if (in_flight) CHECK(ckpt_write_outer(f, tr, g, OUTER_SENT, mine));
            }
            snprintf(g, sizeof g, "/learner_%d/model", id);
            CHECK(write_state_of(f, tr, sc, g, STATE_PARAMS, mine));
            snprintf(g, sizeof g, "/learner_%d/inner/m", id);
            CHECK(write_state_of(f, tr, sc, g, STATE_ADAM_M, mine));
            snprintf(g, sizeof g, "/learner_%d/inner/v", id);
            CHECK(write_state_of(f, tr, sc, g, STATE_ADAM_V, mine));
            snprintf(g, sizeof g, "/learner_%d/inner", id);
            CHECK(ckpt_transfer_shampoo(f, tr, sc, g, mine, 0));
        }
    }
    /* split experts' copies of other sites' experts and the mirrors of this
     * site's (their first learner's ranks hold them), and their counters */
    double copies_state[COPIES_STATE_VALUES(CONFIG_MAX_SITES)];
    if (tr->copies.on) {
        CopiesView cv = {&tr->copies, &tr->shard.table, 0};
        CHECK(h5_write_chunks(f, "/copies", &tr->model, copies_at, &cv));
        cv.mirror = 1;
        CHECK(h5_write_chunks(f, "/mirror", &tr->model, copies_at, &cv));
        copies_state_save(&tr->copies, t->n_sites, copies_state);
    }
    /* per fragment: last outer start, and the start of the exchange in flight (-1: none) */
    double *frag = sc->frag;
    for (int p = 0; p < P; p++) {
        frag[p] = tr->mode != MODE_SYNC ? (double)tr->outer.last_sync[p] : 0.0;
        frag[P + p] = tr->mode != MODE_SYNC ? (double)tr->outer.started[p] : -1.0;
    }
    hid_t g = H5Gcreate2(f->file, "/state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g >= 0) H5Gclose(g);
    int rc = h5_write_doubles(f, "/state/fragments", frag, P);
    if (rc == ISTH_OK) rc = h5_write_doubles(f, "/state/started", frag + P, P);
    if (rc == ISTH_OK && tr->copies.on)
        rc = h5_write_doubles(f, "/state/copies", copies_state, COPIES_STATE_VALUES(t->n_sites));
    return rc;
}

int ckpt_groups(OuterMode mode, int learners, int shampoo, int residual, int in_flight)
{
    const int inner = 2 + (shampoo ? CKPT_SHAMPOO_GROUPS : 0); /* m, v (+ shampoo's) */
    if (mode == MODE_SYNC) return 1 + inner + residual;     /* model, inner state (+ residual) */
    if (mode == MODE_BUTTERFLY) /* model; per learner anchor, momentum, residual, */
        return 1 + learners * (4 + inner + 2 * in_flight); /* pending, sent, model, inner state */
    return 3 + in_flight + (1 + inner) * learners;        /* anchor, momentum, residual, pending; per learner */
}

/* How many model-shaped groups write_state writes into this site's file. */
static int checkpoint_groups(const Trainer *tr)
{
    /* split experts' copies and mirrors: at most a model's experts each */
    return ckpt_groups(tr->mode, tr->topo.sites[tr->topo.site].learners, ckpt_uses_shampoo(tr),
                       shard_any_residual(&tr->shard), exchanges_in_flight(tr)) + (tr->copies.on ? 2 : 0);
}

static int write_checkpoint(Trainer *tr);

/* What a site's first rank tells the others when its file is complete. */
typedef struct {
    long step;
    double start_wall; /* seconds since the epoch when its write began */
    double bytes;      /* the file's size */
} CkptDone;

int ckpt_write(Trainer *tr)
{
    char what[64];
    snprintf(what, sizeof what, "checkpoint of step %ld", tr->step);
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, what, FAULT_HINT_IO);
    const long stall = fault_hook_for("ISTHMUS_CKPT_STALL", tr->topo.sites[tr->topo.site].name);
    if (stall > 0) sleep((unsigned)stall); /* test hook: a write that hangs */
    const int rc = write_checkpoint(tr);
    fault_watchdog_disarm();
    return rc;
}

static int write_checkpoint(Trainer *tr)
{
    const double t0 = now_s();
    const Topology *t = &tr->topo;
    char dir[CONFIG_FILE_PATH_MAX], path[CONFIG_FILE_PATH_MAX + 64];
    ckpt_site_dir(tr, dir, sizeof dir);
    /* the directory was probed before training: failing now is a runtime
     * failure (a full disk), reported by the site's first rank */
    int site_rank0 = 0;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank0));
    const int was = status_set_quiet(site_rank0 != 0);
    int rc = make_dirs(dir);
    status_set_quiet(was);
    if (!coll_all_ok(t->site_comm, rc == ISTH_OK)) return ISTH_ERUNTIME;
    ckpt_file_path(dir, tr->step, path, sizeof path);
    CkptScratch sc;
    CHECK(ckpt_scratch_alloc(tr, &sc));
    H5File f;
    rc = h5_create(&f, path, H5IO_FILE_BYTES(model_total_params(&tr->cfg.model), checkpoint_groups(tr)), t->site_comm);
    if (rc != ISTH_OK) {
        ckpt_scratch_free(&sc);
        return rc;
    }
    rc = write_state(tr, &f, &sc);
    ckpt_scratch_free(&sc);
    if (rc != ISTH_OK) {
        h5_abandon(&f);
        return rc;
    }
    CHECK(h5_commit(&f));
    /* every site's file is complete before anyone prunes or goes on: the
     * sites' first ranks confirm the step to each other through the link,
     * with when they began and how large their file is (for the log) */
    struct stat st;
    CkptDone mine = {tr->step, wall_s() - (now_s() - t0), stat(path, &st) == 0 ? (double)st.st_size : 0.0};
    CkptDone *all = isth_malloc(sizeof *all * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    rc = trainer_control(tr, &mine, sizeof mine, all, "checkpoint completion");
    double first_start = mine.start_wall, bytes_all = 0.0;
    for (int s = 0; rc == ISTH_OK && s < t->n_sites; s++) {
        if (link_is_lost(&tr->link, s)) continue; /* a lost site has no say */
        if (all[s].step != tr->step)
            rc = isth_fail(ISTH_ERUNTIME, "checkpoint: site %s completed step %ld, site %s step %ld",
                           t->sites[s].name, all[s].step, t->sites[t->site].name, tr->step);
        if (all[s].start_wall < first_start) first_start = all[s].start_wall;
        bytes_all += all[s].bytes;
    }
    isth_free(all);
    CHECK(rc);
    int all_in = 1;
    for (int s = 0; s < t->n_sites; s++) all_in &= !link_is_lost(&tr->link, s);
    if (all_in) tr->ckpt_every_site = tr->step;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    if (site_rank == 0) ckpt_prune(dir, tr->cfg.checkpoint.keep, all_in ? -1 : tr->ckpt_every_site);
    const double dt = now_s() - t0, dt_all = wall_s() - first_start;
    if (tr->log) {
        const double mb = mine.bytes / 1e6, mb_all = bytes_all / 1e6;
        printf("checkpoint: step %ld -> %s (%.1f MB) in %.2f s, %.0f MB/s", tr->step, path, mb, dt, mb / dt);
        /* several sites write at once: what the disks took together */
        if (t->n_sites > 1) printf("; every site's file: %.1f MB in %.2f s, %.0f MB/s", mb_all, dt_all, mb_all / dt_all);
        printf("\n");
        fflush(stdout);
        return metrics_checkpoint(&tr->metrics, path, tr->step, mb, dt, mb_all, dt_all);
    }
    return ISTH_OK;
}
