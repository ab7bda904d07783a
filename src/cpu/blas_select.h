/* blas_select.h — make sure OpenBLAS runs kernels for this CPU.
 *
 * Owns: one start-up decision. Debian's OpenBLAS 0.3.21 picks its kernels
 * from the CPUID model number; on CPUs newer than the library (or virtual
 * CPUs with a generic model string, such as the CI machines) it falls back
 * to the "Prescott" SSE3 kernels, 4-5x slower than the AVX-512 ones the CPU
 * can run. OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded, so
 * blas_select_reexec() sets it from the CPU's feature flags and re-executes
 * the program once, before MPI_Init. A user's own OPENBLAS_CORETYPE is
 * always respected; ISTHMUS_BLAS_AUTOSELECT=0 disables the step.
 * Must not: change numerical behaviour beyond the choice of BLAS kernels.
 */
#ifndef ISTHMUS_BLAS_SELECT_H
#define ISTHMUS_BLAS_SELECT_H

/* Returns only if no re-execution was needed (or it failed). */
void blas_select_reexec(char **argv);

/* The OpenBLAS kernel family in use, e.g. "SkylakeX". */
const char *blas_core_name(void);

#endif
