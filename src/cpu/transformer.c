/* transformer.c — see transformer.h. */
#include "transformer.h"
#include "alloc.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "route_plan.h"
#include "status.h"

/* The dimensions of a (no buffers). */
static void acts_dims(Activations *a, const ModelConfig *c, int B, int T, int G, Recompute recompute)
{
    memset(a, 0, sizeof *a);
    a->recompute = recompute;
    a->B = B;
    a->T = T;
    a->dims = model_dims(c);
    a->G = G;
    a->El = c->experts / G;
    a->Lk = recompute == RECOMPUTE_LAYER ? 1 : a->dims.L;
}

/* Where layer l's kept activations live: its own slice, or the one slice
 * every layer shares when backward computes each layer again. */
static int slot(const Activations *a, int l) { return a->recompute == RECOMPUTE_LAYER ? 0 : l; }

/* The buffers carved out of a->block: (where, floats). */
typedef struct {
    float **p;
    size_t n;
} Carve;

#define ACTS_CARVES 30

static size_t block_plan(Activations *a, int threads, Carve *plan)
{
    /* Lk: layers whose activations are kept (all, or one when recomputed) */
    const size_t L = (size_t)a->dims.L, Lk = (size_t)a->Lk, D = (size_t)a->dims.D, E = (size_t)a->dims.E,
                 K = (size_t)a->dims.K, V = (size_t)a->dims.V, B = (size_t)a->B, T = (size_t)a->T, N = B * T;
    const size_t Dh2 = D / (size_t)a->dims.H / 2;
    const size_t VE = V > E ? V : E;
    const Carve p[ACTS_CARVES] = {
        {&a->x, (L + 1) * N * D}, {&a->xn1, Lk * N * D}, {&a->rstd1, Lk * N},
        {&a->q, Lk * N * D}, {&a->k, Lk * N * D}, {&a->v, Lk * N * D}, {&a->ao, Lk * N * D},
        {&a->att, (a->recompute == RECOMPUTE_NONE ? L : 1) * B * (size_t)a->dims.H * T * T},
        {&a->h, Lk * N * D}, {&a->xn2, Lk * N * D}, {&a->rstd2, Lk * N},
        /* probs: the head's, then in backward its gradient in place (dlogits) and each
         * router's (N,E): nothing reads the probabilities after the head's backward */
        {&a->xf, N * D}, {&a->rstdf, N}, {&a->probs, N * VE}, {&a->losses, N},
        {&a->rope_cos, T * Dh2}, {&a->rope_sin, T * Dh2},
        {&a->dx, N * D}, {&a->dh, N * D}, {&a->dxn, N * D}, {&a->dq, N * D}, {&a->dk, N * D},
        {&a->dv, N * D}, {&a->dao, N * D}, {&a->dtmp, N * D},
        {&a->dprobs, N * E}, {&a->send_rows, N * K * D}, {&a->back_rows, N * K * D},
        {&a->att_scratch, (size_t)threads * T * T}, {&a->router_logits, N * E},
    };
    size_t total = 0;
    for (int i = 0; i < ACTS_CARVES; i++) {
        plan[i] = p[i];
        total += (p[i].n + 15) & ~(size_t)15; /* 64-byte aligned */
    }
    return total;
}

/* Bytes of one layer's routing tables (allocated in acts_create). */
static double route_bytes(const Activations *a)
{
    const double N = (double)a->B * a->T, E = a->dims.E, K = a->dims.K, D = a->dims.D, G = a->G;
    return N * E * 4 + N * 4 + N * K * 4 + E * 8 + E * 8 + N * K * 4 + N * K * 4 + G * 4 + G * 4 + N * K * D * 4 +
           (a->El + 1.0) * 4;
}

double acts_bytes(const ModelConfig *c, int B, int T, int G, int threads, Recompute recompute)
{
    Activations a;
    Carve plan[ACTS_CARVES];
    acts_dims(&a, c, B, T, G, recompute);
    const double block = (double)block_plan(&a, threads, plan) * sizeof(float);
    /* + counts (and the plan's scratch) and the learner's count matrix */
    return block + a.Lk * (route_bytes(&a) + (double)sizeof(MoeRouting)) + (4.0 + a.G) * a.dims.E * sizeof(int);
}

int acts_create(Activations *a, const ModelConfig *c, int B, int T, Coll *ep, Recompute recompute)
{
    acts_dims(a, c, B, T, ep->size, recompute);
    a->ep = ep;
    const size_t Lk = (size_t)a->Lk, D = (size_t)a->dims.D, E = (size_t)a->dims.E, K = (size_t)a->dims.K,
                 N = (size_t)B * T;
    Carve plan[ACTS_CARVES];
    const size_t total = block_plan(a, omp_get_max_threads(), plan);
    a->block = isth_aligned_alloc(64, total * sizeof(float));
    a->route = isth_calloc(Lk, sizeof(MoeRouting));
    a->counts = isth_malloc(4 * E * sizeof(int));
    a->counts_all = isth_malloc((size_t)a->G * E * sizeof(int));
    if (!a->block || !a->route || !a->counts || !a->counts_all) {
        acts_destroy(a);
        return isth_fail(ISTH_ERUNTIME, "out of memory for activations (%zu MiB)",
                         total * sizeof(float) >> 20);
    }
    size_t off = 0;
    for (int i = 0; i < ACTS_CARVES; i++) {
        *plan[i].p = a->block + off;
        off += (plan[i].n + 15) & ~(size_t)15;
    }
    a->dlogits = a->probs;
    const size_t G = (size_t)a->G;
    for (size_t l = 0; l < Lk; l++) { /* route_bytes counts these */
        MoeRouting *r = &a->route[l];
        r->probs = isth_malloc(N * E * sizeof(float));
        r->lse = isth_malloc(N * sizeof(float));
        r->choice = isth_malloc(N * K * sizeof(int));
        r->frac = isth_malloc(E * sizeof(double));
        r->mean_prob = isth_malloc(E * sizeof(double));
        r->send_copy = isth_malloc(N * K * sizeof(int));
        r->copy_slot = isth_malloc(N * K * sizeof(int));
        r->send_counts = isth_malloc(G * sizeof(int));
        r->recv_counts = isth_malloc(G * sizeof(int));
        r->y_back = isth_malloc(N * K * D * sizeof(float));
        r->expert_start = isth_malloc(((size_t)a->El + 1) * sizeof(int));
        if (!r->probs || !r->lse || !r->choice || !r->frac || !r->mean_prob || !r->send_copy ||
            !r->copy_slot || !r->send_counts || !r->recv_counts || !r->y_back || !r->expert_start) {
            acts_destroy(a);
            return isth_fail(ISTH_ERUNTIME, "out of memory for routing buffers");
        }
    }
    rope_tables(a->rope_cos, a->rope_sin, T, a->dims.D / a->dims.H);
    return ISTH_OK;
}

/* Expert-row buffers (per layer, and shared) for n arrivals per layer, as
 * ensure_owner grows them. */
double acts_expert_row_bytes(const ModelConfig *c, double n, Recompute recompute)
{
    const int kept = recompute == RECOMPUTE_LAYER ? 1 : c->layers; /* layers that keep their rows */
    const size_t rows_n = (size_t)n, D = (size_t)c->dim, F = (size_t)c->ffn;
    const double rows = (double)moe_rows_grow_target(rows_n);
    const double per_layer = rows * (2 * sizeof(int) + (double)D * 4 + 3.0 * F * 4);
    const double shared = 4.0 * moe_rows_grow_target(rows_n * D) * 4 + (double)moe_rows_grow_target(3 * rows_n * F) * 4;
    return kept * per_layer + shared;
}

void acts_destroy(Activations *a)
{
    if (a->route)
        for (int l = 0; l < a->Lk; l++) {
            MoeRouting *r = &a->route[l];
            void *bufs[] = {r->probs, r->lse, r->choice, r->frac, r->mean_prob, r->send_copy,
                            r->copy_slot, r->send_counts, r->recv_counts, r->y_back,
                            r->expert_start, r->recv_row, r->row_src, r->xrows,
                            r->arows, r->urows, r->hrows};
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) isth_free(bufs[i]);
        }
    isth_free(a->route);
    isth_free(a->block);
    isth_free(a->counts);
    isth_free(a->counts_all);
    isth_free(a->recv_rows);
    isth_free(a->recv_rows2);
    isth_free(a->row_tmp);
    isth_free(a->row_tmp2);
    isth_free(a->ffn_scratch);
    memset(a, 0, sizeof *a);
}

/* Grow *p to hold at least n elements of `size` bytes (contents dropped). */
static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap && *p) return ISTH_OK;
    size_t want = moe_rows_grow_target(n);
    isth_free(*p);
    *p = isth_malloc(want * size);
    if (!*p) {
        *cap = 0;
        return isth_fail(ISTH_ERUNTIME, "out of memory for %zu expert rows", n);
    }
    *cap = want;
    return ISTH_OK;
}

/* Owner-side buffers of layer route r for n_recv arrivals and up to n_recv rows. */
static int ensure_owner_rows(Activations *a, MoeRouting *r, int n_recv);
static int ensure_owner(Activations *a, MoeRouting *r, int n_recv)
{
    const AllocCategory was = alloc_category(ALLOC_EXPERT_ROWS);
    const int rc = ensure_owner_rows(a, r, n_recv);
    alloc_category(was);
    return rc;
}

static int ensure_owner_rows(Activations *a, MoeRouting *r, int n_recv)
{
    const size_t n = (size_t)n_recv, D = (size_t)a->dims.D, F = (size_t)a->dims.F;
    if (n > (size_t)r->recv_cap || !r->recv_row) {
        size_t want = moe_rows_grow_target(n);
        isth_free(r->recv_row);
        isth_free(r->row_src);
        isth_free(r->xrows);
        isth_free(r->arows);
        isth_free(r->urows);
        isth_free(r->hrows);
        r->recv_row = isth_malloc(want * sizeof(int));
        r->row_src = isth_malloc(want * sizeof(int));
        r->xrows = isth_malloc(want * D * sizeof(float));
        r->arows = isth_malloc(want * F * sizeof(float));
        r->urows = isth_malloc(want * F * sizeof(float));
        r->hrows = isth_malloc(want * F * sizeof(float));
        r->recv_cap = (int)want;
        if (!r->recv_row || !r->row_src || !r->xrows || !r->arows ||
            !r->urows || !r->hrows)
            return isth_fail(ISTH_ERUNTIME, "out of memory for %zu expert rows", n);
    }
    float **rowbufs[4] = {&a->recv_rows, &a->recv_rows2, &a->row_tmp, &a->row_tmp2};
    for (int i = 0; i < 4; i++) CHECK(grow((void **)rowbufs[i], &a->recv_caps[i], n * D, sizeof(float)));
    CHECK(grow((void **)&a->ffn_scratch, &a->ffn_cap, 3 * n * F, sizeof(float)));
    return ISTH_OK;
}

/* Per-layer slices of the saved activations. The stride is the allocated
 * size, so slices stay fixed whatever N the current call uses. */
#define SLICE(buf, l, per) ((buf) + (size_t)(l) * (per))

/* The expert weights of local expert e in layer l. */
static void expert_weights(const Model *m, int l, int e, const float **wg, const float **wu,
                           const float **wd)
{
    *wg = model_expert_param(m, T_W_GATE, l, e);
    *wu = model_expert_param(m, T_W_UP, l, e);
    *wd = model_expert_param(m, T_W_DOWN, l, e);
}

/* MoE layer forward with expert parallelism over the learner's G ranks:
 * route locally, share the counts (each rank's per-expert histogram, one
 * allgather): from them every rank knows the whole dispatch plan and the
 * capacity rule's verdict (route_plan.h); each kept copy goes to its
 * expert's owner (all-to-all), owners run their experts on rows in
 * (source rank, position) order, outputs return (all-to-all) and are
 * combined with the gates; dropped copies are never sent and return
 * zeros. With G = 1 the exchanges are copies and the arithmetic is the
 * same. The routing policy (model.h) sets the router's columns read and
 * the width of its probabilities (RouteSpan: Er = E unless ROUTE_LOCAL);
 * the plan covers the learner's experts only. */
static int moe_forward(float *out, const Model *m, Activations *a, int l, size_t N, int training,
                       ForwardStats *st)
{
    const int D = a->dims.D, E = a->dims.E, K = a->dims.K, F = a->dims.F, G = a->G, El = m->experts_local,
              me = a->ep->rank;
    const RouteSpan sp = model_route_span(m, G);
    const int Er = sp.Er;
    MoeRouting *r = &a->route[slot(a, l)];
    const float *xn = SLICE(a->xn2, slot(a, l), (size_t)a->B * a->T * D);

    /* route: logits (N,Er) = xn . router's columns [col, col+Er) ; probs ; top-k ; learner-wide f_e */
    matmul_forward_ldw(a->router_logits, xn, model_param(m, T_ROUTER, l) + sp.col, E, N, D, Er);
    router_softmax_forward(r->probs, r->lse, a->router_logits, N, Er);
    router_topk(r->choice, r->probs, N, Er, K);
    router_stats(a->counts, r->mean_prob, r->choice, r->probs, N, Er, K);
    CHECK(coll_allgather_int(a->ep, a->counts, Er, a->counts_all));
    const double learner_copies = (double)N * G * K;
    for (int e = 0; e < Er; e++) {
        int total = 0; /* integers: the same in any order */
        for (int s = 0; s < G; s++) total += a->counts_all[s * Er + e];
        r->frac[e] = total / learner_copies;
    }
    const int capacity = training ? moe_capacity(m->cfg.capacity_factor, N * (size_t)G, K, Er) : -1;
    if (training) {
        st->aux_loss += moe_balance_loss(r->frac, r->mean_prob, Er, m->cfg.aux_loss);
        st->z_loss += moe_z_loss(r->lse, N, m->cfg.z_loss);
    }

    /* the plan: slots of this rank's copies, arrivals and rows of its experts
     * (the count matrix of the learner's experts: ROUTE_DROP's columns) */
    if (sp.Es < Er) route_keep_columns(a->counts_all, G, Er, sp.off, sp.Es);
    r->n_sent = moe_send_plan(r->send_copy, r->copy_slot, r->send_counts, a->counts, r->choice, a->counts_all, N, K,
                              G, El, me, capacity, sp.off, Er, &r->remote);
    st->remote_dropped += r->remote;
    const int n_recv = moe_recv_count(r->recv_counts, a->counts_all, G, El, me, capacity);
    CHECK(ensure_owner(a, r, n_recv));
    r->n_recv = n_recv;
    r->rows = moe_owner_plan(r->recv_row, r->row_src, r->expert_start, &r->dropped, a->counts_all, G, El, me,
                             capacity);
    if (training) st->dropped += r->dropped;

    /* dispatch: the kept copies' rows to their owners, in slot order */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < r->n_sent; i++)
        memcpy(a->send_rows + (size_t)i * D, xn + (size_t)(r->send_copy[i] / K) * D, (size_t)D * sizeof(float));
    /* with one rank the rows stay where they are: exchange in place */
    float *arrived = G > 1 ? a->recv_rows : a->send_rows;
    CHECK(coll_alltoallv_rows(a->ep, a->send_rows, r->send_counts, arrived, r->recv_counts, D));

    /* owner: rows grouped by expert, compute */
    rows_gather(r->xrows, arrived, r->row_src, (size_t)r->rows, D);
    float *yrows = a->row_tmp;
    for (int e = 0; e < El; e++) {
        const size_t r0 = (size_t)r->expert_start[e], n = (size_t)r->expert_start[e + 1] - r0;
        const float *wg, *wu, *wd;
        expert_weights(m, l, e, &wg, &wu, &wd);
        expert_forward(yrows + r0 * D, r->arows + r0 * F, r->urows + r0 * F, r->hrows + r0 * F,
                       r->xrows + r0 * D, wg, wu, wd, n, D, F);
    }
    /* outputs back to the sources' slots; the dropped copies' slots are zeros */
    float *leaving = G > 1 ? a->recv_rows2 : r->y_back;
    rows_gather(leaving, yrows, r->recv_row, (size_t)n_recv, D);
    CHECK(coll_alltoallv_rows(a->ep, leaving, r->recv_counts, r->y_back, r->send_counts, D));
    memset(r->y_back + (size_t)r->n_sent * D, 0, (N * (size_t)K - (size_t)r->n_sent) * D * sizeof(float));
    moe_combine_forward(out, r, N, Er, K, D);
    return ISTH_OK;
}

/* Layer l of the forward pass: its activations from x_l into its slot;
 * x_{l+1} when `next` (backward's recomputation needs only the slot). */
static int layer_forward(const Model *m, Activations *a, int l, int training, ForwardStats *st, int next)
{
    const int D = a->dims.D, H = a->dims.H, B = a->B_cur, T = a->T_cur;
    const size_t N = a->N, ND = (size_t)a->B * a->T * D, NmaxT = (size_t)a->B * a->T; /* ND: per-layer stride */
    const size_t att_stride = a->recompute == RECOMPUTE_NONE ? (size_t)a->B * H * a->T * a->T : 0;
    const int sl = slot(a, l);
    float *x = SLICE(a->x, l, ND), *xn1 = SLICE(a->xn1, sl, ND), *q = SLICE(a->q, sl, ND),
          *k = SLICE(a->k, sl, ND), *v = SLICE(a->v, sl, ND), *ao = SLICE(a->ao, sl, ND),
          *h = SLICE(a->h, sl, ND), *xn2 = SLICE(a->xn2, sl, ND), *att = SLICE(a->att, l, att_stride);
    rmsnorm_forward(xn1, SLICE(a->rstd1, sl, NmaxT), x, model_param(m, T_ATTN_NORM, l), N, D);
    matmul_forward(q, xn1, model_param(m, T_WQ, l), N, D, D);
    matmul_forward(k, xn1, model_param(m, T_WK, l), N, D, D);
    matmul_forward(v, xn1, model_param(m, T_WV, l), N, D, D);
    rope_forward(q, a->rope_cos, a->rope_sin, B, T, H, D / H);
    rope_forward(k, a->rope_cos, a->rope_sin, B, T, H, D / H);
    attention_forward(ao, att, q, k, v, B, T, D, H);
    matmul_forward(a->dtmp, ao, model_param(m, T_WO, l), N, D, D);
    residual_forward(h, x, a->dtmp, N * D);
    rmsnorm_forward(xn2, SLICE(a->rstd2, sl, NmaxT), h, model_param(m, T_MOE_NORM, l), N, D);
    CHECK(moe_forward(a->dtmp, m, a, l, N, training, st));
    if (next) residual_forward(SLICE(a->x, l + 1, ND), h, a->dtmp, N * D);
    return ISTH_OK;
}

int transformer_forward(const Model *m, Activations *a, const int *tokens, const int *targets,
                        int B, int T, int training, ForwardStats *st)
{
    if (B > a->B || T > a->T)
        return isth_fail(ISTH_ERUNTIME, "transformer_forward: batch %dx%d exceeds buffers %dx%d",
                         B, T, a->B, a->T);
    CHECK(model_route_check(m, a->G, a->ep->rank)); /* and so experts_local <= a->El */
    const int L = a->dims.L, D = a->dims.D, V = a->dims.V;
    const size_t N = (size_t)B * T, ND = (size_t)a->B * a->T * D; /* ND: per-layer stride */
    memset(st, 0, sizeof *st);
    a->N = N;
    a->B_cur = B;
    a->T_cur = T;
    a->training = training;

    /* positions restart at 0 in each sequence: the tables are indexed by t < T
     * and the attention blocks of B, H, T are used with this call's T. */
    encoder_forward(SLICE(a->x, 0, ND), tokens, model_param(m, T_EMBED, 0), N, D);
    for (int l = 0; l < L; l++) {
        if (a->progress) a->progress(a->progress_ctx);
        CHECK(layer_forward(m, a, l, training, st, 1));
    }
    rmsnorm_forward(a->xf, a->rstdf, SLICE(a->x, L, ND), model_param(m, T_FINAL_NORM, 0), N, D);
    /* logits (N,V) = xf . embed^T, softmaxed in place into probs */
    tied_head_forward(a->probs, a->xf, model_param(m, T_EMBED, 0), N, D, V);
    crossentropy_forward(a->losses, a->probs, targets, N, V);
    for (size_t t = 0; t < N; t++)
        if (targets[t] >= 0) {
            st->ce_sum += a->losses[t];
            st->n_targets++;
        }
    return ISTH_OK;
}

static int moe_backward(float *dxn, Model *m, Activations *a, int l, const float *dout,
                        float loss_scale)
{
    const int D = a->dims.D, E = a->dims.E, K = a->dims.K, F = a->dims.F, El = m->experts_local;
    const RouteSpan sp = model_route_span(m, a->G);
    const int Er = sp.Er;
    const size_t N = a->N;
    MoeRouting *r = &a->route[slot(a, l)];
    const float *xn = SLICE(a->xn2, slot(a, l), (size_t)a->B * a->T * D);

    /* combine backward: gate gradients here, row gradients to the owners */
    memset(a->dprobs, 0, N * Er * sizeof(float));
    moe_combine_backward(a->send_rows, a->dprobs, dout, r, N, Er, K, D);
    float *arrived = a->G > 1 ? a->recv_rows : a->send_rows;
    CHECK(coll_alltoallv_rows(a->ep, a->send_rows, r->send_counts, arrived, r->recv_counts, D));
    float *dyrows = a->row_tmp, *dxrows = a->row_tmp2;
    rows_gather(dyrows, arrived, r->row_src, (size_t)r->rows, D);
    memset(dxrows, 0, (size_t)r->rows * D * sizeof(float));
    for (int e = 0; e < El; e++) {
        const size_t r0 = (size_t)r->expert_start[e], n = (size_t)r->expert_start[e + 1] - r0;
        const float *wg, *wu, *wd;
        expert_weights(m, l, e, &wg, &wu, &wd);
        expert_backward(dxrows + r0 * D, model_expert_grad(m, T_W_GATE, l, e),
                        model_expert_grad(m, T_W_UP, l, e), model_expert_grad(m, T_W_DOWN, l, e),
                        a->ffn_scratch, dyrows + r0 * D, r->xrows + r0 * D, r->arows + r0 * F,
                        r->urows + r0 * F, r->hrows + r0 * F, wg, wu, wd, n, D, F);
    }
    float *leaving = a->G > 1 ? a->recv_rows2 : a->back_rows;
    rows_gather(leaving, dxrows, r->recv_row, (size_t)r->n_recv, D);
    CHECK(coll_alltoallv_rows(a->ep, leaving, r->recv_counts, a->back_rows, r->send_counts, D));
    /* the dropped copies' slots: zeros, as their rows were */
    memset(a->back_rows + (size_t)r->n_sent * D, 0, (N * (size_t)K - (size_t)r->n_sent) * D * sizeof(float));
    moe_scatter_add(dxn, a->back_rows, r, N, K, D);

    /* router: balance and z losses, softmax, projection (into the columns read) */
    moe_balance_backward(a->dprobs, r->frac, N, Er, m->cfg.aux_loss, loss_scale);
    router_softmax_backward(a->dlogits, a->dprobs, r->probs, r->lse, N, Er, m->cfg.z_loss, loss_scale);
    matmul_backward_ldw(dxn, model_grad(m, T_ROUTER, l) + sp.col, a->dlogits, xn, model_param(m, T_ROUTER, l) + sp.col,
                        E, N, D, Er);
    return ISTH_OK;
}

int transformer_backward(Model *m, Activations *a, const int *tokens, const int *targets,
                         float loss_scale)
{
    const int L = a->dims.L, D = a->dims.D, H = a->dims.H, V = a->dims.V, B = a->B_cur;
    const size_t N = a->N, ND = (size_t)a->B * a->T * D, NmaxT = (size_t)a->B * a->T;
    const size_t att_stride = a->recompute == RECOMPUTE_NONE ? (size_t)a->B * H * a->T * a->T : 0;
    const size_t nbytes = N * D * sizeof(float);
    size_t n_targets = 0;
    for (size_t t = 0; t < N; t++) n_targets += targets[t] >= 0;
    const int T = a->T_cur;

    /* head: dlogits = (probs - onehot) * scale / n_targets */
    crossentropy_backward(a->dlogits, a->probs, targets,
                          n_targets ? loss_scale / (float)n_targets : 0.0f, N, V);
    memset(a->dxn, 0, nbytes);
    tied_head_backward(a->dxn, model_grad(m, T_EMBED, 0), a->dlogits, a->xf, model_param(m, T_EMBED, 0), N, D, V);
    memset(a->dx, 0, nbytes);
    CHECK(rmsnorm_backward(a->dx, model_grad(m, T_FINAL_NORM, 0), a->dxn, SLICE(a->x, L, ND),
                           model_param(m, T_FINAL_NORM, 0), a->rstdf, N, D));

    for (int l = L - 1; l >= 0; l--) {
        if (a->progress) a->progress(a->progress_ctx);
        /* the layer again from x_l: the same bits (its statistics dropped);
         * the last layer's are still in the slot from the forward */
        if (a->recompute == RECOMPUTE_LAYER && l < L - 1) {
            ForwardStats again;
            memset(&again, 0, sizeof again);
            CHECK(layer_forward(m, a, l, a->training, &again, 0));
        }
        const int sl = slot(a, l);
        const float *x = SLICE(a->x, l, ND), *xn1 = SLICE(a->xn1, sl, ND), *q = SLICE(a->q, sl, ND),
                    *k = SLICE(a->k, sl, ND), *v = SLICE(a->v, sl, ND), *ao = SLICE(a->ao, sl, ND),
                    *h = SLICE(a->h, sl, ND), *att = SLICE(a->att, l, att_stride);
        /* x_{l+1} = h + MoE(RMSNorm(h)) : dh = dx + norm-backward(moe-backward(dx)) */
        memcpy(a->dh, a->dx, nbytes);
        memset(a->dxn, 0, nbytes);
        CHECK(moe_backward(a->dxn, m, a, l, a->dx, loss_scale));
        CHECK(rmsnorm_backward(a->dh, model_grad(m, T_MOE_NORM, l), a->dxn, h,
                               model_param(m, T_MOE_NORM, l), SLICE(a->rstd2, sl, NmaxT), N, D));
        /* h = x + Attn(RMSNorm(x)) */
        memcpy(a->dx, a->dh, nbytes);
        memset(a->dao, 0, nbytes);
        matmul_backward(a->dao, model_grad(m, T_WO, l), a->dh, ao, model_param(m, T_WO, l), N, D, D);
        memset(a->dq, 0, nbytes);
        memset(a->dk, 0, nbytes);
        memset(a->dv, 0, nbytes);
        if (a->recompute == RECOMPUTE_ATTENTION) /* this layer's probabilities again (its output to scratch) */
            attention_forward(a->dtmp, (float *)att, q, k, v, B, T, D, H);
        attention_backward(a->dq, a->dk, a->dv, a->att_scratch, a->dao, att, q, k, v, B, T, D, H);
        rope_backward(a->dq, a->rope_cos, a->rope_sin, B, T, H, D / H);
        rope_backward(a->dk, a->rope_cos, a->rope_sin, B, T, H, D / H);
        memset(a->dxn, 0, nbytes);
        matmul_backward(a->dxn, model_grad(m, T_WQ, l), a->dq, xn1, model_param(m, T_WQ, l), N, D, D);
        matmul_backward(a->dxn, model_grad(m, T_WK, l), a->dk, xn1, model_param(m, T_WK, l), N, D, D);
        matmul_backward(a->dxn, model_grad(m, T_WV, l), a->dv, xn1, model_param(m, T_WV, l), N, D, D);
        CHECK(rmsnorm_backward(a->dx, model_grad(m, T_ATTN_NORM, l), a->dxn, x,
                               model_param(m, T_ATTN_NORM, l), SLICE(a->rstd1, sl, NmaxT), N, D));
    }
    encoder_backward(model_grad(m, T_EMBED, 0), a->dx, tokens, N, D);
    return ISTH_OK;
}
