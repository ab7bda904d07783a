/* knock.c — see knock.h. */
#include "knock.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "clock.h"
#include "fault.h"
#include "status.h"

#define KNOCK_NOTE_S 60.0 /* a waiting leader says whom it waits for this often */

void knock_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void knock_name(const char *service, const char *what, int site, char *out, size_t size)
{
    snprintf(out, size, "%s-%s-%d", service, what, site);
}

/* The answer to one knock lives under a name of its own (the knock's
 * value in it): a site that hosted for a moment before it learned it was
 * dropped may have answered the site's earlier knock "busy", and Open
 * MPI's name service keeps that entry (its publisher gone or not) beside
 * the live host's under a shared name, a lookup returning either. */
static void answer_name(const char *service, int site, const char *value, char *out, size_t size)
{
    snprintf(out, size, "%s-come-%d-%.63s", service, site, value);
}

void knock_value(const char *service, int site, char *value)
{
    char name[160];
    knock_name(service, "knock", site, name, sizeof name);
    if (MPI_Lookup_name(name, MPI_INFO_NULL, value) != MPI_SUCCESS) value[0] = '\0';
}

void knock_ack(const char *service, int site, const char *value, unsigned long beat)
{
    char name[240], busy[128];
    answer_name(service, site, value, name, sizeof name);
    snprintf(busy, sizeof busy, "busy-%.63s-%lu", value, beat);
    MPI_Unpublish_name(name, MPI_INFO_NULL, busy); /* as knock_accept's answer: a publish may not replace */
    MPI_Publish_name(name, MPI_INFO_NULL, busy);
}

int knock_accept(const char *service, const char *port, int site, const char *value, MPI_Comm *c)
{
    char name[240], answer[MPI_MAX_PORT_NAME];
    answer_name(service, site, value, name, sizeof name);
    *c = MPI_COMM_NULL;
    /* the answer names the port: the run's name may meanwhile hold another
     * one (a site that hosted for a moment before it learned it was dropped) */
    if ((size_t)snprintf(answer, sizeof answer, "%.63s|%s", value, port) >= sizeof answer) return 0;
    /* withdrawn first: after this process's connect to another site, Open
     * MPI's name service kept the old value (the "busy") under a publish
     * that replaced it, returning success: the second of two sites taken
     * back together never saw its answer */
    MPI_Unpublish_name(name, MPI_INFO_NULL, answer);
    if (MPI_Publish_name(name, MPI_INFO_NULL, answer) != MPI_SUCCESS) return 0;
    /* bounded by pmix_base_exchange_timeout (main.c) */
    if (MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, c) != MPI_SUCCESS) {
        *c = MPI_COMM_NULL;
        return 0;
    }
    MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
    return 1;
}

/* --- the wait ------------------------------------------------------------------------------- */

void knock_wait_start(KnockWait *w, double join_timeout, double busy_max_s, double heartbeat_s,
                      const volatile sig_atomic_t *stop_flag, int *stopped)
{
    w->started = now_s();
    w->next_note = w->started + KNOCK_NOTE_S;
    w->busy_max_s = busy_max_s;
    w->heartbeat_s = heartbeat_s;
    w->stop_flag = stop_flag;
    w->stopped = stopped;
    w->deadline = join_timeout > 0 ? w->started + join_timeout : -1.0;
    if (w->deadline < 0) snprintf(w->limit, sizeof w->limit, "no limit: until stopped");
    else snprintf(w->limit, sizeof w->limit, "up to %.0f s", join_timeout);
}

int knock_wait_on(KnockWait *w, const char *whom)
{
    const double t = now_s();
    if (*w->stopped) return 0;
    if (w->stop_flag && *w->stop_flag) {
        *w->stopped = 1;
        printf("federation: stopped by a signal while waiting for %s (%.0f s): the run did not form, nothing "
               "trained\n", whom, t - w->started);
        fflush(stdout);
        return 0;
    }
    if (w->deadline >= 0 && t > w->deadline) return 0;
    /* a poll that never returns: a call to a name service that went away
     * mid-call (nameserver.h); exit 3, and the site script starts the site
     * again with the server there is now */
    if (w->deadline < 0)
        fault_watchdog_arm_exit(w->heartbeat_s, "one poll of the wait for the other sites",
                                "a call to the name service that never returned: ompi-server gone?", ISTH_EDROPPED);
    if (t >= w->next_note) {
        printf("federation: still waiting for %s (%.0f min so far; %s)\n", whom, (t - w->started) / 60.0, w->limit);
        fflush(stdout);
        w->next_note += KNOCK_NOTE_S;
    }
    return 1;
}

/* --- the joiner ----------------------------------------------------------------------------- */

int knock_connect(const char *service, int site, KnockWait *w, const char *whom, double probe_s, char *port,
                  MPI_Comm *c, int *busy)
{
    unsigned char raw[16];
    char value[2 * sizeof raw + 1], come[MPI_MAX_PORT_NAME], name[240];
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(value, sizeof value, raw, sizeof raw);
    knock_name(service, "knock", site, name, sizeof name);
    if (MPI_Publish_name(name, MPI_INFO_NULL, value) != MPI_SUCCESS)
        return isth_fail(ISTH_ERUNTIME, "federation: cannot publish '%s' in the name service", name);
    answer_name(service, site, value, name, sizeof name);
    int answered = 0;
    char beat[MPI_MAX_PORT_NAME] = "", host[MPI_MAX_PORT_NAME], now_host[MPI_MAX_PORT_NAME];
    snprintf(host, sizeof host, "%s", port); /* the port the run's name gave: the host knocked at */
    double give_up = now_s() + probe_s, next_look = now_s() + KNOCK_HOST_LOOK_S;
    *busy = 0;
    while (!answered && ((probe_s <= 0 && !*busy) || now_s() < give_up) && knock_wait_on(w, whom)) {
        /* a host that said busy and then ended (its run complete) withdrew
         * the run's name: no live host (*busy 0); another site that hosts
         * now took it: this wait is over, the knock goes to that one */
        if (*busy && now_s() >= next_look) {
            next_look = now_s() + KNOCK_HOST_LOOK_S;
            const int named = MPI_Lookup_name(service, MPI_INFO_NULL, now_host) == MPI_SUCCESS;
            if (!named) *busy = 0;
            if (!named || strcmp(now_host, host)) break;
        }
        const int found = MPI_Lookup_name(name, MPI_INFO_NULL, come) == MPI_SUCCESS;
        const size_t n = strlen(value);
        if (found && !strncmp(come, value, n) && come[n] == '|' && come[n + 1]) {
            answered = 1;
            snprintf(port, MPI_MAX_PORT_NAME, "%s", come + n + 1); /* the answering host's port */
        } else if (found && !strncmp(come, "busy-", 5) && !strncmp(come + 5, value, n) && come[5 + n] == '-' &&
                   strcmp(come + 6 + n, beat)) {
            /* a live host whose beat moved: it comes once its checkpoint is
             * written, or (left alone) once every site out knocks */
            *busy = 1;
            snprintf(beat, sizeof beat, "%s", come + 6 + n);
            give_up = now_s() + w->busy_max_s;
            if (w->deadline >= 0 && w->deadline < give_up) w->deadline = give_up;
        }
        if (!answered) knock_sleep(KNOCK_POLL_S);
    }
    *c = MPI_COMM_NULL;
    if (answered && MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, c) != MPI_SUCCESS) *c = MPI_COMM_NULL;
    knock_name(service, "knock", site, name, sizeof name);
    MPI_Unpublish_name(name, MPI_INFO_NULL, value); /* a later host poll finds no stale knock */
    return ISTH_OK;
}
