/* plans.h — the checks of the GPU kernel, layer and optimiser tests, as
 * data: the name of check i, in the order the test makes them, and how
 * many there are. test_kernels_gpu, test_layers_gpu and test_optim_gpu
 * print their TAP plan from here
 * and compare each check's name with the plan's next one, so a result
 * computed and never compared, or a check added without its line here,
 * fails the run; tests/test_gpu_plans.c counts these lists on the host
 * (make check, no GPU) and checks that every output of every backward
 * kernel has its line. Plain C: no CUDA needed to include it. */
#ifndef ISTHMUS_GPU_PLANS_H
#define ISTHMUS_GPU_PLANS_H

#include <stdio.h>
#include <string.h>

/* sizes the attention checks run at (head dim, sequence length) */
static const int plan_attention_dh[4] = {16, 32, 64, 128}, plan_attention_t[4] = {37, 100, 65, 130};

static const char *const plan_products[] = {
    "matmul_forward", "matmul_backward dinp (+=)", "matmul_backward dweight (+=)",
    "tied_head_forward", "tied_head_backward dx (+=)", "tied_head_backward dembed (+=)",
};
/* the products with operands stored as bf16 (the bf16 path's) */
static const char *const plan_products_stored[] = {
    "matmul_forward (bf16 stored)", "matmul_backward dinp (+=) (bf16 stored)",
    "matmul_backward dweight (+=) (bf16 stored)",
};
static const char *const plan_attention[] = {
    "attention_forward", "attention_backward dq (+=)", "attention_backward dk (+=)", "attention_backward dv (+=)",
};
/* the tensor-core attention (bf16) against the fp32 kernels, at these sizes */
static const int plan_attention_tc_dh[2] = {64, 128}, plan_attention_tc_t[2] = {100, 130};
static const char *const plan_attention_tc[] = {
    "attention_tc forward", "attention_tc lse", "attention_tc backward dq (+=)", "attention_tc backward dk (+=)",
    "attention_tc backward dv (+=)",
};
static const char *const plan_crossentropy[] = {
    "crossentropy_forward losses", "crossentropy_forward probs", "crossentropy_backward",
};
static const char *const plan_moe[] = {
    "router_softmax_forward probs", "router_softmax_forward lse", "router_topk (ties to the lower index)",
    "router_mean_prob", "moe_balance_backward (+=)", "router_softmax_backward", "moe_combine_forward",
    "moe_combine_backward rows", "moe_combine_backward gates (+=)", "moe_scatter_add (+=)", "rows_gather",
    "expert_forward", "expert_backward dx (+=)", "expert_backward dwg (+=)", "expert_backward dwu (+=)",
    "expert_backward dwd (+=)", "expert_forward (bf16 stored)", "expert_backward dx (+=) (bf16 stored)",
    "expert_backward dwg (+=) (bf16 stored)", "expert_backward dwu (+=) (bf16 stored)",
    "expert_backward dwd (+=) (bf16 stored)", "gemm_batch forward (experts of 0-130 rows)", "gemm_batch dinp (+=)",
    "gemm_batch dweight (+=)", "gemm_batch forward (bf16 stored)", "gemm_batch dinp (+=) (bf16 stored)",
    "gemm_batch dweight (+=) (bf16 stored)", "dispatch plan (4 ranks, every one)",
    "dispatch plan losses (balance, z, dropped)",
};
static const char *const plan_layers[] = {
    "encoder_forward", "encoder_backward (+=)", "rmsnorm_forward out", "rmsnorm_forward rstd",
    "rmsnorm_backward dinp (+=)", "rmsnorm_backward dweight (+=)", "residual_rmsnorm_forward (h, out, rstd)",
    "rmsnorm_forward out (bf16 stored)", "residual_rmsnorm_forward (h, out) (bf16 stored)",
    "swiglu_forward", "swiglu_forward (bf16 stored)", "swiglu_backward da (+=)",
    "swiglu_backward du (+=)", "rope_forward", "rope_backward", "rope_qkv forward (bf16 stored)",
};
/* test_optim_gpu: AdamW, then each matrix optimiser against the CPU's
 * precond_step (every piece of its state, its counters), then again on the
 * GPU for the same bits */
static const char *const plan_optim[] = {
    "adamw weights", "adamw first moment", "adamw second moment",
    "shampoo weights' update", "shampoo moments", "shampoo statistics L, R", "shampoo inverse roots",
    "shampoo counters", "shampoo the same bits again",
    "muon weights' update", "muon moments", "muon counters", "muon the same bits again",
};
#define PLAN_LEN(a) ((int)(sizeof(a) / sizeof *(a)))

/* test_kernels_gpu's check i (from 0) into out; returns the plan's length
 * (out untouched when i is beyond it). */
static inline int plan_kernels(int i, char *out, size_t size)
{
    int at = 0;
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int k = 0; k < PLAN_LEN(plan_products); k++, at++)
            if (at == i) snprintf(out, size, "%s%s", plan_products[k], bf16 ? " (bf16)" : "");
    for (int k = 0; k < PLAN_LEN(plan_products_stored); k++, at++)
        if (at == i) snprintf(out, size, "%s", plan_products_stored[k]);
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < PLAN_LEN(plan_attention); k++, at++)
            if (at == i) snprintf(out, size, "%s Dh=%d T=%d", plan_attention[k], plan_attention_dh[s], plan_attention_t[s]);
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < PLAN_LEN(plan_attention_tc); k++, at++)
            if (at == i)
                snprintf(out, size, "%s Dh=%d T=%d", plan_attention_tc[k], plan_attention_tc_dh[s], plan_attention_tc_t[s]);
    for (int k = 0; k < PLAN_LEN(plan_crossentropy); k++, at++)
        if (at == i) snprintf(out, size, "%s", plan_crossentropy[k]);
    for (int k = 0; k < PLAN_LEN(plan_moe); k++, at++)
        if (at == i) snprintf(out, size, "%s", plan_moe[k]);
    return at;
}

/* test_layers_gpu's check i, the same way. */
static inline int plan_layer_checks(int i, char *out, size_t size)
{
    if (i >= 0 && i < PLAN_LEN(plan_layers)) snprintf(out, size, "%s", plan_layers[i]);
    return PLAN_LEN(plan_layers);
}

/* test_optim_gpu's check i, the same way. */
static inline int plan_optim_checks(int i, char *out, size_t size)
{
    if (i >= 0 && i < PLAN_LEN(plan_optim)) snprintf(out, size, "%s", plan_optim[i]);
    return PLAN_LEN(plan_optim);
}

/* Is `name` check number i (from 0) of the plan? */
static inline int plan_matches(int (*plan)(int, char *, size_t), int i, const char *name)
{
    char want[128] = "";
    return i < plan(i, want, sizeof want) && !strcmp(want, name);
}

#endif
