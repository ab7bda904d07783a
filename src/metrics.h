/* metrics.h — the per-step log line and metrics.jsonl.
 *
 * Owns: the format of what rank 0 prints per step and every record it
 * appends to <out_dir>/metrics.jsonl: one JSON object per line, one
 * function per record type, each record's first key naming its type and
 * its last "time" (wall clock, Unix seconds); strings escaped. The record
 * types and their fields are a public interface, docs/metrics.md
 * (tests/cli_metrics.sh checks the file against that page).
 * Must not: compute any of the numbers it reports.
 */
#ifndef ISTHMUS_METRICS_H
#define ISTHMUS_METRICS_H

#include <stdio.h>

#include "config.h"
#include "report.h"

typedef struct {
    long step, steps;
    double loss;          /* mean cross-entropy, nats per token (per byte for a byte model) */
    double aux_loss, z_loss;
    double lr, grad_norm;
    double tokens_per_s, ms_per_step;
    double compute_s;     /* of the step's time, the inner step's own work: not the outer steps, not
                           * sync's reduction across sites (the rest waits on, or works for, the link) */
    double tokens;        /* tokens seen so far */
    double dropped_frac;  /* share of routed copies dropped for capacity */
    double remote_frac;   /* share of routed copies to experts the learner does not hold (ROUTE_DROP) */
    double a2a_bytes;     /* expert all-to-all bytes, sent + received, all ranks */
    double inter_site_bytes, link_wait_s;
    double eta_s;         /* seconds to train.steps at the recent steps' mean time */
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
    int fields; /* of the record being written */
} Metrics;

/* What the start record says about this opening of the file. */
typedef struct {
    const char *command;    /* "train", "eval" */
    const char *config;     /* where the configuration came from (a file, model.h5:/config) */
    unsigned long long fingerprint; /* federation_fingerprint() of the resolved configuration */
    const char *run_id;     /* federation_run_id() */
    const char *site;       /* the site this file logs; NULL: none (eval) */
    int ranks;              /* processes in the job's world */
    long resumed_from_step; /* the checkpoint step this start loaded; < 0: none (null) */
} MetricsStart;

/* Open <out_dir>/metrics.jsonl for appending (creates out_dir) and write
 * the start record: the time, the command, the job id (SLURM_JOB_ID, else
 * PBS_JOBID, else LSB_JOBID), the build and its configure options, and
 * what `start` gives. */
int metrics_open(Metrics *mt, const char *out_dir, const MetricsStart *start);
/* Close; a failed final write is ISTH_ERUNTIME naming the file. */
int metrics_close(Metrics *mt);
/* Flush what was appended; ISTH_ERUNTIME naming the file when the write
 * failed (a full disk): no line is ever lost silently. */
int metrics_flush(Metrics *mt);

/* Print the human line to stdout and append the JSON object (checked). */
int metrics_step(Metrics *mt, const StepLog *s);
/* `model`: NULL, or (split experts) which model was evaluated: "site" (the
 * lead site's, its experts under its routing) or "whole" (every expert):
 * the line ends with it and the record has it as `model`. */
int metrics_eval(Metrics *mt, const char *set, int byte_set, long step, double bpb, double loss, size_t tokens,
                 double bytes, double seconds, const char *model);

/* Another site's summary of its recent steps, as an exchange brought it
 * (progress.h): its last step of `steps`, the steps its means cover, their
 * mean loss, tokens/s and step time; `at_step`: this site's step when it
 * arrived. */
int metrics_site_step(Metrics *mt, const char *site, long step, long steps, int averaged, double loss,
                      double tokens_per_s, double ms_per_step, long at_step);

/* One outer step of one fragment: started after inner step `started`,
 * applied after `step`. */
int metrics_outer(Metrics *mt, long outer_step, int fragment, long started, long step, const ExchangeReport *r);

/* One butterfly round of this learner. */
int metrics_mix(Metrics *mt, long round, int fragment, int partner, int crosses, long started, long step,
                 const ExchangeReport *r, double pair_distance);

/* The training run's shape, after the start record of `isthmus train`
 * ({"run":"start",...}: what `isthmus plot` labels the run with). */
int metrics_run(Metrics *mt, const char *site, const char *mode, const char *codec, int sites, int learners,
                long steps);

/* A site lost (or gone on a signal) at `step`: what did not arrive, after
 * how long, and how many sites are left. */
int metrics_site_lost(Metrics *mt, const char *site, long step, const char *what, double after_s, int sites_left);

/* A lost site taken back at `step`. */
int metrics_site_rejoined(Metrics *mt, const char *site, long step, long lost_at, double tokens_lost,
                          double tokens_lost_total, double rejoin_s);

/* The end of a multi-site run: its inter-site traffic against sync's;
 * `assembly_bytes` (< 0: none, not recorded) what the whole model's
 * assembly moved besides (split experts), `refresh_bytes` (< 0: none)
 * what the experts' copies' refreshes moved. */
int metrics_summary_traffic(Metrics *mt, long steps, long from_step, double inter_site_bytes,
                            double sync_equivalent_bytes, double reduction, int same_start, int max_peer_learners,
                            double auth_failures, double assembly_bytes, double refresh_bytes);

/* The end of training: compute utilisation. */
int metrics_summary_compute(Metrics *mt, long steps, long from_step, double wall_s, double compute_s,
                            double utilisation, double link_wait_s, double paused_s, double final_outer_s,
                            double utilisation_before_final);

/* A checkpoint written. */
int metrics_checkpoint(Metrics *mt, const char *path, long step, double mb, double seconds, double mb_all_sites,
                       double seconds_all_sites);

/* An exchange that will not arrive within its window (eta_s infinite:
 * nothing arrived yet, written as -1). */
int metrics_link_late(Metrics *mt, unsigned long long exchange, int fragment, int steps, int window,
                      double arrived_fraction, double elapsed_s, double eta_s, double window_left_s);

/* One spread probe: the learners' largest distance to their mean. */
int metrics_spread(Metrics *mt, long round, long step, int learners, int samples, double max_rel_dist_to_mean);

/* mkdir -p */
int make_dirs(const char *path);

#endif
