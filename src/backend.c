/* backend.c — see backend.h: choosing the implementation. */
#include "backend.h"

#include "autoconf.h"

#include <string.h>

#include "status.h"

int cpu_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);

const char *backend_name(const Config *cfg)
{
    /* auto: the CUDA backend once it is built in (#15); this build has the CPU one */
    return !strcmp(cfg->train.backend, "auto") ? "cpu" : cfg->train.backend;
}

int backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep)
{
    *out = NULL;
    const char *name = backend_name(cfg);
    if (!strcmp(name, "cpu")) return cpu_backend_create(out, cfg, B, expert_begin, experts_local, ep);
    if (!HAVE_CUDA)
        return isth_fail(ISTH_EINPUT, "config: [train] backend = %s, but this isthmus was built without CUDA "
                         "(./configure --with-cuda); use backend = cpu or auto", name);
    return isth_fail(ISTH_EINPUT, "config: [train] backend = %s: this build has the CUDA toolkit but not the CUDA "
                     "backend's layers yet; use backend = cpu or auto", name);
}

void backend_destroy(Backend *b)
{
    if (b) b->ops->destroy(b);
}
