/* planner_layout.h — fitting a config's layout to the GPUs `isthmus plan`
 * is given, and balancing the sites' batches: both as `--set` lines that a
 * user puts in the config or passes to `train`.
 *
 * Owns: the choice of each site's keys for its --site count (ranks = the
 * count; learner_ranks the config's while it divides the count and the
 * experts, else the largest that divides both: the fewest experts per
 * rank, the least memory per GPU), and of each faster site's grad_accum
 * for the slowest site's step (micro_batch kept: its activations, and so
 * its memory per GPU, stay as planned).
 * Must not: print (planner_report.h prints the lines), compute step times
 * (planner.h) or validate a config (config_load does, loading the lines).
 */
#ifndef ISTHMUS_PLANNER_LAYOUT_H
#define ISTHMUS_PLANNER_LAYOUT_H

#include "planner.h"

#define PLAN_SET_MAX (CONFIG_NAME_MAX + 48)
#define PLAN_MAX_SETS (2 * PLAN_MAX_SITES)
#define PLAN_GRAD_ACCUM_MAX (1 << 20) /* the grad_accum keys' bound (config_keys.c) */

typedef struct {
    char text[PLAN_SET_MAX]; /* "site.NAME.KEY=VALUE", as --set takes it */
    int changed;             /* differs from the config as given (printed) */
} PlanSet;

/* The --set lines that make cfg's layout the --site counts: for every
 * site, its ranks, and its learner_ranks where the config's does not fit
 * (not where the user's --set named it: `user`, n_user). */
int planner_layout_sets(const Config *cfg, const PlanSite *sites, int n_sites, const char *const *user, int n_user,
                        PlanSet *out, int *n_out);

/* The grad_accum of each site faster than the slowest (by more than
 * 0.1%) whose step comes nearest the slowest's, as --set lines (n_out 0:
 * balanced already), and cfg with them in `balanced`. r: cfg's plan. */
void planner_balance_sets(const Config *cfg, const PlanResult *r, PlanSet *out, int *n_out, Config *balanced);

#endif
