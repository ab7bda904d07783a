/* alloc.c — see alloc.h. */
#include "alloc.h"

#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"

const char *const alloc_category_name[ALLOC_CATEGORIES] = {
    "other", "weights", "grads", "optimizer", "outer", "residuals", "staging", "activations", "expert_rows"};

/* Live allocations: open addressing on the pointer, linear probing. A slot
 * is empty (ptr NULL, tomb 0), a tombstone (ptr NULL, tomb 1) or live. */
typedef struct {
    void *ptr;
    size_t bytes;
    unsigned char category, tomb;
} Entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Entry *table;
static size_t capacity, used, live_count; /* used: live entries + tombstones */
static double live[ALLOC_CATEGORIES], peak[ALLOC_CATEGORIES], live_total, peak_total;
static __thread AllocCategory current = ALLOC_OTHER;

AllocCategory alloc_category(AllocCategory c)
{
    const AllocCategory was = current;
    current = c;
    return was;
}

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

/* Rebuild for the live entries (tombstones dropped): at least four slots
 * per live entry, so the size follows what is live, not every address the
 * run ever used. The table's own memory is not counted. Returns 0 when out
 * of memory. */
static int rebuild(void)
{
    size_t cap = 1024;
    while (cap < 4 * (live_count + 1)) cap *= 2;
    Entry *t = calloc(cap, sizeof *t);
    if (!t) return 0;
    size_t n = 0;
    for (size_t i = 0; i < capacity; i++) {
        if (!table[i].ptr) continue;
        size_t s = slot_of(table[i].ptr, cap);
        while (t[s].ptr) s = (s + 1) & (cap - 1);
        t[s] = table[i];
        n++;
    }
    free(table);
    table = t;
    capacity = cap;
    used = n;
    return 1;
}

static void record(void *p, AllocCategory c)
{
    if (!p) return;
    const size_t bytes = malloc_usable_size(p);
    pthread_mutex_lock(&lock);
    if (2 * (used + 1) > capacity && !rebuild()) { /* not counted: accounting never fails an allocation */
        pthread_mutex_unlock(&lock);
        return;
    }
    size_t s = slot_of(p, capacity);
    while (table[s].ptr) s = (s + 1) & (capacity - 1);
    if (!table[s].tomb) used++;
    table[s] = (Entry){p, bytes, (unsigned char)c, 0};
    live_count++;
    live[c] += (double)bytes;
    live_total += (double)bytes;
    if (live[c] > peak[c]) peak[c] = live[c];
    if (live_total > peak_total) peak_total = live_total;
    pthread_mutex_unlock(&lock);
}

/* Remove p from the table; its category, or -1 when it was not counted. */
static int forget(void *p)
{
    int c = -1;
    pthread_mutex_lock(&lock);
    if (capacity) {
        size_t s = slot_of(p, capacity);
        while (table[s].ptr || table[s].tomb) {
            if (table[s].ptr == p) {
                c = table[s].category;
                live[c] -= (double)table[s].bytes;
                live_total -= (double)table[s].bytes;
                table[s].ptr = NULL;
                table[s].tomb = 1;
                live_count--;
                break;
            }
            s = (s + 1) & (capacity - 1);
        }
    }
    pthread_mutex_unlock(&lock);
    return c;
}

void *isth_malloc(size_t bytes)
{
    void *p = fault_alloc_fails() ? NULL : malloc(bytes);
    record(p, current);
    return p;
}

void *isth_calloc(size_t n, size_t size)
{
    void *p = fault_alloc_fails() ? NULL : calloc(n, size);
    record(p, current);
    return p;
}

void *isth_aligned_alloc(size_t alignment, size_t bytes)
{
    /* aligned_alloc wants a multiple of the alignment */
    const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void *p = fault_alloc_fails() ? NULL : aligned_alloc(alignment, rounded ? rounded : alignment);
    record(p, current);
    return p;
}

void *isth_realloc(void *p, size_t bytes)
{
    if (fault_alloc_fails()) return NULL;
    /* out of the table first (keeping its category); back in if realloc fails */
    const int c = p ? forget(p) : -1;
    void *q = realloc(p, bytes);
    record(q ? q : p, c >= 0 ? (AllocCategory)c : current);
    return q;
}

void isth_free(void *p)
{
    if (!p) return;
    forget(p);
    free(p);
}

void alloc_stats(AllocStats *out)
{
    pthread_mutex_lock(&lock);
    memcpy(out->live, live, sizeof live);
    memcpy(out->peak, peak, sizeof peak);
    out->live_total = live_total;
    out->peak_total = peak_total;
    pthread_mutex_unlock(&lock);
}
