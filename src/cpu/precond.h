/* precond.h — the matrix optimisers of the CPU backend: blocked Shampoo
 * and Muon. Each applies to the chunks flagged PARAM_MATRIX (model.h) of
 * the runs this rank updates, one matrix per chunk (an attention
 * projection of a layer, an expert's matrix); every other tensor (norms,
 * the tied embedding, the router) takes AdamW with the same moments.
 *
 * Shampoo (Gupta et al. 2018; the blocked form of Anil et al.'s
 * Distributed Shampoo), per b x b block G of a matrix's gradient:
 *   L <- beta2 L + (1 - beta2) G G^T,   R <- beta2 R + (1 - beta2) G^T G
 * (symmetric: only the upper triangles are formed and kept, by ssyrk;
 * every `stats_every` updates, the published statistics_compute_steps),
 * every `every` updates the inverse fourth roots by symmetric
 * eigendecomposition (LAPACKE_ssyevd) with eps * (largest eigenvalue)
 * added, and the direction L^-1/4 M R^-1/4 on Adam's bias-corrected first
 * moment M, scaled to the norm of Adam's own direction over the matrix
 * (grafting); before the first roots, Adam's direction. A root whose
 * decomposition fails or is not finite keeps the previous one (counted); a
 * statistic that is not finite is reset to zero (counted); a direction that
 * is not finite falls back to Adam's for that matrix (counted).
 * Muon (Jordan et al. 2024; the scale of Liu et al. 2025): the Nesterov
 * momentum of the gradient, orthogonalised by five Newton-Schulz steps,
 * times 0.2 sqrt(max(rows, cols)) so that its RMS matches AdamW's and
 * AdamW's lr and weight decay carry over.
 *
 * Owns: Shampoo's statistics and roots, packed by runs like AdamW's
 * moments (the b x b factor of block (i, j) sits in that block's region of
 * a params-shaped buffer, so the state is model-shaped: checkpoints and
 * resharding treat it like the moments); its scratch; the counters.
 * Must not: reduce anything across ranks (each rank preconditions the
 * matrices it owns: the root work is spread over the learner), or print
 * (the counters are read by the caller).
 */
#ifndef ISTHMUS_PRECOND_H
#define ISTHMUS_PRECOND_H

#include <stddef.h>

#include "config.h"
#include "model.h"
#include "optim.h"
#include "precond_math.h" /* the arithmetic shared with the CUDA backend; MUON_MOMENTUM, MUON_NS_STEPS */

typedef struct {
    int shampoo;                  /* 1 shampoo, 0 muon */
    int block, every, stats_every;
    double eps, beta2;
    float *l, *r, *lroot, *rroot; /* shampoo: (runs.total), packed like the moments */
    float *dir, *sdir;            /* (largest matrix) Adam's direction; Shampoo's, or Muon's iterate */
    float *tmp;                   /* shampoo: a b x b product per thread (first Adam's row scratch);
                                   * muon: the Newton-Schulz products */
    float *work;                  /* per thread: a block's eigendecomposition */
    double *block_sums;           /* shampoo: (2, blocks of the largest matrix) the grafting's norms */
    int threads;
    long roots, root_failures, stat_resets, fallbacks;
} Precond;

/* A matrix chunk of a tensor: rows x cols, the last two axes. */
static inline void precond_matrix_dims(const Tensor *t, size_t *rows, size_t *cols)
{
    *rows = t->local[t->ndim - 2];
    *cols = t->local[t->ndim - 1];
}

/* The model's matrix chunks (PARAM_MATRIX), which both backends and the
 * memory plan size their scratch by: the largest one's values and the
 * longest side. block > 0 (shampoo): a block that does not divide every
 * side is bad input (one line); 0: no check. */
int precond_matrix_extent(const Model *m, int block, size_t *largest, size_t *side);

/* The state of `optimizer` ("shampoo" or "muon") for the runs of opt
 * (zeroed), sized for the model's largest matrix. */
int precond_create(Precond *p, const char *optimizer, const AdamW *opt, const Model *m, const TrainConfig *tc);
void precond_destroy(Precond *p);

/* One update (t = opt->t + 1) of opt's runs; grads read, not modified. */
void precond_step(Precond *p, AdamW *opt, Model *m, double lr, double weight_decay);

/* root = (a + eps * lmax * I)^(-1/4) of a symmetric n x n matrix a
 * (row-major, stride lda; only its upper triangle is read; negative
 * eigenvalues taken as 0), through LAPACKE_ssyevd. work: PRECOND_ROOT_WORK(n)
 * floats (ssyevd's integer workspace included: lapack_int is 32-bit, as a
 * float). Returns 0, or -1 when the decomposition fails or a value is not
 * finite (root left untouched). */
#define PRECOND_SYEVD_LWORK(n) (1 + 6 * (size_t)(n) + 2 * (size_t)(n) * (size_t)(n)) /* LAPACK's minimum, jobz 'V' */
#define PRECOND_SYEVD_LIWORK(n) (3 + 5 * (size_t)(n))
#define PRECOND_ROOT_WORK(n)                                                                                      \
    (3 * (size_t)(n) * (size_t)(n) + (size_t)(n) + PRECOND_SYEVD_LWORK(n) + PRECOND_SYEVD_LIWORK(n))
int inverse_fourth_root(const float *a, int n, int lda, double eps, float *root, int ldr, float *work);

#endif
