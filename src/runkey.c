/* runkey.c — see runkey.h. */
#include "runkey.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "metrics.h" /* make_dirs */
#include "status.h"

void runkey_path(const Config *cfg, char *out, size_t size)
{
    if (cfg->outer.key_file[0]) snprintf(out, size, "%s", cfg->outer.key_file);
    else snprintf(out, size, "%s/run.key", cfg->train.out_dir);
}

int runkey_read(const char *path, unsigned char key[RUNKEY_BYTES])
{
    const int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0)
        return isth_fail(ISTH_EINPUT, "key file %s: %s (every site needs the run's key: copy it from the first "
                         "site, mode 0600)", path, strerror(errno));
    struct stat st;
    int rc = ISTH_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = isth_fail(ISTH_EINPUT, "key file %s: not a regular file", path);
    else if (st.st_uid != geteuid())
        rc = isth_fail(ISTH_EINPUT, "key file %s: owned by uid %u, not by this user (%u)", path, (unsigned)st.st_uid,
                       (unsigned)geteuid());
    else if (st.st_mode & 077)
        rc = isth_fail(ISTH_EINPUT, "key file %s: readable by others (mode %03o): chmod 600 %s", path,
                       (unsigned)(st.st_mode & 0777), path);
    char hex[2 * RUNKEY_BYTES + 2] = "";
    ssize_t got = rc == ISTH_OK ? read(fd, hex, sizeof hex - 1) : -1;
    close(fd);
    CHECK(rc);
    size_t len = 0;
    if (got < 2 * RUNKEY_BYTES || sodium_hex2bin(key, RUNKEY_BYTES, hex, (size_t)got, "\n", &len, NULL) != 0 ||
        len != RUNKEY_BYTES)
        rc = isth_fail(ISTH_EINPUT, "key file %s: not %d bytes in hex", path, RUNKEY_BYTES);
    sodium_memzero(hex, sizeof hex);
    return rc;
}

/* A new key at `path`: temporary name, then link(). *made = 0 when a key
 * appeared there meanwhile (another launch's: kept). */
static int write_new_key(const char *path, int *made)
{
    *made = 0;
    char dir[CONFIG_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        CHECK(make_dirs(dir));
    }
    unsigned char key[RUNKEY_BYTES];
    randombytes_buf(key, sizeof key);
    char hex[2 * RUNKEY_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, key, sizeof key);
    sodium_memzero(key, sizeof key);
    char tmp[CONFIG_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp); /* a stale temporary keeps its mode: never reuse it */
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (fd < 0) return isth_fail(ISTH_EINPUT, "key file %s: cannot create: %s", tmp, strerror(errno));
    const size_t n = strlen(hex);
    hex[n] = '\n';
    const int ok = write(fd, hex, n + 1) == (ssize_t)(n + 1) && fsync(fd) == 0;
    close(fd);
    sodium_memzero(hex, sizeof hex);
    /* link, not rename: a key another launch made meanwhile is kept */
    const int linked = ok && link(tmp, path) == 0;
    const int raced = ok && !linked && errno == EEXIST;
    unlink(tmp);
    if (raced) return ISTH_OK;
    if (!linked) return isth_fail(ISTH_ERUNTIME, "key file %s: cannot write: %s", path, strerror(errno));
    *made = 1;
    return ISTH_OK;
}

int runkey_ensure(const char *path)
{
    if (access(path, F_OK) == 0) return ISTH_OK;
    int made;
    CHECK(write_new_key(path, &made));
    if (made) printf("federation: created the run's key %s (mode 0600); every other site needs a copy\n", path);
    return ISTH_OK;
}

int runkey_keygen(const char *path)
{
    if (sodium_init() < 0) return isth_fail(ISTH_ERUNTIME, "keygen: libsodium failed to initialise");
    struct stat st;
    if (lstat(path, &st) == 0)
        return isth_fail(ISTH_EINPUT, "keygen: %s exists; a run's key is never overwritten (remove it first)", path);
    int made;
    CHECK(write_new_key(path, &made));
    if (!made) return isth_fail(ISTH_EINPUT, "keygen: %s appeared meanwhile; not overwritten", path);
    printf("keygen: wrote a new run key to %s (mode 0600): copy it to every site, set [outer] key_file\n", path);
    return ISTH_OK;
}
