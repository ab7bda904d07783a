/* ckpt_validate.h — checking a checkpoint or model file by one rank alone,
 * and `isthmus inspect`.
 *
 * The one validation `inspect`, `eval`, the model file and `--resume`
 * share: structure (the groups a file of its mode and learners must hold,
 * canonical shapes, float32, the fletcher32 filter), attributes and their
 * counters, and with read_data every value read block by block (a chunk at
 * a time, so every checksum is verified, never more than one block in
 * memory) and found finite.
 * Owns: what makes a file valid, and the inspect listing.
 * Must not: write or rename files, use MPI collectives (one rank calls it),
 * or load state into a trainer (ckpt_load.h).
 */
#ifndef ISTHMUS_CKPT_VALIDATE_H
#define ISTHMUS_CKPT_VALIDATE_H

#include <stddef.h>

/* Full validation of one file by the calling rank alone (every dataset read,
 * fletcher32 verified). Returns ISTH_OK or ISTH_EINPUT with `reason`. */
int ckpt_validate(const char *path, char *reason, size_t cap, long *step);
/* The same without reading the values (read_data 0): structure, shapes,
 * types, filters and attributes. --resume checks its candidates this way
 * and the load verifies every value it reads, so the file is read once. */
int ckpt_check(const char *path, char *reason, size_t cap, long *step, int read_data);

/* `isthmus inspect FILE`: attributes, datasets, verdict. */
int ckpt_inspect(const char *path);

#endif
