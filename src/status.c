/* status.c — see status.h. */
#include "status.h"

#include <stdarg.h>

static int quiet_errors, rank_prefix;

void status_set_quiet(int quiet) { quiet_errors = quiet; }
void status_set_rank(int rank) { rank_prefix = rank; }

int isth_fail(int code, const char *fmt, ...)
{
    /* bad input is detected alike by every rank: one line is enough */
    if (quiet_errors && code == ISTH_EINPUT) return code;
    va_list ap;
    va_start(ap, fmt);
    if (rank_prefix > 0)
        fprintf(stderr, "isthmus: error: rank %d: ", rank_prefix);
    else
        fputs("isthmus: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    return code;
}
