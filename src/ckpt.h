/* ckpt.h — HDF5 checkpoints: complete training state, written collectively
 * per site, validated, selected for restart and pruned.
 *
 * Owns: what a checkpoint contains and how a run resumes from one. One file
 * per site per checkpoint, <dir>/<site>/ckpt-<step>.h5, written by all the
 * site's ranks at once with parallel HDF5 (each its own chunks), under a
 * temporary name and renamed when complete. Contents:
 *   attributes  format_version, config, step, outer_steps, tokens, written,
 *               site, mode, first_learner, learners, exchanges, adam_t
 *   sync        /model (theta), /inner/m, /inner/v  (every learner is equal)
 *   outer modes /model (the anchor = global model), /outer/momentum,
 *               /outer/residual (error feedback, by chunk owner),
 *               /learner_<k>/model, /learner_<k>/inner/m, /learner_<k>/inner/v
 *               for each learner k of the site
 *               (butterfly: /learner_<k>/outer/{anchor,momentum,residual})
 *   in flight   /outer/pending (or /learner_<k>/outer/{pending,sent}): the
 *               drained results of exchanges still waiting for their step
 *   /state/fragments, /state/started  per fragment: last outer start, the
 *               start of the exchange in flight (-1 none)
 * All tensors have canonical shapes, so a run with another expert-parallel
 * degree reads the same file; a restart with the same layout continues bit
 * for bit. Validation (ckpt_validate.h) reads every value block by block.
 * Must not: decide when to checkpoint (run.c) or touch the data stream.
 */
#ifndef ISTHMUS_CKPT_H
#define ISTHMUS_CKPT_H

#include "train.h"

/* Before training: every site's first rank checks that it can create,
 * write and rename files in [train] out_dir and its checkpoint directory;
 * ISTH_EINPUT on every rank when any cannot (collective). */
int ckpt_check_outputs(Trainer *tr);

/* Write a checkpoint of the current state (collective over every rank of
 * every site; the sites confirm completion through the link). */
int ckpt_write(Trainer *tr);

/* Resolve `--resume` (a file or "auto") to this site's file: with "auto"
 * each site validates its newest files (falling back past invalid ones,
 * reported by name and reason) and the sites agree on the newest step they
 * all have (steps in skip[n_skip] are passed over: a load found them
 * damaged). Sets *path to "" when "auto" finds nothing (fresh start).
 * Collective over every rank; the sites agree through the link. */
int ckpt_find(Trainer *tr, const char *arg, char *path, size_t cap, const long *skip, int n_skip);

/* Steps --resume auto may pass over (damaged files), and the step of a
 * checkpoint file's name (-1: not one). */
#define CKPT_MAX_SKIP 16
long ckpt_step_of(const char *path);

/* After a resume at tr->step: this site's checkpoint files of later steps
 * (passed over: another site lacks them, or damaged) are renamed
 * <file>.passed, kept but out of the way, so that pruning the checkpoints
 * written from now on does not count them. The site's first rank. */
int ckpt_set_aside_newer(Trainer *tr);

/* Load the state of `path` into a created trainer (collective). Exit-2
 * errors for a model shape that contradicts the config; allowed changes
 * (schedule, layout) are applied and listed. Every value read is verified
 * (fletcher32, finite). fallback: a damaged value is not an error but a
 * warning ("falling back to an older one") and *damaged is set on every
 * rank of every site, so the caller can choose another step (--resume auto). */
int ckpt_load(Trainer *tr, const char *path, int fallback, int *damaged);

/* The live rejoin of a two-site run, collective over both sites: the live
 * site's (from_site's) first rank sends its checkpoint of `step` (just
 * written) through the link to the rejoining site's first rank, which writes it as
 * <its checkpoint dir>/rejoin-<step>.h5 (size bounded by the config, each
 * piece sealed by the link, a temporary name renamed when complete). *path: the
 * host's file on the host's ranks, the received one on the joiner's. */
int ckpt_share(Trainer *tr, int from_site, long step, char *path, size_t cap);

/* Load another site's file (`from_site`'s, received by ckpt_share): this
 * site's learners take copies of that site's learners' states (learner i of
 * this site the state of its learner i mod its count), error-feedback
 * residuals start at zero. Everything else as ckpt_load, without fallback. */
int ckpt_load_copy(Trainer *tr, const char *path, int from_site);

#endif
