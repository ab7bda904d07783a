/* ckpt_lineage.c — see ckpt_lineage.h. */
#include "ckpt_lineage.h"

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "h5io.h"
#include "status.h"

/* The lineage of the state this process holds: "" until a start or a load
 * sets it, then its text. One per process, not per trainer: the live
 * rejoin makes the trainer again and loads the same state. */
static char held[CKPT_LINEAGE_CAP];
static char written[CKPT_LINEAGE_CAP];

typedef struct {
    long from;
    unsigned long mask;
    unsigned long long id;
} Entry;

static unsigned long every_site(int n_sites)
{
    return n_sites >= (int)(8 * sizeof(unsigned long)) ? ~0ul : (1ul << n_sites) - 1;
}

static void fresh(char *out, size_t cap, int n_sites)
{
    snprintf(out, cap, "0:%lx:0", every_site(n_sites));
}

/* Entry i of text (0 the oldest); 0 past the last. */
static int entry(const char *text, int i, Entry *e)
{
    const char *p = text;
    for (int k = 0; k < i && p; k++) {
        p = strchr(p, ';');
        if (p) p++;
    }
    return p && sscanf(p, "%ld:%lx:%llx", &e->from, &e->mask, &e->id) == 3;
}

static int last_entry(const char *text, Entry *e)
{
    const char *p = strrchr(text, ';');
    return sscanf(p ? p + 1 : text, "%ld:%lx:%llx", &e->from, &e->mask, &e->id) == 3;
}

/* splitmix64's finaliser over the previous ID, the new set and the step */
static unsigned long long next_id(unsigned long long id, unsigned long mask, long step)
{
    unsigned long long z = id ^ (0x9e3779b97f4a7c15ull * (mask + 1)) ^ (0xbf58476d1ce4e5b9ull * (unsigned long long)(step + 1));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ckpt_lineage_set(const char *text, int n_sites)
{
    Entry e;
    if (text && text[0] && last_entry(text, &e) && strlen(text) < sizeof held) snprintf(held, sizeof held, "%s", text);
    else fresh(held, sizeof held, n_sites);
}

const char *ckpt_lineage_for_write(const Trainer *tr)
{
    const int n = tr->topo.n_sites;
    if (!held[0]) fresh(held, sizeof held, n);
    unsigned long present = 0;
    for (int s = 0; s < n && s < (int)(8 * sizeof present); s++)
        if (!link_is_lost(&tr->link, s)) present |= 1ul << s;
    Entry e;
    if (!last_entry(held, &e)) { /* cannot happen: set and appended whole */
        fresh(held, sizeof held, n);
        last_entry(held, &e);
    }
    if (e.mask != present) {
        char add[64];
        snprintf(add, sizeof add, ";%ld:%lx:%llx", tr->step, present, next_id(e.id, present, tr->step));
        /* no room: the oldest entries go (their steps then match nothing) */
        const char *keep = held;
        while (strlen(keep) + strlen(add) >= sizeof held && strchr(keep, ';')) keep = strchr(keep, ';') + 1;
        snprintf(written, sizeof written, "%s%s", keep, add);
        memcpy(held, written, sizeof held);
    }
    return held;
}

uint64_t ckpt_lineage_id(const char *text)
{
    Entry e;
    return last_entry(text, &e) ? (uint64_t)e.id : 0;
}

int ckpt_lineage_at(const char *text, long step, uint64_t *id)
{
    Entry e;
    int found = 0;
    for (int i = 0; entry(text, i, &e) && e.from <= step; i++) {
        *id = (uint64_t)e.id;
        found = 1;
    }
    return found; /* 0: the oldest entry kept is of a later step than asked */
}

int ckpt_lineage_of_file(const char *path, int n_sites, char *out, size_t cap)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (h5_not_readable(path)) return ISTH_EINPUT;
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) return ISTH_EINPUT;
    fresh(out, cap, n_sites);
    int rc = ISTH_OK;
    hid_t a = H5Aexists(file, "lineage") > 0 ? H5Aopen(file, "lineage", H5P_DEFAULT) : -1;
    if (a >= 0) {
        hid_t type = H5Aget_type(a);
        const size_t n = H5Tget_class(type) == H5T_STRING ? H5Tget_size(type) : 0;
        char *s = n ? isth_calloc(n + 1, 1) : NULL;
        Entry e;
        if (s && n < cap && H5Aread(a, type, s) >= 0 && last_entry(s, &e)) snprintf(out, cap, "%s", s);
        else rc = ISTH_EINPUT;
        isth_free(s);
        H5Tclose(type);
        H5Aclose(a);
    }
    H5Fclose(file);
    return rc;
}
