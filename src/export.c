/* export.c — see export.h. */
#include "export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "status.h"

#define ROPE_BASE_EXPORTED 10000.0 /* src/cpu/layers.c's ROPE_BASE */
#define RMS_EPS_EXPORTED 1e-5      /* elementwise.h's RMS_EPS */
#define EXPORT_MAX_FILES 99999     /* five digits in a shard's name */
#define EXPORT_PIECE 65536         /* values converted per write */

/* One tensor of the files: a model tensor whole (layer -1) or one layer of it. */
typedef struct {
    char name[64];
    int tensor, layer;
    int ndim;
    size_t shape[TENSOR_MAX_DIMS];
    size_t bytes;
    int file;
    size_t at;                /* its first byte in its file's data */
} Entry;

/* A growing text (the JSON of a header, the index). */
typedef struct {
    char *s;
    size_t n, cap;
} Text;

static int text_add(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int text_add(Text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int k = t->s ? vsnprintf(t->s + t->n, t->cap - t->n, fmt, ap) : -2;
        va_end(ap);
        if (k >= 0 && (size_t)k < t->cap - t->n) {
            t->n += (size_t)k;
            return ISTH_OK;
        }
        if (k == -1) return isth_fail(ISTH_ERUNTIME, "export: cannot format a header");
        const size_t cap = 2 * t->cap + 4096 + (k > 0 ? (size_t)k : 0);
        char *s = isth_realloc(t->s, cap);
        if (!s) return isth_fail(ISTH_ERUNTIME, "export: out of memory for a header");
        t->s = s;
        t->cap = cap;
    }
}

typedef struct {
    Entry *e;
    int n, files, sharded;
    size_t elem;              /* bytes per value */
    const char *dtype;        /* safetensors' name for it */
    Text *head;               /* (files) each file's first bytes: the length, the JSON, spaces to 8 */
    size_t *data;             /* (files) each file's data bytes */
} Layout;

static void layout_free(Layout *lay)
{
    for (int f = 0; lay->head && f < lay->files; f++) isth_free(lay->head[f].s);
    isth_free(lay->head);
    isth_free(lay->data);
    isth_free(lay->e);
    memset(lay, 0, sizeof *lay);
}

static void add_entry(Layout *lay, const Model *m, int t, int layer)
{
    const Tensor *x = &m->tensors[t];
    Entry *e = &lay->e[lay->n++];
    e->tensor = t;
    e->layer = layer;
    const int drop = layer >= 0; /* one layer: the layer axis goes */
    if (drop) snprintf(e->name, sizeof e->name, "layers.%d.%s", layer, x->name);
    else snprintf(e->name, sizeof e->name, "%s", x->name);
    e->ndim = x->ndim - drop;
    size_t numel = 1;
    for (int i = 0; i < e->ndim; i++) numel *= e->shape[i] = x->shape[i + drop];
    e->bytes = numel * lay->elem;
}

static void file_name(const Layout *lay, int f, char *out, size_t cap)
{
    if (lay->sharded) snprintf(out, cap, "model-%05d-of-%05d.safetensors", f + 1, lay->files);
    else snprintf(out, cap, "model.safetensors");
}

/* The entries, their files and every file's header: the same on every rank. */
static int layout_build(Layout *lay, const Model *m, const ExportOptions *o, long step)
{
    memset(lay, 0, sizeof *lay);
    lay->sharded = o->max_shard_bytes > 0;
    lay->elem = o->dtype == EXPORT_BF16 ? 2 : 4;
    lay->dtype = o->dtype == EXPORT_BF16 ? "BF16" : "F32";
    lay->e = isth_calloc((size_t)N_TENSORS * (size_t)(m->cfg.layers + 1), sizeof(Entry));
    if (!lay->e) return isth_fail(ISTH_ERUNTIME, "export: out of memory");
    if (!lay->sharded) { /* the table's order, whole tensors */
        for (int t = 0; t < N_TENSORS; t++) add_entry(lay, m, t, -1);
    } else { /* the unlayered first, each layer's tensors, what comes after the last layer */
        for (int t = 0; t < N_TENSORS; t++)
            if (!(m->tensors[t].flags & (PARAM_LAYERED | PARAM_AT_END))) add_entry(lay, m, t, -1);
        for (int l = 0; l < m->cfg.layers; l++)
            for (int t = 0; t < N_TENSORS; t++)
                if (m->tensors[t].flags & PARAM_LAYERED) add_entry(lay, m, t, l);
        for (int t = 0; t < N_TENSORS; t++)
            if ((m->tensors[t].flags & (PARAM_LAYERED | PARAM_AT_END)) == PARAM_AT_END) add_entry(lay, m, t, -1);
    }
    size_t at = 0;
    int f = 0;
    for (int i = 0; i < lay->n; i++) {
        Entry *e = &lay->e[i];
        if (lay->sharded && at > 0 && (double)(at + e->bytes) > o->max_shard_bytes) f++, at = 0;
        e->file = f;
        e->at = at;
        at += e->bytes;
    }
    lay->files = f + 1;
    if (lay->files > EXPORT_MAX_FILES)
        return isth_fail(ISTH_EINPUT, "export: --max-shard-size %.0f bytes would make %d files, more than %d",
                         o->max_shard_bytes, lay->files, EXPORT_MAX_FILES);
    lay->head = isth_calloc((size_t)lay->files, sizeof(Text));
    lay->data = isth_calloc((size_t)lay->files, sizeof(size_t));
    if (!lay->head || !lay->data) return isth_fail(ISTH_ERUNTIME, "export: out of memory");
    for (int i = 0; i < lay->n; i++) {
        const Entry *e = &lay->e[i];
        Text *h = &lay->head[e->file];
        if (!h->n) {
            CHECK(text_add(h, "12345678")); /* the length, filled in below */
            CHECK(text_add(h, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"isthmus\",\"step\":\"%ld\"}", step));
        }
        CHECK(text_add(h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e->name, lay->dtype));
        for (int k = 0; k < e->ndim; k++) CHECK(text_add(h, "%s%zu", k ? "," : "", e->shape[k]));
        CHECK(text_add(h, "],\"data_offsets\":[%zu,%zu]}", e->at, e->at + e->bytes));
        lay->data[e->file] = e->at + e->bytes;
    }
    for (int k = 0; k < lay->files; k++) {
        Text *h = &lay->head[k];
        CHECK(text_add(h, "}"));
        while (h->n % 8) CHECK(text_add(h, " ")); /* the data's alignment */
        const uint64_t json = h->n - 8;
        for (int i = 0; i < 8; i++) h->s[i] = (char)(json >> (8 * i)); /* little-endian on any host */
    }
    return ISTH_OK;
}

/* Every rank's status, agreed: the worst code (ISTH_EINPUT over
 * ISTH_ERUNTIME); a bad input only a later rank saw is printed by the first
 * such rank (the others hold theirs back: status.h's quiet mode). */
static int agree(MPI_Comm comm, int rc)
{
    int size, rank;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    if (size == 1) return rc;
    int *all = isth_malloc(sizeof(int) * (size_t)size);
    if (!all || MPI_Allgather(&rc, 1, MPI_INT, all, 1, MPI_INT, comm) != MPI_SUCCESS) {
        isth_free(all);
        return isth_fail(ISTH_ERUNTIME, "export: the ranks could not agree (MPI)");
    }
    int worst = ISTH_OK, first = -1;
    for (int r = 0; r < size; r++) {
        if (all[r] > worst) worst = all[r];
        if (all[r] != ISTH_OK && first < 0) first = r;
    }
    isth_free(all);
    if (first > 0 && rank == first && status_has_suppressed()) status_print_suppressed();
    return worst;
}

/* Under mpirun: does every rank see the directory rank 0 made (one
 * filesystem)? Rank 0 writes a token into it that every rank reads back. */
static int same_dir(const char *dir, MPI_Comm comm)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    char path[CONFIG_FILE_PATH_MAX + 64], token[64] = "", seen[64] = "";
    snprintf(path, sizeof path, "%s/.isthmus-export-check", dir);
    int rc = ISTH_OK;
    if (rank == 0) {
        snprintf(token, sizeof token, "%ld.%ld", (long)getpid(), (long)time(NULL));
        FILE *f = fopen(path, "w");
        if (!f || fputs(token, f) < 0 || fclose(f) != 0)
            rc = isth_fail(ISTH_ERUNTIME, "export: cannot write into %s: %s", dir, strerror(errno));
    }
    MPI_Bcast(token, sizeof token, MPI_CHAR, 0, comm);
    if ((rc = agree(comm, rc)) != ISTH_OK) return rc;
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(seen, sizeof seen, f)) seen[0] = '\0';
        fclose(f);
    }
    if (strcmp(seen, token))
        rc = isth_fail(ISTH_EINPUT, "export: rank %d does not see %s as rank 0 made it: under mpirun, -o DIR must be "
                       "one directory every rank sees (a shared filesystem)", rank, dir);
    rc = agree(comm, rc);
    if (rank == 0) unlink(path);
    return rc;
}

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                               /* to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

/* n values at byte `at` of the open file, in the layout's dtype, little-endian. */
static int put_values(int fd, const char *path, const Layout *lay, const float *v, size_t n, off_t at,
                      unsigned char *buf)
{
    for (size_t done = 0; done < n;) {
        const size_t k = n - done < EXPORT_PIECE ? n - done : EXPORT_PIECE;
        for (size_t i = 0; i < k; i++) {
            uint32_t u;
            if (lay->elem == 2) {
                u = bf16_of(v[done + i]);
            } else {
                memcpy(&u, &v[done + i], sizeof u);
            }
            for (size_t b = 0; b < lay->elem; b++) buf[i * lay->elem + b] = (unsigned char)(u >> (8 * b));
        }
        for (size_t off = 0; off < k * lay->elem;) {
            const ssize_t w = pwrite(fd, buf + off, k * lay->elem - off, at + (off_t)off);
            if (w <= 0) return isth_fail(ISTH_ERUNTIME, "export: cannot write %s: %s", path, w < 0 ? strerror(errno) : "no progress");
            off += (size_t)w;
        }
        at += (off_t)(k * lay->elem);
        done += k;
    }
    return ISTH_OK;
}

/* This rank's bytes of entry e: its experts' slices of an expert tensor;
 * a dense one only on the first rank. Layer by layer, each layer's part
 * one run (the local experts lie together). */
static int put_entry(int fd, const char *path, const Layout *lay, const Entry *e, const Model *m, int first,
                     size_t head, unsigned char *buf)
{
    const Tensor *x = &m->tensors[e->tensor];
    const int layered = (x->flags & PARAM_LAYERED) != 0, expert = (x->flags & PARAM_EXPERT) != 0;
    if (!expert && !first) return ISTH_OK;
    const int L = layered ? m->cfg.layers : 1, l0 = e->layer < 0 ? 0 : e->layer, nl = e->layer < 0 ? L : 1;
    const size_t slice = expert ? (size_t)m->cfg.experts * x->chunk_numel : x->numel / (size_t)L; /* one layer, canonical */
    const size_t skip = expert ? (size_t)m->expert_begin * x->chunk_numel : 0;
    const size_t n = expert ? (size_t)m->experts_local * x->chunk_numel : slice;
    for (int i = 0; i < nl; i++) {
        const off_t at = (off_t)(head + e->at + ((size_t)i * slice + skip) * lay->elem);
        CHECK(put_values(fd, path, lay, model_param(m, (TensorId)e->tensor, l0 + i), n, at, buf));
    }
    return ISTH_OK;
}

/* Write `path` through `path`.tmp and a rename (the small files). */
static int write_small(const char *path, const void *bytes, size_t n)
{
    char tmp[CONFIG_FILE_PATH_MAX + 80];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return isth_fail(ISTH_EINPUT, "export: cannot create %s: %s", tmp, strerror(errno));
    int ok = fwrite(bytes, 1, n, f) == n;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path)) { /* a failing disk, not the user's input */
        const int e = errno;
        unlink(tmp);
        return isth_fail(ISTH_ERUNTIME, "export: cannot write %s: %s", path, strerror(e));
    }
    return ISTH_OK;
}

/* A small file (the tokenizer) into memory, to be written like the others. */
static int read_small(const char *path, char **buf, size_t *n)
{
    FILE *in = fopen(path, "rb");
    if (!in) return isth_fail(ISTH_EINPUT, "export: cannot read the tokenizer %s: %s", path, strerror(errno));
    long size = fseek(in, 0, SEEK_END) == 0 ? ftell(in) : -1;
    *buf = size >= 0 && fseek(in, 0, SEEK_SET) == 0 ? isth_malloc((size_t)size + 1) : NULL;
    const int ok = *buf && fread(*buf, 1, (size_t)size, in) == (size_t)size;
    fclose(in);
    if (!ok) {
        isth_free(*buf);
        return isth_fail(ISTH_EINPUT, "export: cannot read the tokenizer %s", path);
    }
    *n = (size_t)size;
    return ISTH_OK;
}

/* Rank 0: every file under its temporary name, its header written, at its
 * full size (the ranks fill in the data). */
static int create_files(const char *dir, const Layout *lay)
{
    char name[64], path[CONFIG_FILE_PATH_MAX + 96];
    for (int f = 0; f < lay->files; f++) {
        file_name(lay, f, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s.tmp", dir, name);
        const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return isth_fail(ISTH_EINPUT, "export: cannot create %s: %s", path, strerror(errno));
        const Text *h = &lay->head[f];
        int ok = pwrite(fd, h->s, h->n, 0) == (ssize_t)h->n;
        ok = ok && ftruncate(fd, (off_t)(h->n + lay->data[f])) == 0;
        const int e = errno;
        ok = close(fd) == 0 && ok;
        if (!ok) return isth_fail(ISTH_ERUNTIME, "export: cannot write %s: %s", path, strerror(e));
    }
    return ISTH_OK;
}

/* Every rank: its bytes into every file that holds some, synced. */
static int fill_files(const char *dir, const Layout *lay, const Model *m, int first)
{
    unsigned char *buf = isth_malloc((size_t)EXPORT_PIECE * 4);
    if (!buf) return isth_fail(ISTH_ERUNTIME, "export: out of memory");
    char name[64], path[CONFIG_FILE_PATH_MAX + 96];
    int rc = ISTH_OK;
    for (int f = 0; f < lay->files && rc == ISTH_OK; f++) {
        int mine = 0;
        for (int i = 0; i < lay->n; i++)
            mine |= lay->e[i].file == f && (first || (m->tensors[lay->e[i].tensor].flags & PARAM_EXPERT));
        if (!mine) continue;
        file_name(lay, f, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s.tmp", dir, name);
        const int fd = open(path, O_WRONLY);
        if (fd < 0) {
            rc = isth_fail(ISTH_ERUNTIME, "export: cannot open %s: %s", path, strerror(errno));
            break;
        }
        for (int i = 0; i < lay->n && rc == ISTH_OK; i++)
            if (lay->e[i].file == f) rc = put_entry(fd, path, lay, &lay->e[i], m, first, lay->head[f].n, buf);
        if (rc == ISTH_OK && fsync(fd) != 0) rc = isth_fail(ISTH_ERUNTIME, "export: cannot write %s: %s", path, strerror(errno));
        if (close(fd) != 0 && rc == ISTH_OK)
            rc = isth_fail(ISTH_ERUNTIME, "export: cannot write %s: %s", path, strerror(errno));
    }
    isth_free(buf);
    return rc;
}

/* Rank 0, after a failure: no temporary file left. */
static void drop_files(const char *dir, const Layout *lay)
{
    char name[64], path[CONFIG_FILE_PATH_MAX + 96];
    for (int f = 0; f < lay->files; f++) {
        file_name(lay, f, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s.tmp", dir, name);
        unlink(path);
    }
}

/* Rank 0: the other layout's files an earlier export left (a loader that
 * prefers model.safetensors must not find an old one beside a new index). */
static int remove_stale(const char *dir, const Layout *lay)
{
    char path[CONFIG_FILE_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%s", dir, lay->sharded ? "model.safetensors" : "model.safetensors.index.json");
    if (unlink(path) && errno != ENOENT) return isth_fail(ISTH_ERUNTIME, "export: cannot remove %s: %s", path, strerror(errno));
    DIR *d = opendir(dir);
    if (!d) return isth_fail(ISTH_ERUNTIME, "export: cannot list %s: %s", dir, strerror(errno));
    int rc = ISTH_OK;
    for (struct dirent *de; rc == ISTH_OK && (de = readdir(d));) {
        int a, b, end = 0;
        if (sscanf(de->d_name, "model-%5d-of-%5d.safetensors%n", &a, &b, &end) != 2 || de->d_name[end] ||
            strlen(de->d_name) != 32 || (lay->sharded && b == lay->files))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (unlink(path)) rc = isth_fail(ISTH_ERUNTIME, "export: cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
    return rc;
}

/* Rank 0, once every rank has written: the files renamed, the index, config.json, the tokenizer. */
static int finish_files(const char *dir, const Layout *lay, const Model *m, const H5Meta *meta, const char *tokenizer)
{
    char name[64], path[CONFIG_FILE_PATH_MAX + 96], tmp[CONFIG_FILE_PATH_MAX + 128];
    for (int f = 0; f < lay->files; f++) {
        file_name(lay, f, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (rename(tmp, path)) return isth_fail(ISTH_ERUNTIME, "export: cannot rename %s: %s", tmp, strerror(errno));
    }
    const char *dtype = lay->elem == 2 ? "bfloat16" : "float32";
    Text t = {0};
    int rc = ISTH_OK;
    if (lay->sharded) {
        size_t total = 0;
        for (int i = 0; i < lay->n; i++) total += lay->e[i].bytes;
        rc = text_add(&t, "{\n  \"metadata\": {\"total_size\": %zu, \"format\": \"isthmus\", \"dtype\": \"%s\", "
                          "\"step\": %ld},\n  \"weight_map\": {", total, dtype, meta->step);
        for (int i = 0; i < lay->n && rc == ISTH_OK; i++) {
            file_name(lay, lay->e[i].file, name, sizeof name);
            rc = text_add(&t, "%s\n    \"%s\": \"%s\"", i ? "," : "", lay->e[i].name, name);
        }
        if (rc == ISTH_OK) rc = text_add(&t, "\n  }\n}\n");
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (rc == ISTH_OK) rc = write_small(path, t.s, t.n);
        t.n = 0;
    }
    const ModelConfig *c = &m->cfg;
    if (rc == ISTH_OK)
        rc = text_add(&t,
                      "{\n  \"format\": \"isthmus\",\n  \"vocab\": %d,\n  \"dim\": %d,\n  \"layers\": %d,\n  \"heads\": %d,\n"
                      "  \"experts\": %d,\n  \"top_k\": %d,\n  \"ffn\": %d,\n  \"context\": %d,\n  \"rope_base\": %.1f,\n"
                      "  \"norm_eps\": %g,\n  \"step\": %ld,\n  \"tokens_trained\": %.0f,\n  \"dtype\": \"%s\",\n"
                      "  \"tokenizer\": %s\n}\n",
                      c->vocab, c->dim, c->layers, c->heads, c->experts, c->top_k, c->ffn, c->context,
                      ROPE_BASE_EXPORTED, RMS_EPS_EXPORTED, meta->step, meta->tokens, dtype,
                      tokenizer && *tokenizer ? "\"tokenizer.model\"" : "null");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == ISTH_OK) rc = write_small(path, t.s, t.n);
    isth_free(t.s);
    if (rc == ISTH_OK && tokenizer && *tokenizer) {
        char *bytes = NULL;
        size_t n = 0;
        rc = read_small(tokenizer, &bytes, &n);
        snprintf(path, sizeof path, "%s/tokenizer.model", dir);
        if (rc == ISTH_OK) rc = write_small(path, bytes, n);
        isth_free(bytes);
    }
    return rc == ISTH_OK ? remove_stale(dir, lay) : rc;
}

int export_model(const char *dir, const Model *m, const H5Meta *meta, const char *tokenizer, const ExportOptions *o,
                 MPI_Comm comm, ExportResult *res)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    /* together the ranks hold every expert once, in rank order */
    int held[2] = {m->expert_begin, m->experts_local}, *all = isth_malloc(sizeof held * (size_t)size);
    CHECK_ALLOC(all);
    CHECK_MPI(MPI_Allgather(held, 2, MPI_INT, all, 2, MPI_INT, comm));
    int next = 0;
    for (int r = 0; r < size; r++) next = all[2 * r] == next ? next + all[2 * r + 1] : -1;
    isth_free(all);
    if (next != m->cfg.experts)
        return isth_fail(ISTH_ERUNTIME, "export: the ranks do not hold the %d experts once each", m->cfg.experts);
    int rc = ISTH_OK;
    if (rank == 0 && mkdir(dir, 0755) && errno != EEXIST)
        rc = isth_fail(ISTH_EINPUT, "export: cannot create the directory %s: %s", dir, strerror(errno));
    CHECK(agree(comm, rc));
    if (size > 1) CHECK(same_dir(dir, comm));
    Layout lay;
    rc = layout_build(&lay, m, o, meta->step); /* the same on every rank, and so is its failure */
    if (rc == ISTH_OK && rank == 0) rc = create_files(dir, &lay);
    rc = agree(comm, rc);
    if (rc == ISTH_OK) rc = agree(comm, fill_files(dir, &lay, m, rank == 0));
    if (rc == ISTH_OK && rank == 0) rc = finish_files(dir, &lay, m, meta, tokenizer);
    if (rc != ISTH_OK && rank == 0) drop_files(dir, &lay);
    rc = agree(comm, rc);
    res->files = lay.files;
    res->bytes = 0;
    for (int i = 0; i < lay.n; i++) res->bytes += (double)lay.e[i].bytes;
    layout_free(&lay);
    return rc;
}
