/* spread.c — see spread.h. */
#include "spread.h"
#include "alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "link.h"
#include "status.h"

double spread_max_rel_distance(const float *rows, const double *w, int n, int len)
{
    double *mean = isth_calloc((size_t)len, sizeof(double)), worst = 0.0, norm2 = 0.0, wsum = 0.0;
    if (!mean) return NAN;
    for (int i = 0; i < n; i++) {
        const double wi = w ? w[i] : 1.0;
        wsum += wi;
        for (int j = 0; j < len; j++) mean[j] += wi * rows[(size_t)i * len + j];
    }
    for (int j = 0; j < len; j++) {
        mean[j] /= wsum;
        norm2 += mean[j] * mean[j];
    }
    for (int i = 0; i < n; i++) {
        double d2 = 0.0;
        for (int j = 0; j < len; j++) {
            const double d = rows[(size_t)i * len + j] - mean[j];
            d2 += d * d;
        }
        if (d2 > worst) worst = d2;
    }
    isth_free(mean);
    return norm2 > 0 ? sqrt(worst / norm2) : 0.0;
}

int spread_create(Spread *s, const Topology *t, const Model *m, Link *link, const double *weights)
{
    memset(s, 0, sizeof *s);
    s->topo = t;
    s->link = link;
    s->active = t->world_rank == 0 || t->learner_rank == 0;
    s->last_round = -1;
    s->timeout_s = 600.0;
    if (!s->active) return ISTH_OK;
    s->samples = m->dense_end < SPREAD_SAMPLES ? (int)m->dense_end : SPREAD_SAMPLES;
    s->pos = isth_malloc(sizeof(size_t) * (size_t)s->samples);
    s->ones = isth_malloc(sizeof(size_t) * (size_t)s->samples);
    CHECK_ALLOC(s->pos);
    CHECK_ALLOC(s->ones);
    for (int i = 0; i < s->samples; i++) {
        s->pos[i] = (size_t)i * m->dense_end / (size_t)s->samples;
        s->ones[i] = 1;
    }
    const int rows = t->world_rank == 0 ? t->n_learners : 1;
    if (t->world_rank == 0 && weights) {
        s->weights = isth_malloc(sizeof(double) * (size_t)t->n_learners);
        CHECK_ALLOC(s->weights);
        memcpy(s->weights, weights, sizeof(double) * (size_t)t->n_learners);
    }
    for (int k = 0; k < SPREAD_QUEUE; k++) {
        s->q[k].values = isth_malloc(sizeof(float) * (size_t)rows * (size_t)s->samples);
        s->q[k].req = isth_malloc(sizeof(LinkReq) * (size_t)rows);
        CHECK_ALLOC(s->q[k].values);
        CHECK_ALLOC(s->q[k].req);
        for (int i = 0; i < rows; i++) s->q[k].req[i] = (LinkReq){MPI_REQUEST_NULL, NULL};
    }
    return ISTH_OK;
}

void spread_destroy(Spread *s)
{
    const int n = s->topo && s->topo->world_rank == 0 ? s->topo->n_learners : 1;
    for (int k = 0; k < SPREAD_QUEUE; k++) {
        /* a probe still posted (a failed run): retired first, else leaked */
        if (s->q[k].req && !link_raw_retire(s->link, s->q[k].req, n)) continue;
        isth_free(s->q[k].values);
        isth_free(s->q[k].req);
    }
    isth_free(s->pos);
    isth_free(s->ones);
    isth_free(s->weights);
    memset(s, 0, sizeof *s);
}

static int learner_first_rank(const Topology *t, int learner)
{
    int first, size;
    topology_learner_ranks(t, learner, &first, &size);
    return first;
}

static void log_round(Spread *s, SpreadRound *q, Metrics *mt)
{
    const double v = spread_max_rel_distance(q->values, s->weights, s->topo->n_learners, s->samples);
    s->last_round = q->round;
    s->last_value = v;
    printf("spread after step %ld (round %ld): max relative distance to the learners' mean %.5f (%d samples)\n",
           q->step, q->round, v, s->samples);
    fflush(stdout);
    /* a failed write is reported by the next checked line */
    (void)metrics_spread(mt, q->round, q->step, s->topo->n_learners, s->samples, v);
}

void spread_stop(Spread *s);

/* Complete (rank 0: and log) the oldest open round; `wait`: block for it. */
static int retire_oldest(Spread *s, Metrics *mt, int wait, int *done)
{
    SpreadRound *q = &s->q[s->head];
    const int n = s->topo->world_rank == 0 ? s->topo->n_learners : 1;
    int flag = 0;
    const double t0 = MPI_Wtime();
    for (;;) {
        CHECK(link_raw_test(s->link, q->req, n, &flag));
        if (flag || !wait) break;
        if (MPI_Wtime() - t0 > s->timeout_s) {
            if (s->tolerant) { /* a site is gone: the probe measures all learners or nothing */
                if (s->topo->world_rank == 0)
                    printf("spread probe stopped at round %ld: samples missing after %g s (a site lost)\n", q->round,
                           s->timeout_s);
                spread_stop(s);
                *done = 0;
                return ISTH_OK;
            }
            return isth_fail(ISTH_ERUNTIME, "spread probe of round %ld: samples missing after [outer] timeout = %g s",
                             q->round, s->timeout_s);
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    *done = flag;
    if (!flag) return ISTH_OK;
    if (s->topo->world_rank == 0) log_round(s, q, mt);
    s->head = (s->head + 1) % SPREAD_QUEUE;
    s->count--;
    return ISTH_OK;
}

int spread_round(Spread *s, long round, long step, Backend *be, Metrics *mt)
{
    if (!s->active) return ISTH_OK;
    const Topology *t = s->topo;
    int done;
    if (s->count == SPREAD_QUEUE) CHECK(retire_oldest(s, mt, 1, &done));
    SpreadRound *q = &s->q[(s->head + s->count) % SPREAD_QUEUE];
    q->round = round;
    q->step = step;
    s->count++;
    const size_t bytes = sizeof(float) * (size_t)s->samples;
    if (t->world_rank == 0) {
        for (int l = 0; l < t->n_learners; l++) {
            if (l == t->learner) {
                CHECK(be->ops->get(be, STATE_PARAMS, s->pos, s->ones, s->samples, q->values + (size_t)l * s->samples));
                q->req[l] = (LinkReq){MPI_REQUEST_NULL, NULL};
                continue;
            }
            const int src = learner_first_rank(t, l);
            CHECK(link_raw_post(s->link, src, LINK_TAG_SPREAD, q->values + (size_t)l * s->samples, bytes, 0,
                                &q->req[l]));
            if (topology_site_of(t, src) != t->site) s->inter_site_bytes += (double)bytes;
        }
    } else {
        CHECK(be->ops->get(be, STATE_PARAMS, s->pos, s->ones, s->samples, q->values));
        CHECK(link_raw_post(s->link, 0, LINK_TAG_SPREAD, q->values, bytes, 1, &q->req[0]));
        if (topology_site_of(t, 0) != t->site) s->inter_site_bytes += (double)bytes;
    }
    return spread_poll(s, mt);
}

int spread_poll(Spread *s, Metrics *mt)
{
    int done = 1;
    while (s->active && s->count > 0 && done) CHECK(retire_oldest(s, mt, 0, &done));
    return ISTH_OK;
}

void spread_stop(Spread *s)
{
    if (!s->active) return;
    const int n = s->topo->world_rank == 0 ? s->topo->n_learners : 1;
    for (; s->count > 0; s->count--, s->head = (s->head + 1) % SPREAD_QUEUE)
        if (!link_raw_retire(s->link, s->q[s->head].req, n)) /* MPI keeps what it cannot cancel: never freed */
            s->q[s->head].values = NULL, s->q[s->head].req = NULL;
    s->active = 0;
}

int spread_finish(Spread *s, Metrics *mt)
{
    int done;
    while (s->active && s->count > 0) CHECK(retire_oldest(s, mt, 1, &done));
    return ISTH_OK;
}
