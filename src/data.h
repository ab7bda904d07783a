/* data.h — the training corpus and the deterministic training windows.
 *
 * Owns: reading corpus files (pread of each window: a file that shrinks
 * under a running job is a one-line error, never a SIGBUS as with a memory
 * map), their two formats, and which training windows each rank reads.
 * A file is either raw bytes (each byte a token, vocabulary 256) or a token
 * shard in llm.c's format: a header of 256 little-endian int32 (magic
 * 20240520 with uint16 tokens, version 1; or 20240801 with uint32 tokens,
 * version 7; then the token count), then the tokens. The training data is
 * one or more such files ([data] train: paths and globs), all of one kind.
 * Every optimiser step has one global batch of windows, numbered 0, 1, 2,
 * ... in (learner, micro-step, rank, sequence) order; window i of step s
 * starts at a position that is a pure function of (seed, s, i), uniform over
 * every window start of every file (a window never spans two files).
 * Learners take disjoint index ranges of each step's batch, so they read
 * disjoint streams of windows; and because the global batch does not depend
 * on the layout, `sync` training with any split into learners and ranks sees
 * the same data as one learner with the combined batch. The reader state is
 * the step counter (DataCursor), a value a checkpoint can store.
 * Must not: know about the model or MPI.
 */
#ifndef ISTHMUS_DATA_H
#define ISTHMUS_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "config.h" /* CONFIG_FILE_PATH_MAX: a data_dir and a file name */

#define SHARD_MAGIC_U16 20240520 /* llm.c's GPT-2 shards: uint16 tokens, version 1 */
#define SHARD_MAGIC_U32 20240801 /* llm.c's LLaMA 3 shards: uint32 tokens, version 7 */
#define SHARD_HEADER_BYTES 1024  /* 256 int32 */

typedef struct {
    int fd;            /* -1 while closed (a dataset keeps a bounded number open) */
    size_t size;       /* bytes at open; a shorter read later is an error */
    int width;         /* bytes per token: 1 (raw bytes), 2 or 4 (a shard) */
    size_t header;     /* bytes before the first token: 0 or SHARD_HEADER_BYTES */
    size_t n_tokens;
    uint32_t magic;    /* the first 4 bytes as a little-endian int32 (0 for a shorter file): the messages name it */
    uint64_t last_use; /* a dataset closes the least recently used file first */
    uint64_t dev, ino;  /* the file opened first: a reopen must find the same one */
    int64_t mtime_ns;
    char path[CONFIG_FILE_PATH_MAX];
} Corpus;

typedef struct {
    uint64_t seed;
    uint64_t step; /* optimiser steps whose windows were drawn */
} DataCursor;

/* Open `dir/name` (`name` alone when it is absolute or dir is empty) and
 * read its format; a missing, unreadable, non-regular (a FIFO: checked
 * without blocking) or too short file, a shard whose header does not
 * match its size, or a file that starts with a shard's magic but is
 * shorter than its header (cut short: never read as bytes), is
 * ISTH_EINPUT with one line naming the path. */
int corpus_open(Corpus *c, const char *dir, const char *name);
/* What a file of `width` bytes per token holds, in words: "raw bytes", "uint16 tokens", "uint32 tokens". */
const char *corpus_kind(int width);
void corpus_close(Corpus *c);

/* Bytes [off, off + n) of the file; ISTH_ERUNTIME naming the file when it
 * no longer has them (truncated or failing during the run). */
int corpus_read(Corpus *c, size_t off, unsigned char *buf, size_t n);

/* Tokens [first, first + n) of the file into out; a token >= vocab is
 * ISTH_EINPUT naming the file and the token's offset. */
int corpus_tokens(Corpus *c, size_t first, size_t n, int *out, int vocab);

/* Does a file of `width` bytes per token suit a model of `vocab` tokens?
 * Raw bytes only a byte model's (vocab 256; under 256 is the caller's own
 * message: raw bytes need 256): a token model reads token shards only, so
 * a shard whose magic is damaged or unknown, read as raw bytes, never
 * trains under it. (A byte model reads a shard as tokens, each below 256.) */
int data_kind_fits(int width, int vocab);
/* ISTH_EINPUT naming the file and its first 4 bytes when !data_kind_fits. */
int corpus_check_kind(const Corpus *c, int vocab);
/* Every token of the file below vocab (read in pieces; a byte file or a
 * uint16 shard under vocab >= 65536 holds none larger): ISTH_EINPUT naming
 * one that is not, as corpus_tokens. For a file checked whole before
 * training (an eval set), not when a window reads it. */
int corpus_check_tokens(Corpus *c, int vocab);

/* `in`, the value of config key `key`, with each ${NAME} replaced by the
 * environment variable's value; ISTH_EINPUT naming the key, the value and
 * the variable when one is not set. */
int data_expand(const char *key, const char *in, char *out, size_t cap);

/* The training files. */
typedef struct {
    Corpus *files;
    int n_files, n_open;
    uint64_t *first_start; /* [n_files + 1]: window starts in the files before file i */
    uint64_t uses;
    int width;
} Dataset;

/* The files of `list` (paths and globs separated by spaces or commas; a
 * ${NAME} is the environment variable's value; relative to dir unless
 * absolute; "" = dir/train.txt), each holding at least one window of T+1
 * tokens, all of one width. ISTH_EINPUT with one line otherwise. */
int dataset_open(Dataset *d, const char *list, const char *dir, int T);
void dataset_close(Dataset *d);
/* Tokens in all files. */
uint64_t dataset_tokens(const Dataset *d);
/* corpus_check_kind of the files (all of one kind: the first names it). */
int dataset_check_kind(const Dataset *d, int vocab);

/* The data's identity, what the sites of a run must agree on (their paths
 * may differ): a hash of the kind, the number of files and, in order, each
 * file's size and first DATA_IDENTITY_BLOCK bytes (a shard's header and
 * its first tokens). */
#define DATA_IDENTITY_BLOCK 8192
int dataset_identity(Dataset *d, uint64_t *id);

/* Fill tokens/targets (B,T) with windows first_index .. first_index+B-1 of
 * step cur->step; a token >= vocab is ISTH_EINPUT naming file and offset. */
int data_fill(const DataCursor *cur, Dataset *d, uint64_t first_index, int *tokens, int *targets, int B, int T,
              int vocab);

#endif
