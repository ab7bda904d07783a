/* bench.c — see bench.h. */
#include "bench.h"
#include "alloc.h"

#include <cblas.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/blas_select.h"
#include "clock.h"
#include "seal.h"
#include "status.h"
#include "train.h"

double model_flops_per_token(const ModelConfig *mc)
{
    return 6.0 * model_active_matrix_params(mc) + 6.0 * mc->layers * mc->context * (double)mc->dim;
}

/* GFLOP/s of a square-ish sgemm (N=2048 rows, 1024x1024 weights), the
 * reference ceiling for this machine and thread count. */
static double sgemm_gflops(void)
{
    const int M = 2048, K = 1024, N = 1024;
    float *a = isth_malloc((size_t)M * K * sizeof(float)), *b = isth_malloc((size_t)K * N * sizeof(float)),
          *c = isth_malloc((size_t)M * N * sizeof(float));
    if (!a || !b || !c) {
        isth_free(a);
        isth_free(b);
        isth_free(c);
        return 0;
    }
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
    int reps = 5;
    double t0 = now_s();
    for (int r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
    double dt = now_s() - t0;
    isth_free(a);
    isth_free(b);
    isth_free(c);
    return 2.0 * M * N * K * reps / dt / 1e9;
}

/* This process's CPU time, all its threads: on a shared machine it moves less
 * with other jobs' load than the wall clock does. */
static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_seal_rate(int encrypt)
{
    const size_t n = (size_t)64 << 20; /* one 64 MiB frame: the link's rejoin piece */
    unsigned char *buf = isth_malloc(n);
    if (!buf || seal_init() != 0) {
        isth_free(buf);
        return 0;
    }
    unsigned char key[SEAL_KEY_BYTES] = {1}, nonce[SEAL_NONCE_BYTES], tag[SEAL_TAG_BYTES], ad[56] = {2};
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)i;
    const int reps = 3;
    int ok = 1;
    const double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        /* unencrypted, the header and the payload are one run of associated data */
        const unsigned char *a = encrypt ? ad : buf;
        const size_t a_len = encrypt ? sizeof ad : 0;
        seal_frame(key, encrypt, nonce, tag, a, a_len, buf, n);
        ok &= seal_open(key, encrypt, nonce, tag, a, a_len, buf, n) == 0;
    }
    const double dt = now_s() - t0;
    isth_free(buf);
    return ok && dt > 0 ? 2.0 * (double)n * reps / dt : 0;
}

int bench_run(const Config *cfg, const int *threads, int n_threads, int warmup, int steps, double peak_tflops)
{
    const double fpt = model_flops_per_token(&cfg->model);
    const TrainConfig *tc = &cfg->train;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) return isth_fail(ISTH_ERUNTIME, "bench: stdout");
    printf("# ranks: %d (threads per rank as listed)\n", size);
    printf("# isthmus bench: %s | L=%d D=%d H=%d E=%d k=%d F=%d T=%d | micro_batch %d x grad_accum %d\n",
           cfg->source, cfg->model.layers, cfg->model.dim, cfg->model.heads, cfg->model.experts,
           cfg->model.top_k, cfg->model.ffn, cfg->model.context, tc->micro_batch, tc->grad_accum);
    printf("# BLAS: OpenBLAS, %s kernels\n", blas_core_name());
    printf("# model FLOPs per token: %.2f M (6 x %.3f M active matrix params + causal attention)\n",
           fpt / 1e6, model_active_matrix_params(&cfg->model) / 1e6);
    if (peak_tflops > 0) printf("# MFU: model FLOP/s per rank / %.1f TFLOP/s peak\n", peak_tflops);
    printf("# %d warm-up step(s) untimed, then %d timed; cpu ms/step: rank 0's process CPU time\n", warmup, steps);
    printf("# data: rank 0's time reading training windows (data_fill), per step and as a share of it\n");
    printf("%-8s %10s %12s %10s %10s %14s %9s %14s %16s %13s %7s%s\n", "threads", "ms/step", "cpu ms/step", "tokens/s",
           "GFLOP/s", "sgemm GFLOP/s", "of sgemm", "a2a B/step", "inter-site B/step", "data ms/step", "data",
           peak_tflops > 0 ? "      MFU" : "");
    for (int i = 0; i < n_threads; i++) {
        Config c = *cfg;
        c.train.threads = threads[i];
        c.train.steps = warmup + steps;
        Trainer tr;
        int rc = trainer_create(&tr, &c, 0, MPI_COMM_WORLD, NULL);
        if (rc != ISTH_OK) {
            trainer_destroy(&tr);
            return rc;
        }
        StepLog s;
        /* warm-up: page faults, BLAS buffers (and a matrix optimiser's first roots) */
        for (int k = 0; k < warmup && rc == ISTH_OK; k++) rc = trainer_step(&tr, &s);
        if (rc == ISTH_OK && MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) rc = ISTH_ERUNTIME;
        /* the GPU's step by phase (a backend that offers it): timed steps only */
        const int timed = tr.be && tr.be->ops->phases;
        if (rc == ISTH_OK && timed) rc = tr.be->ops->phases(tr.be, 1, NULL, NULL, 0, NULL);
        const double t0 = now_s(), c0 = process_cpu_s(), d0 = tr.data_s;
        for (int k = 0; k < steps && rc == ISTH_OK; k++) rc = trainer_step(&tr, &s);
        const double data = (tr.data_s - d0) / steps;
        const double cpu = (process_cpu_s() - c0) / steps;
        if (rc == ISTH_OK && MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) rc = ISTH_ERUNTIME;
        double dt = (now_s() - t0) / steps;
        const double tokens = tr.topo.total_tokens_per_step;
        const char *phase_names[16];
        double phase_ms[16];
        int n_phases = 0;
        if (rc == ISTH_OK && timed) rc = tr.be->ops->phases(tr.be, 0, phase_names, phase_ms, 16, &n_phases);
        trainer_destroy(&tr);
        CHECK(rc);
        double gflops = tokens * fpt / dt / 1e9;
        double ref = sgemm_gflops();
        printf("%-8d %10.1f %12.1f %10.0f %10.1f %14.1f %8.0f%% %14.0f %16.0f %13.3f %6.2f%%", threads[i], 1e3 * dt,
               1e3 * cpu, tokens / dt, gflops, ref, 100.0 * gflops / ref, s.a2a_bytes, s.inter_site_bytes, 1e3 * data,
               100.0 * data / dt);
        if (peak_tflops > 0) printf(" %7.1f%%", 100.0 * gflops / size / (peak_tflops * 1e3));
        printf("\n");
        if (n_phases) { /* rank 0's device, CUDA events between phase marks; "other": the host's time between steps */
            double sum = 0.0;
            for (int p = 0; p < n_phases; p++) sum += phase_ms[p];
            printf("# step by phase (rank 0's GPU, CUDA events, ms per step and share of the %.1f ms step):\n", 1e3 * dt);
            for (int p = 0; p < n_phases; p++)
                printf("#   %-24s %10.2f %6.1f%%\n", phase_names[p], phase_ms[p] / steps, 100.0 * phase_ms[p] / steps / (1e3 * dt));
            printf("#   %-24s %10.2f %6.1f%% (the phases' sum against the step's wall time)\n", "sum", sum / steps,
                   100.0 * sum / steps / (1e3 * dt));
        }
        fflush(stdout);
    }
    /* what sealing the link's frames costs a core (plan's PLAN_SEAL_BYTES_PER_S) */
    printf("# link seal, one core, 64 MiB frames sealed and opened: encrypted %.2f GB/s, authenticated only "
           "%.2f GB/s\n", bench_seal_rate(1) / 1e9, bench_seal_rate(0) / 1e9);
    return ISTH_OK;
}
