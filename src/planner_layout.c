/* planner_layout.c — see planner_layout.h; docs/planner.md says why. */
#include "planner_layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "status.h"

/* Did the user's --set name this key of this site? */
static int user_named(const char *const *user, int n_user, const char *site, const char *key)
{
    char prefix[PLAN_SET_MAX];
    snprintf(prefix, sizeof prefix, "site.%s.%s=", site, key);
    for (int i = 0; i < n_user; i++)
        if (!strncmp(user[i], prefix, strlen(prefix))) return 1;
    return 0;
}

static void add_set(PlanSet *out, int *n, const char *site, const char *key, long value, int changed)
{
    snprintf(out[*n].text, sizeof out[*n].text, "site.%s.%s=%ld", site, key, value);
    out[*n].changed = changed;
    (*n)++;
}

int planner_layout_sets(const Config *cfg, const PlanSite *sites, int n_sites, const char *const *user, int n_user,
                        PlanSet *out, int *n_out)
{
    *n_out = 0;
    for (int i = 0; i < n_sites; i++) {
        const SiteConfig *sc = NULL;
        for (int s = 0; s < cfg->n_sites; s++)
            if (!strcmp(cfg->sites[s].name, sites[i].name)) sc = &cfg->sites[s];
        /* a site the config lacks: only the one --site of a config without
         * [site.*] sections becomes one (the planner names the others) */
        if (!sc && !(cfg->n_sites == 0 && n_sites == 1)) continue;
        const int N = sites[i].gpus, E = cfg->model.experts;
        add_set(out, n_out, sites[i].name, "ranks", N, !sc || sc->ranks != N);
        if (user_named(user, n_user, sites[i].name, "learner_ranks")) continue; /* the user's choice stands */
        /* one learner of the whole site (learner_ranks = ranks, or unset)
         * stays one of the new count; a smaller learner keeps its size */
        int G = sc && sc->learner_ranks != sc->ranks ? sc->learner_ranks : N;
        if (N % G || E % G) /* the largest learner both divide: the fewest experts per rank */
            for (G = N < E ? N : E; G > 1 && (N % G || E % G); G--) {}
        add_set(out, n_out, sites[i].name, "learner_ranks", G, sc ? sc->learner_ranks != G : G != N);
    }
    return ISTH_OK;
}

void planner_balance_sets(const Config *cfg, const PlanResult *r, PlanSet *out, int *n_out, Config *balanced)
{
    *n_out = 0;
    *balanced = *cfg;
    double slowest = 0;
    for (int s = 0; s < r->n_sites; s++) slowest = fmax(slowest, r->step_s[s]);
    for (int s = 0; s < r->n_sites; s++) {
        const SiteConfig *sc = &cfg->sites[s];
        if (!(r->step_s[s] > 0) || slowest <= r->step_s[s] * 1.001) continue;
        /* a step's time is proportional to its grad_accum: the ideal, then
         * the whole number below (this site idles) or above (it paces the
         * others), whichever leaves the smaller share idle */
        const double ideal = sc->grad_accum * slowest / r->step_s[s];
        const double below = floor(ideal), above = below + 1;
        double pick = below > 0 && 1 - below / ideal <= 1 - ideal / above ? below : above;
        /* sites a thousandfold apart (a peak given as a number) would need
         * more than the key takes: its largest, which train accepts */
        if (!(pick <= PLAN_GRAD_ACCUM_MAX)) pick = PLAN_GRAD_ACCUM_MAX;
        const int ga = (int)pick;
        if (ga == sc->grad_accum) continue;
        add_set(out, n_out, sc->name, "grad_accum", ga, 1);
        balanced->sites[s].grad_accum = ga;
    }
}
