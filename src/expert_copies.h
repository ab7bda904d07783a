/* expert_copies.h — split experts' copies ([outer] expert_replicas = r >
 * 1): each site's experts also held by the r - 1 sites after it (config
 * order, wrapping), refreshed every expert_refresh outer periods, so that
 * a site's loss does not lose its experts.
 *
 * Where a copy lives: site h's first learner; of the n = E - (h's own
 * experts) experts outside h's range, the i-th (in id order) on rank
 * i * G / n of it (copies_place; the whole model's writer, assemble.h,
 * receives the same experts on the same ranks, so a writer that holds a
 * copy has it where it writes it). Host memory, float32.
 *
 * A refresh (every rank of every live site, at the same steps): the
 * owner's first learner, each rank for the experts it holds, sends the
 * codec-encoded difference between its weights and its mirror (exactly
 * what every holder's copy is) and adds the decoded difference to the
 * mirror; each holder adds it to its copy. The codec ([outer] codec) and
 * the mirror make it error feedback: what one refresh's encoding drops
 * goes in the next. One frame per expert tensor and pair of ranks (link.h:
 * sealed, tag LINK_TAG_REFRESH, fragment 1, exchange (step / every) << 8 |
 * tensor + 1: the same at both ends whatever either resumed or rejoined
 * from), all posted, then awaited within the link's deadline; a site late
 * (the federated launch) is marked lost, the same on every rank of the
 * site, and what arrived from it before stays in the copy. Copies and
 * mirrors start from the initial weights (model_init_expert_chunk: the
 * same at every site), so nothing is sent for them before training.
 *
 * Owns: copies, mirrors, the refresh's schedule, frames and byte count.
 * Must not: write files (ckpt.c writes what copies_at shows), or train.
 */
#ifndef ISTHMUS_EXPERT_COPIES_H
#define ISTHMUS_EXPERT_COPIES_H

#include "backend.h"
#include "codec.h"
#include "config.h"
#include "link.h"
#include "plan.h"
#include "topology.h"

typedef struct {
    int on;               /* split experts with r > 1 */
    int replicas;         /* r */
    long every;           /* steps between refreshes: expert_refresh * inner_steps */
    Codec codec;
    CodecParams cp;
    int refreshes;        /* completed in the run (a resume carries them on) */
    int refreshes_loaded; /* ... of which a resume found in its checkpoint */
    long step;            /* the last one's step (-1: none yet) */
    long mirror_step;     /* the last one in which this site's experts went to a holder (-1: none) */
    int live_refreshes[CONFIG_MAX_SITES]; /* refreshes site s was live through (not late in): a copy of it exists */
    long from_step[CONFIG_MAX_SITES];     /* holder: the last refresh whose frames from s all arrived (-1: none) */
    float **copy;         /* (n_chunks) this rank's copy of chunk c, NULL: none here */
    float **mirror;       /* (n_chunks) what the holders have of a chunk this rank trains, NULL: none */
    float *copy_buf, *mirror_buf;
    double bytes;         /* this rank's bytes through the link for refreshes, sent + received */
    double seconds;       /* this rank's time in them */
} ExpertCopies;

/* Which rank of site h's first learner holds (or writes) expert e of
 * another site: of the n = E - h's experts outside h's range, the i-th at
 * i * G / n. */
int copies_place(const Topology *t, int h, int E, int e);
/* Does site h hold copies of site s's experts (r replicas)? */
int copies_holds(const Topology *t, int replicas, int h, int s);
/* Site h's first learner's world rank that sends expert e, h its owner
 * (the rank training it) or a holder of its copy. */
int copies_sender(const Topology *t, int h, int E, int e);

/* The values this rank (t's) keeps: copies of other sites' experts and
 * mirrors of its own (config --memory; the buffers copies_create makes,
 * in ALLOC_OUTER). */
int copies_plan(const Config *cfg, const Topology *t, const Model *m, size_t *copy, size_t *mirror);
/* Set up (every rank; off unless split with r > 1): the copies and
 * mirrors this rank keeps, at the initial weights. `ct`: this rank's
 * table (its site's experts). */
int copies_create(ExpertCopies *x, const Config *cfg, const Topology *t, const ChunkTable *ct);
void copies_destroy(ExpertCopies *x);
/* After training step `step` of `steps`: a refresh when one is due (every
 * `every` steps, not at the last), its line on the log (log: the logging
 * rank) when anything moved. */
int copies_after_step(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, Backend *be, long step,
                      long steps, int log);
/* One refresh (collective over every rank of every live site), from the
 * weights in `be` (STATE_PARAMS). A frame that fails its check or does not
 * decode is an error naming its sender; a late site is not. */
int copies_refresh(ExpertCopies *x, Link *l, const Topology *t, const ChunkTable *ct, Backend *be, long step);
/* This rank's copy of chunk c, NULL when it holds none. */
float *copies_chunk(const ExpertCopies *x, int c);

/* Checkpoints: /copies and /mirror, model-shaped groups in which each
 * rank writes the chunks it holds (a ChunkAt over a CopiesView), and the
 * counters (COPIES_STATE_VALUES(S) doubles: refreshes, step, mirror_step,
 * replicas, then per site live_refreshes, from_step). A resume reads them
 * back (any layout: the groups are canonical), so the copies go on bit for
 * bit. */
typedef struct {
    const ExpertCopies *x;
    const ChunkTable *ct;
    int mirror; /* the mirrors, else the copies */
} CopiesView;
float *copies_at(void *view, int tensor, int layer, int expert);
#define COPIES_STATE_VALUES(S) (4 + 2 * (S))
void copies_state_save(const ExpertCopies *x, int n_sites, double *out);
void copies_state_load(ExpertCopies *x, int n_sites, const double *in);

#endif
