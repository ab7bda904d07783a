/* ckpt_files.c — see ckpt_files.h. */
#include "ckpt_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ckpt_validate.h"
#include "status.h"

#define CKPT_MAX_LIST 16

void ckpt_site_dir(const Trainer *tr, char *out, size_t cap)
{
    const Config *c = &tr->cfg;
    if (c->checkpoint.dir[0])
        snprintf(out, cap, "%s/%s", c->checkpoint.dir, tr->topo.sites[tr->topo.site].name);
    else
        snprintf(out, cap, "%s/checkpoints/%s", c->train.out_dir, tr->topo.sites[tr->topo.site].name);
}

void ckpt_file_path(const char *dir, long step, char *out, size_t cap)
{
    snprintf(out, cap, "%s/ckpt-%08ld.h5", dir, step);
}

long ckpt_step_of(const char *path)
{
    const char *base = strrchr(path, '/');
    long step = -1;
    if (sscanf(base ? base + 1 : path, "ckpt-%ld.h5", &step) != 1) return -1;
    return step;
}

/* Steps of the complete checkpoint files in dir, newest first: at most cap
 * of them in steps[]; returns how many there are in all (-1: out of memory). */
static int list_steps(const char *dir, long *steps, int cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, room = 0;
    long *all = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        long step;
        char tail[8];
        if (sscanf(e->d_name, "ckpt-%ld.h%7s", &step, tail) != 2 || strcmp(tail, "5") || step < 0) continue;
        if (n == room) {
            room = room ? 2 * room : 64;
            long *grown = isth_realloc(all, sizeof(long) * (size_t)room);
            if (!grown) {
                isth_free(all);
                closedir(d);
                return -1;
            }
            all = grown;
        }
        all[n++] = step;
    }
    closedir(d);
    for (int i = 0; i < n; i++) /* sort descending */
        for (int j = i + 1; j < n; j++)
            if (all[j] > all[i]) {
                long t = all[i];
                all[i] = all[j];
                all[j] = t;
            }
    if (steps && cap > 0) memcpy(steps, all, sizeof(long) * (size_t)(n < cap ? n : cap));
    isth_free(all);
    return n;
}

/* Remove all but the newest `keep` files, and the file of step `pin`
 * (>= 0: the newest one every site completed, while a site is out). */
void ckpt_prune(const char *dir, int keep, long pin)
{
    int n = list_steps(dir, NULL, 0);
    long *steps = n > 0 ? isth_malloc(sizeof(long) * (size_t)n) : NULL;
    if (!steps) return; /* nothing to prune, or no memory: keep every file */
    const int listed = n;
    n = list_steps(dir, steps, listed);
    if (n > listed) n = listed;
    for (int i = keep; i < n; i++) {
        if (steps[i] == pin) continue;
        char path[CONFIG_FILE_PATH_MAX + 64];
        ckpt_file_path(dir, steps[i], path, sizeof path);
        unlink(path);
    }
    isth_free(steps);
}

/* Can files be created, written and renamed in dir? ISTH_EINPUT naming it. */
static int probe_dir(const char *what, const char *dir)
{
    CHECK(make_dirs(dir));
    char probe[CONFIG_FILE_PATH_MAX + 64], moved[CONFIG_FILE_PATH_MAX + 96];
    snprintf(probe, sizeof probe, "%s/.isthmus-probe-%ld", dir, (long)getpid());
    snprintf(moved, sizeof moved, "%s.renamed", probe);
    int fd = open(probe, O_CREAT | O_WRONLY | O_EXCL, 0644);
    const char *step = "create a file";
    int ok = fd >= 0;
    if (ok) {
        step = "write";
        ok = write(fd, "x", 1) == 1;
        ok = close(fd) == 0 && ok;
    }
    if (ok) {
        step = "rename a file";
        ok = rename(probe, moved) == 0;
    }
    const int err = errno;
    unlink(ok ? moved : probe);
    if (!ok)
        return isth_fail(ISTH_EINPUT, "%s %s: cannot %s there: %s (checked before training)", what, dir, step,
                         strerror(err));
    return ISTH_OK;
}

int ckpt_check_outputs(Trainer *tr)
{
    const Topology *t = &tr->topo;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    int mine = ISTH_OK;
    if (site_rank == 0) {
        /* only this site's first rank sees it: it prints, quiet or not */
        const int was = status_set_quiet(0);
        char dir[CONFIG_FILE_PATH_MAX];
        ckpt_site_dir(tr, dir, sizeof dir);
        mine = probe_dir("[train] out_dir", tr->cfg.train.out_dir);
        if (mine == ISTH_OK) mine = probe_dir(tr->cfg.checkpoint.dir[0] ? "[checkpoint] dir" : "checkpoint directory", dir);
        /* the model file is written at the end: a directory (or device) in its place is found now */
        char model[CONFIG_FILE_PATH_MAX + 80];
        trainer_model_path(tr, model, sizeof model);
        struct stat st;
        if (mine == ISTH_OK && lstat(model, &st) == 0 && !S_ISREG(st.st_mode))
            mine = isth_fail(ISTH_EINPUT, "model file %s: exists and is not a regular file (training would end "
                             "unable to write it)", model);
        status_set_quiet(was);
    }
    int *all = isth_malloc(sizeof(int) * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    int rc = trainer_control(tr, &mine, sizeof mine, all, "output check");
    for (int s = 0; rc == ISTH_OK && s < t->n_sites; s++)
        if (all[s] != ISTH_OK) rc = all[s]; /* the site's first rank printed why */
    isth_free(all);
    return rc;
}

/* ---- choosing the checkpoint to resume from ------------------------------- */

int ckpt_find(Trainer *tr, const char *arg, char *path, size_t cap, const long *skip, int n_skip)
{
    const Topology *t = &tr->topo;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    char dir[CONFIG_FILE_PATH_MAX];
    ckpt_site_dir(tr, dir, sizeof dir);
    long valid[CKPT_MAX_LIST];
    for (int i = 0; i < CKPT_MAX_LIST; i++) valid[i] = -1;
    int rc = ISTH_OK;
    long want = -1;
    long *all = isth_malloc(sizeof(long) * CKPT_MAX_LIST * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    if (strcmp(arg, "auto")) { /* an explicit file: its step, every site's file of that step */
        char reason[512];
        long mine[2] = {ISTH_OK, -1}; /* (status, step) of world rank 0's check; the others' are not read */
        if (t->world_rank == 0 && ckpt_check(arg, reason, sizeof reason, &mine[1], 0) != ISTH_OK)
            mine[0] = isth_fail(ISTH_EINPUT, "checkpoint %s: invalid: %s", arg, reason);
        rc = trainer_control(tr, mine, sizeof mine, all, "resume file");
        if (rc == ISTH_OK) rc = (int)all[0];
        want = all[1];
        if (rc != ISTH_OK) isth_free(all);
        CHECK(rc);
        if (t->n_sites == 1) {
            isth_free(all);
            snprintf(path, cap, "%s", arg);
            return ISTH_OK;
        }
    }
    if (site_rank == 0) {
        long steps[CKPT_MAX_LIST * 4];
        int n = list_steps(dir, steps, CKPT_MAX_LIST * 4), k = 0;
        if (n > CKPT_MAX_LIST * 4) n = CKPT_MAX_LIST * 4; /* the newest ones */
        for (int i = 0; i < n && k < CKPT_MAX_LIST; i++) {
            if (want >= 0 && steps[i] != want) continue;
            int skipped = 0;
            for (int j = 0; j < n_skip; j++) skipped |= steps[i] == skip[j];
            if (skipped) continue; /* a load found it damaged */
            char p[CONFIG_FILE_PATH_MAX + 64], reason[512];
            ckpt_file_path(dir, steps[i], p, sizeof p);
            /* structure and attributes here; the load verifies every value */
            if (ckpt_check(p, reason, sizeof reason, NULL, 0) == ISTH_OK) {
                valid[k++] = steps[i];
            } else {
                fprintf(stderr, "isthmus: warning: checkpoint %s: invalid: %s; falling back to an older one\n", p, reason);
                fflush(stderr);
            }
        }
    }
    /* the sites agree on the newest step every one of them has: each site's
     * first rank sends its list through the link */
    rc = trainer_control(tr, valid, sizeof valid, all, "resume step");
    if (rc != ISTH_OK) isth_free(all);
    CHECK(rc);
    long best = -1;
    for (int i = 0; i < CKPT_MAX_LIST; i++) {
        long s = all[i];
        if (s < 0) continue;
        int everywhere = 1;
        for (int site = 1; site < t->n_sites && everywhere; site++) {
            int found = 0;
            for (int j = 0; j < CKPT_MAX_LIST; j++) found |= all[(size_t)site * CKPT_MAX_LIST + j] == s;
            everywhere = found;
        }
        if (everywhere && s > best) best = s;
    }
    /* newer files at some site than the step every site has (a site trained
     * on alone after the other left or was lost, then stopped too): said,
     * as is a start from step 0 over checkpoints that have no step in common */
    for (int site = 0; site < t->n_sites && t->world_rank == 0 && want < 0; site++) {
        long newest = -1;
        for (int j = 0; j < CKPT_MAX_LIST; j++)
            if (all[(size_t)site * CKPT_MAX_LIST + j] > newest) newest = all[(size_t)site * CKPT_MAX_LIST + j];
        if (newest > best && best >= 0)
            fprintf(stderr, "isthmus: warning: resume: site %s has checkpoints up to step %ld, but the newest step "
                            "every site has is %ld: the later ones are set aside\n", t->sites[site].name, newest,
                    best);
        else if (newest > best)
            fprintf(stderr, "isthmus: warning: resume: site %s has checkpoints up to step %ld, but no step is at "
                            "every site: starting from step 0\n", t->sites[site].name, newest);
        fflush(stderr);
    }
    isth_free(all);
    if (best < 0) {
        if (want >= 0) return isth_fail(ISTH_EINPUT, "checkpoint step %ld: not valid at every site", want);
        path[0] = '\0';
        return ISTH_OK;
    }
    ckpt_file_path(dir, best, path, cap);
    return ISTH_OK;
}

int ckpt_set_aside_newer(Trainer *tr)
{
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(tr->topo.site_comm, &site_rank));
    if (site_rank != 0) return ISTH_OK;
    char dir[CONFIG_FILE_PATH_MAX];
    ckpt_site_dir(tr, dir, sizeof dir);
    const int n = list_steps(dir, NULL, 0);
    long *steps = n > 0 ? isth_malloc(sizeof(long) * (size_t)n) : NULL;
    if (!steps) return ISTH_OK; /* none, or no memory to list them: the files stay as they are */
    int listed = list_steps(dir, steps, n);
    if (listed > n) listed = n; /* a file made since the count */
    int rc = ISTH_OK;
    for (int i = 0; i < listed && rc == ISTH_OK && steps[i] > tr->step; i++) {
        char path[CONFIG_FILE_PATH_MAX + 64], aside[CONFIG_FILE_PATH_MAX + 80];
        ckpt_file_path(dir, steps[i], path, sizeof path);
        snprintf(aside, sizeof aside, "%s.passed", path);
        if (rename(path, aside) != 0)
            rc = isth_fail(ISTH_ERUNTIME, "resume: cannot set %s aside: %s", path, strerror(errno));
        else
            printf("resume: %s is past step %ld, which every site resumed from: kept as %s\n", path, tr->step, aside);
    }
    fflush(stdout);
    isth_free(steps);
    return rc;
}
