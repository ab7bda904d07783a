/* ckpt_files.h — a site's checkpoint files on disk: where they go, what
 * they are called, which exist, which are kept, and which one a run
 * resumes from.
 *
 * Each site keeps its files in its own directory,
 * <[checkpoint] dir>/<site>/ (default <out_dir>/checkpoints/<site>/), as
 * ckpt-<step, 8 digits>.h5; a file of a step past the one every site
 * resumed from is renamed ckpt-<step>.h5.passed, kept but no longer listed.
 * Owns: the directory and file names, listing the complete files, pruning
 * them, setting the passed-over ones aside, probing the output directories
 * before training, and the sites' agreement on what each resumes from
 * (the site ahead, fetched by the others; a complete run; a rollback
 * where the sites' lineages diverge).
 * Must not: write or read a checkpoint's contents (ckpt.c, ckpt_load.c;
 * it checks candidates through ckpt_validate.h and reads their lineage
 * through ckpt_lineage.h), move files between sites (ckpt_share.h) or
 * decide when to checkpoint (run.c).
 */
#ifndef ISTHMUS_CKPT_FILES_H
#define ISTHMUS_CKPT_FILES_H

#include <stddef.h>

#include "train.h"

/* This site's checkpoint directory, and the file of `step` in a directory. */
void ckpt_site_dir(const Trainer *tr, char *out, size_t cap);
void ckpt_file_path(const char *dir, long step, char *out, size_t cap);

/* Steps --resume auto may pass over (damaged files). */
#define CKPT_MAX_SKIP 16

/* Remove all but the newest `keep` files of dir, and the file of step
 * `pin` (>= 0: the newest one every site completed, while a site is out).
 * The site's first rank. */
void ckpt_prune(const char *dir, int keep, long pin);

/* Before training: every site's first rank checks that it can create,
 * write and rename files in [train] out_dir and its checkpoint directory;
 * ISTH_EINPUT on every rank when any cannot (collective). */
int ckpt_check_outputs(Trainer *tr);

/* What a resume loads (ckpt_find's answer, the same on every rank of every
 * site but path). */
typedef struct {
    char path[CONFIG_FILE_PATH_MAX + 64]; /* this site's own file to load; "" none (fresh, or it fetches) */
    long step;                /* the step every site continues from; -1: step 0 (fresh start) */
    int source;               /* >= 0: the site whose file the sites in fetch[] receive and load as a copy */
    unsigned char fetch[CONFIG_MAX_SITES];
    int any_fetch;            /* some site fetches: every site writes this step at once after the load */
    int complete;             /* the run ended at this step and its model is written: nothing to train */
} CkptPlan;

/* Resolve `--resume` (a file or "auto") to what each site loads. With
 * "auto" each site's first rank validates every checkpoint file it keeps
 * (invalid ones reported by name and reason; steps in skip[n_skip] passed
 * over: a load found them damaged) and reads its lineage (ckpt_lineage.h);
 * the sites exchange their lists through the link and every rank decides
 * alike (docs/architecture.md, failure rule 11):
 *  - the site holding the newest step is the source when every other site's
 *    newest state is one its lineage passed through (one site strictly
 *    ahead on the run's one history; a site with no file counts as at step
 *    0): the sites without that step fetch the source's file, and every
 *    site continues from it; if that step is train.steps and the source
 *    wrote its model file, the run is complete;
 *  - otherwise (the newest states diverge: two sites trained alone) every
 *    site resumes from the newest step whose files carry the same lineage
 *    at every site, and one line says which and why.
 * Collective over every rank; the sites agree through the link. */
int ckpt_find(Trainer *tr, const char *arg, CkptPlan *plan, const long *skip, int n_skip);
/* After a resume at tr->step: this site's checkpoint files of later steps
 * (passed over: another site lacks them, or damaged) are renamed
 * <file>.passed, kept but out of the way, so that pruning the checkpoints
 * written from now on does not count them. The site's first rank. */
int ckpt_set_aside_newer(Trainer *tr);

#endif
