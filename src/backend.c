/* backend.c — see backend.h: the seam's generic part, what holds for every
 * backend. Choosing one (backend_create) is src/backend_choose.c's, above
 * both backends: this file knows neither. */
#include "backend.h"

void backend_destroy(Backend *b)
{
    if (b) b->ops->destroy(b);
}
