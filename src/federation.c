/* federation.c — see federation.h. */
#include "federation.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "alloc.h"
#include "clock.h"
#include "codec.h" /* checksum64 */
#include "coll.h"
#include "config_keys.h"
#include "fault.h"
#include "handshake.h"
#include "knock.h"
#include "nameserver.h"
#include "runkey.h"
#include "seal.h"
#include "status.h"

#define TAG_BUILD 44 /* the "go" before a site is taken into the world (41-43: the handshake's) */

void federation_joint(Federation *f)
{
    memset(f, 0, sizeof *f);
    f->world = MPI_COMM_WORLD;
    f->rejoin_step = -1;
    for (int i = 0; i < CONFIG_MAX_SITES; i++) f->leader_link[i] = MPI_COMM_NULL;
}

/* --- what the sites must share ------------------------------------------ */

static int site_local_line(const char *section, const char *line)
{
    static const char *const train_local[] = {"out_dir", "threads", "backend", "precision", "gpu_share",
                                              "log_every", "eval_every", "recompute"};
    /* the network of each site is its own: where it listens, its buffers */
    static const char *const outer_local[] = {"key_file", "join_timeout", "ports", "interface", "socket_buffer"};
    /* checkpoint.every is shared: it decides when the sites drain and agree */
    static const char *const ckpt_local[] = {"dir", "keep", "timeout"};
    if (!strcmp(section, "[data]") || !strncmp(section, "[eval.", 6)) return 1; /* each site reads its own copy */
    const char *const *keys = NULL;
    size_t n = 0;
    if (!strcmp(section, "[train]")) keys = train_local, n = sizeof train_local / sizeof *train_local;
    if (!strcmp(section, "[outer]")) keys = outer_local, n = sizeof outer_local / sizeof *outer_local;
    if (!strcmp(section, "[checkpoint]")) keys = ckpt_local, n = sizeof ckpt_local / sizeof *ckpt_local;
    for (size_t i = 0; i < n; i++) {
        const size_t k = strlen(keys[i]);
        if (!strncmp(line, keys[i], k) && (line[k] == ' ' || line[k] == '=')) return 1;
    }
    return 0;
}

uint64_t federation_fingerprint(const Config *cfg)
{
    char *text = config_to_text(cfg);
    if (!text) return 0;
    /* keep the shared lines, in order, and hash them */
    char *kept = isth_malloc(strlen(text) + 1);
    if (!kept) {
        isth_free(text);
        return 0;
    }
    size_t used = 0;
    char section[64] = "";
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        const size_t len = next ? (size_t)(next - line) : strlen(line);
        if (next) next++;
        if (line[0] == '[') {
            snprintf(section, sizeof section, "%.*s", (int)(len < 63 ? len : 63), line);
            /* [site.NAME] sections are shared whole, [eval.NAME] ones not at all */
            if (!strncmp(section, "[eval.", 6)) continue;
        } else if (site_local_line(section, line)) {
            continue;
        }
        memcpy(kept + used, line, len);
        used += len;
        kept[used++] = '\n';
    }
    const uint64_t h = checksum64(kept, used);
    isth_free(kept);
    isth_free(text);
    return h;
}

void federation_run_id(const Config *cfg, char *out, size_t size)
{
    if (cfg->outer.run_id[0]) snprintf(out, size, "%s", cfg->outer.run_id);
    else snprintf(out, size, "%016llx", (unsigned long long)federation_fingerprint(cfg));
}

/* --- the link's keys ---------------------------------------------------------------- */

int federation_joint_keys(Federation *f, const Config *cfg)
{
    int me;
    CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &me));
    int ready = seal_init() == 0, all_ready = 0; /* agreed: no rank leaves the others in a broadcast */
    CHECK_MPI(MPI_Allreduce(&ready, &all_ready, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all_ready) return isth_fail(ISTH_ERUNTIME, "link: libsodium failed to initialise on a rank");
    if (!cfg->outer.key_file[0]) { /* rank 0's random key, sent over MPI */
        if (me == 0) seal_random(f->link_master, SEAL_KEY_BYTES);
        CHECK_MPI(MPI_Bcast(f->link_master, SEAL_KEY_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD));
        return ISTH_OK;
    }
    /* every rank reads the key where it runs; the epoch, not secret, goes over MPI */
    unsigned char key[RUNKEY_BYTES], epoch[SEAL_EPOCH_BYTES];
    const int was = status_set_quiet(me != 0); /* the same error on every rank: rank 0 says it */
    int rc = runkey_read(cfg->outer.key_file, key), worst = rc;
    status_set_quiet(was);
    CHECK_MPI(MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (worst != ISTH_OK) {
        sodium_memzero(key, sizeof key);
        return rc != ISTH_OK ? rc : isth_fail(worst, "key file %s: unreadable on another rank", cfg->outer.key_file);
    }
    if (me == 0) seal_random(epoch, sizeof epoch);
    CHECK_MPI(MPI_Bcast(epoch, SEAL_EPOCH_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD));
    char run_id[64];
    federation_run_id(cfg, run_id, sizeof run_id);
    seal_master(f->link_master, key, run_id, epoch);
    sodium_memzero(key, sizeof key);
    /* every rank must hold the same key file: a mismatch found now, by name,
     * rather than as a frame that fails to open H steps in */
    const unsigned long long mine = seal_fingerprint(f->link_master);
    unsigned long long lo = 0, hi = 0;
    CHECK_MPI(MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD));
    if (lo == hi) return ISTH_OK;
    const int quiet = status_set_quiet(me != 0); /* one line, from rank 0 */
    const int rc_key = isth_fail(ISTH_EINPUT, "key file %s: not the same key on every rank (each site needs a copy "
                                 "of the same file)", cfg->outer.key_file);
    status_set_quiet(quiet);
    return rc_key;
}

/* --- waiting for the other sites ---------------------------------------------------- */

double federation_setup_s(const Config *cfg)
{
    return cfg->outer.join_timeout > 0 ? cfg->outer.join_timeout + 60.0 : FEDERATION_SETUP_S;
}

double federation_build_s(const Config *cfg)
{
    /* more sites: a site that joined early waits in the merges until the
     * last one has joined, which the host's wait bounds (join_timeout) */
    if (cfg->n_sites > 2) return federation_setup_s(cfg);
    /* the other site, started again at once, probes for a live run first
     * (FEDERATION_PROBE_S), then hosts: this site, started again after the
     * bound, must still find it waiting */
    const double fit = cfg->outer.join_timeout > 0 ? (cfg->outer.join_timeout - FEDERATION_PROBE_S) / 2.0 : 60.0;
    return fit < 5.0 ? 5.0 : fit > 60.0 ? 60.0 : fit;
}

/* ISTHMUS_BREAK_JOIN=SITE:N (fault.h): this site's leader fails the
 * world's merge in its first N starts (ISTHMUS_START, 1 if unset). */
static int join_breaks(const char *site)
{
    const long starts = fault_hook_for("ISTHMUS_BREAK_JOIN", site);
    const char *start = getenv("ISTHMUS_START");
    return starts > 0 && (start ? atol(start) : 1) <= starts;
}

/* The sites that have not joined the host yet, comma-separated. */
static void missing_sites(const Federation *f, const Config *cfg, char *out, size_t size)
{
    out[0] = '\0';
    for (int s = 1; s < cfg->n_sites; s++)
        if (f->leader_link[s] == MPI_COMM_NULL)
            snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? ", " : "", cfg->sites[s].name);
}

/* A leader's wait for the other sites: until outer.join_timeout, or without
 * a limit (0) until a stop signal, saying every minute whom it waits for. */
static void wait_start(Federation *f, KnockWait *w, const Config *cfg, double limit)
{
    /* the host answers "busy" while it writes the checkpoint it will send */
    knock_wait_start(w, limit, cfg->checkpoint.timeout + FEDERATION_SETUP_S, FEDERATION_HEARTBEAT_S, f->stop_flag,
                     &f->stopped);
}

/* How long the host waits for the other sites as the run forms. With three
 * sites or more, join_timeout and the merges' bound after it: when a join
 * breaks inside Open MPI the host is started again at once, while a site
 * left in the merges comes back only when their bound has passed (two
 * sites: the bound is made short enough, federation_build_s). */
static double host_wait_s(const Config *cfg)
{
    const double t = cfg->outer.join_timeout;
    return t > 0 && cfg->n_sites > 2 ? t + federation_build_s(cfg) : t;
}

/* --- the host (the first site's first rank) ------------------------------------------ */

/* A wait for other sites whose name service went away (nameserver.h):
 * exit 3, so that the site script starts it again with the server there is
 * now (it resolves the server at every start) */
static int name_service_gone(const char *whom)
{
    return isth_fail(ISTH_EDROPPED, "federation: the name service went away while this site waited for %s; exit 3: "
                     "start this site again (scripts/federated.sh does) with the server's new URI or HOST:PORT",
                     whom);
}

/* Try the knock of `site` if its value is new: 1 when the site is now in. */
static int host_try_knock(Federation *f, const Config *cfg, int site, const unsigned char key[RUNKEY_BYTES],
                          const char *run_id, uint64_t fingerprint, long rejoin_step, uint64_t joiners,
                          const unsigned char epoch[SEAL_EPOCH_BYTES])
{
    char value[MPI_MAX_PORT_NAME];
    knock_value(f->service, site, value);
    if (!value[0] || !strncmp(value, f->knock_seen[site], sizeof f->knock_seen[site])) return 0;
    snprintf(f->knock_seen[site], sizeof f->knock_seen[site], "%.63s", value); /* each value is tried once */
    MPI_Comm c;
    if (!knock_accept(f->service, f->port, site, value, &c)) {
        printf("federation: site %s knocked but did not connect (a joiner that gave up, or a stale name)\n",
               cfg->sites[site].name);
        fflush(stdout);
        return 0;
    }
    return handshake_host(cfg, c, f->site, site, key, run_id, fingerprint, f->leader_link, rejoin_step, joiners,
                          epoch) == site;
}

static int host_accept_all(Federation *f, const Config *cfg, const unsigned char key[RUNKEY_BYTES],
                           const char *run_id, uint64_t fingerprint)
{
    CHECK_MPI(MPI_Open_port(MPI_INFO_NULL, f->port));
    if (MPI_Publish_name(f->service, MPI_INFO_NULL, f->port) != MPI_SUCCESS)
        return isth_fail(ISTH_EINPUT, "federation: cannot publish '%s': start each site's mpirun with "
                         "--ompi-server file:URI of a running ompi-server (scripts/federated.sh), and no other "
                         "run with this run id", f->service);
    f->published = f->hosting = 1;
    char missing[256];
    missing_sites(f, cfg, missing, sizeof missing);
    KnockWait w;
    wait_start(f, &w, cfg, host_wait_s(cfg));
    printf("federation: site %s hosts run %s; waiting for site(s) %s (%s)\n", cfg->sites[0].name, run_id, missing,
           w.limit);
    fflush(stdout);
    int joined = 0;
    unsigned char epoch[SEAL_EPOCH_BYTES]; /* one for the run as it forms: every site derives the same keys */
    seal_random(epoch, sizeof epoch);
    seal_master(f->link_master, key, run_id, epoch);
    while (joined < cfg->n_sites - 1) {
        missing_sites(f, cfg, missing, sizeof missing);
        char whom[300];
        snprintf(whom, sizeof whom, "site(s) %s", missing);
        if (!knock_wait_on(&w, whom))
            return f->stopped ? ISTH_OK
                              : isth_fail(ISTH_ERUNTIME, "federation: %s did not join within %.0f s (outer.join_timeout%s)",
                                          whom, host_wait_s(cfg), cfg->n_sites > 2 ? ", and with three sites or more "
                                          "the merges' bound after it" : "");
        if (nameserver_gone()) return name_service_gone(whom);
        const int before = joined;
        for (int s = 1; s < cfg->n_sites; s++)
            if (f->leader_link[s] == MPI_COMM_NULL) joined += host_try_knock(f, cfg, s, key, run_id, fingerprint, -1, 0, epoch);
        if (joined == before) knock_sleep(KNOCK_POLL_S);
    }
    return ISTH_OK;
}

/* --- a joiner (another site's first rank) ------------------------------------------ */

/* Join the run's host: the first site while the run forms, any live site
 * after a loss (the verdict names it). probe_s > 0 (the first site
 * restarted: is the run live, hosted by another site?): *joined = 0 and
 * ISTH_OK when no live host answers within probe_s. */
static int joiner_connect(Federation *f, const Config *cfg, const char *key_file, const char *run_id,
                          uint64_t fingerprint, double probe_s, int *joined)
{
    KnockWait w;
    wait_start(f, &w, cfg, cfg->outer.join_timeout);
    char whom[200];
    snprintf(whom, sizeof whom, "the host of run %s (site %s)", run_id, cfg->sites[0].name); /* or a live one */
    if (probe_s <= 0) {
        printf("federation: site %s waits for %s (%s)\n", cfg->sites[f->site].name, whom, w.limit);
        fflush(stdout);
    }
    MPI_Comm c = MPI_COMM_NULL;
    int found = 0, have_key = 0;
    unsigned char key[RUNKEY_BYTES];
    int rc = ISTH_OK;
    *joined = 0;
    while (c == MPI_COMM_NULL) {
        if (probe_s > 0 && (found || now_s() > w.started + probe_s)) { /* one knock: a live host answered it or not */
            if (have_key) sodium_memzero(key, sizeof key);
            return ISTH_OK;
        }
        if (!knock_wait_on(&w, whom)) {
            if (have_key) sodium_memzero(key, sizeof key);
            if (f->stopped) return ISTH_OK;
            return isth_fail(ISTH_ERUNTIME, "federation: %s: no host %s within %.0f s (outer.join_timeout)",
                             found ? "could not connect to" : "the name service does not know", f->service,
                             cfg->outer.join_timeout);
        }
        if (nameserver_gone()) {
            if (have_key) sodium_memzero(key, sizeof key);
            return name_service_gone(whom);
        }
        /* the port again after a failed connect: the host may have restarted */
        if (MPI_Lookup_name(f->service, MPI_INFO_NULL, f->port) != MPI_SUCCESS) {
            if (probe_s > 0) return ISTH_OK; /* no name: no live run */
            knock_sleep(10 * KNOCK_POLL_S);
            continue;
        }
        found = 1;
        if (!have_key) { /* the host made the key before it published its name */
            CHECK(runkey_read(key_file, key));
            have_key = 1;
        }
        int busy = 0;
        rc = knock_connect(f->service, f->site, &w, whom, probe_s, f->port, &c, &busy);
        if (rc != ISTH_OK) {
            sodium_memzero(key, sizeof key);
            return rc;
        }
        /* a live host said it would come and did not: never host beside it */
        if (probe_s > 0 && busy && c == MPI_COMM_NULL && !f->stopped) {
            sodium_memzero(key, sizeof key);
            return isth_fail(ISTH_EDROPPED, "federation: the live host of %s answered this site's knock \"busy\" "
                             "and did not take it back (it stalled %.0f s, or another site hosts now); exit 3: start "
                             "this site again and it knocks again", f->service, w.busy_max_s);
        }
    }
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    unsigned char epoch[SEAL_EPOCH_BYTES];
    long rejoin_step = -1;
    int host = -1;
    uint64_t rejoiners = 0;
    rc = handshake_join(cfg, c, f->site, key, run_id, fingerprint, f->service, epoch, &rejoin_step, &host,
                        &rejoiners);
    if (rc == ISTH_OK) seal_master(f->link_master, key, run_id, epoch); /* the host's epoch, verified */
    sodium_memzero(key, sizeof key);
    if (rc != ISTH_OK) return rc; /* c freed */
    f->rejoin_step = rejoin_step;
    f->rejoiners = rejoiners;
    f->leader_link[host] = c;
    f->host_site = host;
    *joined = 1;
    return ISTH_OK;
}

/* --- the world ----------------------------------------------------------------- */

static int break_join; /* join_breaks() for this site, read at the join */

/* One site taken into the world: the world so far accepts, collectively
 * on the host's port, and site s's ranks connect, collectively, when their
 * leader hears "go" over the leaders' link, sent just before the accept
 * (the accept and the connect then meet within Open MPI's exchange bound,
 * as the knock arranges for the leaders). A collective connect, not
 * MPI_Intercomm_create over the leaders' link: Open MPI 4.1 introduces to
 * each other the jobs of a connect and an accept, every rank of both, and
 * no others, so a third site's ranks created into the world through the
 * host's leader were never known to the second's (its merge waited
 * forever). `old` holds this side's ranks: the world so far, or the
 * newcomer's MPI_COMM_WORLD; only its rank `root` holds `link` (the
 * newcomer's: 0). The result has
 * the world's ranks first. */
static int take_in(MPI_Comm old, int root, MPI_Comm link, const char *port, int newcomer, MPI_Comm *merged)
{
    int me, go = 1;
    MPI_Comm_rank(old, &me);
    if (me == root && break_join)
        return isth_fail(ISTH_ERUNTIME, "%s:%d: MPI_Comm_%s(port, old, &inter) failed: broken on purpose "
                         "(ISTHMUS_BREAK_JOIN)", __FILE__, __LINE__, newcomer ? "connect" : "accept");
    MPI_Comm inter;
    if (!newcomer) {
        if (me == root) CHECK_MPI(MPI_Send(&go, 1, MPI_INT, 0, TAG_BUILD, link));
        CHECK_MPI(MPI_Comm_accept(port, MPI_INFO_NULL, root, old, &inter));
    } else {
        if (me == 0) CHECK_MPI(MPI_Recv(&go, 1, MPI_INT, 0, TAG_BUILD, link, MPI_STATUS_IGNORE));
        CHECK_MPI(MPI_Bcast(&go, 1, MPI_INT, 0, old));
        CHECK_MPI(MPI_Comm_connect(port, MPI_INFO_NULL, 0, old, &inter));
    }
    CHECK(fault_mpi_errors_return(inter));
    const int rc = MPI_Intercomm_merge(inter, newcomer, merged);
    MPI_Comm_free(&inter);
    CHECK_MPI(rc);
    return ISTH_OK;
}

/* The world in config order (a site taken back comes in last): every
 * rank's key is its site's offset plus its rank in the site. */
static int world_in_config_order(MPI_Comm *world, const Config *cfg, int site)
{
    int me, key = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    for (int s = 0; s < site; s++) key += cfg->sites[s].ranks;
    MPI_Comm ordered;
    CHECK_MPI(MPI_Comm_split(*world, 0, key + me, &ordered));
    MPI_Comm_free(world);
    *world = ordered;
    return fault_mpi_errors_return(ordered);
}

/* Site by site in config order: the world so far (the host's ranks, then
 * every site already in) takes in site s. Every site joined the host
 * before the first merge, so each merge waits only for its two sides. */
static int build_world(Federation *f, const Config *cfg)
{
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm world = MPI_COMM_WORLD;
    for (int s = 1; s < cfg->n_sites; s++) {
        if (f->site > s) continue;         /* taken in later */
        const int newcomer = f->site == s;
        const int leader = me == 0 && (f->site == 0 || newcomer);
        MPI_Comm merged;                   /* the newcomer's ranks after */
        CHECK(take_in(world, 0, leader ? f->leader_link[newcomer ? 0 : s] : MPI_COMM_NULL, f->port, newcomer,
                      &merged));
        if (world != MPI_COMM_WORLD) MPI_Comm_free(&world);
        world = merged;
    }
    CHECK(fault_mpi_errors_return(world));
    f->world = world;
    return ISTH_OK;
}

/* Sites taken back: the live sites' world (`live`: every rank of every
 * live site, the host's first rank at `host_rank`, holding the links)
 * takes in the joiners one by one in config order, as the run forms
 * (build_world): a joiner taken in takes part in taking in the next; then
 * the ranks are put in config order. A joiner passes its own ranks as
 * `live` and the host's first rank in the live sites' world as host_rank. */
static int build_rejoin_world(Federation *f, const Config *cfg, MPI_Comm live, int host_rank, uint64_t joiners)
{
    MPI_Comm world = live;
    const int joining = (int)(joiners >> f->site & 1);
    for (int s = 0; s < cfg->n_sites; s++) {
        if (!(joiners >> s & 1) || (joining && f->site > s)) continue; /* not one, or this site comes in later */
        const int newcomer = f->site == s;
        int me;
        MPI_Comm_rank(world, &me);
        const int root = newcomer ? 0 : host_rank;
        MPI_Comm link = me == root ? f->leader_link[newcomer ? f->host_site : s] : MPI_COMM_NULL;
        MPI_Comm merged; /* the world so far's ranks first: host_rank stays the host's */
        const int rc = take_in(world, root, link, f->port, newcomer, &merged);
        if (world != live) MPI_Comm_free(&world);
        CHECK(rc);
        world = merged;
    }
    CHECK(world_in_config_order(&world, cfg, f->site));
    f->world = world;
    return ISTH_OK;
}

/* The first rank of the host's site among the live sites' ranks (config
 * order, the sites out of `joiners` only): where a joiner taken in with
 * others finds the root of the merges after its own. */
static int live_host_rank(const Federation *f, const Config *cfg, uint64_t joiners)
{
    int rank = 0;
    for (int s = 0; s < f->host_site; s++)
        if (!(joiners >> s & 1)) rank += cfg->sites[s].ranks;
    return rank;
}

/* MPI_Bcast from the leader over MPI_COMM_WORLD, tested every poll with a
 * sleep between: the site's other ranks may wait here for as long as the
 * leader waits for the other sites (hours without a limit), and a blocking
 * broadcast would keep a core busy all that time. */
static int bcast_polled(void *buf, int count, MPI_Datatype type)
{
    MPI_Request req;
    int rc = MPI_Ibcast(buf, count, type, 0, MPI_COMM_WORLD, &req), done = 0;
    while (rc == MPI_SUCCESS && !done) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) knock_sleep(KNOCK_POLL_S);
    }
    return rc;
}

int federation_join(Federation *f, const Config *cfg, const char *site_name, const volatile sig_atomic_t *stop_flag)
{
    federation_joint(f);
    f->stop_flag = stop_flag;
    int me, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (cfg->n_sites < 2) return isth_fail(ISTH_EINPUT, "--site %s: the config names fewer than two [site.*]", site_name);
    f->site = -1;
    for (int s = 0; s < cfg->n_sites; s++)
        if (!strcmp(cfg->sites[s].name, site_name)) f->site = s;
    if (f->site < 0) return isth_fail(ISTH_EINPUT, "--site %s: no [site.%s] in %s", site_name, site_name, cfg->source);
    if (ranks != cfg->sites[f->site].ranks)
        return isth_fail(ISTH_EINPUT, "--site %s: this mpirun has %d ranks, [site.%s] ranks = %d", site_name, ranks,
                         site_name, cfg->sites[f->site].ranks);
    /* with more sites, those that joined wait in the world's merge for the
     * rest, where neither a stop signal nor the leader's polls reach them */
    if (cfg->outer.join_timeout == 0 && cfg->n_sites > 2)
        return isth_fail(ISTH_EINPUT, "outer.join_timeout = 0 (no limit) is for two-site runs; this one has %d sites: "
                         "give the sites a limit in seconds", cfg->n_sites);
    if (sodium_init() < 0) return isth_fail(ISTH_ERUNTIME, "federation: libsodium failed to initialise");
    CHECK(fault_mpi_errors_return(MPI_COMM_SELF)); /* the leaders' accept and connect report, not abort */
    f->federated = 1;
    char run_id[64];
    federation_run_id(cfg, run_id, sizeof run_id);
    for (const char *p = run_id; *p; p++)
        if (!(*p == '-' || *p == '_' || *p == '.' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            return isth_fail(ISTH_EINPUT, "outer.run_id '%s': letters, digits, '.', '_' and '-' only", run_id);
    snprintf(f->service, sizeof f->service, "isthmus-%s", run_id);
    const uint64_t fingerprint = federation_fingerprint(cfg);

    /* the leader does the talking; the site agrees on its outcome */
    int rc = ISTH_OK;
    /* without a limit the leader's polls re-arm it (knock_wait_on); the
     * others wait in the outcome's broadcast for as long as it waits */
    if (cfg->outer.join_timeout > 0)
        fault_watchdog_arm(federation_setup_s(cfg) + host_wait_s(cfg) - cfg->outer.join_timeout,
                           "joining the federated run", FAULT_HINT_NET); /* the host's longer wait, three sites or more */
    else if (me == 0) /* until its first poll: the key, the port, the name */
        fault_watchdog_arm(FEDERATION_HEARTBEAT_S, "starting the wait for the other sites", FAULT_HINT_NET);
    if (me == 0) {
        nameserver_watch(); /* at the start: a restart of the server from here on is seen */
        char path[CONFIG_PATH_MAX + 16];
        runkey_path(cfg, path, sizeof path);
        int joined = 0;
        if (f->site == 0) {
            rc = runkey_ensure(path);
            /* restarted while the other sites train on: one of them hosts
             * now and takes this site back; a run that is not live leaves
             * no one to answer the knock within the probe */
            if (rc == ISTH_OK)
                rc = joiner_connect(f, cfg, path, run_id, fingerprint, FEDERATION_PROBE_S, &joined);
            unsigned char key[RUNKEY_BYTES];
            if (rc == ISTH_OK && !joined && !f->stopped) rc = runkey_read(path, key);
            if (rc == ISTH_OK && !joined && !f->stopped) rc = host_accept_all(f, cfg, key, run_id, fingerprint);
            sodium_memzero(key, sizeof key);
        } else {
            rc = joiner_connect(f, cfg, path, run_id, fingerprint, 0.0, &joined);
        }
    }
    long outcome[6] = {rc, f->rejoin_step, f->host_site, f->hosting, f->stopped, (long)f->rejoiners};
    if (bcast_polled(outcome, 6, MPI_LONG) != MPI_SUCCESS) outcome[0] = ISTH_ERUNTIME;
    f->stopped = (int)outcome[4];
    if (outcome[0] == ISTH_OK && f->stopped) {
        fault_watchdog_disarm();
        return ISTH_OK;
    }
    fault_watchdog_arm_exit(federation_build_s(cfg), "building the sites' world (the join)", FAULT_HINT_NET,
                            ISTH_EDROPPED);
    /* the link keys to the site's ranks (inside the site: its own mpirun) */
    if (outcome[0] == ISTH_OK && MPI_Bcast(f->link_master, SEAL_KEY_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        outcome[0] = ISTH_ERUNTIME;
    int site_rc = (int)outcome[0];
    f->rejoin_step = outcome[1];
    f->host_site = (int)outcome[2];
    f->hosting = (int)outcome[3];
    f->rejoiners = (uint64_t)outcome[5];
    /* a rejoin (any live site may host) or the run forming (site 0 hosts) */
    if (site_rc == ISTH_OK) {
        break_join = join_breaks(site_name);
        site_rc = f->rejoin_step >= 0 ? build_rejoin_world(f, cfg, MPI_COMM_WORLD, live_host_rank(f, cfg, f->rejoiners),
                                                             f->rejoiners)
                                        : build_world(f, cfg);
        if (site_rc != ISTH_OK)
            site_rc = rc = isth_fail(ISTH_EDROPPED, "federation: the join broke inside Open MPI (the line above); exit 3: "
                                     "start this site again (--resume auto; scripts/federated.sh does) and it joins");
    }
    fault_watchdog_disarm();
    if (site_rc != ISTH_OK) return me == 0 ? rc != ISTH_OK ? rc : site_rc : site_rc;
    int size;
    MPI_Comm_size(f->world, &size);
    if (me == 0 && f->hosting) {
        printf("federation: %d sites, %d ranks in one world\n", cfg->n_sites, size);
        fflush(stdout);
    }
    return ISTH_OK;
}

/* --- the live rejoin (host side) ------------------------------------------------- */

int federation_host(Federation *f, const Config *cfg, const unsigned char *out)
{
    /* the host stays while it is live; a lost host's place goes to the
     * first live site in config order (every site computes the same) */
    if (out[f->host_site])
        for (int s = cfg->n_sites - 1; s >= 0; s--)
            if (!out[s]) f->host_site = s;
    if (f->host_site != f->site) return ISTH_OK;
    int me, ok = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == 0) {
        const int was = f->hosting;
        /* a call to a name service that is gone waits forever or ends mpirun */
        ok = !nameserver_gone() && (was || MPI_Open_port(MPI_INFO_NULL, f->port) == MPI_SUCCESS);
        /* the newer publish replaces any other port under the run's name
         * (the lost site's, when it hosted: a restarted site must find us) */
        if (ok) ok = MPI_Publish_name(f->service, MPI_INFO_NULL, f->port) == MPI_SUCCESS;
        if (ok && !was)
            printf("federation: site %s hosts run %s now: the lost site rejoins here\n", cfg->sites[f->site].name,
                   f->service + strlen("isthmus-"));
        else if (!ok)
            printf("federation: site %s cannot host %s (name service): a lost site rejoins at the run's restart\n",
                   cfg->sites[f->site].name, f->service);
        fflush(stdout);
    }
    CHECK_MPI(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    f->hosting = f->published = ok;
    return ISTH_OK;
}

int federation_knocking(Federation *f, int site)
{
    int me, knocking = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == 0 && !nameserver_gone()) {
        char value[MPI_MAX_PORT_NAME];
        knock_value(f->service, site, value);
        knocking = value[0] && strncmp(value, f->knock_seen[site], sizeof f->knock_seen[site]) != 0;
        if (knocking) knock_ack(f->service, site, value, ++f->beats);
    }
    if (MPI_Bcast(&knocking, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS) return 0;
    return knocking;
}

/* The ranks of the live sites (every site but those `out`) as one
 * communicator, made from the world over those ranks only (the lost
 * site's ranks are dead or gone); *host_rank: the host leader's rank in it. */
static int live_world(const Federation *f, const Config *cfg, const unsigned char *out, MPI_Comm *live,
                      int *host_rank)
{
    MPI_Group all = MPI_GROUP_NULL, group;
    int size, n = 0, offset = 0;
    MPI_Comm_size(f->world, &size);
    int *ranks = isth_malloc(sizeof(int) * (size_t)size);
    if (!ranks) return isth_fail(ISTH_ERUNTIME, "federation: out of memory for the live sites' ranks");
    *host_rank = -1;
    for (int s = 0; s < cfg->n_sites; s++) {
        if (!out[s]) {
            if (s == f->host_site) *host_rank = n;
            for (int r = 0; r < cfg->sites[s].ranks && offset + r < size; r++) ranks[n++] = offset + r;
        }
        offset += cfg->sites[s].ranks;
    }
    int rc = MPI_Comm_group(f->world, &all);
    if (rc == MPI_SUCCESS && *host_rank >= 0) rc = MPI_Group_incl(all, n, ranks, &group);
    if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
    isth_free(ranks);
    if (*host_rank < 0) return isth_fail(ISTH_ERUNTIME, "federation: the host's site is not among the live sites");
    CHECK_MPI(rc);
    rc = MPI_Comm_create_group(f->world, group, TAG_BUILD, live);
    MPI_Group_free(&group);
    CHECK_MPI(rc);
    return fault_mpi_errors_return(*live);
}

/* Is every site but `site` out? */
static int out_but(const unsigned char *out, const Config *cfg, int site)
{
    for (int s = 0; s < cfg->n_sites; s++)
        if (!out[s] != (s == site)) return 0;
    return 1;
}

int federation_rejoin(Federation *f, const Config *cfg, const unsigned char *out, uint64_t take, long step, int *joined,
                      MPI_Comm *old_world)
{
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    *joined = 0;
    *old_world = MPI_COMM_NULL;
    int every_out = take != 0, n_take = 0;
    char names[256] = "";
    for (int s = 0; s < cfg->n_sites; s++) {
        every_out &= !out[s] == !(take >> s & 1);
        if (take >> s & 1) {
            const size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s%s", n_take++ ? ", " : "", cfg->sites[s].name);
        }
    }
    if (!f->federated || !every_out || (take >> f->host_site & 1) || (n_take > 1 && !out_but(out, cfg, f->site)))
        return isth_fail(ISTH_EINPUT, "federation: a live rejoin takes back every site out of the run: one, or "
                         "several when only this site is left");
    /* a hang here ends this site with exit 3: started again, it resumes
     * from the checkpoint take_back wrote for this step */
    fault_watchdog_arm_exit(federation_setup_s(cfg), "taking a site back into the run", FAULT_HINT_NET,
                            ISTH_EDROPPED);
    MPI_Comm live = MPI_COMM_NULL;
    int host_rank = -1, live_rank;
    CHECK(live_world(f, cfg, out, &live, &host_rank));
    MPI_Comm_rank(live, &live_rank);
    char path[CONFIG_PATH_MAX + 16], run_id[64];
    runkey_path(cfg, path, sizeof path);
    federation_run_id(cfg, run_id, sizeof run_id);
    /* the host's leader answers the knock; the outcome and the new keys'
     * epoch (public: each site derives the keys from its own copy of the
     * run key) go to every live rank */
    unsigned char epoch[SEAL_EPOCH_BYTES + 1] = {0};
    if (live_rank == host_rank) {
        unsigned char key[RUNKEY_BYTES];
        if (runkey_read(path, key) == ISTH_OK) {
            seal_random(epoch, SEAL_EPOCH_BYTES); /* new keys: nothing from before the loss opens */
            /* each knock in config order; all must be answered (one that is
             * not: the joiners answered before it wait for their merge in
             * vain, exit 3 and knock again) */
            epoch[SEAL_EPOCH_BYTES] = 1;
            for (int s = 0; s < cfg->n_sites && epoch[SEAL_EPOCH_BYTES]; s++) {
                if (!(take >> s & 1)) continue;
                /* the old leaders' link goes (freed, not disconnected: the peer is dead) */
                if (f->leader_link[s] != MPI_COMM_NULL) MPI_Comm_free(&f->leader_link[s]);
                epoch[SEAL_EPOCH_BYTES] = (unsigned char)host_try_knock(f, cfg, s, key, run_id,
                                                                        federation_fingerprint(cfg), step, take, epoch);
            }
        }
        sodium_memzero(key, sizeof key);
    }
    int rc = MPI_Bcast(epoch, SEAL_EPOCH_BYTES + 1, MPI_BYTE, host_rank, live) == MPI_SUCCESS ? ISTH_OK : ISTH_ERUNTIME;
    const int in = rc == ISTH_OK && epoch[SEAL_EPOCH_BYTES];
    if (in && me == 0) { /* every site's leader: the keys from its own copy of the run key */
        unsigned char key[RUNKEY_BYTES];
        rc = runkey_read(path, key);
        if (rc == ISTH_OK) seal_master(f->link_master, key, run_id, epoch);
        sodium_memzero(key, sizeof key);
    }
    if (in && !coll_all_ok(MPI_COMM_WORLD, rc == ISTH_OK)) rc = rc != ISTH_OK ? rc : ISTH_ERUNTIME;
    else if (in && MPI_Bcast(f->link_master, SEAL_KEY_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        rc = ISTH_ERUNTIME; /* inside the site: the new keys to every rank */
    if (rc == ISTH_OK && in) {
        MPI_Comm was = f->world;
        break_join = 0;
        /* the merges: the short bound, as the joiner's (a restarted joiner
         * must find this site hosting again before its own wait ends) */
        fault_watchdog_arm_exit(federation_build_s(cfg), "building the sites' world (a rejoin)", FAULT_HINT_NET,
                                ISTH_EDROPPED);
        rc = build_rejoin_world(f, cfg, live, host_rank, take); /* sets f->world */
        if (rc == ISTH_OK) {
            *old_world = was;
            *joined = 1;
        } else { /* the site's ranks may be split between the merges: no training on from here */
            f->world = was;
            rc = isth_fail(ISTH_EDROPPED, "federation: taking site(s) %s back broke inside Open MPI (the line "
                           "above); exit 3: start this site again (--resume auto; scripts/federated.sh does): it "
                           "resumes from the checkpoint of step %ld", names, step);
        }
    }
    MPI_Comm_free(&live);
    fault_watchdog_disarm();
    return rc;
}

void federation_free_world(MPI_Comm *world)
{
    if (*world != MPI_COMM_WORLD && *world != MPI_COMM_NULL) MPI_Comm_free(world);
    *world = MPI_COMM_NULL;
}

void federation_destroy(Federation *f)
{
    seal_wipe(f->link_master, sizeof f->link_master);
    if (!f->federated) return;
    if (f->published && !nameserver_gone()) MPI_Unpublish_name(f->service, MPI_INFO_NULL, f->port);
    if (f->hosting) MPI_Close_port(f->port);
    for (int i = 0; i < CONFIG_MAX_SITES; i++)
        if (f->leader_link[i] != MPI_COMM_NULL) MPI_Comm_free(&f->leader_link[i]);
    federation_free_world(&f->world);
    f->world = MPI_COMM_WORLD;
    f->federated = 0;
}
