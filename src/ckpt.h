/* ckpt.h — writing an HDF5 checkpoint: the complete training state of a
 * site, written collectively by the site's ranks.
 *
 * Owns: what a checkpoint contains, and its write. One file per site per
 * checkpoint (named and kept by ckpt_files.h), written by all the site's
 * ranks at once with parallel HDF5 (each its own chunks), under a
 * temporary name and renamed when complete. Contents:
 *   attributes  format_version, config, step, outer_steps, tokens, written,
 *               site, mode, first_learner, learners, exchanges, adam_t,
 *               lineage (ckpt_lineage.h), every_site (the step the writer
 *               keeps for the sites' next joint restart while a site is out)
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
 *   split experts with copies: /copies, /mirror (the copies this site
 *               holds of other sites' experts, the mirrors of its own:
 *               expert_copies.h), /state/copies (their counters)
 * All tensors have canonical shapes, so a run with another expert-parallel
 * degree reads the same file (ckpt_load.h); a restart with the same layout
 * continues bit for bit. Validation (ckpt_validate.h) reads every value
 * block by block.
 * Must not: decide when to checkpoint (run.c), read a checkpoint back, or
 * touch the data stream.
 */
#ifndef ISTHMUS_CKPT_H
#define ISTHMUS_CKPT_H

#include "train.h"

/* Model-sized groups (a float32 value per parameter) a site's file holds:
 * the contents above for a site of `learners` learners, its optimiser's
 * state (shampoo: CKPT_SHAMPOO_GROUPS more per learner, counted at a
 * model's size each, the bound the writer reserves), the residual (sync:
 * error feedback between sites; every outer mode writes one) and the
 * exchanges in flight at the checkpoint's step. The writer sizes its file
 * by it; `isthmus plan` prints it. */
int ckpt_groups(OuterMode mode, int learners, int shampoo, int residual, int in_flight);

/* Write a checkpoint of the current state (collective over every rank of
 * every site; the sites confirm completion through the link), then prune
 * the site's older files. */
int ckpt_write(Trainer *tr);

#endif
