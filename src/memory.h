/* memory.h — what one rank of a run holds, by category, from the config
 * and the layout alone: no buffer allocated, no MPI call.
 *
 * Owns: the arithmetic of `isthmus config CONFIG --memory`: for a world
 * rank of the config's layout, the bytes the trainer allocates for weights,
 * grads, optimiser state, outer state, codec residuals, staging and
 * activations (the same categories as alloc.h's counters, which a test
 * compares it with), and the expert rows at balanced routing (they grow
 * with the routing's imbalance, up to every routed row of the learner).
 * Must not: allocate the model or talk to other ranks; its sizes come from
 * the modules that allocate (model, plan, outer, transformer).
 */
#ifndef ISTHMUS_MEMORY_H
#define ISTHMUS_MEMORY_H

#include "alloc.h"
#include "config.h"

typedef struct {
    double bytes[ALLOC_CATEGORIES]; /* ALLOC_OTHER: not predicted (tables, plans, I/O) */
    double plain_state;             /* weights + grads + unsharded AdamW of the parameters the rank holds */
    int site, learner, learner_rank, learner_size, experts_local;
    int gpu; /* the CUDA backend's buffers (memory_on_gpu), else the CPU backend's */
} MemoryPlan;

/* Does the plan lay out the CUDA backend's buffers? For train.backend =
 * cuda, and for train.precision = bf16, which only the CUDA backend runs:
 * a bf16 config is planned for the GPU whatever the build (auto with fp32
 * is the CPU's: which backend auto picks depends on the machine). */
int memory_on_gpu(const TrainConfig *t);

/* World rank `rank` of a job of `world_size` ranks (0: the config's). */
int memory_plan(const Config *cfg, int world_size, int rank, MemoryPlan *out);

/* Of world ranks first .. first+count-1, the one whose total is largest
 * (the lowest such rank), and its plan. */
int memory_plan_largest(const Config *cfg, int world_size, int first, int count, MemoryPlan *out, long *rank);

/* The predicted bytes of every category together. */
double memory_total(const MemoryPlan *p);

/* The table: one line per category, then the total and the ratio to the
 * plain state (what data-parallel training without outer state or
 * optimiser sharding would hold for the same parameters). */
void memory_print(const MemoryPlan *p, int world_size, int rank);

/* This process's counters in the same format (measured). */
void memory_print_measured(int rank);

#endif
