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
#include "ckpt_lineage.h"
#include "ckpt_validate.h"
#include "coll.h"
#include "status.h"

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

/* A valid file of a site: its step and its lineage's ID. */
typedef struct {
    long step;
    uint64_t id;
} Held;

/* What a site's first rank tells the others about its files, before the
 * list (whose length the sites agree on from this). */
typedef struct {
    long n;                        /* valid files */
    long complete;                 /* its newest step is train.steps and its model file of it is written */
    char lineage[CKPT_LINEAGE_CAP]; /* its newest file's ("" none) */
} Holding;

/* The model file site s writes when it ends the run as the lead site
 * (trainer_model_path with s the first site present). */
static void lead_model_path(const Trainer *tr, int s, char *out, size_t cap)
{
    if (s == 0) snprintf(out, cap, "%s/model.h5", tr->cfg.train.out_dir);
    else snprintf(out, cap, "%s/site-%s/model.h5", tr->cfg.train.out_dir, tr->topo.sites[s].name);
}

/* This site's valid files, newest first (the site's first rank): every file
 * it keeps, checked (structure and attributes; the load verifies every
 * value) and its lineage read. *held: allocated (NULL when none). */
static int list_valid(Trainer *tr, const char *dir, long want, const long *skip, int n_skip, Held **held,
                      Holding *h)
{
    *held = NULL;
    int n = list_steps(dir, NULL, 0);
    if (n < 0) return isth_fail(ISTH_ERUNTIME, "resume: out of memory listing %s", dir);
    if (n == 0) return ISTH_OK;
    long *steps = isth_malloc(sizeof(long) * (size_t)n);
    Held *out = isth_malloc(sizeof(Held) * (size_t)n);
    if (!steps || !out) {
        isth_free(steps);
        isth_free(out);
        return isth_fail(ISTH_ERUNTIME, "resume: out of memory listing %s", dir);
    }
    const int listed = list_steps(dir, steps, n);
    if (listed < n) n = listed; /* one went meanwhile */
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (want >= 0 && steps[i] != want) continue;
        int skipped = 0;
        for (int j = 0; j < n_skip; j++) skipped |= steps[i] == skip[j];
        if (skipped) continue; /* a load found it damaged */
        char p[CONFIG_FILE_PATH_MAX + 64], reason[512], lineage[CKPT_LINEAGE_CAP];
        ckpt_file_path(dir, steps[i], p, sizeof p);
        if (ckpt_check(p, reason, sizeof reason, NULL, 0) != ISTH_OK) {
            fprintf(stderr, "isthmus: warning: checkpoint %s: invalid: %s; falling back to an older one\n", p, reason);
        } else if (ckpt_lineage_of_file(p, tr->topo.n_sites, lineage, sizeof lineage) != ISTH_OK) {
            fprintf(stderr, "isthmus: warning: checkpoint %s: invalid: attribute lineage unreadable; falling back "
                            "to an older one\n", p);
        } else {
            if (k == 0) snprintf(h->lineage, sizeof h->lineage, "%s", lineage);
            out[k].step = steps[i];
            out[k++].id = ckpt_lineage_id(lineage);
        }
        fflush(stderr);
    }
    isth_free(steps);
    h->n = k;
    if (k > 0 && out[0].step == tr->cfg.train.steps) { /* ended here: is its model written? */
        char model[CONFIG_FILE_PATH_MAX + 80], reason[512];
        long step = -1;
        lead_model_path(tr, tr->topo.site, model, sizeof model);
        h->complete = ckpt_check(model, reason, sizeof reason, &step, 0) == ISTH_OK && step == out[0].step;
    }
    *held = out;
    return ISTH_OK;
}

/* "a", "a and b", "a, b and c": the sites with mark[s] */
static void name_sites(const Trainer *tr, const unsigned char *mark, char *out, size_t cap)
{
    int n = 0, done = 0;
    for (int s = 0; s < tr->topo.n_sites; s++) n += mark[s] != 0;
    out[0] = '\0';
    for (int s = 0; s < tr->topo.n_sites; s++) {
        if (!mark[s]) continue;
        const size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", done == 0 ? "" : done == n - 1 ? " and " : ", ", tr->topo.sites[s].name);
        done++;
    }
}

/* Decide from every site's files (the same on every rank). */
static int decide(Trainer *tr, long want, const Holding *hold, const Held *all, long width, CkptPlan *plan)
{
    const Topology *t = &tr->topo;
    const int S = t->n_sites;
    long newest[CONFIG_MAX_SITES], top = -1;
    int src = -1, diverged = 0;
    for (int s = 0; s < S; s++) {
        newest[s] = hold[s].n > 0 ? all[s * width].step : -1;
        if (newest[s] > top) top = newest[s], src = s;
    }
    if (top < 0 && want >= 0) return isth_fail(ISTH_EINPUT, "checkpoint step %ld: not valid at every site", want);
    if (top < 0) return ISTH_OK; /* no file anywhere: a fresh start */
    const uint64_t id_src = all[src * width].id;
    for (int s = 0; s < S; s++) {
        if (newest[s] == top) {
            diverged |= all[s * width].id != id_src;
        } else { /* behind: is its newest state one the source's training went through? (none: step 0) */
            uint64_t id = 0;
            const long at = newest[s] < 0 ? 0 : newest[s];
            diverged |= !ckpt_lineage_at(hold[src].lineage, at, &id) || id != (newest[s] < 0 ? 0 : all[s * width].id);
            if (want >= 0) return isth_fail(ISTH_EINPUT, "checkpoint step %ld: not valid at every site", want);
        }
    }
    char names[CONFIG_MAX_SITES * 40];
    /* experts split across sites: a site's experts are in its own files
     * only (another site's file never holds them), so a site behind cannot
     * continue from the one ahead: every site resumes from the newest step
     * all of them hold, as after a divergence */
    int behind = 0;
    for (int s = 0; s < S; s++) behind |= newest[s] != top;
    const int split_behind = !diverged && behind && t->experts_split;
    if (!diverged && !split_behind) {
        plan->step = top;
        for (int s = 0; s < S; s++) plan->any_fetch |= plan->fetch[s] = newest[s] != top;
        plan->source = plan->any_fetch ? src : -1;
        plan->complete = hold[src].complete != 0;
        if (tr->log && plan->complete) {
            char model[CONFIG_FILE_PATH_MAX + 80];
            lead_model_path(tr, src, model, sizeof model);
            printf("resume: the run is complete: site %s trained it to step %ld (train.steps) and wrote %s; "
                   "nothing to train\n", t->sites[src].name, top, model);
        } else if (tr->log && plan->any_fetch) {
            char behind[CONFIG_MAX_SITES * 24] = "";
            for (int s = 0, k = 0; s < S; s++) {
                if (!plan->fetch[s]) continue;
                const size_t len = strlen(behind);
                if (newest[s] < 0) snprintf(behind + len, sizeof behind - len, "%s%s none", k++ ? ", " : "", t->sites[s].name);
                else snprintf(behind + len, sizeof behind - len, "%s%s %ld", k++ ? ", " : "", t->sites[s].name, newest[s]);
            }
            name_sites(tr, plan->fetch, names, sizeof names);
            printf("resume: site %s holds the run's newest step, %ld, and trained on from the others' newest (%s): "
                   "every site continues from step %ld, %s with %s's checkpoint sent through the link\n",
                   t->sites[src].name, top, behind, top, names, t->sites[src].name);
        }
        fflush(stdout);
        return ISTH_OK;
    }
    if (want >= 0)
        return isth_fail(ISTH_EINPUT, "checkpoint step %ld: the sites' files of it hold different training (each "
                         "trained alone before it)", want);
    /* diverged: the newest step every site holds with the same lineage */
    long common = -1;
    for (long i = 0; i < hold[0].n && common < 0; i++) {
        const Held c = all[i];
        int everywhere = 1;
        for (int s = 1; s < S && everywhere; s++) {
            int found = 0;
            for (long j = 0; j < hold[s].n && !found; j++) found = all[s * width + j].step == c.step && all[s * width + j].id == c.id;
            everywhere = found;
        }
        if (everywhere) common = c.step;
    }
    unsigned char ahead[CONFIG_MAX_SITES] = {0};
    char each[CONFIG_MAX_SITES * 40] = "", owners[CONFIG_MAX_SITES * 48] = "";
    int n_ahead = 0;
    for (int s = 0; s < S; s++) n_ahead += ahead[s] = newest[s] > common;
    for (int s = 0, k = 0; s < S; s++) { /* "a to 700, b to 920"; "a's and b's" */
        if (!ahead[s]) continue;
        size_t len = strlen(each);
        snprintf(each + len, sizeof each - len, "%s%s to %ld", k ? ", " : "", t->sites[s].name, newest[s]);
        len = strlen(owners);
        snprintf(owners + len, sizeof owners - len, "%s%s's", k == 0 ? "" : k == n_ahead - 1 ? " and " : ", ",
                 t->sites[s].name);
        k++;
    }
    name_sites(tr, ahead, names, sizeof names);
    if (split_behind && common < 0)
        return isth_fail(ISTH_EINPUT, "resume: experts split across sites: no step is held by every site (%s), and a "
                         "site's experts are in its own checkpoints only: bring back the behind site's files, or start "
                         "without --resume", each);
    if (split_behind && tr->log)
        fprintf(stderr, "isthmus: warning: resume: experts split across sites: site(s) %s hold newer checkpoints than "
                        "the others (%s), but a site's experts are in its own checkpoints only: every site resumes from "
                        "%ld, the newest step they all hold; %s later files set aside as .passed\n", names, each, common,
                owners);
    else if (tr->log && common >= 0)
        fprintf(stderr, "isthmus: warning: resume: sites %s each trained alone after step %ld (%s): %s resume from "
                        "%ld, the newest step they share; %s later files set aside as .passed\n", names, common, each,
                S == 2 ? "both" : "all sites", common, owners);
    else if (tr->log)
        fprintf(stderr, "isthmus: warning: resume: sites %s each trained alone (%s) and no step is at every site with "
                        "the same training: starting from step 0\n", names, each);
    fflush(stderr);
    plan->step = common;
    return ISTH_OK;
}

int ckpt_find(Trainer *tr, const char *arg, CkptPlan *plan, const long *skip, int n_skip)
{
    const Topology *t = &tr->topo;
    memset(plan, 0, sizeof *plan);
    plan->step = -1;
    plan->source = -1;
    int site_rank;
    CHECK_MPI(MPI_Comm_rank(t->site_comm, &site_rank));
    char dir[CONFIG_FILE_PATH_MAX];
    ckpt_site_dir(tr, dir, sizeof dir);
    int rc = ISTH_OK;
    long want = -1;
    if (strcmp(arg, "auto")) { /* an explicit file: its step, every site's file of that step */
        char reason[512];
        long mine[2] = {ISTH_OK, -1}, *all = isth_malloc(sizeof mine * (size_t)t->n_sites);
        CHECK_ALLOC(all);
        /* (status, step) of world rank 0's check; the others' are not read */
        if (t->world_rank == 0 && ckpt_check(arg, reason, sizeof reason, &mine[1], 0) != ISTH_OK)
            mine[0] = isth_fail(ISTH_EINPUT, "checkpoint %s: invalid: %s", arg, reason);
        rc = trainer_control(tr, mine, sizeof mine, all, "resume file");
        if (rc == ISTH_OK) rc = (int)all[0];
        want = all[1];
        isth_free(all);
        CHECK(rc);
        if (t->n_sites == 1) {
            snprintf(plan->path, sizeof plan->path, "%s", arg);
            plan->step = want;
            return ISTH_OK;
        }
    }
    Holding mine;
    memset(&mine, 0, sizeof mine);
    Held *held = NULL;
    if (site_rank == 0) rc = list_valid(tr, dir, want, skip, n_skip, &held, &mine);
    if (!coll_all_ok(t->site_comm, rc == ISTH_OK)) {
        isth_free(held);
        return rc != ISTH_OK ? rc : ISTH_ERUNTIME;
    }
    /* the sites agree on what each holds: how many files and the newest's
     * lineage first, then the lists (as long as the longest) */
    Holding *hold = isth_malloc(sizeof *hold * (size_t)t->n_sites);
    if (!hold) isth_free(held);
    CHECK_ALLOC(hold);
    rc = trainer_control(tr, &mine, sizeof mine, hold, "resume files");
    long width = 0;
    for (int s = 0; rc == ISTH_OK && s < t->n_sites; s++) {
        if (link_is_lost(&tr->link, s))
            rc = isth_fail(ISTH_ERUNTIME, "resume: site %s sent nothing in the resume agreement", t->sites[s].name);
        if (hold[s].n > width) width = hold[s].n;
    }
    Held *list = rc == ISTH_OK ? isth_calloc((size_t)(width ? width : 1), sizeof *list) : NULL;
    Held *all = rc == ISTH_OK ? isth_calloc((size_t)(width ? width : 1) * (size_t)t->n_sites, sizeof *all) : NULL;
    if (rc == ISTH_OK && (!list || !all)) rc = isth_fail(ISTH_ERUNTIME, "resume: out of memory for %ld steps", width);
    if (rc == ISTH_OK && held) memcpy(list, held, sizeof *list * (size_t)mine.n);
    if (rc == ISTH_OK && width > 0) rc = trainer_control(tr, list, sizeof *list * (size_t)width, all, "resume steps");
    if (rc == ISTH_OK) rc = decide(tr, want, hold, all, width, plan);
    isth_free(held);
    isth_free(list);
    isth_free(all);
    isth_free(hold);
    CHECK(rc);
    if (plan->step >= 0 && !plan->fetch[t->site]) ckpt_file_path(dir, plan->step, plan->path, sizeof plan->path);
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
