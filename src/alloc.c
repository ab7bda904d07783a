/* alloc.c — see alloc.h. */
#include "alloc.h"

#include <stdlib.h>

#include "fault.h"

void *isth_malloc(size_t bytes) { return fault_alloc_fails() ? NULL : malloc(bytes); }

void *isth_calloc(size_t n, size_t size) { return fault_alloc_fails() ? NULL : calloc(n, size); }

void *isth_aligned_alloc(size_t alignment, size_t bytes)
{
    /* aligned_alloc wants a multiple of the alignment */
    const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    return fault_alloc_fails() ? NULL : aligned_alloc(alignment, rounded ? rounded : alignment);
}

void *isth_realloc(void *p, size_t bytes) { return fault_alloc_fails() ? NULL : realloc(p, bytes); }
