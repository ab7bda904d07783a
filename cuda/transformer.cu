/* transformer.cu — see transformer.h. */
#include "transformer.h"
#include "attention.h"
#include "acts_plan.h"
#include "attention_tc.h"
#include "check.h"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "alloc.h"
#include "embed_buckets.h"
#include "cpu/layers.h" /* rope_tables: the same tables as the CPU's */
#include "cpu/moe.h"    /* the routing's bookkeeping on the host: the CPU's rules */
#include "status.h"
}

static void dims(CudaActivations *a, const ModelConfig *c, int B, int T, int G, Recompute recompute, int bf16)
{
    memset(a, 0, sizeof *a);
    a->recompute = recompute;
    a->act16 = bf16;
    a->Lk = cuda_acts_kept_layers(c->layers, recompute == RECOMPUTE_LAYER);
    a->B = B;
    a->T = T;
    a->dims = model_dims(c);
    a->G = G;
    a->El = c->experts / G;
}

/* Where layer l's kept activations live (transformer.c's slot). */
static int slot(const CudaActivations *a, int l) { return a->recompute == RECOMPUTE_LAYER ? 0 : l; }

/* The device block's buffers, in acts_plan.h's order. */
static size_t plan(CudaActivations *a, void **where[CUDA_ACTS_PIECES], size_t bytes[CUDA_ACTS_PIECES])
{
    void **const p[CUDA_ACTS_PIECES] = {
        (void **)&a->x, (void **)&a->xn1, (void **)&a->rstd1, (void **)&a->q, (void **)&a->k, (void **)&a->v,
        (void **)&a->ao, (void **)&a->att_lse, (void **)&a->h, (void **)&a->xn2, (void **)&a->rstd2,
        (void **)&a->xf, (void **)&a->rstdf, (void **)&a->probs, (void **)&a->losses, (void **)&a->rope_cos,
        (void **)&a->rope_sin, (void **)&a->dx, (void **)&a->dxn, (void **)&a->dq,
        (void **)&a->dk, (void **)&a->dv, (void **)&a->dao, (void **)&a->dtmp, (void **)&a->dlogits,
        (void **)&a->dprobs, (void **)&a->router_logits, (void **)&a->send_rows, (void **)&a->back_rows,
        (void **)&a->tokens, (void **)&a->targets, (void **)&a->send_token, (void **)&a->embed_plan,
        (void **)&a->block,
    };
    for (int i = 0; i < CUDA_ACTS_PIECES; i++) where[i] = p[i];
    return cuda_acts_pieces(bytes, a->dims.L, a->Lk, a->dims.D, a->dims.H, a->dims.E, a->dims.K, a->dims.V, a->B, a->T,
                            a->act16);
}

/* The bf16 copy of the parameter at p (a pointer into m->params past the
 * tied embedding, which the products never read). */
static const uint16_t *w16(const CudaActivations *a, const Model *m, const float *p)
{
    return a->w16 + (p - m->params - model_after_embed(m));
}

/* The weights at p as the products read them: the bf16 copy, or fp32. */
static const void *weights(const CudaActivations *a, const Model *m, const float *p)
{
    return a->act16 ? (const void *)w16(a, m, p) : (const void *)p;
}

/* out (N,OC) = inp . W(t, l), inp a stored operand (bf16 with act16). */
static int project(const Model *m, const CudaActivations *a, float *out, const void *inp, TensorId t, int l, size_t N,
                   int C, int OC)
{
    const float *w = model_param(m, t, l);
    if (a->act16) return cuda_matmul_forward_bf16(out, (const uint16_t *)inp, w16(a, m, w), N, C, OC, a->blas);
    return cuda_matmul_forward(out, (const float *)inp, w, N, C, OC, a->blas);
}

/* Its backward: dinp += dout . W^T, the weight's gradient += inp^T . dout. */
static int project_backward(Model *m, const CudaActivations *a, float *dinp, const float *dout, const void *inp,
                            TensorId t, int l, size_t N, int C, int OC)
{
    const float *w = model_param(m, t, l);
    float *dw = model_grad(m, t, l);
    if (a->act16)
        return cuda_matmul_backward_bf16(dinp, dw, dout, (const uint16_t *)inp, w16(a, m, w), N, C, OC, a->blas);
    return cuda_matmul_backward(dinp, dw, dout, (const float *)inp, w, N, C, OC, a->blas);
}

/* The router's product for the routing span (model.h: RouteSpan): its
 * columns [col, col + Er) of the (D,E) weight; and the backward into
 * those columns of its gradient (the others untouched). */
static int project_router(const Model *m, const CudaActivations *a, float *out, const void *inp, int l, size_t N,
                          RouteSpan sp)
{
    const float *w = model_param(m, T_ROUTER, l) + sp.col;
    return cuda_matmul_forward_ldw(a->act16, out, inp, weights(a, m, w), a->dims.E, N, a->dims.D, sp.Er, a->blas);
}

static int project_router_backward(Model *m, const CudaActivations *a, float *dinp, const float *dout,
                                   const void *inp, int l, size_t N, RouteSpan sp)
{
    const float *w = model_param(m, T_ROUTER, l) + sp.col;
    return cuda_matmul_backward_ldw(a->act16, dinp, model_grad(m, T_ROUTER, l) + sp.col, dout, inp, weights(a, m, w),
                                    a->dims.E, N, a->dims.D, sp.Er, a->blas);
}

/* Width in floats of a row of D stored operands: bf16 rows travel and are
 * gathered as D/2 floats' bytes (D is even: heads times a head dimension
 * of 16 or more). */
static int op_row_floats(const CudaActivations *a) { return a->act16 ? a->dims.D / 2 : a->dims.D; }

static int create(CudaActivations *a, const ModelConfig *c, int B, int T)
{
    void **where[CUDA_ACTS_PIECES];
    size_t bytes[CUDA_ACTS_PIECES];
    const size_t total = plan(a, where, bytes);
    char *block;
    CHECK_CUDA(cudaMalloc((void **)&block, total));
    size_t off = 0;
    for (int i = 0; i < CUDA_ACTS_PIECES; i++) {
        *where[i] = block + off;
        off += (bytes[i] + 255) & ~(size_t)255;
    }
    a->block = (float *)block;
    a->dlogits = a->probs; /* backward overwrites the probabilities with their gradient (acts_plan.h) */
    const size_t Lk = (size_t)a->Lk, N = (size_t)B * T, E = (size_t)a->dims.E, K = (size_t)a->dims.K,
                 D = (size_t)a->dims.D, G = (size_t)a->G;
    a->route = (CudaRouting *)isth_calloc(Lk, sizeof(CudaRouting));
    a->h_losses = (float *)isth_malloc(N * sizeof(float));
    a->h_embed_plan = (int *)isth_calloc(3 * N + 1, sizeof(int)); /* the ids' unused tail uploads as zeros */
    a->h_embed_count = (int *)isth_malloc((size_t)a->dims.V * sizeof(int));
    if (!a->route || !a->h_losses || !a->h_embed_plan || !a->h_embed_count)
        return isth_fail(ISTH_ERUNTIME, "out of host memory for the CUDA activations");
    /* pinned, so that the header's copy is asynchronous: the host waits for
     * its event while the GPU gathers the rows queued behind it */
    const size_t hdr_bytes = cuda_route_hdr_ints(a->G, a->El) * sizeof(int);
    CHECK_CUDA(cudaHostAlloc((void **)&a->h_hdr, hdr_bytes, cudaHostAllocDefault));
    CHECK_CUDA(cudaEventCreateWithFlags(&a->hdr_ready, cudaEventDisableTiming));
    CHECK(cuda_gemm_batch_create(&a->gemms, 3 * a->El)); /* a layer's expert products, 3 per expert */
    /* the dispatch plan's device scratch (cuda_route_scratch_bytes counts it) */
    CHECK_CUDA(cudaMalloc((void **)&a->d_counts, E * sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&a->d_cnt, G * E * sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&a->d_hdr, cuda_route_hdr_ints(a->G, a->El) * sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&a->d_bases, 3 * E * sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&a->d_pos, cuda_route_pos_ints(N * K, (int)E) * sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&a->d_mean_prob, E * sizeof(double)));
    CHECK_CUDA(cudaMalloc((void **)&a->d_fstats, 3 * sizeof(double)));
    for (size_t l = 0; l < Lk; l++) {
        CudaRouting *r = &a->route[l];
        CHECK_CUDA(cudaMalloc((void **)&r->d_probs, N * E * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_lse, N * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_choice, N * K * sizeof(int)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_copy_slot, N * K * sizeof(int)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_frac, E * sizeof(double)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_y_back, N * K * D * sizeof(float)));
        r->h_send_counts = (int *)isth_malloc(G * sizeof(int));
        r->h_recv_counts = (int *)isth_malloc(G * sizeof(int));
        r->h_expert_start = (int *)isth_malloc(((size_t)a->El + 1) * sizeof(int));
        if (!r->h_send_counts || !r->h_recv_counts || !r->h_expert_start)
            return isth_fail(ISTH_ERUNTIME, "out of host memory for the CUDA routing tables");
    }
    const int Dh = a->dims.D / a->dims.H;
    float *tab = (float *)isth_malloc(sizeof(float) * (size_t)T * Dh);
    CHECK_ALLOC(tab);
    rope_tables(tab, tab + (size_t)T * (Dh / 2), T, Dh);
    const cudaError_t e = cudaMemcpy(a->rope_cos, tab, sizeof(float) * (size_t)T * (Dh / 2), cudaMemcpyHostToDevice);
    const cudaError_t e2 = cudaMemcpy(a->rope_sin, tab + (size_t)T * (Dh / 2), sizeof(float) * (size_t)T * (Dh / 2),
                                      cudaMemcpyHostToDevice);
    /* a pageable copy may still be in flight when cudaMemcpy returns, and the
     * first rope kernel runs on a non-blocking stream that does not wait for
     * the legacy one */
    const cudaError_t e3 = cudaDeviceSynchronize();
    isth_free(tab);
    CHECK_CUDA(e);
    CHECK_CUDA(e2);
    CHECK_CUDA(e3);
    return ISTH_OK;
}

extern "C" int cuda_acts_create(CudaActivations *a, const ModelConfig *c, int B, int T, CudaColl *ep,
                                const CudaBlas *blas, Recompute recompute)
{
    dims(a, c, B, T, ep->mpi->size, recompute, blas->bf16);
    a->ep = ep;
    a->blas = blas;
    const int Dh = c->dim / c->heads;
    if (!cuda_attention_supports(Dh))
        return isth_fail(ISTH_EINPUT, "config: [model] dim / heads = %d: the CUDA attention is built for head "
                         "dimensions 16, 32, 64 and 128", Dh);
    if ((long)B * c->heads > 65535) /* the attention kernels' grid: one y-block per (sequence, head) */
        return isth_fail(ISTH_EINPUT, "config: %d sequences per forward ([train] micro_batch) x [model] heads %d: "
                         "the CUDA attention takes at most 65535 (sequence, head) pairs per launch", B, c->heads);
    if (blas->bf16 && !cuda_attention_tc_supports(Dh))
        return isth_fail(ISTH_EINPUT, "config: [train] precision = bf16 runs attention on tensor cores, for head "
                         "dimensions 64 and 128 (here [model] dim / heads = %d) on a GPU with the shared memory those "
                         "kernels need; use precision = fp32", Dh);
    const int rc = create(a, c, B, T);
    if (rc != ISTH_OK) cuda_acts_destroy(a);
    return rc;
}

extern "C" void cuda_acts_destroy(CudaActivations *a)
{
    if (a->route)
        for (int l = 0; l < a->Lk; l++) {
            CudaRouting *r = &a->route[l];
            void *dev[] = {r->d_probs, r->d_lse, r->d_choice, r->d_copy_slot, r->d_frac, r->d_y_back,
                           r->d_recv_row, r->d_row_src, r->d_xrows, r->d_arows, r->d_urows, r->d_hrows};
            for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
                if (dev[i]) cudaFree(dev[i]);
            void *host[] = {r->h_send_counts, r->h_recv_counts, r->h_expert_start};
            for (size_t i = 0; i < sizeof host / sizeof *host; i++) isth_free(host[i]);
        }
    isth_free(a->route);
    if (a->block) cudaFree(a->block);
    void *dev[] = {a->recv_rows, a->recv_rows2, a->row_tmp,   a->row_tmp2,     a->ffn_scratch, a->d_counts,
                   a->d_cnt,     a->d_hdr,      a->d_bases, a->d_pos, a->d_mean_prob, a->d_fstats, a->w16};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) cudaFree(dev[i]);
    isth_free(a->h_losses);
    if (a->h_hdr) cudaFreeHost(a->h_hdr);
    if (a->hdr_ready) cudaEventDestroy(a->hdr_ready);
    isth_free(a->h_embed_plan);
    isth_free(a->h_embed_count);
    cuda_gemm_batch_destroy(&a->gemms);
    memset(a, 0, sizeof *a);
}

/* Grow the device buffer *p to n floats (contents dropped). */
static int grow_device(float **p, size_t *cap, size_t n)
{
    if (n <= *cap && *p) return ISTH_OK;
    const size_t want = moe_rows_grow_target(n);
    if (*p) CHECK_CUDA(cudaFree(*p));
    *p = NULL;
    *cap = 0;
    CHECK_CUDA(cudaMalloc((void **)p, want * sizeof(float)));
    *cap = want;
    return ISTH_OK;
}

/* Owner-side buffers of layer route r for n_recv arrivals. */
static int ensure_owner(CudaActivations *a, CudaRouting *r, int n_recv)
{
    const size_t n = (size_t)n_recv, D = (size_t)a->dims.D, F = (size_t)a->dims.F;
    const size_t op = a->act16 ? sizeof(uint16_t) : sizeof(float); /* x and h rows: the products' operands */
    if (n > (size_t)r->recv_cap || !r->d_recv_row) {
        const size_t want = moe_rows_grow_target(n);
        void *dev[] = {r->d_recv_row, r->d_row_src, r->d_xrows, r->d_arows, r->d_urows, r->d_hrows};
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
            if (dev[i]) CHECK_CUDA(cudaFree(dev[i]));
        r->d_recv_row = r->d_row_src = NULL;
        r->d_xrows = r->d_arows = r->d_urows = r->d_hrows = NULL;
        r->recv_cap = 0;
        CHECK_CUDA(cudaMalloc((void **)&r->d_recv_row, want * sizeof(int)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_row_src, want * sizeof(int)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_xrows, want * D * op));
        CHECK_CUDA(cudaMalloc((void **)&r->d_arows, want * F * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_urows, want * F * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&r->d_hrows, want * F * op));
        r->recv_cap = (int)want;
    }
    float **rowbufs[4] = {&a->recv_rows, &a->recv_rows2, &a->row_tmp, &a->row_tmp2};
    for (int i = 0; i < 4; i++) CHECK(grow_device(rowbufs[i], &a->recv_caps[i], n * D));
    return grow_device(&a->ffn_scratch, &a->ffn_cap, 3 * n * F);
}

#define SLICE(buf, l, per) ((buf) + (size_t)(l) * (per))
/* Layer slot l of a stored operand (xn1, q, k, v, ao, xn2) of `per` elements per slot:
 * bf16 ones take half the floats. */
#define OP_SLICE(a, buf, l, per) SLICE(buf, l, (a)->act16 ? (per) / 2 : (per))

static int to_host(void *dst, const void *src, size_t bytes, cudaStream_t s)
{
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    return ISTH_OK;
}

static int to_device(void *dst, const void *src, size_t bytes, cudaStream_t s)
{
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return ISTH_OK;
}

/* As transformer.c's moe_forward, with the plan on the device: route, count,
 * allgather the counts (NCCL), the plan from the count matrix
 * (route_plan.h); the host reads the plan's header once — the
 * all-to-all's counts and the experts' row ranges, which NCCL and cuBLAS
 * take on the host: the layer's one synchronisation, which the GPU spends
 * gathering every copy's row into slot order (the kept ones first, the
 * dropped ones zeros: N*K rows, a size the host knows) and adding up the
 * statistics — then kept rows to the owners and back, the dropped copies'
 * slots zeros. The balance and z losses and the dropped copies add up on
 * the device (read once per forward). PHASE_HOST_WAIT measures what the
 * GPU idles beyond that work. The routing policy as transformer.c's:
 * probabilities Er wide, the plan over the learner's experts, the copies
 * to experts held elsewhere (the header's count) in the last slots. */
static int moe_forward(float *out, const Model *m, CudaActivations *a, int l, size_t N, int training, int stats)
{
    const int D = a->dims.D, K = a->dims.K, G = a->G, El = m->experts_local, me = a->ep->mpi->rank;
    const RouteSpan sp = model_route_span(m, G);
    const int E = sp.Er; /* the probabilities' width, as everything below reads it */
    const CudaBlas *blas = a->blas;
    const cudaStream_t s = blas->stream;
    CudaRouting *r = &a->route[slot(a, l)];
    const float *xn = OP_SLICE(a, a->xn2, slot(a, l), (size_t)a->B * a->T * D);
    const size_t copies = N * (size_t)K;
    const int rw = op_row_floats(a);

    phase_mark(a->clock, PHASE_ROUTER);
    CHECK(project_router(m, a, a->router_logits, xn, l, N, sp));
    CHECK(cuda_router_softmax_forward(r->d_probs, r->d_lse, a->router_logits, N, E, s));
    CHECK(cuda_router_topk(r->d_choice, r->d_probs, N, E, K, s));
    CHECK(cuda_route_histogram(a->d_counts, r->d_choice, copies, E, s));
    CHECK(cuda_coll_allgather_int(a->ep, a->d_counts, E, a->d_cnt, s));
    const int capacity = training ? moe_capacity(m->cfg.capacity_factor, N * (size_t)G, K, E) : -1;
    CHECK(cuda_route_plan(a->d_hdr, a->d_bases, r->d_frac, a->d_cnt, G, El, me, capacity, (double)N * G * K, E,
                          sp.off, s));
    CHECK(cuda_route_slots(r->d_copy_slot, a->send_token, a->d_pos, r->d_choice, a->d_bases, a->d_hdr, N, K, E, sp.off,
                           sp.Es, s));
    const size_t hdr = cuda_route_hdr_ints(G, El);
    CHECK_CUDA(cudaMemcpyAsync(a->h_hdr, a->d_hdr, sizeof(int) * hdr, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaEventRecord(a->hdr_ready, s));
    /* queued behind the header's copy: work that needs no host count */
    phase_mark(a->clock, PHASE_DISPATCH);
    CHECK(cuda_rows_gather(a->send_rows, xn, a->send_token, copies, rw, s)); /* bf16 rows: half the bytes */
    if (training && stats) {
        phase_mark(a->clock, PHASE_ROUTER);
        CHECK(cuda_router_mean_prob(a->d_mean_prob, r->d_probs, N, E, s));
        CHECK(cuda_route_losses(a->d_fstats, r->d_frac, a->d_mean_prob, r->d_lse, a->d_hdr, N, E, m->cfg.aux_loss,
                                m->cfg.z_loss, s));
    }
    phase_mark(a->clock, PHASE_HOST_WAIT);
    CHECK_CUDA(cudaEventSynchronize(a->hdr_ready)); /* the layer's one wait for the device */
    r->n_sent = a->h_hdr[ROUTE_HDR_SENT];
    const int n_recv = a->h_hdr[ROUTE_HDR_RECV];
    r->dropped = a->h_hdr[ROUTE_HDR_DROPPED];
    if (stats) a->remote_dropped += a->h_hdr[ROUTE_HDR_REMOTE];
    memcpy(r->h_send_counts, a->h_hdr + ROUTE_HDR_COUNTS, sizeof(int) * G);
    memcpy(r->h_recv_counts, a->h_hdr + ROUTE_HDR_COUNTS + G, sizeof(int) * G);
    memcpy(r->h_expert_start, a->h_hdr + ROUTE_HDR_COUNTS + 2 * G, sizeof(int) * (El + 1));
    if (r->h_expert_start[0] != 0 || r->h_expert_start[El] != n_recv)
        return isth_fail(ISTH_ERUNTIME, "layer %d: the dispatch plan's expert rows %d..%d do not cover its %d arrivals",
                         l, r->h_expert_start[0], r->h_expert_start[El], n_recv);
    CHECK(ensure_owner(a, r, n_recv));
    r->n_recv = r->rows = n_recv;
    phase_mark(a->clock, PHASE_DISPATCH);
    CHECK(cuda_route_owner_map(r->d_recv_row, r->d_row_src, a->d_cnt, a->d_hdr, G, El, me, capacity, n_recv, s));

    /* dispatch: the kept copies' rows (the first n_sent slots) to their owners */
    float *arrived = G > 1 ? a->recv_rows : a->send_rows;
    CHECK(cuda_coll_alltoallv_rows(a->ep, a->send_rows, r->h_send_counts, arrived, r->h_recv_counts, rw, s));

    /* owner: rows grouped by expert, compute */
    CHECK(cuda_rows_gather(r->d_xrows, arrived, r->d_row_src, (size_t)r->rows, rw, s));
    phase_mark(a->clock, PHASE_EXPERTS);
    float *yrows = a->row_tmp;
    CHECK(cuda_experts_forward(a->act16, yrows, r->d_arows, r->d_urows, r->d_hrows, r->d_xrows,
                               weights(a, m, model_expert_param(m, T_W_GATE, l, 0)),
                               weights(a, m, model_expert_param(m, T_W_UP, l, 0)),
                               weights(a, m, model_expert_param(m, T_W_DOWN, l, 0)), r->h_expert_start, El, D,
                               a->dims.F, &a->gemms, blas));
    phase_mark(a->clock, PHASE_DISPATCH);
    float *leaving = G > 1 ? a->recv_rows2 : r->d_y_back;
    CHECK(cuda_rows_gather(leaving, yrows, r->d_recv_row, (size_t)n_recv, D, s));
    CHECK(cuda_coll_alltoallv_rows(a->ep, leaving, r->h_recv_counts, r->d_y_back, r->h_send_counts, D, s));
    CHECK_CUDA(cudaMemsetAsync(r->d_y_back + (size_t)r->n_sent * D, 0,
                               (copies - (size_t)r->n_sent) * D * sizeof(float), s)); /* dropped: zeros */
    return cuda_moe_combine_forward(out, r, N, E, K, D, s);
}

/* Layer l of the forward pass (transformer.c's layer_forward): its
 * activations from x_l into its slot; x_{l+1} when `next`; the balance
 * and z losses and the drops added up when `stats`. */
static int layer_forward(const Model *m, CudaActivations *a, int l, int training, int next, int stats)
{
    const int D = a->dims.D, H = a->dims.H, B = a->B_cur, T = a->T_cur;
    const size_t N = a->N, ND = (size_t)a->B * a->T * D, NmaxT = (size_t)a->B * a->T;
    const size_t lse_stride = (size_t)a->B * H * a->T;
    const CudaBlas *blas = a->blas;
    const cudaStream_t s = blas->stream;
    const int sl = slot(a, l);
    float *x = SLICE(a->x, l, ND), *xn1 = OP_SLICE(a, a->xn1, sl, ND), *q = OP_SLICE(a, a->q, sl, ND),
          *k = OP_SLICE(a, a->k, sl, ND), *v = OP_SLICE(a, a->v, sl, ND), *ao = OP_SLICE(a, a->ao, sl, ND),
          *h = SLICE(a->h, sl, ND), *xn2 = OP_SLICE(a, a->xn2, sl, ND), *lse = SLICE(a->att_lse, sl, lse_stride);
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    if (a->act16)
        CHECK(cuda_rmsnorm_forward_bf16((uint16_t *)xn1, SLICE(a->rstd1, sl, NmaxT), x,
                                        model_param(m, T_ATTN_NORM, l), N, D, s));
    else
        CHECK(cuda_rmsnorm_forward(xn1, SLICE(a->rstd1, sl, NmaxT), x, model_param(m, T_ATTN_NORM, l), N, D, s));
    /* bf16: the projections go into the backward's dq, dk, dv (free until
     * the attention's backward, recomputed layers included), then are
     * rotated and rounded into the layer's bf16 q, k, v in one launch */
    float *pq = a->act16 ? a->dq : q, *pk = a->act16 ? a->dk : k, *pv = a->act16 ? a->dv : v;
    phase_mark(a->clock, PHASE_DENSE);
    CHECK(project(m, a, pq, xn1, T_WQ, l, N, D, D));
    CHECK(project(m, a, pk, xn1, T_WK, l, N, D, D));
    CHECK(project(m, a, pv, xn1, T_WV, l, N, D, D));
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    if (a->act16) {
        CHECK(cuda_rope_qkv_bf16((uint16_t *)q, (uint16_t *)k, (uint16_t *)v, pq, pk, pv, a->rope_cos, a->rope_sin, B,
                                 T, H, D / H, s));
    } else {
        CHECK(cuda_rope_forward(q, a->rope_cos, a->rope_sin, B, T, H, D / H, s));
        CHECK(cuda_rope_forward(k, a->rope_cos, a->rope_sin, B, T, H, D / H, s));
    }
    phase_mark(a->clock, PHASE_ATTENTION);
    CHECK(cuda_attention_forward_as(a->act16, ao, lse, q, k, v, B, T, D, H, s));
    phase_mark(a->clock, PHASE_DENSE);
    CHECK(project(m, a, a->dtmp, ao, T_WO, l, N, D, D));
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    if (a->act16)
        CHECK(cuda_residual_rmsnorm_forward_bf16(h, (uint16_t *)xn2, SLICE(a->rstd2, sl, NmaxT), x, a->dtmp,
                                                 model_param(m, T_MOE_NORM, l), N, D, s));
    else
        CHECK(cuda_residual_rmsnorm_forward(h, xn2, SLICE(a->rstd2, sl, NmaxT), x, a->dtmp,
                                            model_param(m, T_MOE_NORM, l), N, D, s));
    CHECK(moe_forward(a->dtmp, m, a, l, N, training, stats));
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    if (next) CHECK(cuda_residual_forward(SLICE(a->x, l + 1, ND), h, a->dtmp, N * D, s));
    return ISTH_OK;
}

extern "C" int cuda_transformer_forward(const Model *m, CudaActivations *a, const int *tokens, const int *targets,
                                        int B, int T, int training, ForwardStats *st)
{
    if (B > a->B || T > a->T)
        return isth_fail(ISTH_ERUNTIME, "cuda_transformer_forward: batch %dx%d exceeds buffers %dx%d", B, T, a->B,
                         a->T);
    CHECK(model_route_check(m, a->G, a->ep->mpi->rank)); /* and so experts_local <= a->El */
    const int L = a->dims.L, D = a->dims.D, V = a->dims.V;
    const size_t N = (size_t)B * T, ND = (size_t)a->B * a->T * D;
    const CudaBlas *blas = a->blas;
    const cudaStream_t s = blas->stream;
    memset(st, 0, sizeof *st);
    a->remote_dropped = 0;
    a->N = N;
    a->B_cur = B;
    a->T_cur = T;
    a->training = training;
    CHECK(to_device(a->tokens, tokens, sizeof(int) * N, s));
    CHECK(to_device(a->targets, targets, sizeof(int) * N, s));
    /* the embedding backward's buckets, while the host holds the tokens
     * (pageable: the copy has left the buffer when the call returns) */
    int *ids = a->h_embed_plan, *start = ids + N, *order = start + N + 1;
    a->n_embed_ids = embed_buckets(tokens, N, V, a->h_embed_count, ids, start, order);
    if (a->n_embed_ids < 0) return isth_fail(ISTH_ERUNTIME, "cuda_transformer_forward: a token outside [0, %d)", V);
    CHECK(to_device(a->embed_plan, a->h_embed_plan, sizeof(int) * (3 * N + 1), s));
    CHECK_CUDA(cudaMemsetAsync(a->d_fstats, 0, 3 * sizeof(double), s));

    phase_mark(a->clock, PHASE_ELEMENTWISE);
    if (a->act16 && !(training && a->w16_step)) {
        /* the weights as this forward's products read them, whatever changed
         * them since: once per step for training (the parameters hold still
         * from zero_grads to the step's last micro-batch, backend.h), at
         * every scoring forward (evaluation may score another set) */
        const size_t first = model_after_embed(m), n = m->n_params - first;
        if (a->w16_n != n) {
            if (a->w16) CHECK_CUDA(cudaFree(a->w16));
            a->w16 = NULL;
            a->w16_n = 0;
            CHECK_CUDA(cudaMalloc((void **)&a->w16, (n ? n : 1) * sizeof(uint16_t)));
            a->w16_n = n;
        }
        CHECK(cuda_to_bf16(a->w16, m->params + first, n, s));
        a->w16_step = training;
    }
    CHECK(cuda_encoder_forward(SLICE(a->x, 0, ND), a->tokens, model_param(m, T_EMBED, 0), N, D, s));
    for (int l = 0; l < L; l++) {
        if (a->progress) a->progress(a->progress_ctx);
        CHECK(layer_forward(m, a, l, training, 1, 1));
    }
    CHECK(cuda_rmsnorm_forward(a->xf, a->rstdf, SLICE(a->x, L, ND), model_param(m, T_FINAL_NORM, 0), N, D, s));
    phase_mark(a->clock, PHASE_DENSE);
    CHECK(cuda_tied_head_forward(a->probs, a->xf, model_param(m, T_EMBED, 0), N, D, V, blas));
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    CHECK(cuda_crossentropy_forward(a->losses, a->probs, a->targets, N, V, s));
    phase_mark(a->clock, PHASE_OTHER);
    double fstats[3];
    CHECK_CUDA(cudaMemcpyAsync(fstats, a->d_fstats, sizeof fstats, cudaMemcpyDeviceToHost, s));
    CHECK(to_host(a->h_losses, a->losses, sizeof(float) * N, s));
    if (training) { /* the layers' sums, in layer order as the CPU adds them */
        st->aux_loss = fstats[0];
        st->z_loss = fstats[1];
        st->dropped = (long)fstats[2];
    }
    st->remote_dropped = a->remote_dropped;
    for (size_t t = 0; t < N; t++) /* in token order, in double: the CPU's sum */
        if (targets[t] >= 0) {
            st->ce_sum += a->h_losses[t];
            st->n_targets++;
        }
    return ISTH_OK;
}

static int moe_backward(float *dxn, Model *m, CudaActivations *a, int l, const float *dout, float loss_scale)
{
    const int D = a->dims.D, K = a->dims.K, G = a->G;
    const RouteSpan sp = model_route_span(m, G);
    const int E = sp.Er; /* the probabilities' width (moe_forward) */
    const size_t N = a->N;
    const CudaBlas *blas = a->blas;
    const cudaStream_t s = blas->stream;
    CudaRouting *r = &a->route[slot(a, l)];
    const float *xn = OP_SLICE(a, a->xn2, slot(a, l), (size_t)a->B * a->T * D);

    phase_mark(a->clock, PHASE_DISPATCH);
    CHECK_CUDA(cudaMemsetAsync(a->dprobs, 0, N * E * sizeof(float), s));
    CHECK(cuda_moe_combine_backward(a->send_rows, a->dprobs, dout, r, N, E, K, D, s));
    float *arrived = G > 1 ? a->recv_rows : a->send_rows;
    CHECK(cuda_coll_alltoallv_rows(a->ep, a->send_rows, r->h_send_counts, arrived, r->h_recv_counts, D, s));
    float *dyrows = a->row_tmp, *dxrows = a->row_tmp2;
    CHECK(cuda_rows_gather(dyrows, arrived, r->d_row_src, (size_t)r->rows, D, s));
    phase_mark(a->clock, PHASE_EXPERTS);
    CHECK_CUDA(cudaMemsetAsync(dxrows, 0, (size_t)r->rows * D * sizeof(float), s));
    CHECK(cuda_experts_backward(a->act16, dxrows, model_expert_grad(m, T_W_GATE, l, 0),
                                model_expert_grad(m, T_W_UP, l, 0), model_expert_grad(m, T_W_DOWN, l, 0),
                                a->ffn_scratch, dyrows, r->d_xrows, r->d_arows, r->d_urows, r->d_hrows,
                                weights(a, m, model_expert_param(m, T_W_GATE, l, 0)),
                                weights(a, m, model_expert_param(m, T_W_UP, l, 0)),
                                weights(a, m, model_expert_param(m, T_W_DOWN, l, 0)), r->h_expert_start,
                                m->experts_local, D, a->dims.F, &a->gemms, blas));
    float *leaving = G > 1 ? a->recv_rows2 : a->back_rows;
    phase_mark(a->clock, PHASE_DISPATCH);
    CHECK(cuda_rows_gather(leaving, dxrows, r->d_recv_row, (size_t)r->n_recv, D, s));
    CHECK(cuda_coll_alltoallv_rows(a->ep, leaving, r->h_recv_counts, a->back_rows, r->h_send_counts, D, s));
    CHECK_CUDA(cudaMemsetAsync(a->back_rows + (size_t)r->n_sent * D, 0,
                               (N * (size_t)K - (size_t)r->n_sent) * D * sizeof(float), s)); /* dropped: zeros */
    CHECK(cuda_moe_scatter_add(dxn, a->back_rows, r, N, K, D, s));

    phase_mark(a->clock, PHASE_ROUTER);
    CHECK(cuda_moe_balance_backward(a->dprobs, r->d_frac, N, E, m->cfg.aux_loss, loss_scale, s));
    CHECK(cuda_router_softmax_backward(a->dlogits, a->dprobs, r->d_probs, r->d_lse, N, E, m->cfg.z_loss, loss_scale,
                                       s));
    return project_router_backward(m, a, dxn, a->dlogits, xn, l, N, sp);
}

extern "C" int cuda_transformer_backward(Model *m, CudaActivations *a, size_t n_targets, float loss_scale)
{
    if (!a->training) return isth_fail(ISTH_ERUNTIME, "cuda_transformer_backward: the last forward was not training");
    const int L = a->dims.L, D = a->dims.D, H = a->dims.H, V = a->dims.V, B = a->B_cur, T = a->T_cur;
    const size_t N = a->N, ND = (size_t)a->B * a->T * D, NmaxT = (size_t)a->B * a->T;
    const size_t lse_stride = (size_t)a->B * H * a->T, nbytes = N * D * sizeof(float);
    const CudaBlas *blas = a->blas;
    const cudaStream_t s = blas->stream;

    phase_mark(a->clock, PHASE_ELEMENTWISE);
    CHECK(cuda_crossentropy_backward(a->dlogits, a->probs, a->targets,
                                     n_targets ? loss_scale / (float)n_targets : 0.0f, N, V, s));
    CHECK_CUDA(cudaMemsetAsync(a->dxn, 0, nbytes, s));
    phase_mark(a->clock, PHASE_DENSE);
    CHECK(cuda_tied_head_backward(a->dxn, model_grad(m, T_EMBED, 0), a->dlogits, a->xf, model_param(m, T_EMBED, 0),
                                  N, D, V, blas));
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    CHECK_CUDA(cudaMemsetAsync(a->dx, 0, nbytes, s));
    CHECK(cuda_rmsnorm_backward(a->dx, model_grad(m, T_FINAL_NORM, 0), a->dxn, SLICE(a->x, L, ND),
                                model_param(m, T_FINAL_NORM, 0), a->rstdf, N, D, s));
    for (int l = L - 1; l >= 0; l--) {
        if (a->progress) a->progress(a->progress_ctx);
        /* the layer again from x_l: the same bits, without its statistics
         * (read already); the last layer's are still in the slot */
        if (a->recompute == RECOMPUTE_LAYER && l < L - 1) CHECK(layer_forward(m, a, l, a->training, 0, 0));
        const int sl = slot(a, l);
        const float *x = SLICE(a->x, l, ND), *xn1 = OP_SLICE(a, a->xn1, sl, ND), *q = OP_SLICE(a, a->q, sl, ND),
                    *k = OP_SLICE(a, a->k, sl, ND), *v = OP_SLICE(a, a->v, sl, ND), *ao = OP_SLICE(a, a->ao, sl, ND),
                    *h = SLICE(a->h, sl, ND), *lse = SLICE(a->att_lse, sl, lse_stride);
        /* dx is the gradient of x_{l+1} = h + moe(xn2): the MoE's output
         * gradient, then, once the MoE's backward has read it (stream
         * order), h's: += its norm's backward, in place */
        CHECK_CUDA(cudaMemsetAsync(a->dxn, 0, nbytes, s));
        CHECK(moe_backward(a->dxn, m, a, l, a->dx, loss_scale));
        phase_mark(a->clock, PHASE_ELEMENTWISE);
        CHECK(cuda_rmsnorm_backward(a->dx, model_grad(m, T_MOE_NORM, l), a->dxn, h, model_param(m, T_MOE_NORM, l),
                                    SLICE(a->rstd2, sl, NmaxT), N, D, s));
        phase_mark(a->clock, PHASE_DENSE);
        CHECK_CUDA(cudaMemsetAsync(a->dao, 0, nbytes, s));
        CHECK(project_backward(m, a, a->dao, a->dx, ao, T_WO, l, N, D, D));
        phase_mark(a->clock, PHASE_ATTENTION);
        CHECK_CUDA(cudaMemsetAsync(a->dq, 0, nbytes, s));
        CHECK_CUDA(cudaMemsetAsync(a->dk, 0, nbytes, s));
        CHECK_CUDA(cudaMemsetAsync(a->dv, 0, nbytes, s));
        CHECK(cuda_attention_backward_as(a->act16, a->dq, a->dk, a->dv, a->dao, ao, lse, q, k, v, B, T, D, H, s));
        phase_mark(a->clock, PHASE_ELEMENTWISE);
        CHECK(cuda_rope_backward(a->dq, a->rope_cos, a->rope_sin, B, T, H, D / H, s));
        CHECK(cuda_rope_backward(a->dk, a->rope_cos, a->rope_sin, B, T, H, D / H, s));
        CHECK_CUDA(cudaMemsetAsync(a->dxn, 0, nbytes, s));
        phase_mark(a->clock, PHASE_DENSE);
        CHECK(project_backward(m, a, a->dxn, a->dq, xn1, T_WQ, l, N, D, D));
        CHECK(project_backward(m, a, a->dxn, a->dk, xn1, T_WK, l, N, D, D));
        CHECK(project_backward(m, a, a->dxn, a->dv, xn1, T_WV, l, N, D, D));
        phase_mark(a->clock, PHASE_ELEMENTWISE);
        CHECK(cuda_rmsnorm_backward(a->dx, model_grad(m, T_ATTN_NORM, l), a->dxn, x, model_param(m, T_ATTN_NORM, l),
                                    SLICE(a->rstd1, sl, NmaxT), N, D, s));
    }
    phase_mark(a->clock, PHASE_ELEMENTWISE);
    const int *ids = a->embed_plan, *start = ids + N, *order = start + N + 1; /* as the forward laid them out */
    CHECK(cuda_encoder_backward(model_grad(m, T_EMBED, 0), a->dx, ids, start, order, a->n_embed_ids, D, s));
    phase_mark(a->clock, PHASE_OTHER);
    return ISTH_OK;
}
