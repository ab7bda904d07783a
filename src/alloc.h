/* alloc.h — every heap allocation of the library goes through here.
 *
 * Owns: the allocation calls (malloc/calloc/aligned_alloc/realloc with the
 * same contracts, isth_free to release), the accounting of live and peak
 * bytes by category (what `isthmus config --memory` predicts is checked
 * against these counters), and the failure-injection point of the
 * ISTHMUS_FAIL_ALLOC test hook (fault.h), so that "every allocation is
 * checked" is testable: the hook makes one allocation on one rank return
 * NULL and the caller's CHECK_ALLOC must turn it into a one-line error.
 * Must not: retry, exit, or print — callers report failures.
 *
 * Accounting: every live allocation is recorded in a side table (pointer,
 * usable bytes, category), so isth_free of a pointer the library did not
 * allocate (a strdup) only frees it, and a plain free() of a counted
 * pointer cannot crash (it stays counted as live).
 */
#ifndef ISTHMUS_ALLOC_H
#define ISTHMUS_ALLOC_H

#include <stddef.h>

/* What an allocation holds; the categories of the memory report. */
typedef enum {
    ALLOC_OTHER,       /* tables, plans, config, I/O scratch */
    ALLOC_WEIGHTS,     /* model parameters */
    ALLOC_GRADS,       /* gradients */
    ALLOC_OPTIMIZER,   /* inner optimiser state (AdamW m, v) */
    ALLOC_OUTER,       /* outer-mode state: anchor, momentum, butterfly's sent values */
    ALLOC_RESIDUAL,    /* codec error-feedback residuals */
    ALLOC_STAGING,     /* exchange staging: packed values, encodings, messages */
    ALLOC_ACTIVATIONS, /* forward/backward buffers of one micro-batch (fixed at start) */
    ALLOC_EXPERT_ROWS, /* rows routed to this rank's experts (grown with the routing) */
    ALLOC_CATEGORIES
} AllocCategory;

extern const char *const alloc_category_name[ALLOC_CATEGORIES];

void *isth_malloc(size_t bytes);
void *isth_calloc(size_t n, size_t size);
void *isth_aligned_alloc(size_t alignment, size_t bytes);
void *isth_realloc(void *p, size_t bytes);
void isth_free(void *p);

/* Allocations of this thread go to `c` from now on; returns the previous. */
AllocCategory alloc_category(AllocCategory c);

typedef struct {
    double live[ALLOC_CATEGORIES], peak[ALLOC_CATEGORIES]; /* bytes */
    double live_total, peak_total;
} AllocStats;

void alloc_stats(AllocStats *out);

#endif
