/* topology.h — who is who: sites, learners and ranks, derived from
 * MPI_COMM_WORLD and the run configuration alone.
 *
 * Owns: the process hierarchy (world → site → learner → rank),
 * the communicators for each level, and each rank's expert shard. Ranks are
 * assigned to sites in [site.*] section order, and inside a site to learners
 * in blocks of learner_ranks consecutive ranks. Learners are numbered
 * globally in the same order. Expert ids are global: with [outer] experts =
 * split a site's learners hold only its range (expert_split.h), sharded
 * over their ranks; replicated, every learner holds all E.
 * Must not: move model data (collectives, sync) or read files.
 */
#ifndef ISTHMUS_TOPOLOGY_H
#define ISTHMUS_TOPOLOGY_H

#include <mpi.h>

#include "config.h"

typedef struct {
    char name[CONFIG_NAME_MAX];
    int first_rank, ranks;      /* world ranks [first_rank, first_rank+ranks) */
    int learner_ranks;          /* G: ranks per learner */
    int first_learner, learners;/* global learner ids of this site */
    int micro_batch, grad_accum;
    double tokens_per_step;     /* per learner: micro_batch * G * grad_accum * T */
    int expert_begin, experts;  /* the experts each of its learners holds: [begin, begin+experts)
                                 * (split: the site's range; replicated: 0, E) */
} SiteInfo;

typedef struct {
    int world_rank, world_size;
    int n_sites;
    SiteInfo sites[CONFIG_MAX_SITES];
    int n_learners;
    int site;                   /* this rank's site index */
    int learner;                /* global learner id */
    int learner_rank, learner_size; /* position in the learner, G */
    int expert_begin, experts_local; /* this rank's experts, global ids: [begin, begin+local) */
    int experts_split;          /* [outer] experts = split: each site holds only its own range */
    int router_by_owner;        /* split with expert_routing = local: a router column is trained only at
                                 * the site owning its expert, so the outer step takes it from there */
    MPI_Comm site_comm;         /* ranks of this site */
    MPI_Comm learner_comm;      /* ranks of this learner */
    double total_tokens_per_step; /* all learners */
} Topology;

/* Build from the config; every rank detects the same layout errors and the
 * same message is printed once (rank 0). Returns ISTH_EINPUT on an
 * inconsistent layout (world size, divisibility). */
int topology_create(Topology *t, const Config *cfg, MPI_Comm world);
/* The same layout for world rank `world_rank` of `world_size`, without
 * communicators (for planning: no MPI call). */
int topology_layout(Topology *t, const Config *cfg, int world_size, int world_rank);
void topology_destroy(Topology *t);

/* The site that trains expert e (split experts: whose range holds it; -1
 * none); replicated: the first site. */
int topology_expert_site(const Topology *t, int e);
/* Site and learner-rank of a world rank. */
int topology_site_of(const Topology *t, int world_rank);
/* First world rank of global learner `l`, and its size G. */
void topology_learner_ranks(const Topology *t, int learner, int *first, int *size);
/* Site of global learner `l`. */
int topology_site_of_learner(const Topology *t, int learner);

/* One line per site for the start-up banner (rank 0). */
void topology_print(const Topology *t, const Config *cfg);

#endif
