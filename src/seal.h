/* seal.h — the keys and the authenticated encryption of the link's frames.
 *
 * Keys: a run's link master key is BLAKE2b-256 keyed with the run key (the
 * 32 bytes of outer.key_file) over a label, the run id and a 32-byte epoch
 * that the hosting site draws at random each time the sites meet (the run
 * forming, a live rejoin) and sends inside its MAC-covered join verdict:
 * frames recorded before a restart or a rejoin never verify after it. From
 * the master, libsodium's KDF derives one key per ordered pair of sites
 * (from, to): a frame's key names its direction, so a frame reflected back
 * to its sender, or sent on by a third site, does not verify either.
 * Frames: XChaCha20-Poly1305 (IETF) with a random 192-bit nonce per frame
 * (random nonces are safe at that size: no counter to keep across
 * restarts). With encryption the payload is encrypted in place and the
 * header (nonce and tag excepted) is the associated data; without it the
 * header and the payload together are the associated data of an empty
 * message: authenticated, readable on the path.
 * Owns: the key derivation and the seal/open of one buffer. Must not: know
 * the frame's fields or decide what a failure means (link.c does).
 */
#ifndef ISTHMUS_SEAL_H
#define ISTHMUS_SEAL_H

#include <stddef.h>

#define SEAL_KEY_BYTES 32
#define SEAL_NONCE_BYTES 24
#define SEAL_TAG_BYTES 16
#define SEAL_EPOCH_BYTES 32

/* libsodium ready (idempotent); 0 on success. */
int seal_init(void);
/* The link master key of a run (see above). */
void seal_master(unsigned char master[SEAL_KEY_BYTES], const unsigned char run_key[SEAL_KEY_BYTES],
                 const char *run_id, const unsigned char epoch[SEAL_EPOCH_BYTES]);
/* The key of frames sent by site `from` to site `to`. */
void seal_pair_key(unsigned char key[SEAL_KEY_BYTES], const unsigned char master[SEAL_KEY_BYTES], int from, int to);
/* Random bytes (nonces, epochs, keys). */
void seal_random(void *buf, size_t n);
/* Zero key material (not optimised away). */
void seal_wipe(void *buf, size_t n);
/* A 64-bit fingerprint of a master key (a labelled hash: it reveals nothing
 * of the key), for ranks to check that they hold the same one. */
unsigned long long seal_fingerprint(const unsigned char master[SEAL_KEY_BYTES]);

/* Seal: a fresh nonce into `nonce`, the tag into `tag`. `ad` (ad_len bytes)
 * is authenticated; the n bytes at `payload` are encrypted in place when
 * `encrypt`, else authenticated with `ad` (they must follow it in memory:
 * payload == ad + ad_len). */
void seal_frame(const unsigned char key[SEAL_KEY_BYTES], int encrypt, unsigned char nonce[SEAL_NONCE_BYTES],
                unsigned char tag[SEAL_TAG_BYTES], const unsigned char *ad, size_t ad_len, unsigned char *payload,
                size_t n);
/* Open what seal_frame sealed: 0 and the payload decrypted in place, or -1
 * (the payload is then unspecified: never use it). */
int seal_open(const unsigned char key[SEAL_KEY_BYTES], int encrypt, const unsigned char nonce[SEAL_NONCE_BYTES],
              const unsigned char tag[SEAL_TAG_BYTES], const unsigned char *ad, size_t ad_len, unsigned char *payload,
              size_t n);

#endif
