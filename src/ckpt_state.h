/* ckpt_state.h — the parts of the training state moved between a trainer
 * and a checkpoint file's model-shaped groups, for the write (ckpt.c) and
 * the load (ckpt_load.c) alike.
 *
 * Each rank transfers the chunks it owns (its share of the dense chunks
 * and its experts), and only where `active` says (the learner whose state
 * the group holds). The backend's state (weights, moments, shampoo's
 * statistics) goes through the scratch's host staging one tensor at a time
 * (stateview.h); the outer state and the error-feedback residuals are host
 * buffers already and go straight to h5io.
 *
 * Owns: the checkpoint scratch (the fragment table and the staging view,
 * allocated and agreed over the site before a file is opened), the views
 * h5io reads and writes through, and the names of shampoo's groups.
 * Must not: open, create or name files, choose the groups' names (the
 * caller gives them), or decide which learner's state a rank takes.
 */
#ifndef ISTHMUS_CKPT_STATE_H
#define ISTHMUS_CKPT_STATE_H

#include "h5io.h"
#include "stateview.h"
#include "train.h"

/* Scratch of a checkpoint write or load, allocated before the file is
 * opened and agreed over the site: a rank that lacks memory must not leave
 * the others inside an HDF5 collective. */
typedef struct {
    double *frag;   /* (2P) per-fragment last start and start in flight */
    StateView view; /* the backend's state, one tensor of owned chunks at a time */
} CkptScratch;

/* Collective over the site; ISTH_ERUNTIME on every rank when any lacks memory. */
int ckpt_scratch_alloc(const Trainer *tr, CkptScratch *sc);
void ckpt_scratch_free(CkptScratch *sc);

/* The backend's state `which` (params or moments) to (reading 0) or from
 * (reading 1) `group`, through the scratch's view; collective over the
 * file's ranks, a failed get or put agreed among them. */
int ckpt_transfer_state(H5File *f, const Trainer *tr, CkptScratch *sc, const char *group, StateKind which,
                        int active, int reading);

/* Shampoo's statistics and roots beside the moments, under PREFIX (e.g.
 * "/inner" or "/learner_3/inner"); nothing for the other optimisers. */
#define CKPT_SHAMPOO_GROUPS 4
int ckpt_uses_shampoo(const Trainer *tr);
int ckpt_transfer_shampoo(H5File *f, Trainer *tr, CkptScratch *sc, const char *prefix, int active, int reading);

/* Read the expert chunks alone of model-shaped `group` (a live rejoin of
 * split experts takes its experts from the live site's copies of them):
 * into the parameters (through the scratch's view) and the outer state
 * `which`; the dense chunks are left as they are. */
int ckpt_read_experts(H5File *f, Trainer *tr, CkptScratch *sc, const char *group, OuterState which);

/* The outer state `which` and the error-feedback residuals (host buffers).
 * A read of OUTER_PENDING skips the fragments with no result held. */
int ckpt_write_outer(H5File *f, const Trainer *tr, const char *group, OuterState which, int active);
int ckpt_write_residual(H5File *f, const Trainer *tr, const char *group, int active);
int ckpt_read_outer(H5File *f, Trainer *tr, const char *group, OuterState which);
int ckpt_read_residual(H5File *f, Trainer *tr, const char *group);

#endif
