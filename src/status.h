/* status.h — error codes, CHECK macros and the one-line error reporter.
 *
 * Owns: the status-code convention used by every module (0 = success,
 * ISTH_EINPUT = bad input from the user, ISTH_ERUNTIME = anything else) and
 * how an error is printed. Functions return a status; the first place that
 * detects a problem prints one line saying what and where, and callers only
 * propagate the code (CHECK). main() turns the code into the exit status.
 * Must not: exit the process or call MPI_Abort — callers decide that.
 */
#ifndef ISTHMUS_STATUS_H
#define ISTHMUS_STATUS_H

#include <stdio.h>

enum {
    ISTH_OK = 0,
    ISTH_ERUNTIME = 1, /* I/O failure, MPI failure, out of memory */
    ISTH_EINPUT = 2,   /* bad config, bad data file, bad checkpoint: exit 2 */
    ISTH_EDROPPED = 3, /* dropped from a live federated run, or its join broke in Open MPI: start the site again */
};

/* Which messages reach stderr: by default every rank prints its errors;
 * status_set_quiet(1) on ranks other than 0 silences errors that every rank
 * detects identically (config validation), so the user reads one line. */
int status_set_quiet(int quiet); /* returns the previous setting */
/* In a multi-rank job, runtime errors (which may be rank-specific) are
 * printed by the rank that hits them, prefixed with its world rank and site:
 * "isthmus: error: rank 3 (site b): ...". Bad-input errors keep no prefix. */
void status_set_rank(int rank, int world_size);
void status_set_site(const char *site);

/* Has this process printed an error line? */
int status_printed_error(void);
/* Print the last bad-input error that quiet mode held back (with rank and
 * site): for an input only this rank saw. */
void status_print_suppressed(void);
int status_has_suppressed(void);
/* Print it and forget it: "isthmus: error: <line>" as any bad input (when
 * this process has printed no error yet), or as_warning "isthmus: warning:
 * <line><warning_suffix>" (the caller goes on another way). */
void status_print_held(int as_warning, const char *warning_suffix);
/* Forget it (a check that only asked whether something is valid). */
void status_discard_suppressed(void);

/* Print "isthmus: error: <message>" and return `code`. */
int isth_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Propagate a non-zero status to the caller. */
#define CHECK(call)                                                          \
    do {                                                                     \
        int check_rc_ = (call);                                              \
        if (check_rc_ != ISTH_OK) return check_rc_;                          \
    } while (0)

/* An MPI call that must succeed; MPI's own message names the failure.
 * Live because the communicators return errors (fault_mpi_errors_return). */
#define CHECK_MPI(call)                                                      \
    do {                                                                     \
        int check_rc_ = (call);                                              \
        if (check_rc_ != 0 /* MPI_SUCCESS */)                                \
            return isth_fail_mpi(__FILE__, __LINE__, #call, check_rc_);      \
    } while (0)

/* "file:line: call failed: <MPI's error string>", ISTH_ERUNTIME (fault.c). */
int isth_fail_mpi(const char *file, int line, const char *call, int mpi_rc);

/* Allocation that must succeed. */
#define CHECK_ALLOC(ptr)                                                     \
    do {                                                                     \
        if ((ptr) == NULL)                                                   \
            return isth_fail(ISTH_ERUNTIME, "%s:%d: out of memory allocating %s", \
                             __FILE__, __LINE__, #ptr);                      \
    } while (0)

#endif
