/* federation.h — the federated launch: one mpirun per site (its
 * MPI_COMM_WORLD is the site), the sites joined at run time through Open
 * MPI's name service (ompi-server) into one world communicator that the
 * trainer uses exactly as it uses MPI_COMM_WORLD in the joint launch (every
 * site's ranks, in the config's site order).
 *
 * How sites join. The first site in the config's order hosts: its first
 * rank opens a port and publishes it as "isthmus-<run id>"; the first rank
 * of every other site looks the name up, knocks (publishes
 * "isthmus-<run id>-knock-<site>" = a fresh value), and connects when the
 * host answers "...-come-<site>" with that value just before it accepts
 * (knock.h says why accept and connect are never left waiting on spec).
 * The same knock takes a lost site back into the live run: after a loss
 * the host stays while it is live, else the first live site hosts, and
 * the host looks for the knock between steps (federation_knocking); a
 * restarted first site knocks before it hosts anything itself
 * (FEDERATION_PROBE_S). Only the two leaders take part in the knock
 * (MPI_COMM_SELF): Open MPI 4.1 bounds a leader's accept and connect by
 * pmix_base_exchange_timeout (main.c sets it before MPI_Init), where a
 * collective accept left waiting would hold the other ranks forever.
 * Over the leaders' link the two prove the run's key to each other
 * (handshake.h); a joiner refused exits 2, the host keeps waiting,
 * undisturbed. When every site has joined, the world so far takes in each
 * site in config order: a "go" over the leaders' link, then a collective
 * accept on the host's port matched by the site's collective connect, and
 * a merge (a collective connect introduces every rank of both sides to
 * each other; MPI_Intercomm_create over the leaders' link did not, and a
 * third site never met the second).
 * The whole join runs under the fault watchdog (outer.join_timeout + 60 s):
 * a peer that stops answering part-way ends the process with one line. The
 * merges (bounded by federation_build_s) and the trainer's set-up over the
 * new world (federation_setup_s) end it with exit 3 instead: both sites
 * start again and join again.
 * With outer.join_timeout = 0 (two sites only) the leader waits without a
 * limit, naming whom every minute, its every poll re-arming the watchdog,
 * until the other site comes or the caller's stop flag (a signal) is
 * raised; the world's collectives after it keep a finite bound.
 *
 * The key: outer.key_file (runkey.h), made by the host at its first launch
 * if missing; every site must hold the same file.
 *
 * The link's keys: the host draws a random epoch for the run as it forms
 * and a new one for every live rejoin, and sends it in its verdict (under
 * its HMAC); each leader derives the link master key from the run key, the
 * run id and the epoch (seal_master) and gives it to its site's ranks.
 *
 * Owns: the run id, the fingerprint and the published name, the order of a
 * join (who hosts, who knocks, when each gives up), the leaders'
 * communicators and the world made of them, the host side of a live
 * rejoin, and the link's master key. The key file (runkey.h), the knock and
 * the wait (knock.h) and the handshake (handshake.h) are its parts.
 * Must not: train or carry payloads (the link does, over this world), or
 * retry a join once it was refused.
 */
#ifndef ISTHMUS_FEDERATION_H
#define ISTHMUS_FEDERATION_H

#include <signal.h>
#include <stdint.h>

#include <mpi.h>

#include "config.h"
#include "seal.h"

typedef struct {
    int federated;       /* 0: the joint launch (world is MPI_COMM_WORLD) */
    int site;            /* this mpirun's site (config index) */
    MPI_Comm world;      /* every site's ranks in config order */
    MPI_Comm leader_link[CONFIG_MAX_SITES]; /* host: one per site it took in; joiner: [host_site] */
    char service[96];    /* "isthmus-<run id>" */
    char port[MPI_MAX_PORT_NAME];
    int published;       /* the host's name is in the name service */
    char knock_seen[CONFIG_MAX_SITES][64]; /* host: the knock value last tried per site */
    unsigned long beats;                   /* host: its "busy" answers so far (knock_ack's beat) */
    long rejoin_step;    /* joiner: the live host's step to continue from; -1 the run is forming */
    uint64_t rejoiners;  /* joiner of a live run: the sites taken back together (bit s), itself among them */
    int hosting;         /* this site has a port open under the run's name (the first site; a survivor) */
    int host_site;       /* the site that hosts now (every site: after a loss, the first live one) */
    /* the link's master key (seal.h) on every rank: federated, from the run
     * key and the epoch of the sites' last meeting; joint, see
     * federation_joint_keys */
    unsigned char link_master[SEAL_KEY_BYTES];
    /* the caller's flag, raised by a stop signal (SIGUSR1, SIGTERM, SIGUSR2): it
     * ends a wait for the other sites */
    const volatile sig_atomic_t *stop_flag;
    int stopped;         /* the join ended on that signal before the run formed */
} Federation;

/* How long a restarted first site waits for a live run to answer its knock
 * (a "busy" answer, given within the host's next step, extends it to
 * checkpoint.timeout + FEDERATION_SETUP_S) before it hosts the run's
 * forming itself. */
#define FEDERATION_PROBE_S 10.0

/* outer.join_timeout = 0: the sites wait for each other without a limit,
 * until a stop signal (a job's time limit: it exits 0 and requeues). The
 * leader's every poll then re-arms the watchdog for this long (an accept,
 * a connect and the 30 s handshake fit), and the collectives that make the
 * world get FEDERATION_SETUP_S. */
#define FEDERATION_HEARTBEAT_S 120.0
#define FEDERATION_SETUP_S 180.0
/* the bound on the federated set-up's collectives across sites (joining,
 * the trainer's communicators, a rejoin) */
double federation_setup_s(const Config *cfg);
/* The merges that make the world once the leaders have verified each
 * other take seconds. An MPI error in them, or this bound passed, means
 * the join broke inside Open MPI (seen under load: the out-of-band TCP
 * connection between the two mpiruns failed, one side's merge returned an
 * error and the other's never returned): the site exits 3 and, started
 * again (scripts/federated.sh does), joins again. The bound, (outer.
 * join_timeout − FEDERATION_PROBE_S) / 2 within 5 to 60 s, is short enough
 * that a site started again at once (it probes for a live run, then hosts
 * or knocks) still waits when the other, which sat out the bound, comes
 * back — for two sites with join_timeout >= 30 s. With more sites a site
 * that joined early waits in the merges for the last to join: the bound
 * is federation_setup_s's, and a broken join there may end the run. */
double federation_build_s(const Config *cfg);

/* The joint launch: world = MPI_COMM_WORLD. */
void federation_joint(Federation *f);
/* The joint launch's link keys, collectively over MPI_COMM_WORLD: with
 * outer.key_file set, every rank reads it and rank 0's random epoch is
 * sent to all (frames authenticated as in the federated launch); without
 * it, rank 0's random master key is sent to all over MPI — the path the
 * frames take, so they are checked against accidents, not an attacker:
 * the joint launch is for sites joined by a network they trust. */
int federation_joint_keys(Federation *f, const Config *cfg);

/* Join the federated run as [site.<site_name>] (this mpirun's ranks, all of
 * them, collectively). ISTH_EINPUT (exit 2) for a wrong site, rank count,
 * key or config, and when the host refuses us; ISTH_ERUNTIME when a site
 * does not join within outer.join_timeout or the name service fails.
 * ISTH_OK with f->stopped set when *stop_flag ended the wait (every rank
 * of the site learns it): the run did not form, nothing was trained. The
 * leader prints who it waits for when it starts and every minute after. */
int federation_join(Federation *f, const Config *cfg, const char *site_name, const volatile sig_atomic_t *stop_flag);

/* The live rejoin, host side. After each loss (out[s] != 0: site s is out
 * of the run), collectively over this site's ranks, on every live site:
 * the host stays while it is live, else the first live site in config
 * order hosts from now on; the host opens a port if it has none and
 * publishes it under the run's name, replacing any other (a lost host's:
 * a restarted site must find the live run). */
int federation_host(Federation *f, const Config *cfg, const unsigned char *out);
/* Between steps, collectively over the host's ranks: is the lost `site`
 * knocking with a value not yet tried? (it is told "busy" at once) */
int federation_knocking(Federation *f, int site);
/* Take the knocking sites back in at `step`, collectively over every rank
 * of every live site (out[s] != 0: site s is out of the run; every site out
 * is taken, `take` bit s: site s — one, or all of them at once when this
 * site is the only one left): the host's leader answers each knock in
 * config order with the handshake of the run's forming (the verdict names
 * the step, the sites taken together and a new keys' epoch, which every
 * live site's leader turns into the link's keys with its own copy of the
 * run key), then the live sites' ranks take in the joiners', one site
 * after another, and the new world is put in config order. *joined = 1
 * and *old_world = the world it replaces (free it with
 * federation_free_world once nothing uses it); *joined = 0 when a joiner
 * gave up or was refused: nothing changed (a joiner already answered
 * waits for the merge until its bound, exits 3 and knocks again). */
int federation_rejoin(Federation *f, const Config *cfg, const unsigned char *out, uint64_t take, long step, int *joined,
                      MPI_Comm *old_world);
void federation_free_world(MPI_Comm *world);

/* Unpublish the name (host) and free the communicators (MPI_Comm_free:
 * Open MPI 4.1's MPI_Comm_disconnect hangs on a dead peer). */
void federation_destroy(Federation *f);

/* What two sites must agree on to train together: the resolved config
 * without the keys each site may set for itself ([data], [checkpoint],
 * out_dir, threads, backend, precision, gpu_share, log_every, eval_every,
 * the key file and join timeout). */
uint64_t federation_fingerprint(const Config *cfg);

/* The run id: outer.run_id, else the fingerprint in hex. */
void federation_run_id(const Config *cfg, char *out, size_t size);

#endif
