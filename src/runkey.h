/* runkey.h — the run's key file: the one secret of a federated run, which
 * every site holds a copy of (the join's HMACs and the link's keys derive
 * from it).
 *
 * The key: 32 random bytes (hex) in outer.key_file (default
 * <out_dir>/run.key), created with mode 0600 by the host at its first
 * launch if missing (an exclusive temporary, then link(): a key made
 * meanwhile is kept); refused unless a regular file of this user that group
 * and others cannot read (opened without following links). Every site must
 * hold the same file.
 *
 * Owns: the key file's path, reading and checking it, making a new one, and
 * `isthmus keygen`.
 * Must not: touch MPI, or keep a key: the caller holds it and wipes it
 * (sodium_memzero) when done.
 */
#ifndef ISTHMUS_RUNKEY_H
#define ISTHMUS_RUNKEY_H

#include <stddef.h>

#include "config.h"

#define RUNKEY_BYTES 32

/* outer.key_file, else <out_dir>/run.key */
void runkey_path(const Config *cfg, char *out, size_t size);

/* The key at `path`, checked (regular file, this user's, mode 0600);
 * ISTH_EINPUT naming what is wrong. */
int runkey_read(const char *path, unsigned char key[RUNKEY_BYTES]);

/* The host's first launch makes the key when it has none (and says so). */
int runkey_ensure(const char *path);

/* `isthmus keygen FILE`: a new run key (32 random bytes in hex, mode 0600,
 * directories made); an existing FILE is never overwritten (exit 2). */
int runkey_keygen(const char *path);

#endif
