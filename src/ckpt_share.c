/* ckpt_share.c — see ckpt_share.h. */
#include "ckpt_share.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ckpt_files.h"
#include "ckpt_state.h"
#include "coll.h"
#include "fault.h"
#include "h5io.h"
#include "status.h"

#define SHARE_PIECE ((size_t)64 << 20)
#define FRAME_ROOM sizeof(LinkHeader) /* the link's header goes in front of each piece, in place */

/* The host's side, to every receiving site's first rank (peers[0..n)):
 * the size to each, then the file piece by piece, each piece to every
 * receiver in turn. Interleaved, not one whole file after another: a
 * receiver's every wait is then one piece per receiver long, within the
 * link's deadline (outer.timeout), however large the file (a second
 * joiner waiting for the first one's 800 GB would miss it). Each piece is
 * read again for each receiver: the link seals it in place with that
 * pair's key. */
static int send_file(Trainer *tr, const char *path, const int *peers, int n_peers)
{
    Link *l = &tr->link;
    const int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return isth_fail(ISTH_ERUNTIME, "rejoin: cannot read %s: %s", path, strerror(errno));
    }
    const uint64_t size = (uint64_t)st.st_size;
    /* static: a send that misses its deadline cannot be cancelled and must
     * not point into a stack frame that is gone (as recv_file's buffer) */
    static unsigned char head[FRAME_ROOM + sizeof size];
    int rc = ISTH_OK;
    for (int i = 0; rc == ISTH_OK && i < n_peers; i++) {
        memcpy(head + FRAME_ROOM, &size, sizeof size); /* sealed in place: again for each */
        rc = link_send_blob(l, peers[i], LINK_TAG_REJOIN, head, sizeof size, 0, "the rejoin checkpoint's size");
    }
    unsigned char *buf = rc == ISTH_OK ? isth_malloc(FRAME_ROOM + SHARE_PIECE) : NULL;
    if (rc == ISTH_OK && !buf) rc = isth_fail(ISTH_ERUNTIME, "rejoin: out of memory for a %zu-byte piece", SHARE_PIECE);
    for (uint64_t off = 0, seq = 1; rc == ISTH_OK && off < size; off += SHARE_PIECE, seq++) {
        const size_t n = size - off < SHARE_PIECE ? (size_t)(size - off) : SHARE_PIECE;
        for (int i = 0; rc == ISTH_OK && i < n_peers; i++) {
            if (pread(fd, buf + FRAME_ROOM, n, (off_t)off) != (ssize_t)n)
                rc = isth_fail(ISTH_ERUNTIME, "rejoin: reading %s: %s", path, strerror(errno));
            if (rc == ISTH_OK) rc = link_send_blob(l, peers[i], LINK_TAG_REJOIN, buf, n, seq, "the rejoin checkpoint");
        }
    }
    if (rc == ISTH_OK) isth_free(buf); /* after a failure MPI may still hold it: leaked (failure rule 6) */
    close(fd);
    return rc;
}

/* The joiner's side: size bounded by what the live site could have written,
 * every piece checked, a temporary name renamed when complete. */
static int recv_file(Trainer *tr, const char *path, int peer)
{
    Link *l = &tr->link;
    const Topology *t = &tr->topo;
    uint64_t size = 0;
    static unsigned char head[FRAME_ROOM + sizeof size]; /* not on the stack: a failed receive may outlive us */
    CHECK(link_recv_blob(l, peer, LINK_TAG_REJOIN, head, sizeof size, 0, "the rejoin checkpoint's size"));
    memcpy(&size, head + FRAME_ROOM, sizeof size);
    int most = 0;
    for (int s = 0; s < t->n_sites; s++) most = t->sites[s].learners > most ? t->sites[s].learners : most;
    const double bound = H5IO_FILE_BYTES(model_total_params(&tr->cfg.model), 8 + (6 + CKPT_SHAMPOO_GROUPS) * most);
    if ((double)size > bound)
        return isth_fail(ISTH_ERUNTIME, "rejoin: the live site announces a %llu-byte checkpoint; this config's "
                         "are at most %.0f bytes", (unsigned long long)size, bound);
    char tmp[CONFIG_FILE_PATH_MAX + 80];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return isth_fail(ISTH_ERUNTIME, "rejoin: cannot create %s: %s", tmp, strerror(errno));
    unsigned char *buf = isth_malloc(FRAME_ROOM + SHARE_PIECE);
    int rc = buf ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "rejoin: out of memory for a %zu-byte piece", SHARE_PIECE);
    for (uint64_t off = 0, seq = 1; rc == ISTH_OK && off < size; off += SHARE_PIECE, seq++) {
        const size_t n = size - off < SHARE_PIECE ? (size_t)(size - off) : SHARE_PIECE;
        rc = link_recv_blob(l, peer, LINK_TAG_REJOIN, buf, n, seq, "the rejoin checkpoint");
        if (rc == ISTH_OK && pwrite(fd, buf + FRAME_ROOM, n, (off_t)off) != (ssize_t)n)
            rc = isth_fail(ISTH_ERUNTIME, "rejoin: writing %s: %s", tmp, strerror(errno));
    }
    if (rc == ISTH_OK) isth_free(buf); /* after a failure MPI may still hold it: leaked (failure rule 6) */
    if (rc == ISTH_OK && fsync(fd) != 0) rc = isth_fail(ISTH_ERUNTIME, "rejoin: %s: %s", tmp, strerror(errno));
    close(fd);
    if (rc == ISTH_OK && rename(tmp, path) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "rejoin: cannot rename %s: %s", tmp, strerror(errno));
    if (rc != ISTH_OK) unlink(tmp);
    return rc;
}

int ckpt_share_to(Trainer *tr, int from_site, long step, const unsigned char *to, char *path, size_t cap)
{
    const Topology *t = &tr->topo;
    char dir[CONFIG_FILE_PATH_MAX];
    ckpt_site_dir(tr, dir, sizeof dir);
    const int host = t->site == from_site, receives = !host && to[t->site];
    if (host) ckpt_file_path(dir, step, path, cap);
    else if (receives) snprintf(path, cap, "%s/rejoin-%08ld.h5", dir, step);
    if (!host && !receives) return ISTH_OK; /* neither end */
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    char what[96];
    snprintf(what, sizeof what, "passing site %s's checkpoint of step %ld through the link", t->sites[from_site].name,
             step);
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, what, FAULT_HINT_IO);
    int rc = ISTH_OK;
    if (site_rank == 0 && receives) rc = make_dirs(dir);
    /* the host sends to every receiving site, in site order, piece by piece */
    if (site_rank == 0 && host && rc == ISTH_OK) {
        int peers[CONFIG_MAX_SITES], n = 0;
        for (int s = 0; s < t->n_sites; s++)
            if (s != from_site && to[s]) peers[n++] = tr->site_leaders[s];
        rc = send_file(tr, path, peers, n);
    }
    if (site_rank == 0 && receives && rc == ISTH_OK) rc = recv_file(tr, path, tr->site_leaders[from_site]);
    const int ok = coll_all_ok(t->site_comm, rc == ISTH_OK);
    fault_watchdog_disarm();
    return ok ? ISTH_OK : rc != ISTH_OK ? rc : ISTH_ERUNTIME;
}

int ckpt_share(Trainer *tr, int from_site, const unsigned char *to, long step, char *path, size_t cap)
{
    char dir[CONFIG_FILE_PATH_MAX];
    ckpt_site_dir(tr, dir, sizeof dir);
    ckpt_file_path(dir, step, path, cap); /* a third site's: its own */
    return ckpt_share_to(tr, from_site, step, to, path, cap);
}
