/* progress.h — how far each site is, as the exchanges carry it: this
 * site's recent steps (their mean loss, rate and step time, and from them
 * the run's ETA), and each other site's summary as it arrives, so that one
 * site's metrics.jsonl shows every site's training (docs/metrics.md,
 * `site_step`).
 *
 * A summary is PROGRESS_BYTES on the wire: the site's last step, how many
 * steps its means cover, the mean training loss, tokens/s and ms per step
 * over them (little-endian uint32, uint32, float32 x3). A slot no site
 * wrote is all 0xFF bytes: the verdicts it rides on are combined with a
 * bytewise AND (between sites) and MIN (inside a site), which keep a
 * written slot as it is wherever the others hold 0xFF. What arrives is
 * untrusted: a slot that does not decode to a plausible summary is
 * ignored. Summaries are observation only: nothing that trains reads them.
 *
 * Who writes what: train.c adds each step (progress_step, with values the
 * same on every rank of the site); reduce.c (every verdict: this site's
 * slot) and mix.c (every pair verdict: the whole table, passed on
 * learner to learner) encode and learn; run.c writes what the log has not
 * seen yet (progress_news).
 * Owns: the window of recent steps, the table of the newest summary of
 * each site, and the summary's encoding.
 * Must not: send or receive anything, or write the log.
 */
#ifndef ISTHMUS_PROGRESS_H
#define ISTHMUS_PROGRESS_H

#include <stddef.h>

#include "config.h"

#define PROGRESS_BYTES 20          /* one site's summary on the wire */
#define PROGRESS_WINDOW_MAX 4096   /* the most recent steps a summary's means cover */
#define PROGRESS_MAX_MS_PER_STEP 86.4e6   /* a day: a slower step in a summary is not plausible */
#define PROGRESS_MAX_TOKENS_PER_S 1e15    /* nor a faster rate */

typedef struct {
    long step;                     /* the site's last step; < 0: nothing known */
    int steps;                     /* the steps its means cover (fewer than the window after a start) */
    double loss;                   /* mean training loss over them, nats per token */
    double tokens_per_s;           /* the site's tokens over their time */
    double ms_per_step;            /* their mean time */
} SiteProgress;

typedef struct {
    double *loss, *seconds;        /* (window) ring of this site's last steps */
    int window, n, next;
    long last_step;                /* this site's last step added (-1: none) */
    long steps_total;              /* train.steps: the ETA's goal, the bound on a summary's step */
    double tokens_per_step;        /* this site's, every learner of it */
    int n_sites, site;
    SiteProgress sites[CONFIG_MAX_SITES]; /* the newest summary heard of each other site */
    long recorded[CONFIG_MAX_SITES];      /* the newest step of each the log has written (-1: none) */
} Progress;

/* window: the steps a summary covers (outer.inner_steps: one outer step;
 * at most PROGRESS_WINDOW_MAX). */
int progress_create(Progress *p, int window, long steps_total, int n_sites, int site, double tokens_per_step);
void progress_destroy(Progress *p);

/* This site's step `step`: its loss and its time (the same values on
 * every rank of the site). */
void progress_step(Progress *p, long step, double loss, double seconds);
/* This site's summary of its recent steps (step -1 before the first). */
SiteProgress progress_mine(const Progress *p);
/* Seconds to train.steps at the recent steps' mean time (0 at the end). */
double progress_eta(const Progress *p);

/* n_sites slots of PROGRESS_BYTES: slot s holds this site's own summary
 * (s == p->site) or, unless only_mine, the newest heard of site s; every
 * other slot 0xFF. p NULL: every slot 0xFF. */
void progress_encode(const Progress *p, int n_sites, int only_mine, unsigned char *out);
/* Take from n_sites slots every summary newer than the one held (this
 * site's own slot is skipped). Returns how many were new. */
int progress_learn(Progress *p, const unsigned char *in);
/* The next other site whose newest summary the log has not written: its
 * index (marked written), or -1 when none. */
int progress_news(Progress *p, SiteProgress *out);

#endif
