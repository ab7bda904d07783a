/* federation.c — see federation.h. */
#include "federation.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "alloc.h"
#include "clock.h"
#include "codec.h" /* checksum64 */
#include "fault.h"
#include "metrics.h" /* make_dirs */
#include "status.h"

#define JOIN_MAGIC 0x6a6f696eu /* "join" */
#define JOIN_VERSION 1u
#define KEY_BYTES 32
#define NONCE_BYTES 32
#define TAG_NONCE 41
#define TAG_HELLO 42
#define TAG_VERDICT 43
#define TAG_BUILD 44

/* What a joiner sends: every field is covered by the MAC. */
typedef struct {
    uint32_t magic, version;
    int32_t site, ranks;
    uint64_t fingerprint;
    char run_id[64];
    unsigned char nonce[NONCE_BYTES]; /* the joiner's: the host proves the key over it */
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
} JoinHello;

/* The host's answer, its MAC over both nonces and every field: a joiner
 * trusts no host that cannot prove the key (a process that published the
 * run's name first would otherwise receive every payload). */
typedef struct {
    int32_t ok;
    char reason[200];
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
} JoinVerdict;

void federation_joint(Federation *f)
{
    memset(f, 0, sizeof *f);
    f->world = MPI_COMM_WORLD;
    for (int i = 0; i < CONFIG_MAX_SITES; i++) f->leader_link[i] = MPI_COMM_NULL;
}

/* --- what the sites must share ------------------------------------------ */

static int site_local_line(const char *section, const char *line)
{
    static const char *const train_local[] = {"out_dir", "threads", "backend", "precision", "gpu_share",
                                              "log_every", "eval_every"};
    static const char *const outer_local[] = {"key_file", "join_timeout"};
    /* checkpoint.every is shared: it decides when the sites drain and agree */
    static const char *const ckpt_local[] = {"dir", "keep", "timeout"};
    if (!strcmp(section, "[data]")) return 1;
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
            /* [site.NAME] sections are shared whole */
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

/* --- the key -------------------------------------------------------------- */

static void key_path(const Config *cfg, char *out, size_t size)
{
    if (cfg->outer.key_file[0]) snprintf(out, size, "%s", cfg->outer.key_file);
    else snprintf(out, size, "%s/run.key", cfg->train.out_dir);
}

static int read_key(const char *path, unsigned char key[KEY_BYTES])
{
    const int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0)
        return isth_fail(ISTH_EINPUT, "key file %s: %s (every site needs the run's key: copy it from the first "
                         "site, mode 0600)", path, strerror(errno));
    struct stat st;
    int rc = ISTH_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = isth_fail(ISTH_EINPUT, "key file %s: not a regular file", path);
    else if (st.st_uid != geteuid())
        rc = isth_fail(ISTH_EINPUT, "key file %s: owned by uid %u, not by this user (%u)", path, (unsigned)st.st_uid,
                       (unsigned)geteuid());
    else if (st.st_mode & 077)
        rc = isth_fail(ISTH_EINPUT, "key file %s: readable by others (mode %03o): chmod 600 %s", path,
                       (unsigned)(st.st_mode & 0777), path);
    char hex[2 * KEY_BYTES + 2] = "";
    ssize_t got = rc == ISTH_OK ? read(fd, hex, sizeof hex - 1) : -1;
    close(fd);
    CHECK(rc);
    size_t len = 0;
    if (got < 2 * KEY_BYTES || sodium_hex2bin(key, KEY_BYTES, hex, (size_t)got, "\n", &len, NULL) != 0 || len != KEY_BYTES)
        rc = isth_fail(ISTH_EINPUT, "key file %s: not %d bytes in hex", path, KEY_BYTES);
    sodium_memzero(hex, sizeof hex);
    return rc;
}

/* The host's first launch makes the key: temporary name, then rename. */
static int ensure_key(const char *path)
{
    if (access(path, F_OK) == 0) return ISTH_OK;
    char dir[CONFIG_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        CHECK(make_dirs(dir));
    }
    unsigned char key[KEY_BYTES];
    randombytes_buf(key, sizeof key);
    char hex[2 * KEY_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, key, sizeof key);
    sodium_memzero(key, sizeof key);
    char tmp[CONFIG_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp); /* a stale temporary keeps its mode: never reuse it */
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (fd < 0) return isth_fail(ISTH_EINPUT, "key file %s: cannot create: %s", tmp, strerror(errno));
    const size_t n = strlen(hex);
    hex[n] = '\n';
    const int ok = write(fd, hex, n + 1) == (ssize_t)(n + 1) && fsync(fd) == 0;
    close(fd);
    sodium_memzero(hex, sizeof hex);
    /* link, not rename: a key another launch made meanwhile is kept */
    const int linked = ok && link(tmp, path) == 0;
    const int raced = ok && !linked && errno == EEXIST;
    unlink(tmp);
    if (raced) return ISTH_OK;
    if (!linked) return isth_fail(ISTH_ERUNTIME, "key file %s: cannot write: %s", path, strerror(errno));
    printf("federation: created the run's key %s (mode 0600); every other site needs a copy\n", path);
    return ISTH_OK;
}

static void hello_mac(const JoinHello *h, const unsigned char nonce[NONCE_BYTES], const unsigned char key[KEY_BYTES],
                      unsigned char out[crypto_auth_hmacsha256_BYTES])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, KEY_BYTES);
    crypto_auth_hmacsha256_update(&st, nonce, NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)h, offsetof(JoinHello, mac));
    crypto_auth_hmacsha256_final(&st, out);
}

static void verdict_mac(const JoinVerdict *v, const unsigned char host_nonce[NONCE_BYTES],
                        const unsigned char joiner_nonce[NONCE_BYTES], const unsigned char key[KEY_BYTES],
                        unsigned char out[crypto_auth_hmacsha256_BYTES])
{
    static const unsigned char label[] = "isthmus verdict";
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, KEY_BYTES);
    crypto_auth_hmacsha256_update(&st, label, sizeof label);
    crypto_auth_hmacsha256_update(&st, host_nonce, NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, joiner_nonce, NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)v, offsetof(JoinVerdict, mac));
    crypto_auth_hmacsha256_final(&st, out);
}

/* --- messages with a deadline ----------------------------------------------- */

static int wait_deadline(MPI_Request *req, double deadline, const char *what, int expect_bytes)
{
    int done = 0;
    MPI_Status st;
    while (!done) {
        CHECK_MPI(MPI_Test(req, &done, &st));
        if (done && expect_bytes >= 0) {
            int got = -1;
            MPI_Get_count(&st, MPI_BYTE, &got);
            if (got != expect_bytes)
                return isth_fail(ISTH_ERUNTIME, "federation: %s: %d bytes, expected %d", what, got, expect_bytes);
        }
        if (done) break;
        if (now_s() > deadline) {
            MPI_Cancel(req);
            MPI_Request_free(req);
            return isth_fail(ISTH_ERUNTIME, "federation: %s: no answer before the deadline", what);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return ISTH_OK;
}

static int send_within(const void *buf, int bytes, int tag, MPI_Comm c, double deadline, const char *what)
{
    MPI_Request r;
    CHECK_MPI(MPI_Isend(buf, bytes, MPI_BYTE, 0, tag, c, &r));
    return wait_deadline(&r, deadline, what, -1);
}

static int recv_within(void *buf, int bytes, int tag, MPI_Comm c, double deadline, const char *what)
{
    MPI_Request r;
    CHECK_MPI(MPI_Irecv(buf, bytes, MPI_BYTE, 0, tag, c, &r));
    return wait_deadline(&r, deadline, what, bytes);
}

/* --- the host (first site's first rank) ------------------------------------------ */

/* Check one joiner's hello; on refusal `reason` says why. */
static int check_hello(const Config *cfg, const JoinHello *h, const unsigned char nonce[NONCE_BYTES],
                       const unsigned char key[KEY_BYTES], const char *run_id, uint64_t fingerprint,
                       const MPI_Comm *links, char *reason, size_t size)
{
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
    if (h->magic != JOIN_MAGIC || h->version != JOIN_VERSION) {
        snprintf(reason, size, "not an isthmus join (magic %08x, version %u)", h->magic, h->version);
        return 0;
    }
    hello_mac(h, nonce, key, mac);
    if (sodium_memcmp(mac, h->mac, sizeof mac) != 0) {
        snprintf(reason, size, "wrong key: the proof does not verify under this run's key");
        return 0;
    }
    if (strncmp(h->run_id, run_id, sizeof h->run_id)) {
        snprintf(reason, size, "run id '%.63s' is not this run's '%s'", h->run_id, run_id);
        return 0;
    }
    if (h->fingerprint != fingerprint) {
        snprintf(reason, size, "config fingerprint %016llx differs from this run's %016llx ([model], [outer], "
                 "[site.*] and the schedule must match)", (unsigned long long)h->fingerprint,
                 (unsigned long long)fingerprint);
        return 0;
    }
    if (h->site <= 0 || h->site >= cfg->n_sites) {
        snprintf(reason, size, "site %d is not a joining site of this run", h->site);
        return 0;
    }
    if (links[h->site] != MPI_COMM_NULL) {
        snprintf(reason, size, "site %s has already joined", cfg->sites[h->site].name);
        return 0;
    }
    if (h->ranks != cfg->sites[h->site].ranks) {
        snprintf(reason, size, "site %s came with %d ranks, [site.%s] ranks = %d", cfg->sites[h->site].name,
                 h->ranks, cfg->sites[h->site].name, cfg->sites[h->site].ranks);
        return 0;
    }
    return 1;
}

/* One accepted connection: the handshake. Returns the joiner's site
 * (its link kept in links[]), 0 when refused or broken (link freed). */
static int host_handshake(const Config *cfg, MPI_Comm c, const unsigned char key[KEY_BYTES], const char *run_id,
                          uint64_t fingerprint, MPI_Comm *links)
{
    const double deadline = now_s() + 30.0;
    unsigned char nonce[NONCE_BYTES];
    randombytes_buf(nonce, sizeof nonce);
    JoinHello h;
    memset(&h, 0, sizeof h);
    JoinVerdict v;
    memset(&v, 0, sizeof v);
    if (send_within(nonce, NONCE_BYTES, TAG_NONCE, c, deadline, "sending the nonce") != ISTH_OK ||
        recv_within(&h, sizeof h, TAG_HELLO, c, deadline, "a joiner's hello") != ISTH_OK) {
        MPI_Comm_free(&c);
        return 0;
    }
    v.ok = check_hello(cfg, &h, nonce, key, run_id, fingerprint, links, v.reason, sizeof v.reason);
    const int site = v.ok ? h.site : 0;
    if (!v.ok) printf("federation: refused a join: %s\n", v.reason);
    else printf("federation: site %s joined (proof verified)\n", cfg->sites[site].name);
    fflush(stdout);
    verdict_mac(&v, nonce, h.nonce, key, v.mac);
    if (send_within(&v, sizeof v, TAG_VERDICT, c, deadline, "the verdict") != ISTH_OK || !v.ok) {
        MPI_Comm_free(&c);
        return 0;
    }
    links[site] = c;
    return site;
}

static int host_accept_all(Federation *f, const Config *cfg, const unsigned char key[KEY_BYTES],
                           const char *run_id, uint64_t fingerprint)
{
    CHECK_MPI(MPI_Open_port(MPI_INFO_NULL, f->port));
    if (MPI_Publish_name(f->service, MPI_INFO_NULL, f->port) != MPI_SUCCESS)
        return isth_fail(ISTH_EINPUT, "federation: cannot publish '%s': start each site's mpirun with "
                         "--ompi-server file:URI of a running ompi-server (scripts/federated.sh), and no other "
                         "run with this run id", f->service);
    f->published = 1;
    printf("federation: site %s hosts run %s; waiting up to %.0f s for %d site(s)\n", cfg->sites[0].name, run_id,
           cfg->outer.join_timeout, cfg->n_sites - 1);
    fflush(stdout);
    const double deadline = now_s() + cfg->outer.join_timeout;
    int joined = 0;
    while (joined < cfg->n_sites - 1) {
        if (now_s() > deadline) {
            char missing[256] = "";
            for (int s = 1; s < cfg->n_sites; s++)
                if (f->leader_link[s] == MPI_COMM_NULL)
                    snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                             missing[0] ? ", " : "", cfg->sites[s].name);
            return isth_fail(ISTH_ERUNTIME, "federation: site(s) %s did not join within %.0f s (outer.join_timeout)",
                             missing, cfg->outer.join_timeout);
        }
        MPI_Comm c;
        /* bounded by pmix_base_exchange_timeout (main.c): then try again */
        if (MPI_Comm_accept(f->port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &c) != MPI_SUCCESS) continue;
        MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
        joined += host_handshake(cfg, c, key, run_id, fingerprint, f->leader_link) > 0;
    }
    return ISTH_OK;
}

/* --- a joiner (another site's first rank) ------------------------------------------ */

static int joiner_connect(Federation *f, const Config *cfg, const char *key_file, const char *run_id,
                          uint64_t fingerprint)
{
    const double deadline = now_s() + cfg->outer.join_timeout;
    MPI_Comm c = MPI_COMM_NULL;
    int found = 0;
    unsigned char key[KEY_BYTES];
    int rc = ISTH_OK;
    while (c == MPI_COMM_NULL) {
        if (now_s() > deadline) {
            if (found) sodium_memzero(key, sizeof key);
            return isth_fail(ISTH_ERUNTIME, "federation: %s: no host %s within %.0f s (outer.join_timeout)",
                             found ? "could not connect to" : "the name service does not know", f->service,
                             cfg->outer.join_timeout);
        }
        if (!found && MPI_Lookup_name(f->service, MPI_INFO_NULL, f->port) != MPI_SUCCESS) {
            sleep(1);
            continue;
        }
        if (!found) { /* the host made the key before it published its name */
            CHECK(read_key(key_file, key));
            found = 1;
        }
        if (MPI_Comm_connect(f->port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &c) != MPI_SUCCESS) c = MPI_COMM_NULL;
    }
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    const double until = now_s() + 30.0;
    unsigned char nonce[NONCE_BYTES];
    JoinHello h;
    memset(&h, 0, sizeof h);
    h.magic = JOIN_MAGIC;
    h.version = JOIN_VERSION;
    h.site = f->site;
    h.ranks = cfg->sites[f->site].ranks;
    h.fingerprint = fingerprint;
    snprintf(h.run_id, sizeof h.run_id, "%s", run_id);
    randombytes_buf(h.nonce, sizeof h.nonce);
    JoinVerdict v;
    memset(&v, 0, sizeof v);
    rc = recv_within(nonce, NONCE_BYTES, TAG_NONCE, c, until, "the host's nonce");
    if (rc == ISTH_OK) {
        hello_mac(&h, nonce, key, h.mac);
        rc = send_within(&h, sizeof h, TAG_HELLO, c, until, "our hello");
    }
    sodium_memzero(key, sizeof key);
    if (rc == ISTH_OK) rc = recv_within(&v, sizeof v, TAG_VERDICT, c, until, "the host's verdict");
    if (rc == ISTH_OK && !v.ok) {
        v.reason[sizeof v.reason - 1] = '\0';
        rc = isth_fail(ISTH_EINPUT, "federation: site %s was refused by site %s: %s", cfg->sites[f->site].name,
                       cfg->sites[0].name, v.reason);
    }
    if (rc != ISTH_OK) {
        MPI_Comm_free(&c);
        return rc;
    }
    printf("federation: site %s joined run %s at site %s\n", cfg->sites[f->site].name, run_id, cfg->sites[0].name);
    fflush(stdout);
    f->leader_link[0] = c;
    return ISTH_OK;
}

/* --- the world ----------------------------------------------------------------- */

/* Site by site in config order: the world so far (the host's ranks, then
 * every site already in) and site s meet through the leaders' link. */
static int build_world(Federation *f, const Config *cfg)
{
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm world = MPI_COMM_WORLD;
    for (int s = 1; s < cfg->n_sites; s++) {
        const int in_world = f->site < s;   /* already part of the world */
        if (f->site > s) continue;          /* joins later */
        MPI_Comm peer = MPI_COMM_NULL;      /* the two leaders, host first */
        const int leader = me == 0 && (f->site == 0 || f->site == s);
        if (leader) CHECK_MPI(MPI_Intercomm_merge(f->leader_link[f->site == 0 ? s : 0], f->site == s, &peer));
        MPI_Comm inter, merged;
        CHECK_MPI(MPI_Intercomm_create(in_world ? world : MPI_COMM_WORLD, 0, peer, in_world ? 1 : 0, TAG_BUILD,
                                       &inter));
        CHECK_MPI(MPI_Intercomm_merge(inter, !in_world, &merged)); /* the newcomer's ranks after */
        MPI_Comm_free(&inter);
        if (peer != MPI_COMM_NULL) MPI_Comm_free(&peer);
        if (world != MPI_COMM_WORLD) MPI_Comm_free(&world);
        world = merged;
    }
    CHECK(fault_mpi_errors_return(world));
    f->world = world;
    return ISTH_OK;
}

int federation_join(Federation *f, const Config *cfg, const char *site_name)
{
    federation_joint(f);
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
    fault_watchdog_arm(cfg->outer.join_timeout + 60.0, "joining the federated run");
    if (me == 0) {
        char path[CONFIG_PATH_MAX + 16];
        key_path(cfg, path, sizeof path);
        if (f->site == 0) {
            unsigned char key[KEY_BYTES];
            rc = ensure_key(path);
            if (rc == ISTH_OK) rc = read_key(path, key);
            if (rc == ISTH_OK) rc = host_accept_all(f, cfg, key, run_id, fingerprint);
            sodium_memzero(key, sizeof key);
        } else {
            rc = joiner_connect(f, cfg, path, run_id, fingerprint);
        }
    }
    int site_rc = rc;
    if (MPI_Bcast(&site_rc, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS) site_rc = ISTH_ERUNTIME;
    if (site_rc == ISTH_OK) site_rc = build_world(f, cfg);
    fault_watchdog_disarm();
    if (site_rc != ISTH_OK) return me == 0 ? rc != ISTH_OK ? rc : site_rc : site_rc;
    int size;
    MPI_Comm_size(f->world, &size);
    if (me == 0 && f->site == 0) {
        printf("federation: %d sites, %d ranks in one world\n", cfg->n_sites, size);
        fflush(stdout);
    }
    return ISTH_OK;
}

void federation_destroy(Federation *f)
{
    if (!f->federated) return;
    if (f->published) MPI_Unpublish_name(f->service, MPI_INFO_NULL, f->port);
    if (f->port[0] && f->site == 0) MPI_Close_port(f->port);
    for (int i = 0; i < CONFIG_MAX_SITES; i++)
        if (f->leader_link[i] != MPI_COMM_NULL) MPI_Comm_free(&f->leader_link[i]);
    if (f->world != MPI_COMM_WORLD && f->world != MPI_COMM_NULL) MPI_Comm_free(&f->world);
    f->world = MPI_COMM_WORLD;
    f->federated = 0;
}
