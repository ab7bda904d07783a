/* data.h — the byte corpus and the deterministic training windows.
 *
 * Owns: reading corpus files (pread of each window: a file that shrinks
 * under a running job is a one-line error, never a SIGBUS as with a memory
 * map), and which training windows each rank
 * reads. Every optimiser step has one global batch of windows, numbered
 * 0, 1, 2, ... in (learner, micro-step, rank, sequence) order; window i of
 * step s starts at a position that is a pure function of (seed, s, i),
 * uniform over the file. Learners take disjoint index ranges of each step's
 * batch, so they read disjoint streams of windows; and because the global
 * batch does not depend on the layout, `sync` training with any split into
 * learners and ranks sees the same data as one learner with the combined
 * batch. The reader state is the step counter (DataCursor), a value a
 * checkpoint can store.
 * Must not: know about the model or MPI.
 */
#ifndef ISTHMUS_DATA_H
#define ISTHMUS_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "config.h" /* CONFIG_FILE_PATH_MAX: a data_dir and a file name */

typedef struct {
    int fd, is_open;
    size_t size;       /* at open; a shorter read later is an error */
    char path[CONFIG_FILE_PATH_MAX];
} Corpus;

typedef struct {
    uint64_t seed;
    uint64_t step; /* optimiser steps whose windows were drawn */
} DataCursor;

/* Open `dir/name`; a missing, unreadable, non-regular (a FIFO: checked
 * without blocking) or too short file is ISTH_EINPUT with a message naming
 * the path. */
int corpus_open(Corpus *c, const char *dir, const char *name);
void corpus_close(Corpus *c);

/* Bytes [off, off + n) of the file; ISTH_ERUNTIME naming the file when it
 * no longer has them (truncated or failing during the run). */
int corpus_read(const Corpus *c, size_t off, unsigned char *buf, size_t n);

/* Check that the file holds at least one window of T+1 bytes. */
int data_check_windows(const Corpus *c, int T);

/* Fill tokens/targets (B,T) with windows first_index .. first_index+B-1 of
 * step cur->step. */
int data_fill(const DataCursor *cur, const Corpus *c, uint64_t first_index, int *tokens,
              int *targets, int B, int T);

#endif
