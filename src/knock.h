/* knock.h — how the leaders of two sites meet through Open MPI's name
 * service (ompi-server), and a leader's wait for the other sites.
 *
 * The knock: Open MPI pairs a connect with whatever accept is pending on
 * the port; a leader's accept that times out (3 s, main.c) while a connect
 * is half done leaves that connect hanging (seen about once in 20 joins).
 * So neither side waits in accept/connect on spec: the joiner publishes
 * "<service>-knock-<site>" with a fresh value per attempt, the host answers
 * "<service>-come-<site>-<value>" with that value (and its port) just
 * before it accepts, and the joiner connects to the port that answer names
 * when it reads its own value back. Both calls then start within a poll of
 * each other. A name service lookup of a missing name returns at once. A
 * newer publish of a name by another process does not replace the older
 * value, and after a connect not even one by the same process (Open MPI
 * 4.1): an answer is withdrawn before it is published again, and each
 * knock's answer has a name of its own, so that a site that answered an
 * earlier knock for a moment (it hosted before it learned it was dropped)
 * cannot stand in front of the live host's answer. A live host that sees a
 * knock between steps answers "busy-<value>-<beat>" at once (knock_ack), the
 * beat counting its polls: it comes once its checkpoint is written (or, a
 * host left alone, once every site out knocks), and the joiner waits for it
 * while the beat moves, past its own deadline; busy_max_s after the last
 * move the host has stalled.
 *
 * Owns: the knock's names and values, the host's answers and its accept,
 * the joiner's knock and connect, the poll interval, and the wait (its
 * deadline, a note every minute, the stop signal, the watchdog re-armed at
 * every poll when there is no deadline).
 * Must not: open or publish the run's port, verify the other side
 * (handshake.h), or build the world.
 */
#ifndef ISTHMUS_KNOCK_H
#define ISTHMUS_KNOCK_H

#include <signal.h>

#include <mpi.h>

/* the interval of every poll of the name service (and of a leader's wait) */
#define KNOCK_POLL_S 0.05
/* a joiner answered "busy" looks this often whether the run's name still
 * names the host it knocked at (a host whose run ended withdrew it) */
#define KNOCK_HOST_LOOK_S 1.0
void knock_sleep(double s);

/* A leader's wait for the other sites: until a deadline, or without a
 * limit until a stop signal, saying every minute whom it waits for. */
typedef struct {
    double started, deadline, next_note;
    double busy_max_s;   /* how long a live host's "busy" keeps a joiner waiting past its last beat */
    double heartbeat_s;  /* no deadline: every poll re-arms the watchdog for this long */
    char limit[64];      /* "up to 120 s" or "no limit: until stopped" */
    const volatile sig_atomic_t *stop_flag; /* the caller's, raised by a stop signal (may be NULL) */
    int *stopped;        /* set when the wait ended on that signal; a wait already stopped ends at once */
} KnockWait;

/* join_timeout > 0: the deadline, seconds from now; 0: none. */
void knock_wait_start(KnockWait *w, double join_timeout, double busy_max_s, double heartbeat_s,
                      const volatile sig_atomic_t *stop_flag, int *stopped);
/* Called at every poll of the wait: 1 to poll again; 0 when the wait is
 * over, on a stop signal (*stopped set) or past the deadline. */
int knock_wait_on(KnockWait *w, const char *whom);

/* Host: the value site `site` knocks with now ("" when none) under the
 * run's name `service`. */
void knock_value(const char *service, int site, char *value);
/* Host, at every poll that sees a knock it has not taken yet:
 * "busy-<value>-<beat>", so that the knocker knows a live run will answer
 * and, by the beat moving, that it still lives. */
void knock_ack(const char *service, int site, const char *value, unsigned long beat);
/* Host: answer the knock `value` with `port`, then accept the joiner's
 * connect on it (MPI_COMM_SELF). 1 with *c the leaders' link; 0 when
 * nobody connected (*c = MPI_COMM_NULL). */
int knock_accept(const char *service, const char *port, int site, const char *value, MPI_Comm *c);
/* Joiner (site `site`): knock, wait for the host's answer with our value,
 * connect to the port it names (copied into port[MPI_MAX_PORT_NAME]).
 * probe_s > 0: give up after that long unless a live host has answered
 * "busy". A busy answer whose beat moves extends the wait (w's deadline
 * too) to w->busy_max_s past the move, while the run's name still names
 * the host (port, on entry) knocked at; *busy: the host answered busy and
 * the run's name was still there when the wait ended (no longer when the
 * host withdrew it: its run ended). *c stays
 * MPI_COMM_NULL when the wait ends or the connect fails. ISTH_ERUNTIME only
 * when the knock cannot be published. */
int knock_connect(const char *service, int site, KnockWait *w, const char *whom, double probe_s, char *port,
                  MPI_Comm *c, int *busy);

#endif
