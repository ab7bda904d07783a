/* backend.c — see backend.h: choosing the implementation. */
#include "backend.h"

#include <string.h>

#include "status.h"

int cpu_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);

int backend_create(Backend **out, const char *name, const Config *cfg, int B, int expert_begin, int experts_local,
                   Coll *ep)
{
    *out = NULL;
    if (!strcmp(name, "cpu")) return cpu_backend_create(out, cfg, B, expert_begin, experts_local, ep);
    return isth_fail(ISTH_EINPUT, "backend '%s' is not built into this isthmus (available: cpu)", name);
}

void backend_destroy(Backend *b)
{
    if (b) b->ops->destroy(b);
}
