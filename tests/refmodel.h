/* refmodel.h — an independent, naive double-precision implementation of the
 * model, written from the model's equations with plain loops (no BLAS, no
 * OpenMP, no shared code with src/ beyond the parameter table's offsets).
 * Tests differentiate it with central finite differences and compare with
 * the float32 analytic backward of the CPU backend.
 */
#ifndef ISTHMUS_REFMODEL_H
#define ISTHMUS_REFMODEL_H

#include <stdint.h>

#include "model.h"

void ref_rmsnorm(double *out, const double *x, const double *g, int N, int D);
void ref_matmul(double *out, const double *x, const double *w, int N, int C, int OC);
/* half-split rotary on every head of x (B,T,H*Dh), in place */
void ref_rope(double *x, int B, int T, int H, int Dh);
void ref_attention(double *out, const double *q, const double *k, const double *v, int B, int T,
                   int D, int H);
/* y (D) = (silu(x.wg) * (x.wu)) . wd for one token */
void ref_expert(double *y, const double *x, const double *wg, const double *wu, const double *wd,
                int D, int F);
/* MoE layer on N tokens; returns routing signature (changes when any
 * top-k choice or capacity decision changes). aux/z/remote may be NULL.
 * The router wr is (D,E); the experts wg, wu, wd are the ones held,
 * [lo, lo + Es) (lo = 0, Es = E: all), routed as model.h's RoutePolicy
 * `policy` says, written from its definition; *remote += the copies routed
 * to experts not held (ROUTE_DROP). */
uint64_t ref_moe(double *out, double *aux, double *z, long *remote, const double *x, const double *wr,
                 const double *wg, const double *wu, const double *wd, int N, int D, int E, int K, int F,
                 double capacity_factor, double aux_coef, double z_coef, int training, int policy, int lo, int Es);
/* mean cross-entropy over targets >= 0 of softmax(logits) */
double ref_crossentropy(const double *logits, const int *targets, int N, int V);

/* Whole-model loss: mean CE + (training ? sum of aux + z losses : 0), with
 * parameters in `params` laid out like m->params (double), routed as m's
 * policy says for a learner of one rank (m's experts the learner's);
 * *remote (may be NULL) += the copies routed to experts m lacks. */
double ref_model_loss(const Model *m, const double *params, const int *tokens, const int *targets,
                      int B, int T, int training, uint64_t *route_sig, long *remote);

#endif
