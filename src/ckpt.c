/* ckpt.c — see ckpt.h. */
#include "ckpt.h"
#include "alloc.h"
#include "ckpt_validate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "h5io.h"
#include "clock.h"
#include "coll.h"
#include "stateview.h"
#include "status.h"

#define CKPT_MAX_LIST 16

static void site_dir(const Trainer *tr, char *out, size_t cap)
{
    const Config *c = &tr->cfg;
    if (c->checkpoint.dir[0])
        snprintf(out, cap, "%s/%s", c->checkpoint.dir, tr->topo.sites[tr->topo.site].name);
    else
        snprintf(out, cap, "%s/checkpoints/%s", c->train.out_dir, tr->topo.sites[tr->topo.site].name);
}

static void ckpt_path(const char *dir, long step, char *out, size_t cap)
{
    snprintf(out, cap, "%s/ckpt-%08ld.h5", dir, step);
}

long ckpt_step_of(const char *path)
{
    const char *base = strrchr(path, '/');
    long step = -1;
    if (sscanf(base ? base + 1 : path, "ckpt-%ld.h5", &step) != 1) return -1;
    return step;
}

/* Steps of the complete checkpoint files in dir, newest first: at most cap
 * of them in steps[]; returns how many there are in all (-1: out of memory). */
static int list_steps(const char *dir, long *steps, int cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, room = 0;
    long *all = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        long step;
        char tail[8];
        if (sscanf(e->d_name, "ckpt-%ld.h%7s", &step, tail) != 2 || strcmp(tail, "5") || step < 0) continue;
        if (n == room) {
            room = room ? 2 * room : 64;
            long *grown = isth_realloc(all, sizeof(long) * (size_t)room);
            if (!grown) {
                isth_free(all);
                closedir(d);
                return -1;
            }
            all = grown;
        }
        all[n++] = step;
    }
    closedir(d);
    for (int i = 0; i < n; i++) /* sort descending */
        for (int j = i + 1; j < n; j++)
            if (all[j] > all[i]) {
                long t = all[i];
                all[i] = all[j];
                all[j] = t;
            }
    if (steps && cap > 0) memcpy(steps, all, sizeof(long) * (size_t)(n < cap ? n : cap));
    isth_free(all);
    return n;
}

/* Views of the training state for h5_write_chunks / h5_read_chunks. A
 * state is written by the ranks that own each chunk (every rank its share
 * of the dense chunks and its experts), by the learner(s) `active` says.
 * The backend's state (weights, moments) goes through host staging one
 * tensor at a time (stateview.h); the outer state and the residuals are
 * host buffers already. */
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
    if (!v->active) return NULL;
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

/* Scratch of a checkpoint write or load, allocated before the file is
 * opened and agreed over the site: a rank that lacks memory must not leave
 * the others inside an HDF5 collective. */
typedef struct {
    double *frag;   /* (2P) per-fragment last start and start in flight */
    StateView view; /* the backend's state, one tensor of owned chunks at a time */
} CkptScratch;

static int scratch_alloc(const Trainer *tr, CkptScratch *sc)
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

static void scratch_free(CkptScratch *sc)
{
    state_view_destroy(&sc->view);
    isth_free(sc->frag);
}

static int no_chunk(const void *shard, int c) { (void)shard; (void)c; return 0; }

/* The backend's state `which` (params or moments) through the scratch's
 * view; a failed get or put is agreed over the file's ranks, so nobody
 * goes on into the next collective alone. */
static int transfer_state(H5File *f, const Trainer *tr, CkptScratch *sc, const char *group, StateKind which,
                          int active, int reading)
{
    const int moments = state_is_packed(which);
    StateView *v = &sc->view;
    state_view_begin(v, tr->be, which, moments ? tr->shard.run_pos : NULL, active ? trainer_owns_chunk : no_chunk,
                     &tr->shard, reading);
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

static int write_state_of(H5File *f, const Trainer *tr, CkptScratch *sc, const char *group, StateKind which,
                          int active)
{
    return transfer_state(f, tr, sc, group, which, active, 0);
}

static int write_outer(H5File *f, const Trainer *tr, const char *group, OuterState which, int active)
{
    HostView v = {tr, VIEW_OUTER, which, active, 0};
    return h5_write_chunks(f, group, &tr->model, host_at, &v);
}

static int write_residual(H5File *f, const Trainer *tr, const char *group, int active)
{
    HostView v = {tr, VIEW_RESIDUAL, OUTER_ANCHOR, active && shard_has_residual(&tr->shard), 0};
    return h5_write_chunks(f, group, &tr->model, host_at, &v);
}

/* The weights: each rank reads the chunks it owns, then the dense ones are
 * shared inside the learner (the file is read once per site). */
static int read_params(H5File *f, Trainer *tr, CkptScratch *sc, const char *group)
{
    CHECK(transfer_state(f, tr, sc, group, STATE_PARAMS, 1, 1));
    return shard_share_params(&tr->shard, tr->be);
}

/* Each owner reads its moments; nobody else holds them. */
static int read_moments(H5File *f, Trainer *tr, CkptScratch *sc, const char *group, StateKind which)
{
    return transfer_state(f, tr, sc, group, which, 1, 1);
}

static int read_outer(H5File *f, Trainer *tr, const char *group, OuterState which)
{
    HostView v = {tr, VIEW_OUTER, which, 1, 1};
    return h5_read_chunks(f, group, &tr->model, host_at, &v);
}

static int read_residual(H5File *f, Trainer *tr, const char *group)
{
    HostView v = {tr, VIEW_RESIDUAL, OUTER_ANCHOR, shard_has_residual(&tr->shard), 1};
    return h5_read_chunks(f, group, &tr->model, host_at, &v);
}


/* Shampoo's statistics and roots beside the moments: under PREFIX (e.g.
 * "/inner" or "/learner_3/inner") as shampoo_l, shampoo_r, shampoo_lroot,
 * shampoo_rroot; nothing for the other optimisers. */
static const struct {
    const char *name;
    StateKind kind;
} shampoo_groups[] = {{"shampoo_l", STATE_SHAMPOO_L}, {"shampoo_r", STATE_SHAMPOO_R},
                      {"shampoo_lroot", STATE_SHAMPOO_LROOT}, {"shampoo_rroot", STATE_SHAMPOO_RROOT}};
#define SHAMPOO_GROUPS 4

static int uses_shampoo(const Trainer *tr) { return !strcmp(tr->cfg.train.optimizer, "shampoo"); }

static int transfer_shampoo(H5File *f, Trainer *tr, CkptScratch *sc, const char *prefix, int active, int reading)
{
    for (int i = 0; i < SHAMPOO_GROUPS && uses_shampoo(tr); i++) {
        char g[96];
        snprintf(g, sizeof g, "%s/%s", prefix, shampoo_groups[i].name);
        CHECK(transfer_state(f, tr, sc, g, shampoo_groups[i].kind, active, reading));
    }
    return ISTH_OK;
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

    const int P = tr->cfg.outer.fragments, in_flight = exchanges_in_flight(tr);
    if (tr->mode == MODE_SYNC) {
        CHECK(write_state_of(f, tr, sc, "/model", STATE_PARAMS, first));
        CHECK(write_state_of(f, tr, sc, "/inner/m", STATE_ADAM_M, first));
        CHECK(write_state_of(f, tr, sc, "/inner/v", STATE_ADAM_V, first));
        CHECK(transfer_shampoo(f, tr, sc, "/inner", first, 0));
        /* sync with a lossy codec: error feedback of the gradient sums */
        if (shard_any_residual(&tr->shard)) CHECK(write_residual(f, tr, "/outer/residual", first));
    } else {
        const int bf = tr->mode == MODE_BUTTERFLY; /* butterfly: outer state per learner */
        if (bf) CHECK(write_state_of(f, tr, sc, "/model", STATE_PARAMS, first));
        else CHECK(write_outer(f, tr, "/model", OUTER_ANCHOR, first));
        if (!bf) {
            CHECK(write_outer(f, tr, "/outer/momentum", OUTER_MOMENTUM, first));
            CHECK(write_residual(f, tr, "/outer/residual", first));
            /* fragments in flight (drained): their reduced pseudo-gradients, equal on every learner */
            if (in_flight) CHECK(write_outer(f, tr, "/outer/pending", OUTER_PENDING, first));
        }
        for (int k = 0; k < site->learners; k++) {
            const int id = site->first_learner + k, mine = t->learner == id;
            char g[64];
            if (bf) {
                snprintf(g, sizeof g, "/learner_%d/outer/anchor", id);
                CHECK(write_outer(f, tr, g, OUTER_ANCHOR, mine));
                snprintf(g, sizeof g, "/learner_%d/outer/momentum", id);
                CHECK(write_outer(f, tr, g, OUTER_MOMENTUM, mine));
                snprintf(g, sizeof g, "/learner_%d/outer/residual", id);
                CHECK(write_residual(f, tr, g, mine));
                /* a round in flight (drained): the mixed values and what was sent */
                snprintf(g, sizeof g, "/learner_%d/outer/pending", id);
                if (in_flight) CHECK(write_outer(f, tr, g, OUTER_PENDING, mine));
                snprintf(g, sizeof g, "/learner_%d/outer/sent", id);
                if (in_flight) CHECK(write_outer(f, tr, g, OUTER_SENT, mine));
            }
            snprintf(g, sizeof g, "/learner_%d/model", id);
            CHECK(write_state_of(f, tr, sc, g, STATE_PARAMS, mine));
            snprintf(g, sizeof g, "/learner_%d/inner/m", id);
            CHECK(write_state_of(f, tr, sc, g, STATE_ADAM_M, mine));
            snprintf(g, sizeof g, "/learner_%d/inner/v", id);
            CHECK(write_state_of(f, tr, sc, g, STATE_ADAM_V, mine));
            snprintf(g, sizeof g, "/learner_%d/inner", id);
            CHECK(transfer_shampoo(f, tr, sc, g, mine, 0));
        }
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
    return rc;
}

/* How many model-shaped groups write_state writes into this site's file. */
static int checkpoint_groups(const Trainer *tr)
{
    const int learners = tr->topo.sites[tr->topo.site].learners, residual = shard_any_residual(&tr->shard);
    const int in_flight = exchanges_in_flight(tr);
    const int inner = 2 + (uses_shampoo(tr) ? SHAMPOO_GROUPS : 0); /* m, v (+ shampoo's) */
    if (tr->mode == MODE_SYNC) return 1 + inner + residual;     /* model, inner state (+ residual) */
    if (tr->mode == MODE_BUTTERFLY) /* model; per learner anchor, momentum, residual, */
        return 1 + learners * (4 + inner + 2 * in_flight); /* pending, sent, model, inner state */
    return 3 + in_flight + (1 + inner) * learners;        /* anchor, momentum, residual, pending; per learner */
}

/* Remove all but the newest `keep` files, and the file of step `pin`
 * (>= 0: the newest one every site completed, while a site is out). */
static void prune(const char *dir, int keep, long pin)
{
    int n = list_steps(dir, NULL, 0);
    long *steps = n > 0 ? isth_malloc(sizeof(long) * (size_t)n) : NULL;
    if (!steps) return; /* nothing to prune, or no memory: keep every file */
    const int listed = n;
    n = list_steps(dir, steps, listed);
    if (n > listed) n = listed;
    for (int i = keep; i < n; i++) {
        if (steps[i] == pin) continue;
        char path[CONFIG_FILE_PATH_MAX + 64];
        ckpt_path(dir, steps[i], path, sizeof path);
        unlink(path);
    }
    isth_free(steps);
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
    site_dir(tr, dir, sizeof dir);
    /* the directory was probed before training: failing now is a runtime
     * failure (a full disk), reported by the site's first rank */
    int site_rank0 = 0;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank0));
    const int was = status_set_quiet(site_rank0 != 0);
    int rc = make_dirs(dir);
    status_set_quiet(was);
    if (!coll_all_ok(t->site_comm, rc == ISTH_OK)) return ISTH_ERUNTIME;
    ckpt_path(dir, tr->step, path, sizeof path);
    CkptScratch sc;
    CHECK(scratch_alloc(tr, &sc));
    H5File f;
    rc = h5_create(&f, path, H5IO_FILE_BYTES(model_total_params(&tr->cfg.model), checkpoint_groups(tr)), t->site_comm);
    if (rc != ISTH_OK) {
        scratch_free(&sc);
        return rc;
    }
    rc = write_state(tr, &f, &sc);
    scratch_free(&sc);
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
    if (site_rank == 0) prune(dir, tr->cfg.checkpoint.keep, all_in ? -1 : tr->ckpt_every_site);
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

/* --- the live rejoin: the live site's file to the joining site ------------------ */

#define SHARE_PIECE ((size_t)64 << 20)
#define FRAME_ROOM sizeof(LinkHeader) /* the link's header goes in front of each piece, in place */

static int send_file(Trainer *tr, const char *path, int peer)
{
    Link *l = &tr->link;
    const int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return isth_fail(ISTH_ERUNTIME, "rejoin: cannot read %s: %s", path, strerror(errno));
    }
    const uint64_t size = (uint64_t)st.st_size;
    /* static: a send that misses its deadline cannot be cancelled and must
     * not point into a stack frame that is gone (as recv_file's buffer) */
    static unsigned char head[FRAME_ROOM + sizeof size];
    memcpy(head + FRAME_ROOM, &size, sizeof size);
    int rc = link_send_blob(l, peer, LINK_TAG_REJOIN, head, sizeof size, 0, "the rejoin checkpoint's size");
    unsigned char *buf = rc == ISTH_OK ? isth_malloc(FRAME_ROOM + SHARE_PIECE) : NULL;
    if (rc == ISTH_OK && !buf) rc = isth_fail(ISTH_ERUNTIME, "rejoin: out of memory for a %zu-byte piece", SHARE_PIECE);
    for (uint64_t off = 0, seq = 1; rc == ISTH_OK && off < size; off += SHARE_PIECE, seq++) {
        const size_t n = size - off < SHARE_PIECE ? (size_t)(size - off) : SHARE_PIECE;
        if (pread(fd, buf + FRAME_ROOM, n, (off_t)off) != (ssize_t)n)
            rc = isth_fail(ISTH_ERUNTIME, "rejoin: reading %s: %s", path, strerror(errno));
        if (rc == ISTH_OK) rc = link_send_blob(l, peer, LINK_TAG_REJOIN, buf, n, seq, "the rejoin checkpoint");
    }
    if (rc == ISTH_OK) isth_free(buf); /* after a failure MPI may still hold it: leaked (failure rule 6) */
    close(fd);
    return rc;
}

/* The joiner's side: size bounded by what the live site could have written,
 * every piece checked, a temporary name renamed when complete. */
static int recv_file(Trainer *tr, const char *path, int peer)
{
    Link *l = &tr->link;
    const Topology *t = &tr->topo;
    uint64_t size = 0;
    static unsigned char head[FRAME_ROOM + sizeof size]; /* not on the stack: a failed receive may outlive us */
    CHECK(link_recv_blob(l, peer, LINK_TAG_REJOIN, head, sizeof size, 0, "the rejoin checkpoint's size"));
    memcpy(&size, head + FRAME_ROOM, sizeof size);
    int most = 0;
    for (int s = 0; s < t->n_sites; s++) most = t->sites[s].learners > most ? t->sites[s].learners : most;
    const double bound = H5IO_FILE_BYTES(model_total_params(&tr->cfg.model), 8 + (6 + SHAMPOO_GROUPS) * most);
    if ((double)size > bound)
        return isth_fail(ISTH_ERUNTIME, "rejoin: the live site announces a %llu-byte checkpoint; this config's "
                         "are at most %.0f bytes", (unsigned long long)size, bound);
    char tmp[CONFIG_FILE_PATH_MAX + 80];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return isth_fail(ISTH_ERUNTIME, "rejoin: cannot create %s: %s", tmp, strerror(errno));
    unsigned char *buf = isth_malloc(FRAME_ROOM + SHARE_PIECE);
    int rc = buf ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "rejoin: out of memory for a %zu-byte piece", SHARE_PIECE);
    for (uint64_t off = 0, seq = 1; rc == ISTH_OK && off < size; off += SHARE_PIECE, seq++) {
        const size_t n = size - off < SHARE_PIECE ? (size_t)(size - off) : SHARE_PIECE;
        rc = link_recv_blob(l, peer, LINK_TAG_REJOIN, buf, n, seq, "the rejoin checkpoint");
        if (rc == ISTH_OK && pwrite(fd, buf + FRAME_ROOM, n, (off_t)off) != (ssize_t)n)
            rc = isth_fail(ISTH_ERUNTIME, "rejoin: writing %s: %s", tmp, strerror(errno));
    }
    if (rc == ISTH_OK) isth_free(buf); /* after a failure MPI may still hold it: leaked (failure rule 6) */
    if (rc == ISTH_OK && fsync(fd) != 0) rc = isth_fail(ISTH_ERUNTIME, "rejoin: %s: %s", tmp, strerror(errno));
    close(fd);
    if (rc == ISTH_OK && rename(tmp, path) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "rejoin: cannot rename %s: %s", tmp, strerror(errno));
    if (rc != ISTH_OK) unlink(tmp);
    return rc;
}

int ckpt_share(Trainer *tr, int from_site, long step, char *path, size_t cap)
{
    const Topology *t = &tr->topo;
    char dir[CONFIG_FILE_PATH_MAX];
    site_dir(tr, dir, sizeof dir);
    const int host = t->site == from_site, other = 1 - from_site; /* two sites */
    if (host) ckpt_path(dir, step, path, cap);
    else snprintf(path, cap, "%s/rejoin-%08ld.h5", dir, step);
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, "passing the live site's checkpoint to the rejoining site",
                       FAULT_HINT_IO);
    int rc = ISTH_OK;
    if (site_rank == 0 && !host) rc = make_dirs(dir);
    if (site_rank == 0 && rc == ISTH_OK)
        rc = host ? send_file(tr, path, tr->site_leaders[other]) : recv_file(tr, path, tr->site_leaders[from_site]);
    const int ok = coll_all_ok(t->site_comm, rc == ISTH_OK);
    fault_watchdog_disarm();
    return ok ? ISTH_OK : rc != ISTH_OK ? rc : ISTH_ERUNTIME;
}

/* Can files be created, written and renamed in dir? ISTH_EINPUT naming it. */
static int probe_dir(const char *what, const char *dir)
{
    CHECK(make_dirs(dir));
    char probe[CONFIG_FILE_PATH_MAX + 64], moved[CONFIG_FILE_PATH_MAX + 96];
    snprintf(probe, sizeof probe, "%s/.isthmus-probe-%ld", dir, (long)getpid());
    snprintf(moved, sizeof moved, "%s.renamed", probe);
    int fd = open(probe, O_CREAT | O_WRONLY | O_EXCL, 0644);
    const char *step = "create a file";
    int ok = fd >= 0;
    if (ok) {
        step = "write";
        ok = write(fd, "x", 1) == 1;
        ok = close(fd) == 0 && ok;
    }
    if (ok) {
        step = "rename a file";
        ok = rename(probe, moved) == 0;
    }
    const int err = errno;
    unlink(ok ? moved : probe);
    if (!ok)
        return isth_fail(ISTH_EINPUT, "%s %s: cannot %s there: %s (checked before training)", what, dir, step,
                         strerror(err));
    return ISTH_OK;
}

int ckpt_check_outputs(Trainer *tr)
{
    const Topology *t = &tr->topo;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    int mine = ISTH_OK;
    if (site_rank == 0) {
        /* only this site's first rank sees it: it prints, quiet or not */
        const int was = status_set_quiet(0);
        char dir[CONFIG_FILE_PATH_MAX];
        site_dir(tr, dir, sizeof dir);
        mine = probe_dir("[train] out_dir", tr->cfg.train.out_dir);
        if (mine == ISTH_OK) mine = probe_dir(tr->cfg.checkpoint.dir[0] ? "[checkpoint] dir" : "checkpoint directory", dir);
        /* the model file is written at the end: a directory (or device) in its place is found now */
        char model[CONFIG_FILE_PATH_MAX + 80];
        trainer_model_path(tr, model, sizeof model);
        struct stat st;
        if (mine == ISTH_OK && lstat(model, &st) == 0 && !S_ISREG(st.st_mode))
            mine = isth_fail(ISTH_EINPUT, "model file %s: exists and is not a regular file (training would end "
                             "unable to write it)", model);
        status_set_quiet(was);
    }
    int *all = isth_malloc(sizeof(int) * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    int rc = trainer_control(tr, &mine, sizeof mine, all, "output check");
    for (int s = 0; rc == ISTH_OK && s < t->n_sites; s++)
        if (all[s] != ISTH_OK) rc = all[s]; /* the site's first rank printed why */
    isth_free(all);
    return rc;
}

/* ---- choosing the checkpoint to resume from ------------------------------- */

int ckpt_find(Trainer *tr, const char *arg, char *path, size_t cap, const long *skip, int n_skip)
{
    const Topology *t = &tr->topo;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    char dir[CONFIG_FILE_PATH_MAX];
    site_dir(tr, dir, sizeof dir);
    long valid[CKPT_MAX_LIST];
    for (int i = 0; i < CKPT_MAX_LIST; i++) valid[i] = -1;
    int rc = ISTH_OK;
    long want = -1;
    long *all = isth_malloc(sizeof(long) * CKPT_MAX_LIST * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    if (strcmp(arg, "auto")) { /* an explicit file: its step, every site's file of that step */
        char reason[512];
        long mine[2] = {ISTH_OK, -1}; /* (status, step) of world rank 0's check; the others' are not read */
        if (t->world_rank == 0 && ckpt_check(arg, reason, sizeof reason, &mine[1], 0) != ISTH_OK)
            mine[0] = isth_fail(ISTH_EINPUT, "checkpoint %s: invalid: %s", arg, reason);
        rc = trainer_control(tr, mine, sizeof mine, all, "resume file");
        if (rc == ISTH_OK) rc = (int)all[0];
        want = all[1];
        if (rc != ISTH_OK) isth_free(all);
        CHECK(rc);
        if (t->n_sites == 1) {
            isth_free(all);
            snprintf(path, cap, "%s", arg);
            return ISTH_OK;
        }
    }
    if (site_rank == 0) {
        long steps[CKPT_MAX_LIST * 4];
        int n = list_steps(dir, steps, CKPT_MAX_LIST * 4), k = 0;
        if (n > CKPT_MAX_LIST * 4) n = CKPT_MAX_LIST * 4; /* the newest ones */
        for (int i = 0; i < n && k < CKPT_MAX_LIST; i++) {
            if (want >= 0 && steps[i] != want) continue;
            int skipped = 0;
            for (int j = 0; j < n_skip; j++) skipped |= steps[i] == skip[j];
            if (skipped) continue; /* a load found it damaged */
            char p[CONFIG_FILE_PATH_MAX + 64], reason[512];
            ckpt_path(dir, steps[i], p, sizeof p);
            /* structure and attributes here; the load verifies every value */
            if (ckpt_check(p, reason, sizeof reason, NULL, 0) == ISTH_OK) {
                valid[k++] = steps[i];
            } else {
                fprintf(stderr, "isthmus: warning: checkpoint %s: invalid: %s; falling back to an older one\n", p, reason);
                fflush(stderr);
            }
        }
    }
    /* the sites agree on the newest step every one of them has: each site's
     * first rank sends its list through the link */
    rc = trainer_control(tr, valid, sizeof valid, all, "resume step");
    if (rc != ISTH_OK) isth_free(all);
    CHECK(rc);
    long best = -1;
    for (int i = 0; i < CKPT_MAX_LIST; i++) {
        long s = all[i];
        if (s < 0) continue;
        int everywhere = 1;
        for (int site = 1; site < t->n_sites && everywhere; site++) {
            int found = 0;
            for (int j = 0; j < CKPT_MAX_LIST; j++) found |= all[(size_t)site * CKPT_MAX_LIST + j] == s;
            everywhere = found;
        }
        if (everywhere && s > best) best = s;
    }
    /* newer files at some site than the step every site has (a site trained
     * on alone after the other left or was lost, then stopped too): said,
     * as is a start from step 0 over checkpoints that have no step in common */
    for (int site = 0; site < t->n_sites && t->world_rank == 0 && want < 0; site++) {
        long newest = -1;
        for (int j = 0; j < CKPT_MAX_LIST; j++)
            if (all[(size_t)site * CKPT_MAX_LIST + j] > newest) newest = all[(size_t)site * CKPT_MAX_LIST + j];
        if (newest > best && best >= 0)
            fprintf(stderr, "isthmus: warning: resume: site %s has checkpoints up to step %ld, but the newest step "
                            "every site has is %ld: the later ones are set aside\n", t->sites[site].name, newest,
                    best);
        else if (newest > best)
            fprintf(stderr, "isthmus: warning: resume: site %s has checkpoints up to step %ld, but no step is at "
                            "every site: starting from step 0\n", t->sites[site].name, newest);
        fflush(stderr);
    }
    isth_free(all);
    if (best < 0) {
        if (want >= 0) return isth_fail(ISTH_EINPUT, "checkpoint step %ld: not valid at every site", want);
        path[0] = '\0';
        return ISTH_OK;
    }
    ckpt_path(dir, best, path, cap);
    return ISTH_OK;
}

int ckpt_set_aside_newer(Trainer *tr)
{
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(tr->topo.site_comm, &site_rank));
    if (site_rank != 0) return ISTH_OK;
    char dir[CONFIG_FILE_PATH_MAX];
    site_dir(tr, dir, sizeof dir);
    const int n = list_steps(dir, NULL, 0);
    long *steps = n > 0 ? isth_malloc(sizeof(long) * (size_t)n) : NULL;
    if (!steps) return ISTH_OK; /* none, or no memory to list them: the files stay as they are */
    int listed = list_steps(dir, steps, n);
    if (listed > n) listed = n; /* a file made since the count */
    int rc = ISTH_OK;
    for (int i = 0; i < listed && rc == ISTH_OK && steps[i] > tr->step; i++) {
        char path[CONFIG_FILE_PATH_MAX + 64], aside[CONFIG_FILE_PATH_MAX + 80];
        ckpt_path(dir, steps[i], path, sizeof path);
        snprintf(aside, sizeof aside, "%s.passed", path);
        if (rename(path, aside) != 0)
            rc = isth_fail(ISTH_ERUNTIME, "resume: cannot set %s aside: %s", path, strerror(errno));
        else
            printf("resume: %s is past step %ld, which every site resumed from: kept as %s\n", path, tr->step, aside);
    }
    fflush(stdout);
    isth_free(steps);
    return rc;
}

/* ---- loading ----------------------------------------------------------------- */

/* The checkpoint's stored config (into *saved) against the run's. */
static int compare_configs(Trainer *tr, const char *saved_text, const char *path, Config *saved)
{
    int rc = config_load_text(saved, saved_text, path, NULL, 0);
    if (rc != ISTH_OK) return isth_fail(ISTH_EINPUT, "checkpoint %s: stored config unreadable", path);
    const ModelConfig *a = &saved->model, *b = &tr->cfg.model;
    struct { const char *key; double was, now; } fields[] = {
        {"layers", a->layers, b->layers}, {"dim", a->dim, b->dim}, {"heads", a->heads, b->heads},
        {"experts", a->experts, b->experts}, {"top_k", a->top_k, b->top_k}, {"ffn", a->ffn, b->ffn},
        {"context", a->context, b->context}, {"vocab", a->vocab, b->vocab},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (fields[i].was != fields[i].now)
            return isth_fail(ISTH_EINPUT, "checkpoint %s: [model] %s = %g in the checkpoint, %g in the config (a different model)",
                             path, fields[i].key, fields[i].was, fields[i].now);
    /* each optimiser's state means something of its own (muon's momentum is
     * not AdamW's first moment; shampoo's statistics are laid out by its block) */
    if (strcmp(saved->train.optimizer, tr->cfg.train.optimizer))
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [train] optimizer = %s in the checkpoint, %s in the config", path,
                         saved->train.optimizer, tr->cfg.train.optimizer);
    if (uses_shampoo(tr) && saved->train.precond_block != tr->cfg.train.precond_block)
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [train] precond_block = %d in the checkpoint, %d in the config",
                         path, saved->train.precond_block, tr->cfg.train.precond_block);
    if (strcmp(saved->outer.mode, tr->cfg.outer.mode))
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [outer] mode = %s in the checkpoint, %s in the config", path,
                         saved->outer.mode, tr->cfg.outer.mode);
    if (tr->mode != MODE_SYNC && saved->outer.fragments != tr->cfg.outer.fragments)
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [outer] fragments = %d in the checkpoint, %d in the config", path,
                         saved->outer.fragments, tr->cfg.outer.fragments);
    if (tr->log) { /* allowed changes: list them */
        char *now = config_to_text(&tr->cfg), *was = config_to_text(saved);
        const char *p = now && was ? now : NULL; /* out of memory: list nothing */
        while (p && *p) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            char line[CONFIG_FILE_PATH_MAX + 64]; /* a key = value line: a path at most */
            snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), p);
            if (line[0] && line[0] != '[' && !strstr(was, line)) printf("resume: changed: %s\n", line);
            p = nl ? nl + 1 : NULL;
        }
        isth_free(now);
        isth_free(was);
    }
    return ISTH_OK;
}

/* The counters and names a checkpoint's attributes hold must agree with its
 * config, the layout and each other: a tampered or mixed-up file is bad
 * input, not a run that silently continues differently. */
static int check_attributes(Trainer *tr, H5File *f, const char *path, int from_site, long long step,
                            long long adam_t, long long data_step, const char *saved_optimizer)
{
    const SiteInfo *site = &tr->topo.sites[from_site >= 0 ? from_site : tr->topo.site];
    char *mode = NULL, *name = NULL;
    int rc = h5_attr_read_string(f, "/", "mode", &mode);
    if (rc == ISTH_OK) rc = h5_attr_read_string(f, "/", "site", &name);
    if (rc == ISTH_OK && strcmp(mode, tr->cfg.outer.mode))
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute mode = '%s', the config has [outer] mode = %s", path, mode,
                       tr->cfg.outer.mode);
    if (rc == ISTH_OK && strcmp(name, site->name))
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute site = '%s', but this is site %s's file", path, name,
                       site->name);
    isth_free(mode);
    isth_free(name);
    /* AdamW counts one step per optimiser step; plain SGD none */
    const long long want_t = !strcmp(saved_optimizer, "sgd") ? 0 : step;
    if (rc == ISTH_OK && adam_t != want_t)
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute adam_t = %lld, expected %lld for step %lld", path, adam_t,
                       want_t, step);
    if (rc == ISTH_OK && data_step != step)
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute data_step = %lld, expected the step, %lld", path,
                       data_step, step);
    return rc;
}

static int load_checkpoint(Trainer *tr, const char *path, int from_site, int *damaged);
static int load_reported(Trainer *tr, const char *path, int from_site, int fallback, int *damaged);

int ckpt_load(Trainer *tr, const char *path, int fallback, int *damaged)
{
    return load_reported(tr, path, -1, fallback, damaged);
}

int ckpt_load_copy(Trainer *tr, const char *path, int from_site)
{
    int damaged = 0;
    return load_reported(tr, path, from_site, 0, &damaged);
}

static int load_reported(Trainer *tr, const char *path, int from_site, int fallback, int *damaged)
{
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, "loading the checkpoint", FAULT_HINT_IO);
    int site_rank = 0;
    MPI_Comm_rank(tr->topo.site_comm, &site_rank);
    /* what is wrong with this site's file only its ranks see, and any of
     * them may see it (the rank reading a damaged chunk): every rank holds
     * its line until the outcome is known, then the site's lowest rank that
     * has one prints it, once — as a warning when a damaged value makes
     * --resume auto pass over the step */
    const int was = status_set_quiet(1);
    *damaged = 0;
    int rc = load_checkpoint(tr, path, from_site, damaged);
    if (!fallback) *damaged = 0; /* an explicit file: damage is an error */
    status_set_quiet(was);
    if (rc != ISTH_OK) {
        int me = status_has_suppressed() ? site_rank : 1 << 30;
        if (MPI_Allreduce(MPI_IN_PLACE, &me, 1, MPI_INT, MPI_MIN, tr->topo.site_comm) != MPI_SUCCESS) me = -1;
        if (me == site_rank) status_print_held(*damaged, "; falling back to an older one");
        status_discard_suppressed();
    }
    fault_watchdog_disarm();
    return rc;
}

/* from_site >= 0: the file is that site's (a rejoin): this site's
 * learners take copies of its learners' states, residuals start at zero
 * (error feedback is a site's own: another site's would be counted twice). */
static int load_checkpoint(Trainer *tr, const char *path, int from_site, int *damaged)
{
    const double t0 = now_s();
    const Topology *t = &tr->topo;
    const SiteInfo *site = &t->sites[t->site];
    Backend *be = tr->be;
    CkptScratch sc;
    CHECK(scratch_alloc(tr, &sc));
    /* nothing of an earlier, failed attempt stays: held results go back to
     * the pool, residuals start at zero (a file without them keeps them so) */
    for (int p = 0; p < tr->shard.fragments; p++)
        if (shard_result(&tr->shard, p)) shard_release(&tr->shard, p);
    shard_zero_residuals(&tr->shard);
    /* a file this site cannot open still goes to the agreement below, so
     * the other sites hear of it instead of waiting for a deadline */
    H5File f;
    int rc = h5_open(&f, path, t->site_comm);
    const int opened = rc == ISTH_OK;
    f.label = "checkpoint";
    char *text = NULL;
    long long step = 0, outer_steps = 0, exchanges = 0, adam_t = 0, first = 0, learners = 0, data_step = 0;
    double tokens = 0;
    if (rc == ISTH_OK) rc = h5_attr_read_string(&f, "/", "config", &text);
    Config saved;
    if (rc == ISTH_OK) rc = compare_configs(tr, text, path, &saved);
    isth_free(text);
    const char *saved_optimizer = rc == ISTH_OK ? saved.train.optimizer : "";
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "step", &step);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "outer_steps", &outer_steps);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "exchanges", &exchanges);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "adam_t", &adam_t);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "first_learner", &first);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "learners", &learners);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "data_step", &data_step);
    if (rc == ISTH_OK) rc = h5_attr_read_double(&f, "/", "tokens", &tokens);
    if (rc == ISTH_OK) rc = check_attributes(tr, &f, path, from_site, step, adam_t, data_step, saved_optimizer);
    if (rc == ISTH_OK && from_site >= 0 && (first != t->sites[from_site].first_learner ||
                                            learners != t->sites[from_site].learners))
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: learners %lld..%lld, site %s has %d..%d", path, first,
                       first + learners - 1, t->sites[from_site].name, t->sites[from_site].first_learner,
                       t->sites[from_site].first_learner + t->sites[from_site].learners - 1);
    if (rc == ISTH_OK && from_site < 0 && tr->mode != MODE_SYNC &&
        (first != site->first_learner || learners != site->learners))
        rc = isth_fail(ISTH_EINPUT,
                       "checkpoint %s: site %s had learners %lld..%lld, the layout gives %d..%d (an outer-mode "
                       "checkpoint keeps one state per learner; change ranks per learner, not the learner count)",
                       path, site->name, first, first + learners - 1, site->first_learner,
                       site->first_learner + site->learners - 1);
    const int P = tr->cfg.outer.fragments;
    double *frag = sc.frag;
    if (rc == ISTH_OK) rc = h5_read_doubles(&f, "/state/fragments", frag, P);
    if (rc == ISTH_OK) rc = h5_read_doubles(&f, "/state/started", frag + P, P);
    int in_flight = 0;
    for (int p = 0; rc == ISTH_OK && tr->mode != MODE_SYNC && p < P; p++) in_flight |= frag[P + p] >= 0;
    if (rc == ISTH_OK && tr->mode == MODE_SYNC) {
        rc = read_params(&f, tr, &sc, "/model");
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, "/inner/m", STATE_ADAM_M);
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, "/inner/v", STATE_ADAM_V);
        if (rc == ISTH_OK) rc = transfer_shampoo(&f, tr, &sc, "/inner", 1, 1);
        /* error feedback of a lossy codec; a checkpoint written with codec
         * none has none, and the residuals start at zero */
        const int has_residual = H5Lexists(f.file, "/outer", H5P_DEFAULT) > 0 &&
                                 H5Lexists(f.file, "/outer/residual", H5P_DEFAULT) > 0;
        if (rc == ISTH_OK && shard_any_residual(&tr->shard) && has_residual && from_site < 0) {
            rc = read_residual(&f, tr, "/outer/residual");
        } else if (rc == ISTH_OK && shard_any_residual(&tr->shard) && tr->log && from_site < 0) {
            printf("resume: %s has no error-feedback residuals (written without a lossy codec); they start at 0\n",
                   path);
        }
    } else if (rc == ISTH_OK) {
        char g[64], ga[64], gm[64], gr[64];
        const int bf = tr->mode == MODE_BUTTERFLY;
        /* whose state this learner takes: its own, or on a rejoin one of the live site's learners */
        const int k = from_site < 0 ? t->learner : (int)first + (t->learner - site->first_learner) % (int)learners;
        snprintf(ga, sizeof ga, "/learner_%d/outer/anchor", k);
        snprintf(gm, sizeof gm, "/learner_%d/outer/momentum", k);
        snprintf(gr, sizeof gr, "/learner_%d/outer/residual", k);
        rc = read_outer(&f, tr, bf ? ga : "/model", OUTER_ANCHOR);
        if (rc == ISTH_OK) rc = read_outer(&f, tr, bf ? gm : "/outer/momentum", OUTER_MOMENTUM);
        if (rc == ISTH_OK && from_site < 0) rc = read_residual(&f, tr, bf ? gr : "/outer/residual");
        snprintf(g, sizeof g, "/learner_%d/model", k);
        if (rc == ISTH_OK) rc = read_params(&f, tr, &sc, g);
        snprintf(g, sizeof g, "/learner_%d/inner/m", k);
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, g, STATE_ADAM_M);
        snprintf(g, sizeof g, "/learner_%d/inner/v", k);
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, g, STATE_ADAM_V);
        snprintf(g, sizeof g, "/learner_%d/inner", k);
        if (rc == ISTH_OK) rc = transfer_shampoo(&f, tr, &sc, g, 1, 1);
        /* exchanges that were in flight (drained before the checkpoint):
         * their results wait in staging slots until their steps */
        if (rc == ISTH_OK) { /* a staging slot per drained fragment; a rank without memory must not
                              * leave the others inside the next collective read */
            for (int p = 0; rc == ISTH_OK && p < P; p++)
                if (frag[P + p] >= 0 && !shard_hold(&tr->shard, p)) rc = ISTH_ERUNTIME;
            if (!coll_all_ok(t->site_comm, rc == ISTH_OK)) rc = ISTH_ERUNTIME;
        }
        snprintf(g, sizeof g, "/learner_%d/outer/pending", k);
        if (rc == ISTH_OK && in_flight) rc = read_outer(&f, tr, bf ? g : "/outer/pending", OUTER_PENDING);
        snprintf(g, sizeof g, "/learner_%d/outer/sent", k);
        if (rc == ISTH_OK && in_flight && bf) rc = read_outer(&f, tr, g, OUTER_SENT);
        if (rc == ISTH_OK) outer_restore(&tr->outer, frag, frag + P, t->n_sites, (long)step, (long)outer_steps);
    }
    scratch_free(&sc);
    int outcome[2] = {rc != ISTH_OK, opened && f.damaged}; /* failed, a value was damaged */
    if (opened) h5_close(&f);
    /* every site must resume the same step: the site agrees on its outcome,
     * then the sites' first ranks compare through the link */
    int agreed = MPI_Allreduce(MPI_IN_PLACE, outcome, 2, MPI_INT, MPI_MAX, t->site_comm);
    if (agreed != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "resume: MPI_Allreduce failed");
    const int fail = outcome[0];
    long mine[3] = {fail ? -1 : (long)step, fail, outcome[1]}, *all = isth_malloc(sizeof mine * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    /* the other sites are loading too, and a load may take as long as the
     * checkpoint deadline, not an exchange's (a rejoining site loads a whole
     * checkpoint it has just received while the host loads its own) */
    const double exchange_deadline = link_timeout(&tr->link);
    if (tr->cfg.checkpoint.timeout > exchange_deadline) link_set_timeout(&tr->link, tr->cfg.checkpoint.timeout);
    int crc = trainer_control(tr, mine, sizeof mine, all, "resume agreement");
    link_set_timeout(&tr->link, exchange_deadline);
    int any_fail = 0, same = 1, other = 0, any_damaged = 0;
    for (int s2 = 0; crc == ISTH_OK && s2 < t->n_sites; s2++) {
        if (link_is_lost(&tr->link, s2)) continue; /* it missed even that: its slot is empty */
        const long *site_outcome = all + 3 * s2;
        any_fail |= site_outcome[1] != 0;
        any_damaged |= site_outcome[2] != 0;
        other |= site_outcome[1] && !site_outcome[2]; /* failed for another reason */
        same &= site_outcome[0] == all[3 * t->site];
    }
    isth_free(all);
    CHECK(crc);
    /* only damaged values (on any site) make the step one to pass over */
    *damaged = any_fail && any_damaged && !other;
    if (any_fail) return rc != ISTH_OK ? rc : ISTH_EINPUT;
    if (!same) return isth_fail(ISTH_EINPUT, "resume: the sites' checkpoints are of different steps");
    tr->step = (long)step;
    if (from_site < 0) tr->ckpt_every_site = tr->step; /* a resume: every site has this step (ckpt_find) */
    tr->cursor.step = (uint64_t)data_step;
    tr->tokens_seen = tokens;
    be->optimizer_t = (long)adam_t;
    shard_restore_exchanges(&tr->shard, (uint64_t)exchanges);
    if (tr->log) {
        printf("resumed from %s: step %lld, %.0f tokens, in %.2f s\n", path, step, tokens, now_s() - t0);
        fflush(stdout);
    }
    return ISTH_OK;
}

