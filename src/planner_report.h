/* planner_report.h — the printed plan of `isthmus plan`.
 *
 * Owns: what the plan prints and in which order — the layout's --set
 * lines, each site's step, its largest rank's memory against its GPU's
 * (exit 2, one line, when a site's does not fit), the modes' utilisation,
 * the batches that balance the sites, the smallest H, the link's seal and
 * socket buffers, the codecs compared on the link with the bpb each cost
 * where it was measured (docs/results/, cited), and the run's totals: wall
 * time for train.steps, each site's checkpoint (its groups, size and write
 * time at the storage rate), the checkpoint interval the cost allows, and a
 * live rejoin's transfer.
 * Must not: change the arithmetic of a mode (planner.h), choose a layout
 * (planner_layout.h) or allocate a model; it reads sizes from the modules
 * that own them (memory, ckpt, outer, plan).
 */
#ifndef ISTHMUS_PLANNER_REPORT_H
#define ISTHMUS_PLANNER_REPORT_H

#include "planner_layout.h"

/* A checkpoint may cost at most this share of the run's wall time: the
 * interval the plan names. A site lost mid-run rejoins from the live
 * sites' state (architecture.md, 4.6), so checkpoints guard against losing
 * every site at once, rarer than one: their cost sets the interval. */
#define PLAN_CKPT_SHARE 0.02
/* Linux's default ceiling for autotuned socket buffers: the third field of
 * net.ipv4.tcp_wmem (the sender's; tcp_rmem's is 6 MiB). */
#define PLAN_LINUX_WMEM_MAX 4194304.0

typedef struct {
    PlanLink link;
    double mfu, target;
    double storage_bytes_per_s; /* each site's checkpoint storage (--storage) */
    const PlanSet *layout;      /* the --set lines planner_layout_sets applied */
    int n_layout;
} PlanInputs;

/* `isthmus plan` of cfg (its layout the --site counts already). ISTH_EINPUT
 * when a site's largest rank does not fit its GPU (after the plan). */
int planner_run(const Config *cfg, const PlanSite *sites, int n_sites, const PlanInputs *in);

#endif
