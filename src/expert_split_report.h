/* expert_split_report.h — what splitting the experts saves: the bytes of
 * one outer period of split against replicated experts (the dense part,
 * the copies' refresh, the whole model), and the summary `isthmus config`
 * prints after a resolved config in split mode.
 *
 * Owns: those sizes (from the model's chunk table and the run's codec,
 * without allocating a model) and that summary.
 * Must not: decide the assignment (expert_split.h) or move anything.
 */
#ifndef ISTHMUS_EXPERT_SPLIT_REPORT_H
#define ISTHMUS_EXPERT_SPLIT_REPORT_H

#include <stdio.h>

#include "expert_split.h"

/* Parameters and encoded bytes (the run's outer codec) of one outer step
 * of the whole model: what replicated experts send per site and exchange
 * (values, bytes), its dense part (everything but the experts: what split
 * sends), and one expert's (every layer's three matrices). */
typedef struct {
    double all_values, all_bytes;     /* replicated: the whole model */
    double dense_values, dense_bytes; /* split: the dense part and the router */
    double expert_values, expert_bytes; /* one expert, all layers */
} ExpertSplitSizes;

int expert_split_sizes(const Config *cfg, ExpertSplitSizes *out);

/* Bytes a site sends to refresh its copies at other sites, averaged per
 * outer step: its experts' encoded bytes x (r - 1) / outer.expert_refresh. */
double expert_split_refresh_bytes(const Config *cfg, const ExpertSplit *x, const ExpertSplitSizes *z, int s);

/* Comment lines ("# ...") for the end of a resolved config: each site's
 * experts and share, and the bytes per outer period against replicated. */
int expert_split_print(const Config *cfg, FILE *out);

#endif
