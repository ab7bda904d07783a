/* status.c — see status.h. */
#include "status.h"

#include <stdarg.h>

static int quiet_errors;

void status_set_quiet(int quiet) { quiet_errors = quiet; }

int isth_fail(int code, const char *fmt, ...)
{
    if (quiet_errors) return code;
    va_list ap;
    va_start(ap, fmt);
    fputs("isthmus: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    return code;
}
