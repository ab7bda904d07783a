/* ckpt_share.h — a checkpoint file sent through the link: the host's to
 * the site that rejoins the live run, and on a cold restart the file of
 * the site ahead to the sites that fetch it (ckpt_files.h).
 *
 * Owns: moving the file's bytes between two sites' first ranks in
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
 * written) through the link to each rejoining site's (to[s]: site s, in
 * site order, piece by piece: each piece to every one in turn, so that no
 * receiver's wait is another's whole file) first rank, which writes it as <its checkpoint
 * dir>/rejoin-<step>.h5 (size bounded by the config, each piece sealed by
 * the link, a temporary name renamed when complete). *path: the received
 * file on a joiner's ranks, the site's own checkpoint of `step` on every
 * other site's (the host's included: each loads its own). */
int ckpt_share(Trainer *tr, int from_site, const unsigned char *to, long step, char *path, size_t cap);

/* The same to every site s with to[s] (the cold restart's fetch; in site
 * order), collective over every site: the sending and receiving sites'
 * ranks set *path as above, the others return at once. */
int ckpt_share_to(Trainer *tr, int from_site, long step, const unsigned char *to, char *path, size_t cap);

#endif
