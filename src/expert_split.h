/* expert_split.h — which site owns which experts when [outer] experts =
 * split: every expert trained by exactly one site, its copies held by the
 * r - 1 sites after it (outer.expert_replicas = r).
 *
 * An owner's experts are one contiguous range of expert ids, [begin,
 * begin + count): its learners hold exactly those, sharded over their
 * ranks by the existing expert parallelism (count a multiple of the
 * site's learner_ranks, so that every rank holds whole experts). By
 * default the ranges follow each site's share of the run's compute (ranks
 * x micro_batch x grad_accum: its tokens per step), in site order, largest
 * remainder first; `site.NAME.experts = LO-HI` gives them explicitly
 * (every site, covering every expert once).
 *
 * Owns: that assignment (pure arithmetic on a Config's fields: no MPI, no
 * model) and the replica sites of an owner.
 * Must not: train, route or move anything (the trainer, cpu/moe.c and the
 * exchange read the assignment), or call into config.c (which validates
 * a config with it) or size the model (expert_split_report.h does).
 */
#ifndef ISTHMUS_EXPERT_SPLIT_H
#define ISTHMUS_EXPERT_SPLIT_H

#include <stddef.h>

#include "config_types.h"

typedef struct {
    int n_sites, experts;
    int begin[CONFIG_MAX_SITES], count[CONFIG_MAX_SITES]; /* site s trains experts [begin, begin + count) */
    double share[CONFIG_MAX_SITES]; /* its share of the run's tokens per step */
    int replicas;      /* r: sites holding each expert, its owner included */
    int given;         /* the ranges came from site.NAME.experts (else from the shares) */
} ExpertSplit;

/* Is the config's [outer] experts = split? */
int expert_split_on(const Config *cfg);

/* The key at fault: site.NAME.experts of site `site` when >= 0, else
 * [outer] `key`. */
typedef struct {
    int site;
    const char *key;
} ExpertSplitFault;

/* The assignment of a config in split mode. On a layout that cannot be
 * split: nonzero, `why` one line naming the key and the value (config.c
 * prefixes where it was set) and *bad the key at fault. */
int expert_split_assign(const Config *cfg, ExpertSplit *x, char *why, size_t why_size, ExpertSplitFault *bad);

/* The site that trains expert e. */
int expert_split_owner(const ExpertSplit *x, int e);

/* The k-th site (1 <= k < r) holding a copy of site s's experts: the
 * sites after s in config order, wrapping around. */
int expert_split_replica_site(const ExpertSplit *x, int s, int k);

#endif
