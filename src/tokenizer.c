/* tokenizer.c — see tokenizer.h. */
#include "tokenizer.h"
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "data.h"
#include "status.h"

int tokenizer_have_sentencepiece(void) { return HAVE_SENTENCEPIECE; }

#if !HAVE_SENTENCEPIECE
/* this build has no libsentencepiece: tokenizer_open refuses a path first */
void *tokenizer_sp_load(const char *path, char *reason, size_t reason_size)
{
    snprintf(reason, reason_size, "this build has no sentencepiece");
    return NULL;
}
void tokenizer_sp_free(void *sp) {}
int tokenizer_sp_vocab(const void *sp) { return -1; }
int tokenizer_sp_encode(const void *sp, const char *text, int **ids, size_t *n) { return -1; }
int tokenizer_sp_decode(const void *sp, const int *ids, size_t n, char **text, size_t *len) { return -1; }
#endif

int tokenizer_open(Tokenizer *t, const char *path, int vocab)
{
    memset(t, 0, sizeof *t);
    t->vocab = vocab;
    if (!path || !*path) {
        t->kind = vocab == 256 ? TOKENIZER_BYTES : TOKENIZER_IDS;
        return ISTH_OK;
    }
    if (!HAVE_SENTENCEPIECE)
        return isth_fail(ISTH_EINPUT, "tokenizer %s: this isthmus was built without libsentencepiece (install "
                         "libsentencepiece-dev and configure again), so text cannot be tokenized; leave the "
                         "tokenizer out to give and get token ids", path);
    char reason[256];
    t->sp = tokenizer_sp_load(path, reason, sizeof reason);
    if (!t->sp) return isth_fail(ISTH_EINPUT, "tokenizer %s: cannot load: %s", path, reason);
    const int n = tokenizer_sp_vocab(t->sp);
    if (n != vocab) {
        tokenizer_close(t);
        return isth_fail(ISTH_EINPUT, "tokenizer %s: a vocabulary of %d pieces, the model's is %d: not this model's "
                         "tokenizer", path, n, vocab);
    }
    t->kind = TOKENIZER_SENTENCEPIECE;
    return ISTH_OK;
}

int tokenizer_resolve(const char *configured, const char *dir, char *out, size_t cap)
{
    out[0] = '\0';
    if (!configured[0]) return ISTH_OK;
    char expanded[CONFIG_FILE_PATH_MAX];
    CHECK(data_expand("data.tokenizer", configured, expanded, sizeof expanded));
    const int n = expanded[0] != '/' && dir[0] ? snprintf(out, cap, "%s/%s", dir, expanded)
                                               : snprintf(out, cap, "%s", expanded);
    if (n < 0 || (size_t)n >= cap) return isth_fail(ISTH_EINPUT, "tokenizer %s: path too long", configured);
    return ISTH_OK;
}

void tokenizer_close(Tokenizer *t)
{
    if (t->sp) tokenizer_sp_free(t->sp);
    t->sp = NULL;
}

/* "12 7 301" -> ids, each checked against the vocabulary. */
static int parse_ids(const Tokenizer *t, const char *text, int **ids, size_t *n)
{
    size_t cap = strlen(text) / 2 + 1, k = 0;
    int *v = isth_malloc(cap * sizeof(int));
    if (!v) return isth_fail(ISTH_ERUNTIME, "out of memory for the prompt");
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        const long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id >= t->vocab) {
            const int len = (int)strcspn(p, " \t\n,");
            isth_free(v);
            return isth_fail(ISTH_EINPUT, "prompt: '%.*s' is not a token id below the vocabulary's %d (without its "
                             "tokenizer a token model's prompt is ids separated by spaces)", len, p, t->vocab);
        }
        v[k++] = (int)id;
        p = end;
    }
    *ids = v;
    *n = k;
    return ISTH_OK;
}

int tokenizer_encode(const Tokenizer *t, const char *text, int **ids, size_t *n)
{
    if (t->kind == TOKENIZER_IDS) return parse_ids(t, text, ids, n);
    if (t->kind == TOKENIZER_SENTENCEPIECE) {
        if (tokenizer_sp_encode(t->sp, text, ids, n)) return isth_fail(ISTH_ERUNTIME, "prompt: sentencepiece cannot encode it");
        return ISTH_OK;
    }
    const size_t len = strlen(text);
    int *v = isth_malloc((len + 1) * sizeof(int));
    if (!v) return isth_fail(ISTH_ERUNTIME, "out of memory for the prompt");
    for (size_t i = 0; i < len; i++) v[i] = (unsigned char)text[i];
    *ids = v;
    *n = len;
    return ISTH_OK;
}

int tokenizer_decode(const Tokenizer *t, const int *ids, size_t n, char **text, size_t *len)
{
    if (t->kind == TOKENIZER_SENTENCEPIECE) {
        if (tokenizer_sp_decode(t->sp, ids, n, text, len)) return isth_fail(ISTH_ERUNTIME, "sentencepiece cannot decode the sample");
        return ISTH_OK;
    }
    const size_t cap = t->kind == TOKENIZER_BYTES ? n + 1 : n * 9 + 1;
    char *s = isth_malloc(cap);
    if (!s) return isth_fail(ISTH_ERUNTIME, "out of memory for the sample");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->kind == TOKENIZER_BYTES) s[k++] = (char)ids[i];
        else k += (size_t)snprintf(s + k, cap - k, "%s%d", i ? " " : "", ids[i]);
    }
    s[k] = '\0';
    *text = s;
    *len = k;
    return ISTH_OK;
}
