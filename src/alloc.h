/* alloc.h — every heap allocation of the library goes through here.
 *
 * Owns: the allocation calls (malloc/calloc/aligned_alloc/realloc with the
 * same contracts) and the failure-injection point of the ISTHMUS_FAIL_ALLOC
 * test hook (fault.h), so that "every allocation is checked" is testable:
 * the hook makes one allocation on one rank return NULL and the caller's
 * CHECK_ALLOC must turn it into a one-line error.
 * Must not: retry, exit, or print — callers report failures.
 */
#ifndef ISTHMUS_ALLOC_H
#define ISTHMUS_ALLOC_H

#include <stddef.h>

void *isth_malloc(size_t bytes);
void *isth_calloc(size_t n, size_t size);
void *isth_aligned_alloc(size_t alignment, size_t bytes);
void *isth_realloc(void *p, size_t bytes);

#endif
