/* data.c — see data.h. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "config.h"
#include "rng.h"
#include "status.h"

int corpus_open(Corpus *c, const char *dir, const char *name)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    int n = snprintf(c->path, sizeof c->path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof c->path)
        return isth_fail(ISTH_EINPUT, "data: path too long: %s/%s", dir, name);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    int fd = open(c->path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        struct stat st;
        char xz[sizeof c->path + 3]; /* path.xz */
        snprintf(xz, sizeof xz, "%s.xz", c->path);
        if (errno == ENOENT && stat(xz, &st) == 0)
            return isth_fail(ISTH_EINPUT, "data file %s: missing (only %s exists; run 'make' to decompress it)",
                             c->path, xz);
        return isth_fail(ISTH_EINPUT, "data file %s: cannot open: %s", c->path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "data file %s: not a regular file", c->path);
    }
    if (st.st_size < 2) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "data file %s: %lld byte(s); a corpus needs at least 2 (one byte to predict)",
                         c->path, (long long)st.st_size);
    }
    c->fd = fd;
    c->is_open = 1;
    c->size = (size_t)st.st_size;
    return ISTH_OK;
}

void corpus_close(Corpus *c)
{
    if (c->is_open) close(c->fd);
    c->is_open = 0;
    c->fd = -1;
    c->size = 0;
}

int corpus_read(const Corpus *c, size_t off, unsigned char *buf, size_t n)
{
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

int data_check_windows(const Corpus *c, int T)
{
    if (c->size < (size_t)T + 1)
        return isth_fail(ISTH_EINPUT,
                         "data file %s: %zu bytes, less than one window of context+1 = %d bytes",
                         c->path, c->size, T + 1);
    return ISTH_OK;
}

int data_fill(const DataCursor *cur, const Corpus *c, uint64_t first_index, int *tokens,
              int *targets, int B, int T)
{
    const uint64_t positions = (uint64_t)(c->size - (size_t)T); /* starts in [0, size-T-1] */
    unsigned char *w = isth_malloc((size_t)T + 1);
    CHECK_ALLOC(w);
    for (int b = 0; b < B; b++) {
        uint64_t r = rng_bits(cur->seed, 0x5eed000000000000ull ^ cur->step, first_index + (uint64_t)b);
        const int rc = corpus_read(c, (size_t)(r % positions), w, (size_t)T + 1);
        if (rc != ISTH_OK) {
            isth_free(w);
            return rc;
        }
        for (int t = 0; t < T; t++) {
            tokens[(size_t)b * T + t] = w[t];
            targets[(size_t)b * T + t] = w[t + 1];
        }
    }
    isth_free(w);
    return ISTH_OK;
}
