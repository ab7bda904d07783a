/* ckpt_share.h — the live rejoin's file transfer: the host's checkpoint
 * sent through the link to the site that rejoins the run.
 *
 * Owns: moving the file's bytes between the two sites' first ranks in
 * pieces the link seals, the bound on the size the joiner accepts (what
 * the config's largest site could have written), and the received file's
 * name, rejoin-<step>.h5 in the joiner's checkpoint directory (a temporary
 * name renamed when complete).
 * Must not: read or interpret the file's contents (ckpt_load.h loads it),
 * write checkpoints, or decide when a site rejoins (run.c).
 */
#ifndef ISTHMUS_CKPT_SHARE_H
#define ISTHMUS_CKPT_SHARE_H

#include <stddef.h>

#include "train.h"

/* The live rejoin, collective over every site of the new world: the
 * host's (from_site's) first rank sends its checkpoint of `step` (just
 * written) through the link to the rejoining site's (to_site's) first
 * rank, which writes it as <its checkpoint dir>/rejoin-<step>.h5 (size
 * bounded by the config, each piece sealed by the link, a temporary name
 * renamed when complete). *path: the received file on the joiner's ranks,
 * the site's own checkpoint of `step` on every other site's (the host's
 * included: each loads its own). */
int ckpt_share(Trainer *tr, int from_site, int to_site, long step, char *path, size_t cap);

#endif
