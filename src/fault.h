/* fault.h — the job's failure policy and the test hooks that inject faults.
 *
 * Owns: how an MPI error reaches the code (MPI_ERRORS_RETURN on the
 * communicators isthmus owns, so every CHECK_MPI is live), how a runtime
 * failure ends a multi-rank job (MPI_Abort after the one-line message, so no
 * rank waits for one that gave up), and every test hook that makes a fault
 * happen on purpose. The hooks, read from the environment (the site hooks
 * once; ISTHMUS_FAIL_ALLOC at each allocation, so tests can set it late):
 *   ISTHMUS_LINK_CORRUPT=SITE:N   (link.c) flip a byte in exchange N's payloads
 *   ISTHMUS_LINK_DELAY=SITE:S     (link.c) post sends S polls late
 *   ISTHMUS_LINK_MUTE=SITE:1      (link.c) never send payloads (a cut link)
 *   ISTHMUS_WIRE_PORT_SHIFT=SITE:N (train.c, wire_conn.c) connect to other sites'
 *                                 ranks at their port + N (a proxy, tests/wan/tamper)
 *   ISTHMUS_NAN_AT=SITE:STEP      the ranks of SITE see a NaN loss at STEP
 *   ISTHMUS_FAIL_ALLOC=RANK:STEP  world rank RANK's first allocation during
 *                                 step STEP (0: during set-up) fails
 *   ISTHMUS_STOP_AT_STEP=N        every rank behaves as if signalled after N
 *   ISTHMUS_CKPT_STALL=SITE:S     a checkpoint write of SITE sleeps S seconds
 *                                 (to test the watchdog)
 *   ISTHMUS_BREAK_JOIN=SITE:N     (federation.c) the leader of SITE fails the
 *                                 merge of the sites' world, as Open MPI did
 *                                 under load, in its first N starts
 *                                 (ISTHMUS_START, which federated.sh sets)
 *   ISTHMUS_NO_SPACE_CHECK=1      (h5io.c) skip the free-space check, so a
 *                                 write runs out of space part-way
 * Must not: decide what a failure means for training (callers do), or exit
 * on its own except through fault_end_job.
 */
#ifndef ISTHMUS_FAULT_H
#define ISTHMUS_FAULT_H

#include <mpi.h>

/* After MPI_Init: errors on MPI_COMM_WORLD (and the communicators split
 * from it, which inherit the handler) are returned, not fatal. */
int fault_mpi_errors_return(MPI_Comm comm);

/* The value N of a hook "SITE:N" whose SITE equals `name`, else 0. */
long fault_hook_for(const char *var, const char *name);

/* Which site this rank belongs to, for messages and site hooks. */
void fault_set_site(const char *site_name);

/* The trainer's step in progress (0 before the first), for step hooks. */
void fault_set_step(long step);
/* ISTHMUS_NAN_AT: does this rank's site see a NaN loss at this step? */
int fault_nan_now(void);
/* ISTHMUS_FAIL_ALLOC: should this allocation fail (once)? */
int fault_alloc_fails(void);

/* A deadline for work that waits without one of its own (a checkpoint's
 * parallel HDF5 collectives: a rank that fails inside one leaves the others
 * there; the federated set-up's collectives across sites). When `seconds`
 * pass before the disarm, a watchdog thread prints one line naming `what`
 * and the likely cause (`hint`) and ends the process with exit 1; mpirun
 * then ends the rest of the job. One armed at a time; arming again moves
 * the deadline. fault_watchdog_arm_exit ends it with `rc` instead: 3
 * (ISTH_EDROPPED) where starting the site again is the remedy, as for a
 * federated join that broke inside Open MPI. */
#define FAULT_HINT_IO "a rank stuck in parallel I/O?"
#define FAULT_HINT_NET                                                                                           \
    "no traffic between the sites' ranks? Open MPI's and the wire's ports must be open between the sites: "      \
    "jobs/README.md, Cross-site networking"
void fault_watchdog_arm(double seconds, const char *what, const char *hint);
void fault_watchdog_arm_exit(double seconds, const char *what, const char *hint, int rc);
void fault_watchdog_disarm(void);
/* A process that failed, on its way out: if MPI_Finalize has not returned
 * within `seconds`, exit with `rc` and no further line (a federated site
 * cut off from the others may wait there for peers it cannot reach). */
void fault_exit_within(double seconds, int rc);
#define FAULT_FINALIZE_S 15.0

/* End the job for status `rc`: in a multi-rank job any failure aborts every
 * rank with that exit code (the rank that found it has printed its line; a
 * bad input that only one rank saw must not leave the others waiting);
 * otherwise returns rc for main() to exit with. */
int fault_end_job(int rc);

#endif
