/* topology.c — see topology.h. */
#include "topology.h"

#include <stdio.h>
#include <string.h>

#include "expert_split.h"
#include "status.h"

int topology_layout(Topology *t, const Config *cfg, int world_size, int world_rank)
{
    memset(t, 0, sizeof *t);
    t->site_comm = t->learner_comm = MPI_COMM_NULL;
    t->world_rank = world_rank;
    t->world_size = world_size;
    const int T = cfg->model.context;

    if (cfg->n_sites == 0) { /* one implicit site, one learner of every rank */
        SiteInfo *s = &t->sites[0];
        snprintf(s->name, sizeof s->name, "default");
        s->ranks = s->learner_ranks = t->world_size;
        s->micro_batch = cfg->train.micro_batch;
        s->grad_accum = cfg->train.grad_accum;
        t->n_sites = 1;
        if (cfg->model.experts % t->world_size)
            return isth_fail(ISTH_EINPUT,
                             "layout: %d ranks form one learner, but [model] experts = %d is not "
                             "divisible by %d (add [site.*] sections or change the rank count)",
                             t->world_size, cfg->model.experts, t->world_size);
    } else {
        t->n_sites = cfg->n_sites;
        for (int i = 0; i < cfg->n_sites; i++) {
            SiteInfo *s = &t->sites[i];
            const SiteConfig *c = &cfg->sites[i];
            snprintf(s->name, sizeof s->name, "%s", c->name);
            s->ranks = c->ranks;
            s->learner_ranks = c->learner_ranks;
            s->micro_batch = c->micro_batch;
            s->grad_accum = c->grad_accum;
        }
    }
    int rank = 0, learner = 0;
    for (int i = 0; i < t->n_sites; i++) {
        SiteInfo *s = &t->sites[i];
        s->first_rank = rank;
        s->learners = s->ranks / s->learner_ranks;
        s->first_learner = learner;
        s->tokens_per_step = (double)s->micro_batch * s->learner_ranks * s->grad_accum * T;
        rank += s->ranks;
        learner += s->learners;
        t->total_tokens_per_step += s->tokens_per_step * s->learners;
    }
    t->n_learners = learner;
    for (int i = 0; i < t->n_sites; i++) t->sites[i].experts = cfg->model.experts;
    if (expert_split_on(cfg) && cfg->n_sites > 0) { /* each site's learners hold only its range */
        ExpertSplit x;
        ExpertSplitFault bad;
        char why[512];
        if (expert_split_assign(cfg, &x, why, sizeof why, &bad)) return isth_fail(ISTH_EINPUT, "layout: %s", why);
        t->experts_split = 1;
        t->router_by_owner = strcmp(cfg->outer.expert_routing, "drop") != 0;
        for (int i = 0; i < t->n_sites; i++) {
            t->sites[i].expert_begin = x.begin[i];
            t->sites[i].experts = x.count[i];
        }
    }
    if (rank != t->world_size) {
        char list[512] = "";
        size_t n = 0;
        for (int i = 0; i < t->n_sites && n < sizeof list - 80; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s=%d", i ? " + " : "", t->sites[i].name,
                                  t->sites[i].ranks);
        return isth_fail(ISTH_EINPUT, "layout: the [site.*] sections describe %d ranks (%s), but the job has %d",
                         rank, list, t->world_size);
    }

    t->site = topology_site_of(t, t->world_rank);
    const SiteInfo *me = &t->sites[t->site];
    const int within = t->world_rank - me->first_rank;
    t->learner_size = me->learner_ranks;
    t->learner = me->first_learner + within / me->learner_ranks;
    t->learner_rank = within % me->learner_ranks;
    t->experts_local = me->experts / t->learner_size;
    t->expert_begin = me->expert_begin + t->learner_rank * t->experts_local;
    return ISTH_OK;
}

int topology_create(Topology *t, const Config *cfg, MPI_Comm world)
{
    int rank, size;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    CHECK(topology_layout(t, cfg, size, rank));
    CHECK_MPI(MPI_Comm_split(world, t->site, t->world_rank, &t->site_comm));
    CHECK_MPI(MPI_Comm_split(world, t->learner, t->world_rank, &t->learner_comm));
    return ISTH_OK;
}

void topology_destroy(Topology *t)
{
    if (t->site_comm != MPI_COMM_NULL) MPI_Comm_free(&t->site_comm);
    if (t->learner_comm != MPI_COMM_NULL) MPI_Comm_free(&t->learner_comm);
    t->site_comm = t->learner_comm = MPI_COMM_NULL;
}

int topology_site_of(const Topology *t, int world_rank)
{
    for (int i = 0; i < t->n_sites; i++)
        if (world_rank < t->sites[i].first_rank + t->sites[i].ranks) return i;
    return -1;
}

int topology_site_of_learner(const Topology *t, int learner)
{
    for (int i = 0; i < t->n_sites; i++)
        if (learner < t->sites[i].first_learner + t->sites[i].learners) return i;
    return -1;
}

void topology_learner_ranks(const Topology *t, int learner, int *first, int *size)
{
    const SiteInfo *s = &t->sites[topology_site_of_learner(t, learner)];
    *size = s->learner_ranks;
    *first = s->first_rank + (learner - s->first_learner) * s->learner_ranks;
}

void topology_print(const Topology *t, const Config *cfg)
{
    (void)cfg; /* the sites' figures are the topology's own */
    printf("layout: %d ranks, %d sites, %d learners\n", t->world_size, t->n_sites, t->n_learners);
    for (int i = 0; i < t->n_sites; i++) {
        const SiteInfo *s = &t->sites[i];
        char split[64] = "";
        if (t->experts_split) /* global ids: the site trains these only */
            snprintf(split, sizeof split, "experts %d-%d, ", s->expert_begin, s->expert_begin + s->experts - 1);
        printf("  site %-12s ranks %d-%d | %d learner(s) of %d ranks (%s%d experts per rank) | "
               "micro_batch %d x grad_accum %d | %.0f tokens per learner step\n",
               s->name, s->first_rank, s->first_rank + s->ranks - 1, s->learners, s->learner_ranks, split,
               s->experts / s->learner_ranks, s->micro_batch, s->grad_accum, s->tokens_per_step);
    }
}

int topology_expert_site(const Topology *t, int e)
{
    for (int s = 0; s < t->n_sites; s++)
        if (e >= t->sites[s].expert_begin && e < t->sites[s].expert_begin + t->sites[s].experts) return s;
    return -1;
}
