/* handshake.h — the federated join's handshake: two sites' leaders, once
 * connected (an intercommunicator of one rank a side), prove the run's key
 * to each other and agree on what the joiner joins.
 *
 * Over the leaders' link the host sends a fresh nonce; the joiner answers
 * with the run id, its site, its rank count, its build, the config
 * fingerprint and an HMAC-SHA256 (libsodium) under the run's key over all
 * of it and a nonce of its own; the host checks each and answers with a
 * verdict (a reason when refused) that carries the link keys' epoch, the
 * step a rejoin continues from, and the host's own HMAC over both nonces:
 * the joiner trusts no host without the key. Every message is bounded by a
 * deadline (30 s for the whole exchange).
 *
 * Owns: the wire structs (hello, verdict) and their MACs, the checks of a
 * hello, both sides of the exchange.
 * Must not: find or connect to the other leader (knock.h), read the key
 * file (runkey.h), derive the link's keys, or build the world.
 */
#ifndef ISTHMUS_HANDSHAKE_H
#define ISTHMUS_HANDSHAKE_H

#include <stdint.h>

#include <mpi.h>

#include "config.h"
#include "runkey.h"
#include "seal.h"

/* Host: one accepted connection `c` from the site that knocked (`knocked`),
 * `host` its own site. Returns the joiner's site, its link kept in
 * links[site]; -1 when refused or broken (c freed). rejoin_step: -1 while
 * the run forms, else the live host's step the joiner continues from;
 * joiners: then every site taken back with it (bit s: site s); epoch: the
 * link keys' epoch the verdict carries. */
int handshake_host(const Config *cfg, MPI_Comm c, int host, int knocked, const unsigned char key[RUNKEY_BYTES],
                   const char *run_id, uint64_t fingerprint, MPI_Comm *links, long rejoin_step, uint64_t joiners,
                   const unsigned char epoch[SEAL_EPOCH_BYTES]);

/* Joiner: site `site` over connection `c` to the run's host (`service`,
 * the run's published name, for messages). ISTH_OK when accepted by a host
 * that proved the key: *epoch, *rejoin_step, *host_site (whichever site
 * hosts now) and *joiners (a live rejoin: the sites taken back together,
 * this one among them; checked) are the verdict's, and the outcome is printed. Else the error (ISTH_EINPUT when refused, with the
 * host's reason, or when the host does not prove the key; ISTH_ERUNTIME
 * when it broke off), c freed. */
int handshake_join(const Config *cfg, MPI_Comm c, int site, const unsigned char key[RUNKEY_BYTES],
                   const char *run_id, uint64_t fingerprint, const char *service,
                   unsigned char epoch[SEAL_EPOCH_BYTES], long *rejoin_step, int *host_site, uint64_t *joiners);

#endif
