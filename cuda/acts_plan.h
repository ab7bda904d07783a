/* acts_plan.h — the CUDA backend's activation layout as plain arithmetic:
 * the bytes of each piece of its device block, in the order
 * cuda/transformer.cu carves them, and of one layer's routing buffers.
 * Plain C (no CUDA): src/memory.c includes it too, so a build without
 * CUDA (a login node planning a GPU job) predicts the GPU's memory.
 *
 * Owns: the sizes only. Must not: allocate, or know any pointer
 * (transformer.cu pairs each size with its buffer, in this order).
 * The attention keeps one log-sum-exp per row (att_lse), never the T x T
 * probabilities: backward computes them again, whatever train.recompute is.
 * `kept` layers keep their activations: all of them, or one slot that
 * every layer shares with train.recompute = layer (only the residual
 * stream x keeps every layer's).
 */
#ifndef ISTHMUS_CUDA_ACTS_PLAN_H
#define ISTHMUS_CUDA_ACTS_PLAN_H

#include <stddef.h>

#ifdef __cplusplus /* C declarations, whichever compiler includes this first */
extern "C" {
#endif
#include "cpu/moe.h" /* moe_rows_grow_target: how the row buffers grow */
#ifdef __cplusplus
}
#endif

#define CUDA_ACTS_PIECES 34

/* Layers whose activations are kept (recompute_layer: train.recompute = layer). */
static inline int cuda_acts_kept_layers(int layers, int recompute_layer) { return recompute_layer ? 1 : layers; }

/* bytes[i] of each piece for up to B sequences of T tokens; returns the
 * block's total (each piece 256-byte aligned). bf16: train.precision =
 * bf16, whose stored operands (xn1, q, k, v, ao, xn2) are bf16. */
static inline size_t cuda_acts_pieces(size_t bytes[CUDA_ACTS_PIECES], int layers, int kept, int dim, int heads,
                                      int experts, int top_k, int vocab, int B, int T, int bf16)
{
    const size_t L = (size_t)layers, Lk = (size_t)kept, D = (size_t)dim, H = (size_t)heads, E = (size_t)experts,
                 K = (size_t)top_k, V = (size_t)vocab, N = (size_t)B * (size_t)T, f = sizeof(float);
    const size_t op = bf16 ? 2 : f; /* a stored operand's element */
    const size_t Dh2 = D / H / 2, VE = V > E ? V : E;
    const size_t p[CUDA_ACTS_PIECES] = {
        (L + 1) * N * D * f /* x */, Lk * N * D * op /* xn1 */, Lk * N * f /* rstd1 */,
        Lk * N * D * op /* q */, Lk * N * D * op /* k */, Lk * N * D * op /* v */,
        Lk * N * D * op /* ao */, Lk * (size_t)B * H * (size_t)T * f /* att_lse */,
        Lk * N * D * f /* h */, Lk * N * D * op /* xn2 */, Lk * N * f /* rstd2 */,
        N * D * f /* xf */, N * f /* rstdf */, N * VE * f /* probs, and in backward dlogits */,
        N * f /* losses */, (size_t)T * Dh2 * f /* rope_cos */, (size_t)T * Dh2 * f /* rope_sin */,
        N * D * f /* dx */, N * D * f /* dxn */,
        N * D * f /* dq */, N * D * f /* dk */, N * D * f /* dv */,
        N * D * f /* dao */, N * D * f /* dtmp */, 0 /* dlogits: probs' buffer */,
        N * E * f /* dprobs */, N * E * f /* router_logits */,
        N * K * D * f /* send_rows */, N * K * D * f /* back_rows */,
        N * sizeof(int) /* tokens */, N * sizeof(int) /* targets */,
        N * K * sizeof(int) /* send_token */, (3 * N + 1) * sizeof(int) /* embed_plan */,
        0 /* block: the base */,
    };
    size_t total = 0;
    for (int i = 0; i < CUDA_ACTS_PIECES; i++) {
        bytes[i] = p[i];
        total += (p[i] + 255) & ~(size_t)255;
    }
    return total;
}

/* Device bytes of one layer's routing buffers before any rows arrive. */
static inline double cuda_route_bytes(int experts, int top_k, int dim, int B, int T)
{
    const double N = (double)B * T, E = experts, K = top_k, D = dim;
    return N * E * 4 + N * 4 + 2 * N * K * 4 + E * 8 + N * K * D * 4;
}

/* Copies per block of the positions' count (cuda/moe.cu). */
#define CUDA_ROUTE_CHUNK 256

/* Ints of the positions' scratch for `copies` copies and E experts: each
 * copy's position, then each chunk's count per expert (chunks, E). */
static inline size_t cuda_route_pos_ints(size_t copies, int experts)
{
    return copies + (copies + CUDA_ROUTE_CHUNK - 1) / CUDA_ROUTE_CHUNK * (size_t)experts;
}

/* Device bytes of the dispatch plan's scratch (shared by the layers): the
 * counts, the learner's count matrix (G ranks), the header, the slot
 * bases, the positions' scratch, the mean router probabilities and the
 * forward's three statistics. */
static inline double cuda_route_scratch_bytes(int experts, int top_k, int G, int B, int T)
{
    const double E = experts, El = (double)experts / G;
    const size_t copies = (size_t)B * T * (size_t)top_k;
    const double pos = (double)cuda_route_pos_ints(copies, experts);
    return E * 4 + G * E * 4 + (4 + 2.0 * G + El + 1) * 4 + 3 * E * 4 + pos * 4 + E * 8 + 3 * 8;
}

/* The device block, every kept layer's routing buffers and the plan's scratch. */
static inline double cuda_acts_plan_bytes(int layers, int kept, int dim, int heads, int experts, int top_k, int vocab,
                                          int B, int T, int G, int bf16)
{
    size_t bytes[CUDA_ACTS_PIECES];
    return (double)cuda_acts_pieces(bytes, layers, kept, dim, heads, experts, top_k, vocab, B, T, bf16) +
           kept * cuda_route_bytes(experts, top_k, dim, B, T) + cuda_route_scratch_bytes(experts, top_k, G, B, T);
}

/* The expert rows' device buffers for n arrivals per layer, as
 * transformer.cu grows them (n + n/4 + 64 rows, cpu/moe.h's rule): per
 * kept layer the rows' sources and destinations (ints), x (D), a, u (F)
 * and h (F), x and h as stored operands (bf16 on the bf16 path); shared
 * by the layers four row buffers (D floats) and the experts' backward
 * scratch (3F floats). */
static inline double cuda_expert_row_bytes(int kept, int dim, int ffn, double n, int bf16)
{
    const size_t rows = (size_t)n, nd = rows * (size_t)dim, nf3 = 3 * rows * (size_t)ffn;
    const double grow = (double)moe_rows_grow_target(rows), D = dim, F = ffn, op = bf16 ? 2 : 4;
    const double shared = 4.0 * (double)moe_rows_grow_target(nd) * 4 + (double)moe_rows_grow_target(nf3) * 4;
    return kept * grow * (2 * 4 + D * op + 2 * F * 4 + F * op) + shared;
}

/* Device bytes the stream-ordered pool keeps for the step's scratch (its
 * release threshold keeps them between steps): at most the sum of the
 * distinct allocations, each freed on the stream before the next is made
 * but kept reserved (a freed block serves only requests it holds) — the
 * attention's row deltas (B,H,T); RMSNorm's weight-gradient partials
 * (64,D); in bf16 a product's gradient rounded once: the router's (N,E),
 * the attention projections' (N,D), the experts' (rows,D), rows the
 * expert-row buffers' grown size for n arrivals. */
static inline double cuda_pool_scratch_bytes(int dim, int heads, int experts, int B, int T, double n, int bf16)
{
    const double N = (double)B * T, D = dim, grown = (double)moe_rows_grow_target((size_t)n);
    double sum = N * heads * 4 + 64.0 * D * 4; /* the delta: B*T rows per head; the partials */
    if (bf16) sum += N * experts * 2 + N * D * 2 + grown * D * 2;
    return sum;
}

#endif
