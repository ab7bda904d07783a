/* layers.h — CPU forward/backward kernels of the dense layers.
 *
 * Owns: the arithmetic of one layer at a time on float32 arrays. Every layer
 * is an x_forward / x_backward pair with the argument order
 * (outputs, inputs, weights, dims); shapes are given in comments, row-major,
 * N = B*T tokens. Backward functions ACCUMULATE into their gradient outputs
 * (+=), so callers zero them once and several paths can add into one buffer.
 * Matrix products go through cblas_sgemm; element-wise loops use OpenMP with
 * static schedules, and reductions use a fixed chunking, so results do not
 * depend on timing.
 * Must not: know about the model layout, experts, MPI or files.
 */
#ifndef ISTHMUS_LAYERS_H
#define ISTHMUS_LAYERS_H

#include <stddef.h>

/* out (N,D) = embed[tokens] ; embed (V,D) */
void encoder_forward(float *out, const int *tokens, const float *embed, size_t N, int D);
/* dembed (V,D) += scatter of dout (N,D) by token */
void encoder_backward(float *dembed, const float *dout, const int *tokens, size_t N, int D);

/* out (N,D) = inp / sqrt(mean(inp^2) + 1e-5) * weight ; rstd (N) saved */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, size_t N, int D);
/* Returns ISTH_OK, or ISTH_ERUNTIME when its scratch cannot be allocated. */
int rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, const float *rstd, size_t N, int D);

/* out (N,OC) = inp (N,C) . weight (C,OC)   [weights stored (in, out)] */
void matmul_forward(float *out, const float *inp, const float *weight, size_t N, int C, int OC);
/* dinp (N,C) += dout . weight^T ; dweight (C,OC) += inp^T . dout. Either may be NULL. */
void matmul_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, size_t N, int C, int OC);
/* The same products on OC columns of a weight (and its gradient) stored
 * with rows of ldw >= OC floats: weight points at the first column used
 * (a router's columns of one site's experts). ldw = OC: the products above,
 * the same call. */
void matmul_forward_ldw(float *out, const float *inp, const float *weight, int ldw, size_t N, int C, int OC);
void matmul_backward_ldw(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         int ldw, size_t N, int C, int OC);

/* The tied output head: logits (N,V) = x (N,D) . embed (V,D)^T. */
void tied_head_forward(float *logits, const float *x, const float *embed, size_t N, int D, int V);
/* dx (N,D) += dlogits . embed ; dembed (V,D) += dlogits^T . x. */
void tied_head_backward(float *dx, float *dembed, const float *dlogits, const float *x, const float *embed, size_t N,
                        int D, int V);

/* Rotary tables for positions 0..T-1, head dim Dh: cos/sin (T, Dh/2). */
void rope_tables(float *cos_t, float *sin_t, int T, int Dh);
/* In place on x (B,T,H*Dh): pairs (i, i+Dh/2) of every head rotated by pos*freq_i. */
void rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh);
/* In place on dx: the transpose rotation (gradient w.r.t. the unrotated input). */
void rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int Dh);

/* Causal attention. q,k,v,out (B,T,D) with head h in columns [h*Dh,(h+1)*Dh);
 * att (B,H,T,T) keeps the softmax probabilities for backward (rows masked
 * above the diagonal are 0). */
void attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                       int B, int T, int D, int H);
/* dq,dk,dv (B,T,D) += ... ; scratch: T*T floats per OpenMP thread. */
void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                        const float *att, const float *q, const float *k, const float *v, int B,
                        int T, int D, int H);

/* h (n) = silu(a) * u */
void swiglu_forward(float *h, const float *a, const float *u, size_t n);
/* da, du (n) += ... from dh */
void swiglu_backward(float *da, float *du, const float *dh, const float *a, const float *u, size_t n);

/* probs (N,V) = softmax(logits) in place; losses (N) = -log probs[target].
 * targets < 0 are ignored (loss 0). */
void crossentropy_forward(float *losses, float *probs_logits, const int *targets, size_t N, int V);
/* dlogits (N,V) = (probs - onehot(target)) * scale, rows with target < 0 zeroed.
 * (Overwrites: the logits gradient has no other source.) */
void crossentropy_backward(float *dlogits, const float *probs, const int *targets, float scale,
                           size_t N, int V);

/* out (n) = a + b */
void residual_forward(float *out, const float *a, const float *b, size_t n);

/* Number of fixed chunks used for deterministic reductions over tokens. */
#define REDUCE_CHUNKS 16

#endif
