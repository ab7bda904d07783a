/* ckpt_lineage.h — the lineage of a site's training state: which sites'
 * training it holds since when, so that a cold restart can tell a site that
 * is strictly ahead on the run's one history from two sites that each
 * trained alone (docs/architecture.md, failure rule 11).
 *
 * A lineage is a list of entries "FROM:MASK:ID" (hex MASK and ID, ';'
 * between them, oldest first): from the checkpoint of step FROM on, the
 * state was trained by the sites in MASK, and its files carry ID. A fresh
 * start is "0:<every site>:0". Every checkpoint stores the lineage of its
 * state (attribute `lineage`); the first checkpoint written after the set
 * of sites present changed (a loss, a leave, a rejoin, a restart) appends
 * an entry whose ID hashes the previous ID, the new set and the step, so
 * sites that go through the same events hold the same ID, and two sites
 * that each trained alone hold different ones. A load takes the file's
 * lineage (a rejoin's or a fetch's copy: the source's).
 * Owns: the lineage of the state this process holds (one per process: it
 * outlives a rejoin's new trainer), its text, the entry a write appends,
 * the look-up of the ID at a step, reading a file's lineage by one rank.
 * Must not: write or load checkpoints (ckpt.c, ckpt_load.c) or choose the
 * step to resume from (ckpt_files.c).
 */
#ifndef ISTHMUS_CKPT_LINEAGE_H
#define ISTHMUS_CKPT_LINEAGE_H

#include <stddef.h>
#include <stdint.h>

#include "train.h"

/* The text's room, NUL included: the oldest entries are dropped past it
 * (a step older than every entry kept then matches nothing). */
#define CKPT_LINEAGE_CAP 1024

/* The lineage of the state this process holds: a fresh start's, or one
 * loaded (NULL or "": a file written before lineages, taken as a fresh
 * start's). Every rank alike. */
void ckpt_lineage_set(const char *text, int n_sites);

/* The lineage a checkpoint of the current state stores: the held one,
 * with an entry appended when the sites present (the link's) differ from
 * its last entry's. Every rank of the site alike (the lost set is agreed). */
const char *ckpt_lineage_for_write(const Trainer *tr);

/* The ID of a lineage's newest entry (the ID its files of now carry). */
uint64_t ckpt_lineage_id(const char *text);

/* The ID a lineage's files of `step` carry: 1 and *id, or 0 when the step
 * is older than the oldest entry kept (unknown). */
int ckpt_lineage_at(const char *text, long step, uint64_t *id);

/* A file's lineage, read by the calling rank alone (a file without one: a
 * fresh start's). ISTH_OK, or ISTH_EINPUT when unreadable. */
int ckpt_lineage_of_file(const char *path, int n_sites, char *out, size_t cap);

#endif
