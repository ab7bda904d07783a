/* data.c — see data.h. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rng.h"
#include "status.h"

int corpus_open(Corpus *c, const char *dir, const char *name)
{
    memset(c, 0, sizeof *c);
    int n = snprintf(c->path, sizeof c->path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof c->path)
        return isth_fail(ISTH_EINPUT, "data: path too long: %s/%s", dir, name);
    int fd = open(c->path, O_RDONLY);
    if (fd < 0) {
        struct stat st;
        char xz[1100];
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
        return isth_fail(ISTH_EINPUT, "data file %s: empty (needs at least 2 bytes)", c->path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return isth_fail(ISTH_EINPUT, "data file %s: mmap failed: %s", c->path, strerror(errno));
    c->bytes = p;
    c->size = (size_t)st.st_size;
    return ISTH_OK;
}

void corpus_close(Corpus *c)
{
    if (c->bytes) munmap((void *)c->bytes, c->size);
    c->bytes = NULL;
    c->size = 0;
}

int data_check_windows(const Corpus *c, int T)
{
    if (c->size < (size_t)T + 1)
        return isth_fail(ISTH_EINPUT,
                         "data file %s: %zu bytes, less than one window of context+1 = %d bytes",
                         c->path, c->size, T + 1);
    return ISTH_OK;
}

void data_fill(const DataCursor *cur, const Corpus *c, uint64_t first_index, int *tokens,
               int *targets, int B, int T)
{
    const uint64_t positions = (uint64_t)(c->size - (size_t)T); /* starts in [0, size-T-1] */
    for (int b = 0; b < B; b++) {
        uint64_t r = rng_bits(cur->seed, 0x5eed000000000000ull ^ cur->step, first_index + (uint64_t)b);
        const unsigned char *w = c->bytes + (size_t)(r % positions);
        for (int t = 0; t < T; t++) {
            tokens[(size_t)b * T + t] = w[t];
            targets[(size_t)b * T + t] = w[t + 1];
        }
    }
}
