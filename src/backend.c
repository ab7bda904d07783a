/* backend.c — see backend.h: choosing the implementation. */
#include "backend.h"

#include "autoconf.h"

#include <string.h>

#include "status.h"

int cpu_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);
#if HAVE_CUDA
int cuda_backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep);
int cuda_device_count(void);
#endif

const char *backend_name(const Config *cfg)
{
    if (strcmp(cfg->train.backend, "auto")) return cfg->train.backend;
#if HAVE_CUDA
    if (cuda_device_count() > 0) return "cuda";
#endif
    return "cpu";
}

int backend_create(Backend **out, const Config *cfg, int B, int expert_begin, int experts_local, Coll *ep)
{
    *out = NULL;
    const char *name = backend_name(cfg);
    if (!strcmp(name, "cpu")) {
        if (!strcmp(cfg->train.precision, "bf16"))
            return isth_fail(ISTH_EINPUT, "config: [train] precision = bf16 needs the CUDA backend; the CPU backend "
                             "computes in fp32 (precision = fp32)");
        return cpu_backend_create(out, cfg, B, expert_begin, experts_local, ep);
    }
#if HAVE_CUDA
    return cuda_backend_create(out, cfg, B, expert_begin, experts_local, ep);
#else
    return isth_fail(ISTH_EINPUT, "config: [train] backend = %s, but this isthmus was built without CUDA "
                     "(./configure --with-cuda); use backend = cpu or auto", name);
#endif
}

void backend_destroy(Backend *b)
{
    if (b) b->ops->destroy(b);
}
