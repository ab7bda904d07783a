/* bench.h — `isthmus bench`: training-step throughput of the backend the config selects.
 *
 * Owns: timing of full training steps (forward, backward, clipping, the optimiser)
 * on the bundled corpus, and the FLOP model used to report GFLOP/s:
 *   6 x active matrix parameters per token (attention projections, router,
 *   top_k experts, tied output head) + 6 L T D for causal attention
 *   (QK^T and PV over the ~T/2 visible positions, forward and backward).
 * An sgemm of the same size class is timed in the same run as a reference;
 * rank 0's process CPU time per step (summed over its threads, spinning
 * ones included: compare it at one thread) is reported beside the wall time.
 * Must not: be used by tests to decide pass/fail (timings are noisy).
 */
#ifndef ISTHMUS_BENCH_H
#define ISTHMUS_BENCH_H

#include "config.h"

double model_flops_per_token(const ModelConfig *mc);
/* Bytes per second one core seals and opens (seal.h) in 64 MiB frames,
 * encrypted or authenticated only; 0 when it could not be measured. */
double bench_seal_rate(int encrypt);
/* peak_tflops > 0: also MFU = model FLOP/s per rank / peak. */
/* warmup untimed steps, then steps timed ones, for each thread count. */
int bench_run(const Config *cfg, const int *threads, int n_threads, int warmup, int steps, double peak_tflops);

#endif
