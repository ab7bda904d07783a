/* data.c — see data.h. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "rng.h"
#include "status.h"

#define DATA_MAX_OPEN 128 /* files a dataset keeps open at once (a shard set may have thousands) */

static uint32_t le32(const unsigned char *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* open the path read-only; its size must be at least `want` (0: none yet) */
static int open_checked(Corpus *c, size_t want)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    int fd = open(c->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        struct stat st;
        char xz[sizeof c->path + 3]; /* path.xz */
        snprintf(xz, sizeof xz, "%s.xz", c->path);
        if (errno == ENOENT && stat(xz, &st) == 0)
            return isth_fail(ISTH_EINPUT, "data file %s: missing (only %s exists; run 'make' to decompress it)",
                             c->path, xz);
        return isth_fail(want ? ISTH_ERUNTIME : ISTH_EINPUT, "data file %s: cannot open: %s", c->path,
                         strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "data file %s: not a regular file", c->path);
    }
    const int64_t mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (want && (size_t)st.st_size < want) {
        close(fd);
        return isth_fail(ISTH_ERUNTIME, "data file %s: now %lld bytes, was %zu when the run opened it (truncated "
                         "during the run)", c->path, (long long)st.st_size, want);
    }
    if (want && ((uint64_t)st.st_dev != c->dev || (uint64_t)st.st_ino != c->ino || mtime != c->mtime_ns)) {
        close(fd); /* opened again (a dataset keeps a bounded number open): the run's data must not change */
        return isth_fail(ISTH_ERUNTIME, "data file %s: replaced or modified since the run opened it", c->path);
    }
    c->dev = (uint64_t)st.st_dev;
    c->ino = (uint64_t)st.st_ino;
    c->mtime_ns = mtime;
    c->fd = fd;
    c->size = want ? want : (size_t)st.st_size;
    return ISTH_OK;
}

/* a shard's header against its size */
static int read_format(Corpus *c)
{
    unsigned char h[12] = {0};
    const size_t head = c->size < sizeof h ? c->size : sizeof h;
    if (pread(c->fd, h, head, 0) != (ssize_t)head)
        return isth_fail(ISTH_EINPUT, "data file %s: cannot read its first bytes: %s", c->path, strerror(errno));
    c->magic = c->size >= 4 ? le32(h) : 0;
    /* a shard cut inside its header would otherwise be read as raw bytes */
    if (c->size < SHARD_HEADER_BYTES && (c->magic == SHARD_MAGIC_U16 || c->magic == SHARD_MAGIC_U32))
        return isth_fail(ISTH_EINPUT, "data file %s: starts with a token shard's magic %u but has %zu bytes, less "
                         "than the %d-byte header (cut short)", c->path, c->magic, c->size, SHARD_HEADER_BYTES);
    if (c->size >= SHARD_HEADER_BYTES && (le32(h) == SHARD_MAGIC_U16 || le32(h) == SHARD_MAGIC_U32)) {
        const uint32_t magic = le32(h), version = le32(h + 4), want_version = magic == SHARD_MAGIC_U16 ? 1 : 7;
        const int32_t count = (int32_t)le32(h + 8);
        c->width = magic == SHARD_MAGIC_U16 ? 2 : 4;
        c->header = SHARD_HEADER_BYTES;
        if (version != want_version)
            return isth_fail(ISTH_EINPUT, "data file %s: token shard (magic %u) of version %u at byte 4, expected %u",
                             c->path, magic, version, want_version);
        if (count < 0 || c->size != SHARD_HEADER_BYTES + (size_t)count * (size_t)c->width)
            return isth_fail(ISTH_EINPUT, "data file %s: its header (byte 8) says %d tokens of %d bytes, %zu bytes "
                             "with the header; the file has %zu", c->path, count, c->width,
                             SHARD_HEADER_BYTES + (size_t)(count < 0 ? 0 : count) * (size_t)c->width, c->size);
        c->n_tokens = (size_t)count;
    } else {
        c->width = 1;
        c->header = 0;
        c->n_tokens = c->size;
    }
    if (c->n_tokens < 2)
        return isth_fail(ISTH_EINPUT, "data file %s: %zu %s; a corpus needs at least 2 (one to predict)", c->path,
                         c->n_tokens, c->width == 1 ? "byte(s)" : "token(s)");
    return ISTH_OK;
}

const char *corpus_kind(int width) { return width == 1 ? "raw bytes" : width == 2 ? "uint16 tokens" : "uint32 tokens"; }

int corpus_open(Corpus *c, const char *dir, const char *name)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    int n = name[0] == '/' || !dir[0] ? snprintf(c->path, sizeof c->path, "%s", name)
                                      : snprintf(c->path, sizeof c->path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof c->path) return isth_fail(ISTH_EINPUT, "data: path too long: %s/%s", dir, name);
    CHECK(open_checked(c, 0));
    const int rc = read_format(c);
    if (rc != ISTH_OK) corpus_close(c);
    return rc;
}

void corpus_close(Corpus *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

int corpus_read(Corpus *c, size_t off, unsigned char *buf, size_t n)
{
    if (c->fd < 0) CHECK(open_checked(c, c->size));
    size_t done = 0;
    while (done < n) {
        const ssize_t got = pread(c->fd, buf + done, n - done, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            return isth_fail(ISTH_ERUNTIME, "data file %s: read at byte %zu failed: %s", c->path, off + done,
                             strerror(errno));
        if (got == 0) {
            struct stat st;
            const long long now = fstat(c->fd, &st) == 0 ? (long long)st.st_size : -1;
            return isth_fail(ISTH_ERUNTIME,
                             "data file %s: now %lld bytes, was %zu when the run opened it (truncated during the "
                             "run; reading byte %zu)", c->path, now, c->size, off + done);
        }
        done += (size_t)got;
    }
    return ISTH_OK;
}

int corpus_tokens(Corpus *c, size_t first, size_t n, int *out, int vocab)
{
    const size_t w = (size_t)c->width;
    unsigned char *raw = (unsigned char *)out; /* n * w <= 4 n bytes: decoded in place, last first */
    CHECK(corpus_read(c, c->header + first * w, raw, n * w));
    for (size_t i = n; i-- > 0;) {
        const unsigned char *p = raw + i * w;
        const uint32_t t = w == 1 ? p[0] : w == 2 ? (uint32_t)(p[0] | p[1] << 8) : le32(p);
        if (t >= (uint32_t)vocab)
            return isth_fail(ISTH_EINPUT, "data file %s: token %u at token %zu (byte %zu) is not below model.vocab = %d",
                             c->path, t, first + i, c->header + (first + i) * w, vocab);
        out[i] = (int)t;
    }
    return ISTH_OK;
}

int data_kind_fits(int width, int vocab) { return width != 1 || vocab <= 256; }

int corpus_check_kind(const Corpus *c, int vocab)
{
    if (data_kind_fits(c->width, vocab)) return ISTH_OK;
    return isth_fail(ISTH_EINPUT, "data file %s: no token shard header (its first 4 bytes, a little-endian int32, are "
                     "%u, not the magic %d or %d), and model.vocab = %d reads token shards only (raw bytes are "
                     "model.vocab = 256)", c->path, c->magic, SHARD_MAGIC_U16, SHARD_MAGIC_U32, vocab);
}

int corpus_check_tokens(Corpus *c, int vocab)
{
    if (c->width == 1 || (c->width == 2 && vocab >= 65536)) return ISTH_OK;
    enum { PIECE = 65536 }; /* tokens read at once */
    int *buf = isth_malloc(sizeof(int) * PIECE);
    CHECK_ALLOC(buf);
    int rc = ISTH_OK;
    for (size_t first = 0; first < c->n_tokens && rc == ISTH_OK; first += PIECE)
        rc = corpus_tokens(c, first, c->n_tokens - first < PIECE ? c->n_tokens - first : PIECE, buf, vocab);
    isth_free(buf);
    return rc;
}

/* --- the training files ---------------------------------------------------- */

/* `in` with each ${NAME} replaced by the environment's value */
int data_expand(const char *key, const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = in; *p;) {
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p, '}');
            if (!end) return isth_fail(ISTH_EINPUT, "%s = '%s': a ${ without its }", key, in);
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(end - p - 2 < 255 ? end - p - 2 : 255), p + 2);
            const char *v = getenv(name);
            if (!v) return isth_fail(ISTH_EINPUT, "%s = '%s': ${%s} is not set in the environment", key, in, name);
            const size_t n = strlen(v);
            if (o + n >= cap) return isth_fail(ISTH_EINPUT, "%s = '%s': too long", key, in);
            memcpy(out + o, v, n);
            o += n;
            p = end + 1;
        } else {
            if (o + 1 >= cap) return isth_fail(ISTH_EINPUT, "%s = '%s': too long", key, in);
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return ISTH_OK;
}

static int add_file(Dataset *d, const char *dir, const char *name, int T)
{
    Corpus *grown = isth_realloc(d->files, sizeof *grown * (size_t)(d->n_files + 1));
    CHECK_ALLOC(grown);
    d->files = grown;
    Corpus *c = &d->files[d->n_files];
    CHECK(corpus_open(c, dir, name));
    d->n_files++;
    d->n_open++;
    if (d->n_files == 1) d->width = c->width;
    if (c->width != d->width)
        return isth_fail(ISTH_EINPUT, "data.train: %s holds %s and %s %s: one kind per run", c->path,
                         corpus_kind(c->width), d->files[0].path, corpus_kind(d->width));
    if (c->n_tokens < (size_t)T + 1)
        return isth_fail(ISTH_EINPUT, "data file %s: %zu %s, less than one window of context+1 = %d", c->path,
                         c->n_tokens, c->width == 1 ? "bytes" : "tokens", T + 1);
    if (d->n_open > DATA_MAX_OPEN) { /* opened again when a window needs it */
        corpus_close(c);
        d->n_open--;
    }
    return ISTH_OK;
}

static int by_file_id(const void *a, const void *b)
{
    const Corpus *x = *(Corpus *const *)a, *y = *(Corpus *const *)b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* a file listed twice (or matched by two globs) would count twice as often */
static int refuse_twice(const Dataset *d)
{
    const Corpus **order = isth_malloc(sizeof *order * (size_t)d->n_files);
    CHECK_ALLOC(order);
    for (int i = 0; i < d->n_files; i++) order[i] = &d->files[i];
    qsort(order, (size_t)d->n_files, sizeof *order, by_file_id);
    int rc = ISTH_OK;
    for (int i = 1; i < d->n_files && rc == ISTH_OK; i++)
        if (order[i]->dev == order[i - 1]->dev && order[i]->ino == order[i - 1]->ino)
            rc = isth_fail(ISTH_EINPUT, "data.train: %s and %s are the same file (listed twice)", order[i - 1]->path,
                           order[i]->path);
    isth_free(order);
    return rc;
}

int dataset_open(Dataset *d, const char *list, const char *dir, int T)
{
    memset(d, 0, sizeof *d);
    char *copy = isth_malloc(strlen(list) + 1);
    CHECK_ALLOC(copy);
    strcpy(copy, list);
    int rc = ISTH_OK;
    char *save = NULL;
    for (char *item = strtok_r(copy, " ,\t", &save); item && rc == ISTH_OK; item = strtok_r(NULL, " ,\t", &save)) {
        char name[CONFIG_FILE_PATH_MAX], pattern[CONFIG_FILE_PATH_MAX];
        rc = data_expand("data.train", item, name, sizeof name);
        if (rc != ISTH_OK) break;
        if (!strpbrk(name, "*?[")) { /* a plain path: its own message when it cannot be opened */
            rc = add_file(d, dir, name, T);
            continue;
        }
        const int n = name[0] == '/' || !dir[0] ? snprintf(pattern, sizeof pattern, "%s", name)
                                                : snprintf(pattern, sizeof pattern, "%s/%s", dir, name);
        if (n < 0 || (size_t)n >= sizeof pattern) {
            rc = isth_fail(ISTH_EINPUT, "data.train: '%s': path too long", item);
            break;
        }
        glob_t g;
        const int grc = glob(pattern, 0, NULL, &g); /* sorted: the same file order on every rank and run */
        if (grc == GLOB_NOMATCH) rc = isth_fail(ISTH_EINPUT, "data.train: '%s' matches no file", pattern);
        else if (grc != 0) rc = isth_fail(ISTH_EINPUT, "data.train: '%s': glob failed", pattern);
        for (size_t i = 0; grc == 0 && i < g.gl_pathc && rc == ISTH_OK; i++) rc = add_file(d, "", g.gl_pathv[i], T);
        if (grc == 0) globfree(&g);
    }
    isth_free(copy);
    if (rc == ISTH_OK && d->n_files == 0) rc = add_file(d, dir, "train.txt", T);
    if (rc == ISTH_OK) rc = refuse_twice(d);
    if (rc == ISTH_OK) {
        d->first_start = isth_malloc(sizeof *d->first_start * (size_t)(d->n_files + 1));
        if (!d->first_start) rc = isth_fail(ISTH_ERUNTIME, "out of memory for %d data files", d->n_files);
    }
    if (rc != ISTH_OK) {
        dataset_close(d);
        return rc;
    }
    d->first_start[0] = 0;
    for (int i = 0; i < d->n_files; i++) /* a window starts at 0 .. n - T - 1 */
        d->first_start[i + 1] = d->first_start[i] + (uint64_t)(d->files[i].n_tokens - (size_t)T);
    return ISTH_OK;
}

void dataset_close(Dataset *d)
{
    for (int i = 0; i < d->n_files; i++) corpus_close(&d->files[i]);
    isth_free(d->files);
    isth_free(d->first_start);
    memset(d, 0, sizeof *d);
}

uint64_t dataset_tokens(const Dataset *d)
{
    uint64_t n = 0;
    for (int i = 0; i < d->n_files; i++) n += d->files[i].n_tokens;
    return n;
}

int dataset_check_kind(const Dataset *d, int vocab) { return d->n_files ? corpus_check_kind(&d->files[0], vocab) : ISTH_OK; }

/* file i, open (closing the least recently used one when too many are) */
static int use_file(Dataset *d, int i);

/* FNV-1a, 64 bits, continued from h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int dataset_identity(Dataset *d, uint64_t *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t head[2] = {(uint64_t)d->width, (uint64_t)d->n_files};
    h = fnv1a(h, head, sizeof head);
    unsigned char block[DATA_IDENTITY_BLOCK];
    for (int i = 0; i < d->n_files; i++) {
        Corpus *c = &d->files[i];
        CHECK(use_file(d, i));
        const size_t n = c->size < sizeof block ? c->size : sizeof block;
        CHECK(corpus_read(c, 0, block, n));
        const uint64_t size = c->size;
        h = fnv1a(h, &size, sizeof size);
        h = fnv1a(h, block, n);
    }
    *id = h;
    return ISTH_OK;
}

static int use_file(Dataset *d, int i)
{
    Corpus *c = &d->files[i];
    c->last_use = ++d->uses;
    if (c->fd >= 0) return ISTH_OK;
    if (d->n_open >= DATA_MAX_OPEN) {
        int lru = -1;
        for (int j = 0; j < d->n_files; j++)
            if (d->files[j].fd >= 0 && (lru < 0 || d->files[j].last_use < d->files[lru].last_use)) lru = j;
        if (lru >= 0) {
            corpus_close(&d->files[lru]);
            d->n_open--;
        }
    }
    CHECK(open_checked(c, c->size));
    d->n_open++;
    return ISTH_OK;
}

int data_fill(const DataCursor *cur, Dataset *d, uint64_t first_index, int *tokens, int *targets, int B, int T,
              int vocab)
{
    const uint64_t starts = d->first_start[d->n_files];
    int *w = isth_malloc(sizeof(int) * ((size_t)T + 1));
    CHECK_ALLOC(w);
    for (int b = 0; b < B; b++) {
        const uint64_t pos = rng_bits(cur->seed, 0x5eed000000000000ull ^ cur->step, first_index + (uint64_t)b) % starts;
        int lo = 0, hi = d->n_files - 1; /* the file whose starts hold pos */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (d->first_start[mid] <= pos) lo = mid;
            else hi = mid - 1;
        }
        int rc = use_file(d, lo);
        if (rc == ISTH_OK) rc = corpus_tokens(&d->files[lo], (size_t)(pos - d->first_start[lo]), (size_t)T + 1, w, vocab);
        if (rc != ISTH_OK) {
            isth_free(w);
            return rc;
        }
        memcpy(tokens + (size_t)b * T, w, sizeof(int) * (size_t)T);
        memcpy(targets + (size_t)b * T, w + 1, sizeof(int) * (size_t)T);
    }
    isth_free(w);
    return ISTH_OK;
}
