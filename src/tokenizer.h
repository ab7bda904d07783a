/* tokenizer.h — text to token ids and back, for the commands that take text
 * in or give it out (generate, the samples of train.sample_every).
 *
 * Three kinds: bytes (a byte model, vocab 256: a token is a byte), a
 * sentencepiece model (libsentencepiece, when configure found it), and
 * ids (a token model without its tokenizer: text is token ids written as
 * decimal numbers, separated by spaces, both ways).
 *
 * Owns: the sentencepiece processor (tokenizer_sp.cc, C++ behind a C API)
 * and the check that a tokenizer fits the model (its vocabulary).
 * Must not: read the model or configs (callers pass the path and vocab).
 */
#ifndef ISTHMUS_TOKENIZER_H
#define ISTHMUS_TOKENIZER_H

#include <stddef.h>

typedef enum { TOKENIZER_BYTES, TOKENIZER_SENTENCEPIECE, TOKENIZER_IDS } TokenizerKind;

typedef struct {
    TokenizerKind kind;
    int vocab;
    void *sp; /* the sentencepiece processor (TOKENIZER_SENTENCEPIECE) */
} Tokenizer;

/* Was this build linked with libsentencepiece? */
int tokenizer_have_sentencepiece(void);

/* The tokenizer of a model of `vocab` tokens: `path` a sentencepiece model
 * ("" none: bytes for vocab 256, else ids). A file that cannot be loaded,
 * or whose vocabulary is not `vocab`, or a path given to a build without
 * sentencepiece: ISTH_EINPUT, one line naming the file. */
int tokenizer_open(Tokenizer *t, const char *path, int vocab);
void tokenizer_close(Tokenizer *t);

/* A configured tokenizer path ([data] tokenizer) as a file name: ${NAME}
 * expanded, relative to `dir` unless absolute; "" stays "". */
int tokenizer_resolve(const char *configured, const char *dir, char *out, size_t cap);

/* text -> ids (*ids allocated, *n set); ids outside the vocabulary or a
 * malformed id list: ISTH_EINPUT naming the token. */
int tokenizer_encode(const Tokenizer *t, const char *text, int **ids, size_t *n);
/* ids -> text (*text allocated, NUL-terminated; *len its bytes, which may
 * hold NULs for a byte model). */
int tokenizer_decode(const Tokenizer *t, const int *ids, size_t n, char **text, size_t *len);

/* The C side of tokenizer_sp.cc (NULL/-1 on failure, with a reason). */
void *tokenizer_sp_load(const char *path, char *reason, size_t reason_size);
void tokenizer_sp_free(void *sp);
int tokenizer_sp_vocab(const void *sp);
int tokenizer_sp_encode(const void *sp, const char *text, int **ids, size_t *n);
int tokenizer_sp_decode(const void *sp, const int *ids, size_t n, char **text, size_t *len);

#endif
