/* reduce.h — reductions over all learners of all sites: the gradient sum of
 * `sync` mode and the pseudo-gradient average of the DiLoCo modes.
 *
 * Owns: the canonical decomposition of the model into chunks (one per dense
 * tensor and layer, one per expert tensor, layer and expert), which rank
 * owns each chunk inside a learner, the per-fragment exchange plans, error
 * feedback state, and the agreement on which sites' payloads are applied.
 *
 * A reduction of fragment f runs in two halves so that the wide-area part
 * can overlap with training:
 *   start   (1) gradients only: dense chunks summed inside the learner;
 *           (2) every rank packs the chunks it owns; the learners of a site
 *               sum them in learner order (site network, blocking);
 *           (3) the first learner of each site encodes its site sum chunk
 *               by chunk (codec + error feedback; its own contribution is
 *               the decoded value, exactly what the other sites will
 *               decode) and posts non-blocking sends of the chunks each
 *               rank of every other site's first learner owns, and the
 *               matching receives (canonical-chunk plans: layouts may
 *               differ between sites);
 *   finish  (4) completes the link against the deadline, checks every
 *               payload (checksum, size, finite values), and agrees —
 *               inside the site, then across sites with a small verdict
 *               message — on the set of sites whose payloads every site
 *               accepted; the rejected ones are left out and the rest
 *               re-weighted;
 *           (5) sums the accepted sites in site order, broadcasts to the
 *               site's other learners and shares dense chunks inside the
 *               learner.
 * Every rank of every learner ends with the same values for the chunks it
 * holds. Callers pre-scale their values by their token share.
 * Must not: apply updates (optim.c, outer.c) or compute gradients.
 */
#ifndef ISTHMUS_REDUCE_H
#define ISTHMUS_REDUCE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "link.h"
#include "model.h"
#include "topology.h"

typedef struct {
    int tensor, layer, expert; /* expert -1: a dense chunk */
    size_t size;
    int fragment;
} Chunk;

typedef struct {
    int world_rank, site;
    int *chunks;               /* indices into the fragment's owned list */
    int n;
    size_t values, enc_bytes;
    LinkMsg msg, verdict;
} Peer;

typedef struct {
    int *owned;                /* chunk ids this rank owns in the fragment, canonical order */
    size_t *packed_off, *enc_off;
    int n_owned;
    size_t size, enc_size;     /* packed values, encoded bytes */
    size_t *held_off, *held_len; /* local runs of every chunk of the fragment this rank holds */
    int n_held;
    int *dense_chunks;         /* every dense chunk of the fragment */
    int n_dense;
    size_t dense_size;
    Peer *peers;
    int n_peers;
    LinkMsg **links;           /* (2 n_peers) the peers' payload messages, then their verdicts */
    float *staging;            /* (n_sites, size) per-site sums of my owned chunks */
    float *gather;             /* (site learners, size) */
    float *residual;           /* (size) error feedback, first learner of a site only */
    float *scratch;            /* (max chunk) */
    unsigned char *enc;        /* (enc_size) */
    float *dense_buf;          /* (dense_size) */
    unsigned char *verdict_out, *verdict_in; /* per peer frames */
    /* the exchange in flight */
    int in_flight, kind, polls, arrived_poll, sends_deferred, sent_poll;
    uint64_t exchange;
    double err2, norm2;
} FragPlan;

typedef struct {
    int fragment;
    uint64_t exchange;
    double payload_bytes;      /* encoded bytes this site sent (all its ranks) */
    double codec_rel_error;    /* ||sent - decoded|| / ||sent|| over this site */
    int accepted_sites, n_sites;
    char rejected[512];        /* "site: reason; ..." */
    int arrived_poll;          /* polls (inner steps) until everything had arrived; -1: at finish */
    int partner, crosses;      /* butterfly: partner learner, in another site */
    Codec codec;               /* butterfly: the payloads' codec (none in the final exact rounds) */
    int sent_poll;             /* polls before this rank posted its sends (0: at start; test hook) */
} ReduceReport;

enum { REDUCE_GRADS, REDUCE_REPLICATED };

/* A butterfly exchange of one fragment with one partner learner. */
typedef struct {
    int partner, fragment, crosses;  /* partner learner id; in another site? */
    Codec codec;                     /* the reducer's, or none for exact averaging */
    size_t *raw_off;                 /* codec none (exact plans): byte offsets of owned chunks in `mine` */
    Peer *peers;                     /* the partner's ranks whose chunks overlap mine */
    int n_peers;
    LinkMsg **links;                 /* (2 n_peers) payload messages, then verdicts */
    float *mine, *theirs;            /* (fragment owned size) decoded values */
    double w_me, w_them;
    int in_flight, polls, arrived_poll;
    uint64_t exchange;
    double err2, norm2;
} PairPlan;

#define REDUCE_MAX_LEARNER_SIZES CONFIG_MAX_SITES

typedef struct {
    const Topology *topo;
    const Model *model;
    PairPlan *pairs;           /* (fragments x 32 partner bits x 2) butterfly plans (lossy, exact),
                                * built on first use */
    float **mix_residual;      /* (fragments) error feedback of butterfly payloads */
    Chunk *chunks;
    int n_chunks;
    int fragments;
    FragPlan *frag;
    Codec codec;
    int block, error_feedback;
    int leader;                /* my learner is the first of its site */
    MPI_Comm world, site_peers;
    Link link;
    double *site_weight;       /* token share of each site */
    uint64_t exchanges;
    int max_peer_learners;     /* most other learners one finished exchange of mine waited on */
    /* owners of dense chunks per learner size G (at most one size per site) */
    int dense_G[REDUCE_MAX_LEARNER_SIZES], *dense_owner[REDUCE_MAX_LEARNER_SIZES], n_dense_cache;
    /* the stop vote between sites rides on the verdicts (train.c sets the
     * request, the same on every rank of a site; see docs/architecture.md) */
    int stop_request;          /* this site asks to stop */
    int stop_agreed;           /* a finished site exchange carried a stop request */
    long stop_round;           /* butterfly: earliest round in which a learner asked to stop, -1 none */
} Reducer;

int reducer_create(Reducer *r, const Topology *t, const Model *m, int fragments, Codec codec,
                   int block, int error_feedback, double timeout_s, MPI_Comm world);
void reducer_destroy(Reducer *r);

/* Fragment of (tensor, layer): layer mod fragments; embed -> 0;
 * final_norm -> the last layer's. */
int fragment_of(int tensor, int layer, int layers, int fragments);

/* Begin reducing fragment f of `buf` (laid out like model params), in
 * place. REDUCE_GRADS sums dense chunks inside the learner first;
 * REDUCE_REPLICATED takes them as they are (every rank of a learner holds
 * the same dense values). The caller must not change f's chunks of buf
 * until reduce_finish. */
int reduce_start(Reducer *r, int f, float *buf, int kind);
/* Only the learner part of a gradient reduction: dense gradients summed
 * over the learner's ranks (the outer modes train each learner alone). */
int reduce_learner_sum(Reducer *r, float *grads);
/* Progress every exchange in flight (call once per inner step). */
int reduce_poll(Reducer *r);
/* Finish fragment f: the reduced values of every chunk of f this rank holds
 * are written into buf. */
int reduce_finish(Reducer *r, int f, float *buf, ReduceReport *rep);

/* Local runs (offset, length) of fragment f's chunks on this rank. */
void reduce_fragment_runs(const Reducer *r, int f, const size_t **off, const size_t **len, int *n);
/* Canonical element count (all chunks). */
size_t reduce_canonical_params(const Reducer *r);

/* Does this rank own chunk (tensor, layer, expert) inside its learner? */
int reduce_owns(const void *reducer, int tensor, int layer, int expert);
/* Error-feedback residuals <-> a buffer laid out like model params (only
 * owned chunks; zeros elsewhere on export). No-ops without feedback state. */
void reduce_residual_export(const Reducer *r, float *buf);
void reduce_residual_import(Reducer *r, const float *buf);
/* Has this rank error-feedback state (first learner of a site, codec on)? */
int reduce_has_residual(const Reducer *r);
/* Does any rank of this run keep outer-mode / sync error feedback (a lossy
 * codec between several sites)? The same answer on every rank. */
int reduce_any_residual(const Reducer *r);

/* Butterfly mixing of fragment f with learner `partner` (point-to-point
 * between the two learners' ranks on canonical chunk plans, codec and error
 * feedback as for the outer modes). start posts the exchange of buf's
 * values; finish writes the pair's weighted average
 *   (w_lo*v_lo + w_hi*v_hi) / (w_lo + w_hi)   (lower learner id first)
 * of the decoded values into buf, identically on both learners, or leaves
 * buf unchanged on both when either side rejected a payload. `exact`:
 * send the values uncompressed and without error feedback (the final
 * exact averaging: learners holding equal values send equal payloads and
 * the result is the mean of the values themselves, not of a codec's
 * rendering); otherwise the reducer's codec with error feedback. */
/* Prepare butterfly plans and error-feedback state (before any mix_start). */
int reduce_enable_mixing(Reducer *r);
int mix_start(Reducer *r, int f, int partner, float *buf, double w_me, double w_partner, int exact);
int mix_finish(Reducer *r, int f, float *buf, ReduceReport *rep, double *pair_distance);
int mix_in_flight(const Reducer *r, int f);

/* Squared L2 norm of the learner's full gradient, the same number on every
 * rank of every learner whatever the sharding. */
int grad_norm_sq_learner(const Model *m, MPI_Comm learner_comm, double *out);
/* 64-bit hash of the learner's canonical parameters in `buf` (laid out like
 * m->params); equal on learners holding identical models. */
int model_fingerprint(const Model *m, const float *buf, MPI_Comm learner_comm, uint64_t *out);

#endif
