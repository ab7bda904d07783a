/* export.c — see export.h. */
#include "export.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "status.h"

#define ROPE_BASE_EXPORTED 10000.0 /* src/cpu/layers.c's ROPE_BASE */
#define RMS_EPS_EXPORTED 1e-5      /* elementwise.h's RMS_EPS */

/* Write `path` through `path`.tmp and a rename. */
static int write_file(const char *path, const void *head, size_t head_n, const Model *m)
{
    char tmp[CONFIG_FILE_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return isth_fail(ISTH_EINPUT, "export: cannot create %s: %s", tmp, strerror(errno));
    int ok = fwrite(head, 1, head_n, f) == head_n;
    for (int t = 0; m && t < N_TENSORS && ok; t++)
        ok = fwrite(m->params + m->tensors[t].offset, sizeof(float), m->tensors[t].numel, f) == m->tensors[t].numel;
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

/* Append printf output to buf (cap), tracking the length; ISTH_ERUNTIME when full. */
static int append(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) return isth_fail(ISTH_ERUNTIME, "export: header too long");
    *len += (size_t)n;
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

int export_model(const char *dir, const Model *m, const H5Meta *meta, const char *tokenizer)
{
    if (m->experts_local != m->cfg.experts)
        return isth_fail(ISTH_ERUNTIME, "export: the model holds %d of %d experts", m->experts_local, m->cfg.experts);
    if (mkdir(dir, 0755) && errno != EEXIST)
        return isth_fail(ISTH_EINPUT, "export: cannot create the directory %s: %s", dir, strerror(errno));
    char path[CONFIG_FILE_PATH_MAX + 32];
    const ModelConfig *c = &m->cfg;
    /* safetensors: the header's JSON, padded with spaces to 8 bytes (the data's alignment) */
    char head[8192];
    size_t len = 8, at = 0;
    CHECK(append(head, sizeof head, &len, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"isthmus\",\"step\":\"%ld\"}",
                 meta->step));
    for (int t = 0; t < N_TENSORS; t++) {
        const Tensor *x = &m->tensors[t];
        CHECK(append(head, sizeof head, &len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", x->name));
        for (int i = 0; i < x->ndim; i++) CHECK(append(head, sizeof head, &len, "%s%zu", i ? "," : "", x->shape[i]));
        const size_t bytes = x->numel * sizeof(float);
        CHECK(append(head, sizeof head, &len, "],\"data_offsets\":[%zu,%zu]}", at, at + bytes));
        at += bytes;
    }
    CHECK(append(head, sizeof head, &len, "}"));
    while (len % 8) CHECK(append(head, sizeof head, &len, " "));
    const uint64_t json = len - 8;
    for (int i = 0; i < 8; i++) head[i] = (char)(json >> (8 * i)); /* little-endian on any host */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(write_file(path, head, len, m));

    char js[2048];
    size_t jl = 0;
    CHECK(append(js, sizeof js, &jl,
                 "{\n  \"format\": \"isthmus\",\n  \"vocab\": %d,\n  \"dim\": %d,\n  \"layers\": %d,\n  \"heads\": %d,\n"
                 "  \"experts\": %d,\n  \"top_k\": %d,\n  \"ffn\": %d,\n  \"context\": %d,\n  \"rope_base\": %.1f,\n"
                 "  \"norm_eps\": %g,\n  \"step\": %ld,\n  \"tokens_trained\": %.0f,\n  \"tokenizer\": %s\n}\n",
                 c->vocab, c->dim, c->layers, c->heads, c->experts, c->top_k, c->ffn, c->context, ROPE_BASE_EXPORTED,
                 RMS_EPS_EXPORTED, meta->step, meta->tokens, tokenizer && *tokenizer ? "\"tokenizer.model\"" : "null"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(write_file(path, js, jl, NULL));
    if (tokenizer && *tokenizer) {
        char *bytes = NULL;
        size_t n = 0;
        CHECK(read_small(tokenizer, &bytes, &n));
        snprintf(path, sizeof path, "%s/tokenizer.model", dir);
        const int rc = write_file(path, bytes, n, NULL);
        isth_free(bytes);
        CHECK(rc);
    }
    return ISTH_OK;
}
