/* metrics.h — the per-step log line and metrics.jsonl.
 *
 * Owns: the format of what rank 0 prints per step and appends to
 * <out_dir>/metrics.jsonl (one JSON object per line; field names are a
 * public interface, docs/configuration.md "metrics.jsonl").
 * Must not: compute any of the numbers it reports.
 */
#ifndef ISTHMUS_METRICS_H
#define ISTHMUS_METRICS_H

#include <stdio.h>

#include "config.h"

typedef struct {
    long step, steps;
    double loss;          /* mean cross-entropy, nats per byte */
    double aux_loss, z_loss;
    double lr, grad_norm;
    double tokens_per_s, ms_per_step;
    double compute_s;     /* of the step's time, the inner step's own work: not the outer steps, not
                           * sync's reduction across sites (the rest waits on, or works for, the link) */
    double tokens;        /* tokens seen so far */
    double dropped_frac;  /* share of routed copies dropped for capacity */
    double a2a_bytes;     /* expert all-to-all bytes, sent + received, all ranks */
    double inter_site_bytes, link_wait_s;
    double inter_site_total; /* inter_site_bytes of every step since this start of the run (logged or not) */
    int sites_present, n_sites; /* federated launch: the sites still in the run */
    /* federated launch: deadlines each site has missed in this run (each a
     * loss, until it rejoined); site_names[s] for the line */
    int misses[CONFIG_MAX_SITES];
    const char *site_names[CONFIG_MAX_SITES];
} StepLog;

typedef struct {
    FILE *f;
    char path[CONFIG_FILE_PATH_MAX];
} Metrics;

/* Open <out_dir>/metrics.jsonl for appending (creates out_dir). */
int metrics_open(Metrics *mt, const char *out_dir);
/* Close; a failed final write is ISTH_ERUNTIME naming the file. */
int metrics_close(Metrics *mt);
/* Flush what was appended; ISTH_ERUNTIME naming the file when the write
 * failed (a full disk): no line is ever lost silently. */
int metrics_flush(Metrics *mt);

/* Print the human line to stdout and append the JSON object (checked). */
int metrics_step(Metrics *mt, const StepLog *s);
int metrics_eval(Metrics *mt, const char *set, int byte_set, long step, double bpb, double loss, size_t tokens,
                 double bytes, double seconds);

/* One outer step of one fragment: started after inner step `started`,
 * applied after `step`. */
int metrics_outer(Metrics *mt, long outer_step, int fragment, long started, long step,
                   const void *report /* ReduceReport */);

/* One butterfly round of this learner. */
int metrics_mix(Metrics *mt, long round, int fragment, int partner, int crosses, long started, long step,
                 const void *report, double pair_distance);

/* mkdir -p */
int make_dirs(const char *path);

#endif
