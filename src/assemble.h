/* assemble.h — the whole model of a run whose experts are split across
 * sites ([outer] experts = split): every other site's experts brought
 * through the link to the ranks that write model.h5.
 *
 * The writer is the lead site's first learner (train.h's
 * trainer_lead_site); it holds the dense part (the same at every site: the
 * replica check) and its own site's experts. Every other site's first
 * learner sends its experts, each rank the expert chunks it holds, to the
 * writer's G ranks: the i-th of the n experts outside the lead site's
 * range (in id order) goes to writer rank i * G / n. One frame per expert
 * tensor and pair of ranks (link.h: sealed, authenticated, tag
 * LINK_TAG_ASSEMBLY, its exchange the tensor's id + 1), the tensor's
 * chunks in canonical order; tensors one after another, each one's frames
 * all posted, then awaited within the link's deadline. The writer's ranks
 * keep what they receive in host memory (their share of the other sites'
 * experts) until the file is written. With copies (expert_copies.h) a
 * site already lost is stood in for by the first live site holding a
 * copy of its experts (its first learner's rank copies_place sends them;
 * nothing moves when that is the writer's site: the copy is where it is
 * written), once a refresh has run; otherwise a lost site, or one that
 * misses the deadline (the federated launch: marked lost, the same on
 * every rank of the site), leaves the model not whole: no model.h5.
 *
 * Owns: who sends which chunks to whom, the received chunks, and the
 * assembly's byte count.
 * Must not: write files (train.c writes model.h5, asking assembly_chunk
 * for what arrived), decide when to assemble (run.c), or send anything
 * except through the link.
 */
#ifndef ISTHMUS_ASSEMBLE_H
#define ISTHMUS_ASSEMBLE_H

#include "backend.h"
#include "expert_copies.h"
#include "link.h"
#include "plan.h"
#include "topology.h"

typedef struct {
    int done;             /* assembly_gather ran */
    int whole;            /* no site lost: the writer's ranks hold every other site's experts (their share) */
    int lost_site;        /* not whole: the first site lost (-1: none) */
    int lost_during;      /* ... found lost during the assembly itself */
    int from_copy[CONFIG_MAX_SITES]; /* a lost site whose experts came from a copy */
    long copy_step[CONFIG_MAX_SITES]; /* ... the refresh it is of, where the writer holds it (-1: elsewhere) */
    int *src;             /* (E) the site each expert comes from: its owner, a holder of its copy; -1 none */
    const ExpertCopies *copies;
    const ChunkTable *ct;
    const Topology *topo;
    int lead;             /* the writer's site */
    float **at;           /* (n_chunks) where a received chunk lies, NULL: not received here */
    unsigned char **bufs; /* the received frames (header + payload), n_bufs of them */
    int n_bufs;
    double bytes;         /* this rank's bytes through the link for it, sent + received */
} Assembly;

/* Collective over every rank of every live site (each rank finds its
 * part: writer, sender or neither; a site's ranks agree on the outcome
 * through site_comm). `ct`: this rank's table (its site's experts held),
 * `be`: the weights sent (STATE_PARAMS), `copies`: the copies this rank
 * holds, `lead`: the writer's site. A lost site is not a failure
 * (a->whole 0, a->lost_site, unless a copy stood in); a frame that fails
 * its check is (ISTH_ERUNTIME naming its sender). */
int assembly_gather(Assembly *a, Link *l, const Topology *t, const ChunkTable *ct, Backend *be,
                    const ExpertCopies *copies, int lead);
/* The received chunk c on this rank, NULL when it did not come here. */
float *assembly_chunk(const Assembly *a, int c);
void assembly_free(Assembly *a);

#endif
