/* clock.h — the one clock for durations: monotonic seconds (deadlines,
 * step times, throughput). Never the wall clock, which can jump; wall_s
 * only for times that are compared across processes (sites on one host,
 * or hosts kept in step by NTP) and the metrics records' timestamps, and
 * never for a deadline.
 * Owns: now_s and wall_s.
 * Must not: sleep, or keep state. */
#ifndef ISTHMUS_CLOCK_H
#define ISTHMUS_CLOCK_H

#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
