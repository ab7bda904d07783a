/* handshake.c — see handshake.h. */
#include "handshake.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "clock.h"
#include "fault.h"
#include "status.h"
#include "version.h"

#define JOIN_MAGIC 0x6a6f696eu /* "join" */
#define JOIN_VERSION 6u /* 3: the verdict carries the link keys' epoch; 4: the hello the build; 5: the verdict the host's
                           * site; 6: the sites taken back together */
#define NONCE_BYTES 32
#define TAG_NONCE 41
#define TAG_HELLO 42
#define TAG_VERDICT 43

/* What a joiner sends: every field is covered by the MAC. */
typedef struct {
    uint32_t magic, version;
    int32_t site, ranks;
    uint64_t fingerprint;
    char run_id[64];
    char build[64];   /* isthmus_build(): both sites run the same program */
    unsigned char nonce[NONCE_BYTES]; /* the joiner's: the host proves the key over it */
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
} JoinHello;

/* The host's answer, its MAC over both nonces and every field: a joiner
 * trusts no host that cannot prove the key (a process that published the
 * run's name first would otherwise receive every payload). */
typedef struct {
    int32_t ok;
    int32_t host;        /* the host's site: after a loss any live site may host */
    int64_t rejoin_step; /* -1: the run is forming; else the live host's step to continue from */
    uint64_t joiners;    /* a live rejoin: every site taken back with this one (bit s: site s), itself included */
    char reason[200];
    unsigned char epoch[SEAL_EPOCH_BYTES]; /* the link keys' epoch (seal.h), fresh each time the sites meet */
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
} JoinVerdict;

static void hello_mac(const JoinHello *h, const unsigned char nonce[NONCE_BYTES],
                      const unsigned char key[RUNKEY_BYTES], unsigned char out[crypto_auth_hmacsha256_BYTES])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, RUNKEY_BYTES);
    crypto_auth_hmacsha256_update(&st, nonce, NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)h, offsetof(JoinHello, mac));
    crypto_auth_hmacsha256_final(&st, out);
}

static void verdict_mac(const JoinVerdict *v, const unsigned char host_nonce[NONCE_BYTES],
                        const unsigned char joiner_nonce[NONCE_BYTES], const unsigned char key[RUNKEY_BYTES],
                        unsigned char out[crypto_auth_hmacsha256_BYTES])
{
    static const unsigned char label[] = "isthmus verdict";
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, RUNKEY_BYTES);
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
            return isth_fail(ISTH_ERUNTIME, "federation: %s: no answer before the deadline (%s)", what, FAULT_HINT_NET);
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

/* --- the host ------------------------------------------------------------------------------- */

/* Check one joiner's hello; on refusal `reason` says why. */
static int check_hello(const Config *cfg, const JoinHello *h, int host, int knocked, const unsigned char nonce[NONCE_BYTES],
                       const unsigned char key[RUNKEY_BYTES], const char *run_id, uint64_t fingerprint,
                       const MPI_Comm *links, char *reason, size_t size)
{
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
    if (h->magic != JOIN_MAGIC || h->version != JOIN_VERSION) {
        snprintf(reason, size, "not an isthmus join of this version (magic %08x, version %u)", h->magic, h->version);
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
    if (strncmp(h->build, isthmus_build(), sizeof h->build - 1)) {
        snprintf(reason, size, "site %d runs isthmus %.63s, this site %s: every site of a run must run the same build",
                 (int)h->site, h->build, isthmus_build());
        return 0;
    }
    if (h->fingerprint != fingerprint) {
        snprintf(reason, size, "config fingerprint %016llx differs from this run's %016llx ([model], [outer], "
                 "[site.*] and the schedule must match)", (unsigned long long)h->fingerprint,
                 (unsigned long long)fingerprint);
        return 0;
    }
    if (h->site < 0 || h->site >= cfg->n_sites || h->site == host || h->site != knocked) {
        snprintf(reason, size, "site %d is not a joining site of this run, or not the one that knocked (%d)", h->site,
                 knocked);
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

/* One accepted connection from the site that knocked: the handshake.
 * Returns the joiner's site (its link kept in links[]), -1 when refused or
 * broken (link freed). rejoin_step: -1 while the run forms, else the live
 * host's step the joiner continues from. */
int handshake_host(const Config *cfg, MPI_Comm c, int host, int knocked, const unsigned char key[RUNKEY_BYTES],
                   const char *run_id, uint64_t fingerprint, MPI_Comm *links, long rejoin_step, uint64_t joiners,
                   const unsigned char epoch[SEAL_EPOCH_BYTES])
{
    const double deadline = now_s() + 30.0;
    unsigned char nonce[NONCE_BYTES];
    randombytes_buf(nonce, sizeof nonce);
    JoinHello h;
    memset(&h, 0, sizeof h);
    JoinVerdict v;
    memset(&v, 0, sizeof v);
    v.rejoin_step = rejoin_step;
    v.joiners = rejoin_step < 0 ? 0 : joiners;
    v.host = host;
    memcpy(v.epoch, epoch, sizeof v.epoch);
    if (send_within(nonce, NONCE_BYTES, TAG_NONCE, c, deadline, "sending the nonce") != ISTH_OK ||
        recv_within(&h, sizeof h, TAG_HELLO, c, deadline, "a joiner's hello") != ISTH_OK) {
        MPI_Comm_free(&c);
        return -1;
    }
    v.ok = check_hello(cfg, &h, host, knocked, nonce, key, run_id, fingerprint, links, v.reason, sizeof v.reason);
    const int site = v.ok ? h.site : -1;
    if (!v.ok) printf("federation: refused a join: %s\n", v.reason);
    else if (rejoin_step < 0) printf("federation: site %s joined (proof verified)\n", cfg->sites[site].name);
    else printf("federation: site %s rejoins at step %ld (proof verified)\n", cfg->sites[site].name, rejoin_step);
    fflush(stdout);
    verdict_mac(&v, nonce, h.nonce, key, v.mac);
    if (send_within(&v, sizeof v, TAG_VERDICT, c, deadline, "the verdict") != ISTH_OK || !v.ok) {
        MPI_Comm_free(&c);
        return -1;
    }
    links[site] = c;
    return site;
}

/* --- the joiner -------------------------------------------------------------------------------- */

int handshake_join(const Config *cfg, MPI_Comm c, int site, const unsigned char key[RUNKEY_BYTES],
                   const char *run_id, uint64_t fingerprint, const char *service,
                   unsigned char epoch[SEAL_EPOCH_BYTES], long *rejoin_step, int *host_site, uint64_t *joiners)
{
    const double until = now_s() + 30.0;
    unsigned char nonce[NONCE_BYTES];
    JoinHello h;
    memset(&h, 0, sizeof h);
    h.magic = JOIN_MAGIC;
    h.version = JOIN_VERSION;
    h.site = site;
    h.ranks = cfg->sites[site].ranks;
    h.fingerprint = fingerprint;
    snprintf(h.run_id, sizeof h.run_id, "%s", run_id);
    snprintf(h.build, sizeof h.build, "%s", isthmus_build());
    randombytes_buf(h.nonce, sizeof h.nonce);
    JoinVerdict v;
    memset(&v, 0, sizeof v);
    int rc = recv_within(nonce, NONCE_BYTES, TAG_NONCE, c, until, "the host's nonce");
    if (rc == ISTH_OK) {
        hello_mac(&h, nonce, key, h.mac);
        rc = send_within(&h, sizeof h, TAG_HELLO, c, until, "our hello");
    }
    if (rc == ISTH_OK) rc = recv_within(&v, sizeof v, TAG_VERDICT, c, until, "the host's verdict");
    int proven = 0; /* the host proves the key too: an acceptance that does not verify is not one */
    if (rc == ISTH_OK) {
        unsigned char mac[crypto_auth_hmacsha256_BYTES];
        verdict_mac(&v, nonce, h.nonce, key, mac);
        proven = sodium_memcmp(mac, v.mac, sizeof mac) == 0;
        if (proven && v.ok) memcpy(epoch, v.epoch, SEAL_EPOCH_BYTES); /* the host's epoch, verified */
        if (proven && v.ok && (v.host < 0 || v.host >= cfg->n_sites || v.host == site))
            rc = isth_fail(ISTH_ERUNTIME, "federation: the host of %s names site index %d as its own: not joining",
                           service, (int)v.host);
        /* a rejoin's set of joiners: this site in it, the host and sites the config lacks not; several
         * only from a host left alone, which takes every other site back together */
        const uint64_t sites = cfg->n_sites >= 64 ? ~0ull : (1ull << cfg->n_sites) - 1;
        const int several = (v.joiners & (v.joiners - 1)) != 0;
        if (rc == ISTH_OK && proven && v.ok && v.rejoin_step >= 0 &&
            (!(v.joiners >> site & 1) || (v.joiners & ~sites) || (v.joiners >> v.host & 1) ||
             (several && v.joiners != (sites & ~(1ull << v.host)))))
            rc = isth_fail(ISTH_ERUNTIME, "federation: the host of %s names the sites taken back as %#llx: not "
                           "joining", service, (unsigned long long)v.joiners);
    }
    /* a refusal names the site that answered only when it is one */
    const char *host = v.host >= 0 && v.host < cfg->n_sites ? cfg->sites[v.host].name : "?";
    if (rc == ISTH_OK && !v.ok) { /* a refusal's reason is shown, verified or not: it grants nothing */
        v.reason[sizeof v.reason - 1] = '\0';
        rc = isth_fail(ISTH_EINPUT, "federation: site %s was refused by site %s: %s", cfg->sites[site].name,
                       host, v.reason);
    } else if (rc == ISTH_OK && !proven) {
        rc = isth_fail(ISTH_EINPUT, "federation: the host of %s does not prove the run's key: not joining",
                       service);
    }
    if (rc != ISTH_OK) {
        MPI_Comm_free(&c);
        return rc;
    }
    *rejoin_step = v.rejoin_step;
    if (v.rejoin_step < 0)
        printf("federation: site %s joined run %s at site %s\n", cfg->sites[site].name, run_id, host);
    else
        printf("federation: site %s rejoins run %s at site %s's step %ld\n", cfg->sites[site].name, run_id,
               host, (long)v.rejoin_step);
    fflush(stdout);
    *host_site = v.host;
    *joiners = v.rejoin_step < 0 ? 0 : v.joiners;
    return ISTH_OK;
}
