/* data.h — the byte corpus and the deterministic training-window streams.
 *
 * Owns: memory-mapping corpus files, and which training windows a learner
 * reads. The training file is split into `nstreams` contiguous shards, one
 * per learner, so learners read disjoint bytes; inside its shard a stream
 * draws windows of T+1 bytes at positions that are a pure function of
 * (seed, stream, draw counter). The whole reader state is the DataCursor
 * value — saving it in a checkpoint and restoring it resumes the stream
 * exactly.
 * Must not: know about the model or MPI.
 */
#ifndef ISTHMUS_DATA_H
#define ISTHMUS_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const unsigned char *bytes;
    size_t size;
    char path[1024];
} Corpus;

typedef struct {
    uint64_t seed;
    uint64_t stream, nstreams;
    uint64_t drawn; /* windows drawn so far */
} DataCursor;

/* Map `dir/name`; a missing, unreadable or empty file is ISTH_EINPUT with
 * a message naming the path. */
int corpus_open(Corpus *c, const char *dir, const char *name);
void corpus_close(Corpus *c);

/* Check that every stream's shard holds at least one window of T+1 bytes. */
int data_cursor_init(DataCursor *cur, const Corpus *c, uint64_t seed, int stream, int nstreams, int T);

/* Fill tokens/targets (B,T) with the next B windows of the stream. */
void data_next_batch(DataCursor *cur, const Corpus *c, int *tokens, int *targets, int B, int T);

#endif
