/* blas_select.c — see blas_select.h. */
#include "blas_select.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *blas_core_name(void) { return openblas_get_corename(); }

static const char *best_coretype(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

void blas_select_reexec(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's choice, or already re-executed */
    const char *flag = getenv("ISTHMUS_BLAS_AUTOSELECT");
    if (flag && !strcmp(flag, "0")) return;
    const char *core = openblas_get_corename();
    static const char *const generic[] = {"Prescott", "Core2", "Nehalem", "Katmai", "Coppermine",
                                          "Northwood", "Penryn", "Dunnington", "Atom", "Banias"};
    int is_generic = 0;
    for (size_t i = 0; i < sizeof generic / sizeof *generic; i++)
        is_generic |= core && !strcasecmp(core, generic[i]);
    const char *want = best_coretype();
    if (!is_generic || !want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the generic kernels */
}
