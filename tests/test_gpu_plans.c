/* test_gpu_plans.c — the GPU tests' check lists (tests/gpu/plans.h),
 * counted on the host: no GPU is needed to find a plan that misses an
 * output or counts wrong. On a GPU, test_kernels_gpu, test_layers_gpu and
 * test_optim_gpu then compare each check's name with these lists in order
 * (a result computed and never compared leaves the run short of its plan:
 * exit 1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/plans.h"

static int has(int (*plan)(int, char *, size_t), const char *name)
{
    char unused[8];
    const int n = plan(-1, unused, sizeof unused);
    for (int i = 0; i < n; i++)
        if (plan_matches(plan, i, name)) return 1;
    return 0;
}

static void unique(int (*plan)(int, char *, size_t))
{
    char a[128], b[128], unused[8];
    const int n = plan(-1, unused, sizeof unused);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            plan(i, a, sizeof a);
            plan(j, b, sizeof b);
            if (!strcmp(a, b)) fail_msg("check '%s' twice (%d and %d)", a, i + 1, j + 1);
        }
}

/* dq, dk and dv of an attention backward are compared at each of its sizes. */
static void attention_outputs_checked(const char *kernel, const int *dh, const int *t, int sizes)
{
    for (int s = 0; s < sizes; s++)
        for (int k = 0; k < 3; k++) {
            char name[128];
            snprintf(name, sizeof name, "%s %s (+=) Dh=%d T=%d", kernel, k == 0 ? "dq" : k == 1 ? "dk" : "dv", dh[s],
                     t[s]);
            if (!has(plan_kernels, name)) fail_msg("no check of %s", name);
        }
}

static void test_kernel_plan(void **state)
{
    (void)state;
    char unused[8];
    /* 2 precisions x 6 products, 3 with bf16 operands, 4 sizes x 4 attention, 2 x 5 tensor-core attention,
     * 3 cross-entropy, 16 MoE, 5 bf16 experts, 2 x 3 grouped products, 2 dispatch plan */
    assert_int_equal(plan_kernels(-1, unused, sizeof unused), 2 * 6 + 3 + 4 * 4 + 2 * 5 + 3 + 16 + 5 + 2 * 3 + 2);
    unique(plan_kernels);
    /* every output of every backward kernel is compared */
    const char *outputs[] = {"matmul_backward dinp (+=)", "matmul_backward dweight (+=)",
                             "matmul_backward dinp (+=) (bf16)", "matmul_backward dweight (+=) (bf16)",
                             "tied_head_backward dx (+=)", "tied_head_backward dembed (+=)",
                             "crossentropy_backward", "router_softmax_backward", "moe_balance_backward (+=)",
                             "moe_combine_backward rows", "moe_combine_backward gates (+=)", "moe_scatter_add (+=)",
                             "expert_backward dx (+=)", "expert_backward dwg (+=)", "expert_backward dwu (+=)",
                             "expert_backward dwd (+=)", "gemm_batch dinp (+=)", "gemm_batch dweight (+=)",
                             "matmul_backward dinp (+=) (bf16 stored)", "matmul_backward dweight (+=) (bf16 stored)",
                             "expert_backward dx (+=) (bf16 stored)", "expert_backward dwg (+=) (bf16 stored)",
                             "expert_backward dwu (+=) (bf16 stored)", "expert_backward dwd (+=) (bf16 stored)",
                             "gemm_batch dinp (+=) (bf16 stored)", "gemm_batch dweight (+=) (bf16 stored)"};
    for (size_t i = 0; i < sizeof outputs / sizeof *outputs; i++)
        if (!has(plan_kernels, outputs[i])) fail_msg("no check of %s", outputs[i]);
    attention_outputs_checked("attention_backward", plan_attention_dh, plan_attention_t, 4);
    attention_outputs_checked("attention_tc backward", plan_attention_tc_dh, plan_attention_tc_t, 2);
    assert_false(plan_matches(plan_kernels, 73, "dispatch plan losses (balance, z, dropped)")); /* nothing beyond */
}

static void test_layer_plan(void **state)
{
    (void)state;
    char unused[8];
    /* embedding 2, rmsnorm 4 + the fused one, swiglu 3, rope 2, and the 4 outputs stored as bf16 */
    assert_int_equal(plan_layer_checks(-1, unused, sizeof unused), 2 + 5 + 3 + 2 + 4);
    unique(plan_layer_checks);
    const char *outputs[] = {"encoder_backward (+=)", "rmsnorm_backward dinp (+=)", "rmsnorm_backward dweight (+=)",
                             "swiglu_backward da (+=)", "swiglu_backward du (+=)", "rope_backward",
                             "rmsnorm_forward out (bf16 stored)", "residual_rmsnorm_forward (h, out) (bf16 stored)",
                             "swiglu_forward (bf16 stored)", "rope_qkv forward (bf16 stored)"};
    for (size_t i = 0; i < sizeof outputs / sizeof *outputs; i++)
        if (!has(plan_layer_checks, outputs[i])) fail_msg("no check of %s", outputs[i]);
}

static void test_optim_plan(void **state)
{
    (void)state;
    char unused[8];
    /* AdamW's 3; Shampoo's update, moments, statistics, roots, counters, repeat; Muon's all but statistics and roots */
    assert_int_equal(plan_optim_checks(-1, unused, sizeof unused), 3 + 6 + 4);
    unique(plan_optim_checks);
    /* every piece of each optimiser's state (cpu/precond.h's Precond) and its counters is compared */
    const char *outputs[] = {"adamw weights", "adamw first moment", "adamw second moment",
                             "shampoo weights' update", "shampoo moments", "shampoo statistics L, R",
                             "shampoo inverse roots", "shampoo counters", "shampoo the same bits again",
                             "muon weights' update", "muon moments", "muon counters", "muon the same bits again"};
    for (size_t i = 0; i < sizeof outputs / sizeof *outputs; i++)
        if (!has(plan_optim_checks, outputs[i])) fail_msg("no check of %s", outputs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kernel_plan), cmocka_unit_test(test_layer_plan),
                                       cmocka_unit_test(test_optim_plan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
