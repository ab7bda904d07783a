/* expert_split.c — see expert_split.h. */
#include "expert_split.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int expert_split_on(const Config *cfg) { return !strcmp(cfg->outer.experts, "split"); }

static int refuse(char *why, size_t size, ExpertSplitFault *bad, int site, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    bad->site = site;
    bad->key = key;
    return 1;
}

static int local_routing(const Config *cfg) { return strcmp(cfg->outer.expert_routing, "drop") != 0; }

/* The fewest experts a site of learners of g ranks can train: whole
 * experts per rank, and with local routing at least top_k (its tokens
 * choose top_k among its own). */
static int least_experts(const Config *cfg, int g)
{
    const int k = local_routing(cfg) ? cfg->model.top_k : 1;
    return (k + g - 1) / g * g;
}

/* "LO-HI" (inclusive) or "N": *lo, *hi; nonzero when it is neither. */
static int parse_range(const char *text, int *lo, int *hi)
{
    char tail;
    if (sscanf(text, "%d-%d%c", lo, hi, &tail) == 2) return *lo < 0 || *hi < *lo;
    if (sscanf(text, "%d%c", lo, &tail) == 1) {
        *hi = *lo;
        return *lo < 0;
    }
    return 1;
}

/* Ranges from site.NAME.experts: every site names one, together they
 * cover every expert exactly once. */
static int given_ranges(const Config *cfg, ExpertSplit *x, char *why, size_t size, ExpertSplitFault *bad)
{
    const int E = cfg->model.experts;
    unsigned char *owner = calloc((size_t)E, 1);
    if (!owner) return refuse(why, size, bad, -1, "experts", "out of memory");
    int rc = 0;
    for (int s = 0; s < cfg->n_sites && !rc; s++) {
        const SiteConfig *st = &cfg->sites[s];
        int lo, hi;
        if (!st->experts[0])
            rc = refuse(why, size, bad, s, "experts", "[site.%s] experts is not given while another site's is: give every "
                        "site's range, or none (ranges by compute share)", st->name);
        else if (parse_range(st->experts, &lo, &hi))
            rc = refuse(why, size, bad, s, "experts", "[site.%s] experts = %s: expected a range LO-HI of expert ids (or one "
                        "id N)", st->name, st->experts);
        else if (hi >= E)
            rc = refuse(why, size, bad, s, "experts", "[site.%s] experts = %s: ids run from 0 to %d ([model] experts = %d)",
                        st->name, st->experts, E - 1, E);
        else if (local_routing(cfg) && hi - lo + 1 < cfg->model.top_k)
            rc = refuse(why, size, bad, s, "experts", "[site.%s] experts = %s: %d expert(s), fewer than top_k = %d "
                        "(expert_routing = local chooses top_k among the site's own)", st->name, st->experts,
                        hi - lo + 1, cfg->model.top_k);
        else if ((hi - lo + 1) % st->learner_ranks)
            rc = refuse(why, size, bad, s, "experts", "[site.%s] experts = %s: %d experts over learner_ranks = %d ranks: "
                        "every rank holds whole experts (a multiple of %d)", st->name, st->experts, hi - lo + 1,
                        st->learner_ranks, st->learner_ranks);
        for (int e = lo; !rc && e <= hi; e++) {
            if (owner[e])
                rc = refuse(why, size, bad, s, "experts", "[site.%s] experts = %s: expert %d is also site %s's (every expert "
                            "has one owner)", st->name, st->experts, e, cfg->sites[owner[e] - 1].name);
            owner[e] = (unsigned char)(s + 1);
        }
        if (!rc) {
            x->begin[s] = lo;
            x->count[s] = hi - lo + 1;
        }
    }
    for (int e = 0; e < E && !rc; e++)
        if (!owner[e])
            rc = refuse(why, size, bad, -1, "experts", "site.NAME.experts: expert %d is no site's (the ranges must cover 0-%d)",
                        e, E - 1);
    free(owner);
    return rc;
}

/* Ranges in proportion to the shares: each site's count a multiple of its
 * learner_ranks, at least least_experts; the remainder to the sites
 * furthest below their share (ties to the first site), the surplus taken
 * from those furthest above it. */
static int shared_ranges(const Config *cfg, ExpertSplit *x, char *why, size_t size, ExpertSplitFault *bad)
{
    const int E = cfg->model.experts, S = cfg->n_sites;
    double target[CONFIG_MAX_SITES];
    int sum = 0;
    int least[CONFIG_MAX_SITES];
    for (int s = 0; s < S; s++) {
        const int g = cfg->sites[s].learner_ranks;
        least[s] = least_experts(cfg, g);
        target[s] = E * x->share[s];
        int n = (int)(target[s] / g) * g;
        x->count[s] = n < least[s] ? least[s] : n;
        sum += x->count[s];
    }
    while (sum != E) {
        int best = -1;
        for (int s = 0; s < S; s++) {
            const int g = cfg->sites[s].learner_ranks;
            const int fits = sum < E ? sum + g <= E : x->count[s] - g >= least[s];
            const double gap = sum < E ? target[s] - x->count[s] : x->count[s] - target[s];
            if (fits && (best < 0 || gap > (sum < E ? target[best] - x->count[best] : x->count[best] - target[best])))
                best = s;
        }
        if (best < 0) {
            char list[256] = "";
            for (int s = 0; s < S; s++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s %d", s ? ", " : "",
                         cfg->sites[s].name, cfg->sites[s].learner_ranks);
            return refuse(why, size, bad, -1, "experts", "[model] experts = %d cannot be split into whole multiples of each "
                          "site's learner_ranks (%s)%s: every rank holds whole experts; change learner_ranks or give "
                          "site.NAME.experts", E, list, local_routing(cfg) ? ", each at least top_k" : "");
        }
        const int g = cfg->sites[best].learner_ranks;
        x->count[best] += sum < E ? g : -g;
        sum += sum < E ? g : -g;
    }
    for (int s = 0, next = 0; s < S; s++) {
        x->begin[s] = next;
        next += x->count[s];
    }
    return 0;
}

int expert_split_assign(const Config *cfg, ExpertSplit *x, char *why, size_t why_size, ExpertSplitFault *bad)
{
    memset(x, 0, sizeof *x);
    bad->site = -1;
    bad->key = "experts";
    why[0] = '\0';
    const int S = cfg->n_sites, E = cfg->model.experts;
    x->n_sites = S;
    x->experts = E;
    if (S < 2)
        return refuse(why, why_size, bad, -1, "experts", "[outer] experts = split needs two [site.*] sections or more (it "
                      "splits the experts between sites)");
    if (cfg->outer.mode_id != MODE_DILOCO && cfg->outer.mode_id != MODE_STREAMING)
        return refuse(why, why_size, bad, -1, "mode", "[outer] experts = split needs mode = diloco or streaming (mode is "
                      "%s: %s)", cfg->outer.mode, cfg->outer.mode_id == MODE_SYNC
                      ? "sync sums every gradient of every expert across sites every step"
                      : "butterfly mixes whole models between pairs of learners, and two sites' learners share only "
                        "the dense part");
    if (S > E)
        return refuse(why, why_size, bad, -1, "experts", "[outer] experts = split: %d sites but [model] experts = %d: every "
                      "site trains at least one expert", S, E);
    x->replicas = cfg->outer.expert_replicas > 0 ? cfg->outer.expert_replicas : 2; /* -1: unresolved (a unit's Config) */
    if (x->replicas > S)
        return refuse(why, why_size, bad, -1, "expert_replicas", "[outer] expert_replicas = %d exceeds the %d sites (r counts the "
                      "sites holding each expert, its owner included)", x->replicas, S);
    double total = 0;
    for (int s = 0; s < S; s++) {
        const SiteConfig *st = &cfg->sites[s];
        x->share[s] = (double)st->ranks * st->micro_batch * st->grad_accum;
        total += x->share[s];
    }
    for (int s = 0; s < S; s++) x->share[s] /= total;
    int any_given = 0;
    for (int s = 0; s < S; s++) any_given |= cfg->sites[s].experts[0] != 0;
    x->given = any_given;
    return any_given ? given_ranges(cfg, x, why, why_size, bad) : shared_ranges(cfg, x, why, why_size, bad);
}

int expert_split_owner(const ExpertSplit *x, int e)
{
    for (int s = 0; s < x->n_sites; s++)
        if (e >= x->begin[s] && e < x->begin[s] + x->count[s]) return s;
    return -1;
}

int expert_split_replica_site(const ExpertSplit *x, int s, int k) { return (s + k) % x->n_sites; }
