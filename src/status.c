/* status.c — see status.h. */
#include "status.h"

#include <stdarg.h>
#include <string.h>

static int quiet_errors, my_rank, multi_rank;
static const char *my_site = "";
static int printed_error;

static char suppressed[1024];

int status_printed_error(void) { return printed_error; }

int status_has_suppressed(void) { return suppressed[0] != 0; }

void status_discard_suppressed(void) { suppressed[0] = '\0'; }

/* "isthmus: error: " and, when `with_rank`, "rank R (site S): " */
static int line_prefix(char *buf, size_t cap, int with_rank)
{
    if (!with_rank) return snprintf(buf, cap, "isthmus: error: ");
    if (my_site[0]) return snprintf(buf, cap, "isthmus: error: rank %d (site %s): ", my_rank, my_site);
    return snprintf(buf, cap, "isthmus: error: rank %d: ", my_rank);
}

void status_print_suppressed(void)
{
    if (!suppressed[0] || printed_error) return;
    char prefix[160];
    line_prefix(prefix, sizeof prefix, 1);
    fprintf(stderr, "%s%s\n", prefix, suppressed);
    fflush(stderr);
    printed_error = 1;
}

void status_print_held(int as_warning, const char *warning_suffix)
{
    if (!suppressed[0]) return;
    if (as_warning) {
        fprintf(stderr, "isthmus: warning: %s%s\n", suppressed, warning_suffix);
    } else if (!printed_error) {
        fprintf(stderr, "isthmus: error: %s\n", suppressed); /* as bad input is printed: no rank prefix */
        printed_error = 1;
    }
    fflush(stderr);
    suppressed[0] = '\0';
}

int status_set_quiet(int quiet)
{
    const int was = quiet_errors;
    quiet_errors = quiet;
    return was;
}
void status_set_rank(int rank, int world_size)
{
    my_rank = rank;
    multi_rank = world_size > 1;
}
void status_set_site(const char *site) { my_site = site ? site : ""; }

int isth_fail(int code, const char *fmt, ...)
{
    /* bad input is detected alike by every rank: one line is enough */
    va_list ap;
    if (quiet_errors && code == ISTH_EINPUT) { /* kept, in case rank 0 did not see it (fault_end_job) */
        va_start(ap, fmt);
        vsnprintf(suppressed, sizeof suppressed, fmt, ap);
        va_end(ap);
        return code;
    }
    printed_error = 1;
    /* the whole line in one write: lines of several ranks must not mix */
    char line[2048];
    const int n = line_prefix(line, sizeof line, multi_rank && code != ISTH_EINPUT);
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    const size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    } else {
        line[sizeof line - 2] = '\n';
    }
    fputs(line, stderr);
    fflush(stderr);
    return code;
}
