/* memory.c — see memory.h. Every figure mirrors an allocation: model.c
 * (weights, grads), optim.c (AdamW), outer.c (packed outer state), shard.c
 * (residuals, dense staging, the staging pool), payload.c (frames), transformer.c
 * (activations, expert rows), expert_copies.c (split experts' copies and
 * mirrors). The memory test keeps them in step. */
#include "memory.h"

#include "backend.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "codec.h"
#include "expert_copies.h"
#include "model.h"
#include "outer.h"
#include "payload.h"
#include "plan.h"
#include "status.h"
#include "topology.h"
#include "cpu/precond.h"     /* a matrix optimiser's state */
#include "cpu/transformer.h" /* the CPU backend's activations */
#include "../cuda/acts_plan.h" /* the CUDA backend's (plain arithmetic, any build) */
#include "../cuda/precond_plan.h" /* the CUDA backend's matrix optimisers (the same) */

static double floats(size_t n) { return (double)n * sizeof(float); }
static double aligned64(double bytes) { return (double)(((size_t)bytes + 63) / 64 * 64); }

/* A matrix optimiser's bytes beyond the moments (src/cpu/precond.c):
 * shampoo's four packed buffers and block sums, both optimisers' scratch;
 * with backend = cuda the device block of cuda/precond.cu (every block of a
 * matrix at once: more scratch than the CPU's per-thread blocks). */
static double precond_bytes(const Config *cfg, const Model *m, size_t owned)
{
    const int shampoo = !strcmp(cfg->train.optimizer, "shampoo");
    if (!shampoo && strcmp(cfg->train.optimizer, "muon")) return 0.0;
    size_t largest, side;
    precond_matrix_extent(m, 0, &largest, &side); /* no block check: cannot fail */
    const size_t b = (size_t)cfg->train.precond_block;
    if (memory_on_gpu(&cfg->train)) {
        size_t pieces[CUDA_PRECOND_PIECES];
        return (double)cuda_precond_pieces(pieces, shampoo, owned, largest, side, b);
    }
    const int threads = cfg->train.threads > 0 ? cfg->train.threads : omp_get_max_threads();
    double bytes = 2 * floats(largest + 1); /* the two directions */
    if (!shampoo) return bytes + floats(2 * side * side + 1);
    return bytes + 4 * floats(owned + 1) + floats(b * b * (size_t)threads + 1) +
           sizeof(float) * (double)PRECOND_ROOT_WORK(b) * threads +
           sizeof(double) * 2.0 * (double)(largest / (b * b) + 1); /* the grafting's block sums */
}

/* Staging, residual and outer-state bytes of the exchanges (shard, payload
 * frames) and the outer state. */
static int plan_exchanges(const Config *cfg, const Topology *t, const Model *m, MemoryPlan *out)
{
    const OuterConfig *oc = &cfg->outer;
    const int butterfly = oc->mode_id == MODE_BUTTERFLY, outer_mode = oc->mode_id != MODE_SYNC;
    const Codec codec = (Codec)codec_from_name(oc->codec);
    const CodecParams cp = config_codec_params(oc);
    const int ef = !strcmp(oc->error_feedback, "on") && codec != CODEC_NONE;
    const SiteInfo *site = &t->sites[t->site];
    const int leader = t->learner == site->first_learner, G = t->learner_size;
    int k = 0;
    while ((1 << k) < t->n_learners) k++;
    ChunkTable ct;
    CHECK(chunk_table_create(&ct, m, oc->fragments));
    if (t->experts_split) chunk_table_set_experts(&ct, site->expert_begin, site->experts); /* as shard.c */
    size_t owned = 0, max_size = 0, max_enc = 0, max_chunk = 1, max_dense = 1, send = 0, recv = 0;
    size_t per_tensor[N_TENSORS] = {0}; /* owned values of each tensor: a file view's staging */
    double residual = 0.0;
    int rc = ISTH_OK;
    for (int f = 0; f < oc->fragments && rc == ISTH_OK; f++) {
        Owned own;
        rc = owned_build(&own, &ct, f, G, t->learner_rank, codec, cp);
        if (rc != ISTH_OK) break;
        owned += own.size;
        if (own.size > max_size) max_size = own.size;
        for (int i = 0; i < own.n; i++) per_tensor[ct.chunks[own.chunk[i]].tensor] += ct.chunks[own.chunk[i]].size;
        if (own.enc_size > max_enc) max_enc = own.enc_size;
        if (own.max_chunk > max_chunk) max_chunk = own.max_chunk;
        size_t dense = 0;
        for (int c = 0; c < ct.n_chunks; c++)
            if (ct.chunks[c].fragment == f && ct.chunks[c].expert < 0) dense += ct.chunks[c].size;
        if (dense > max_dense) max_dense = dense;
        if (butterfly) {
            if (ef) residual += floats(own.size + 1);
            for (int d = 0; d < k; d++) { /* the partner's ranks, lossy and exact plans */
                int first, Gp;
                topology_learner_ranks(t, t->learner ^ (1 << d), &first, &Gp);
                const size_t lossy = peers_frame_bytes(&ct, &own, Gp, codec, cp);
                const size_t exact = peers_frame_bytes(&ct, &own, Gp, CODEC_NONE, cp);
                const size_t most = lossy > exact ? lossy : exact;
                if (most > send) send = recv = most;
            }
        } else if (leader && t->n_sites > 1) {
            if (ef) residual += floats(own.size + 1);
            size_t frames = 0;
            for (int s = 0; s < t->n_sites; s++)
                if (s != t->site) frames += peers_frame_bytes(&ct, &own, t->sites[s].learner_ranks, codec, cp);
            if (frames > send) send = recv = frames;
        }
        owned_free(&own);
    }
    chunk_table_destroy(&ct);
    CHECK(rc);
    out->bytes[ALLOC_RESIDUAL] = residual;
    out->bytes[ALLOC_OPTIMIZER] = 2 * floats(owned + 1); /* AdamW m, v of the owned chunks (ZeRO-1) */
    out->bytes[ALLOC_OPTIMIZER] += precond_bytes(cfg, m, owned); /* shampoo's statistics and roots, scratch */
    if (outer_mode) out->bytes[ALLOC_OUTER] = floats(owned + 1) * (butterfly ? 3 : 2);
    /* staging: the learner's dense sums, the encoder's scratch, a file
     * view's tensor (checkpoints, the model file), outer merges, the pool */
    double staging = 0.0;
    if (G > 1) staging += floats(max_dense < BACKEND_SUM_BATCH ? max_dense : BACKEND_SUM_BATCH);
    size_t largest_tensor = 0;
    for (int i = 0; i < N_TENSORS; i++)
        if (per_tensor[i] > largest_tensor) largest_tensor = per_tensor[i];
    staging += floats(largest_tensor);
    if (outer_mode) staging += floats(max_size + 1);
    if (t->n_sites > 1 || t->n_learners > 1) staging += floats(max_chunk);
    if (t->n_learners > 1 || outer_mode) { /* sync with one learner stages nothing */
        const int slots = outer_mode ? outer_max_in_flight(oc) : 1;
        const size_t rows = butterfly ? 2 : (size_t)t->n_sites;
        const size_t gather = !butterfly && site->learners > 1 ? (size_t)site->learners : 0;
        double slot = floats(max_size * rows + 1) + (double)(max_enc + 1) + (double)(send + 1) + (double)(recv + 1);
        if (gather) slot += floats(max_size * gather + 1);
        staging += slots * slot;
    }
    out->bytes[ALLOC_STAGING] = staging;
    return ISTH_OK;
}

int memory_plan(const Config *cfg, int world_size, int rank, MemoryPlan *out)
{
    memset(out, 0, sizeof *out);
    if (world_size <= 0) {
        world_size = 0;
        for (int s = 0; s < cfg->n_sites; s++) world_size += cfg->sites[s].ranks;
        if (!world_size) world_size = 1;
    }
    if (rank < 0 || rank >= world_size)
        return isth_fail(ISTH_EINPUT, "memory: rank %d is not in a job of %d ranks", rank, world_size);
    Topology t;
    CHECK(topology_layout(&t, cfg, world_size, rank));
    Model m;
    model_describe(&m, &cfg->model, t.expert_begin, t.experts_local);
    const double params = floats(m.n_params);
    out->bytes[ALLOC_WEIGHTS] = aligned64(params);
    out->bytes[ALLOC_GRADS] = aligned64(params);
    CHECK(plan_exchanges(cfg, &t, &m, out));
    size_t copy, mirror; /* split experts: the copies of other sites' experts and the mirrors of my own */
    CHECK(copies_plan(cfg, &t, &m, &copy, &mirror));
    if (copy || mirror) out->bytes[ALLOC_OUTER] += floats(copy + 1) + floats(mirror + 1);
    const SiteInfo *site = &t.sites[t.site];
    const int threads = cfg->train.threads > 0 ? cfg->train.threads : omp_get_max_threads();
    out->bytes[ALLOC_ACTIVATIONS] = acts_bytes(&cfg->model, site->micro_batch, cfg->model.context, t.learner_size,
                                               threads, config_recompute(&cfg->train));
    /* balanced routing: each of my experts receives its share of the learner's copies (experts
     * split, routing local: every copy goes to one of the site's experts; drop: the others' are lost) */
    const double copies = (double)site->micro_batch * cfg->model.context * t.learner_size * cfg->model.top_k;
    const int routed = t.experts_split && !strcmp(cfg->outer.expert_routing, "local") ? site->experts
                                                                                        : cfg->model.experts;
    const double arrivals = copies * t.experts_local / routed;
    out->bytes[ALLOC_EXPERT_ROWS] = acts_expert_row_bytes(&cfg->model, arrivals, config_recompute(&cfg->train));
    if (memory_on_gpu(&cfg->train)) { /* the GPU's (device memory; its attention keeps O(T) per row) */
        const int bf16 = !strcmp(cfg->train.precision, "bf16");
        const int kept =
            cuda_acts_kept_layers(cfg->model.layers, config_recompute(&cfg->train) == RECOMPUTE_LAYER);
        out->bytes[ALLOC_ACTIVATIONS] =
            cuda_acts_plan_bytes(cfg->model.layers, kept, cfg->model.dim, cfg->model.heads, cfg->model.experts,
                                 cfg->model.top_k, cfg->model.vocab, site->micro_batch, cfg->model.context,
                                 t.learner_size, bf16);
        out->bytes[ALLOC_EXPERT_ROWS] = cuda_expert_row_bytes(kept, cfg->model.dim, cfg->model.ffn, arrivals, bf16);
        out->bytes[ALLOC_ACTIVATIONS] += cuda_pool_scratch_bytes(cfg->model.dim, cfg->model.heads, cfg->model.experts,
                                                                 site->micro_batch, cfg->model.context, arrivals, bf16);
        if (bf16) /* the products' bf16 copy of the weights after the embedding */
            out->bytes[ALLOC_WEIGHTS] += aligned64(2.0 * (double)(m.n_params - model_after_embed(&m)));
    }
    out->plain_state = 4 * params; /* what plain data-parallel training holds: weights, grads, AdamW m and v */
    out->gpu = memory_on_gpu(&cfg->train);
    out->site = t.site;
    out->learner = t.learner;
    out->learner_rank = t.learner_rank;
    out->learner_size = t.learner_size;
    out->experts_local = t.experts_local;
    return ISTH_OK;
}

double memory_total(const MemoryPlan *p)
{
    double total = 0.0;
    for (int c = 1; c < ALLOC_CATEGORIES; c++) total += p->bytes[c];
    return total;
}

int memory_on_gpu(const TrainConfig *t) { return !strcmp(t->backend, "cuda") || !strcmp(t->precision, "bf16"); }

int memory_plan_largest(const Config *cfg, int world_size, int first, int count, MemoryPlan *out, long *rank)
{
    *rank = first;
    CHECK(memory_plan(cfg, world_size, first, out));
    for (int r = first + 1; r < first + count; r++) {
        MemoryPlan p;
        CHECK(memory_plan(cfg, world_size, r, &p));
        if (memory_total(&p) > memory_total(out)) {
            *out = p;
            *rank = r;
        }
    }
    return ISTH_OK;
}

static void print_row(const char *name, double bytes, double total)
{
    printf("  %-16s %14.0f B %10.3f GiB %6.1f%%\n", name, bytes, bytes / 1073741824.0,
           total > 0 ? 100.0 * bytes / total : 0.0);
}

void memory_print(const MemoryPlan *p, int world_size, int rank)
{
    const double total = memory_total(p);
    printf("memory of world rank %d of %d (learner %d, rank %d of %d, %d expert(s)), predicted:\n", rank, world_size,
           p->learner, p->learner_rank, p->learner_size, p->experts_local);
    printf("  %s\n", p->gpu ? "the CUDA backend's buffers (train.backend = cuda, or train.precision = bf16, which needs it)"
                            : "the CPU backend's buffers (--set train.backend=cuda for the GPU's)");
    for (int c = 1; c < ALLOC_CATEGORIES; c++) print_row(alloc_category_name[c], p->bytes[c], total);
    print_row("total", total, total);
    const double model_state = p->plain_state, rest = total - p->bytes[ALLOC_ACTIVATIONS] - p->bytes[ALLOC_EXPERT_ROWS];
    printf("  without activations: %.3f GiB = %.3f x (weights + grads + unsharded AdamW of the rank's parameters, "
           "%.3f GiB)\n", rest / 1073741824.0,
           model_state > 0 ? rest / model_state : 0.0, model_state / 1073741824.0);
    printf("  (expert rows at balanced routing; they grow with imbalance. Tables, plans and I/O buffers are not "
           "predicted: 'other' in a run's measured line)\n");
}

void memory_print_measured(int rank)
{
    AllocStats s;
    alloc_stats(&s);
    printf("memory of world rank %d, measured peak bytes:", rank);
    for (int c = 0; c < ALLOC_CATEGORIES; c++) printf(" %s=%.0f", alloc_category_name[c], s.peak[c]);
    printf(" total=%.0f\n", s.peak_total);
    fflush(stdout);
}
