/* stop.c — see stop.h. */
#include "stop.h"

#include <stdio.h>
#include <string.h>

#include "metrics.h" /* make_dirs */
#include "status.h"

/* SIGUSR1 (what Slurm sends before the time limit), SIGTERM (scancel) and
 * SIGUSR2 (a job script passing SIGTERM on: jobs/lib.sh): finish the step,
 * checkpoint, exit 0. USR1 asks for a pause (the job comes back: the pause
 * marker), TERM and USR2 for an end (ballot.h), which no later USR1 undoes.
 * The handler only raises flags; a second signal during the checkpoint
 * changes nothing (the file is renamed when complete). */
static volatile sig_atomic_t stop_signal, stop_end;

static void on_stop_signal(int sig)
{
    if (sig != SIGUSR1) stop_end = 1;
    stop_signal = sig;
}

const volatile sig_atomic_t *stop_flag(void) { return &stop_signal; }
int stop_ended(void) { return stop_end != 0; }

void stop_handlers(void)
{
    signal(SIGTERM, on_stop_signal);
    signal(SIGUSR1, on_stop_signal);
    signal(SIGUSR2, on_stop_signal);
}

/* The pause marker that jobs/lib.sh requeues a job by: <out_dir>/paused,
 * or <out_dir>/paused-SITE for a federated site. Removed at every start;
 * written (by this launch's first rank) when the site stops on a pause,
 * its own or the run's, and not when it ends. */
void stop_marker_path(const Config *cfg, const char *site, char *path, size_t cap)
{
    snprintf(path, cap, "%s/paused%s%s", cfg->train.out_dir, site ? "-" : "", site ? site : "");
}

int stop_mark_paused(const Config *cfg, const char *site, long step, const char *why)
{
    int rank;
    CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (rank != 0) return ISTH_OK;
    char path[CONFIG_FILE_PATH_MAX + 80];
    stop_marker_path(cfg, site, path, sizeof path);
    CHECK(make_dirs(cfg->train.out_dir));
    FILE *f = fopen(path, "w");
    int bad = !f || fprintf(f, "step %ld: %s\n", step, why) < 0;
    if (f && fclose(f) != 0) bad = 1;
    if (bad)
        return isth_fail(ISTH_ERUNTIME, "%s: cannot write the pause marker (the job would not come back)", path);
    printf("paused: wrote %s (a job script requeues the job; resume with --resume auto)\n", path);
    fflush(stdout);
    return ISTH_OK;
}

/* local and *site_agreed: STOP_NONE, STOP_PAUSE or STOP_END (an end wins) */
int stop_vote(StopVote *v, MPI_Comm site_comm, int local, int *site_agreed)
{
    *site_agreed = 0;
    if (v->pending) {
        CHECK_MPI(MPI_Wait(&v->req, MPI_STATUS_IGNORE));
        *site_agreed = v->recv;
        v->pending = 0;
    }
    v->send = local;
    CHECK_MPI(MPI_Iallreduce(&v->send, &v->recv, 1, MPI_INT, MPI_MAX, site_comm, &v->req));
    v->pending = 1;
    return ISTH_OK;
}

/* The federated launch, after the checkpoint of an agreed stop: a stop
 * that only some sites asked for (their jobs' time limit, scancel,
 * preemption) lets those sites leave — they exit 0 and, started again,
 * rejoin — while the others train on; 1 when this site trains on. Any
 * site may leave (the host's place goes to the first site left, as after
 * a loss); a stop every site asked for ends the whole run. The same on
 * every rank of every site still in (the request bits came with the
 * agreed verdicts). *alone: this site stops and the others train on (its
 * own request's intent decides whether its job comes back); otherwise a
 * stop is run-wide (stop_pauses). */
int stop_others_leave(Trainer *tr, int *alone)
{
    const Topology *t = &tr->topo;
    StopBallot *b = &tr->ballot;
    int any = 0, all = 1;
    for (int s = 0; s < t->n_sites; s++) any |= b->sites[s];
    for (int s = 0; s < t->n_sites; s++) all &= b->sites[s] || link_is_lost(&tr->link, s);
    *alone = 0;
    if (!link_survives(&tr->link) || !any) return 0;
    if (b->sites[t->site]) {
        *alone = !all;
        return 0;
    }
    for (int s = 0; s < t->n_sites; s++)
        if (b->sites[s]) link_mark_left(&tr->link, s);
    b->agreed = 0;
    memset(b->sites, 0, sizeof b->sites);
    memset(b->ends, 0, sizeof b->ends);
    b->round = -1; /* butterfly: a site that asked later votes again */
    b->round_sites = b->round_ends = 0;
    return 1;
}

/* Has every site agreed to stop after this step? site_agreed: the site's
 * vote (STOP_NONE, STOP_PAUSE, STOP_END). */
int stop_decided(Trainer *tr, int site_agreed)
{
    if (tr->topo.n_sites == 1) return site_agreed;
    /* goes out with the next verdicts; an end replaces a pause */
    if (site_agreed > tr->ballot.request) tr->ballot.request = site_agreed;
    return tr->ballot.agreed;
}

/* Does this site's job come back after the stop (a pause), or end? A site
 * that leaves alone does as its own request says; a stop of every site is
 * an end when any site that asked asked to end (from the verdicts: the same
 * at every site). An end this site's ranks saw (scancel) wins either way. */
int stop_pauses(const Trainer *tr, int site_intent, int alone)
{
    const StopBallot *b = &tr->ballot;
    if (stop_end || site_intent == STOP_END || b->request == STOP_END) return 0;
    if (tr->topo.n_sites == 1) return site_intent == STOP_PAUSE;
    if (alone) return !b->ends[tr->topo.site];
    for (int s = 0; s < tr->topo.n_sites; s++)
        if (b->sites[s] && b->ends[s]) return 0;
    return 1;
}

