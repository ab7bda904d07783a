/* fault.c — see fault.h. */
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "status.h"

/* seconds a rank that printed nothing waits before aborting */
#define FAULT_QUIET_ABORT_DELAY_S 2
/* seconds a rank that held back a bad-input line waits for rank 0's abort */
#define FAULT_SUPPRESSED_DELAY_S 10

static char site_name[64];
static long current_step;
static int alloc_failed;

int isth_fail_mpi(const char *file, int line, const char *call, int mpi_rc)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", mpi_rc);
    return isth_fail(ISTH_ERUNTIME, "%s:%d: %s failed: %s", file, line, call, text);
}

int fault_mpi_errors_return(MPI_Comm comm)
{
    CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    return ISTH_OK;
}

/* Is hook `var` set to "NAME:N" for this name? Then *value = N. */
static int hook_match(const char *var, const char *name, long *value)
{
    const char *v = getenv(var);
    if (!v || !name) return 0;
    const char *colon = strrchr(v, ':');
    if (!colon || (size_t)(colon - v) != strlen(name) || strncmp(v, name, strlen(name))) return 0;
    *value = atol(colon + 1);
    return 1;
}

long fault_hook_for(const char *var, const char *name)
{
    long value = 0;
    return hook_match(var, name, &value) ? value : 0;
}

void fault_set_site(const char *name)
{
    snprintf(site_name, sizeof site_name, "%s", name ? name : "");
    status_set_site(site_name);
}

void fault_set_step(long step) { current_step = step; }

int fault_nan_now(void)
{
    static long at = -1;
    if (at < 0) at = fault_hook_for("ISTHMUS_NAN_AT", site_name);
    return at > 0 && current_step == at;
}

int fault_alloc_fails(void)
{
    if (alloc_failed || !getenv("ISTHMUS_FAIL_ALLOC")) return 0; /* the usual case: one getenv */
    int rank = 0, init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char me[16];
    snprintf(me, sizeof me, "%d", rank);
    long step;
    if (!hook_match("ISTHMUS_FAIL_ALLOC", me, &step) || step != current_step) return 0;
    alloc_failed = 1;
    return 1;
}

static pthread_mutex_t dog_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dog_cond; /* on CLOCK_MONOTONIC: a clock change must not fire it */
static pthread_t dog_thread;
static int dog_armed, dog_started;
static struct timespec dog_deadline;
static char dog_what[256], dog_hint[160];
static double dog_seconds;
static int dog_rc;

static void *watchdog(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&dog_lock);
    for (;;) {
        while (!dog_armed) pthread_cond_wait(&dog_cond, &dog_lock);
        const int rc = pthread_cond_timedwait(&dog_cond, &dog_lock, &dog_deadline);
        if (rc == ETIMEDOUT && dog_armed) {
            if (!dog_what[0]) /* fault_exit_within: the failure was said already */
                ;
            else if (dog_rc == ISTH_EDROPPED)
                isth_fail(dog_rc, "%s did not finish within %g s (%s); exit 3: start this site again "
                          "(--resume auto; scripts/federated.sh does) and it joins", dog_what, dog_seconds, dog_hint);
            else
                isth_fail(dog_rc, "%s did not finish within %g s (%s); ending the job", dog_what, dog_seconds,
                          dog_hint);
            fflush(stdout);
            _exit(dog_rc); /* mpirun ends the other ranks */
        }
    }
    return NULL;
}

void fault_watchdog_arm(double seconds, const char *what, const char *hint)
{
    fault_watchdog_arm_exit(seconds, what, hint, ISTH_ERUNTIME);
}

void fault_watchdog_arm_exit(double seconds, const char *what, const char *hint, int rc)
{
    pthread_mutex_lock(&dog_lock);
    if (!dog_started) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&dog_cond, &attr);
        pthread_condattr_destroy(&attr);
        dog_started = pthread_create(&dog_thread, NULL, watchdog, NULL) == 0;
        if (!dog_started) fprintf(stderr, "isthmus: warning: no watchdog thread: I/O runs without a deadline\n");
    }
    clock_gettime(CLOCK_MONOTONIC, &dog_deadline);
    dog_deadline.tv_sec += (time_t)seconds;
    dog_deadline.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (dog_deadline.tv_nsec >= 1000000000L) {
        dog_deadline.tv_sec++;
        dog_deadline.tv_nsec -= 1000000000L;
    }
    snprintf(dog_what, sizeof dog_what, "%s", what);
    snprintf(dog_hint, sizeof dog_hint, "%s", hint);
    dog_seconds = seconds;
    dog_rc = rc;
    dog_armed = dog_started;
    pthread_cond_broadcast(&dog_cond);
    pthread_mutex_unlock(&dog_lock);
}

void fault_exit_within(double seconds, int rc)
{
    fault_watchdog_arm_exit(seconds, "", "", rc);
}

void fault_watchdog_disarm(void)
{
    pthread_mutex_lock(&dog_lock);
    if (!dog_started) {
        pthread_mutex_unlock(&dog_lock);
        return;
    }
    dog_armed = 0;
    pthread_cond_broadcast(&dog_cond);
    pthread_mutex_unlock(&dog_lock);
}

int fault_end_job(int rc)
{
    int init = 0, fin = 0, size = 1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rc != ISTH_OK && size > 1) {
        /* the others may be waiting for this rank in a collective: a clean
         * return would leave them there. A rank that only learned of the
         * failure (an agreement) gives the rank that found it a moment to
         * print its line and abort first. */
        fflush(stdout);
        fflush(stderr);
        if (!status_printed_error()) {
            /* a held-back bad-input line is printed only if rank 0 (which
             * reports what every rank sees) has not ended the job by then */
            /* the job's end arrives as SIGTERM from mpirun: let it end us
             * (training installs a handler that only raises a flag) */
            signal(SIGTERM, SIG_DFL);
            signal(SIGUSR1, SIG_DFL);
            struct timespec ts = {status_has_suppressed() ? FAULT_SUPPRESSED_DELAY_S : FAULT_QUIET_ABORT_DELAY_S, 0};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
            status_print_suppressed();
        }
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    return rc;
}
