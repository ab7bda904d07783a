/* report.h — what one finished exchange reports: the record a site
 * reduction (reduce.h) or a butterfly pair (mix.h) fills as it finishes,
 * and metrics.c prints and writes as an `outer` or `mix` line.
 *
 * Owns: the report's fields and the sums over ranks they are made of.
 * Must not: hold behaviour (a type only: no module reaches another through
 * it).
 */
#ifndef ISTHMUS_REPORT_H
#define ISTHMUS_REPORT_H

#include <stdint.h>

#include "codec.h"

typedef struct {
    int fragment;
    uint64_t exchange;
    double payload_bytes;      /* encoded bytes this site sent (all its ranks) */
    double codec_rel_error;    /* ||sent - decoded|| / ||sent|| over this site */
    int accepted_sites, n_sites;
    char rejected[512];        /* "site: reason; ..." */
    int arrived_poll;          /* polls (inner steps) until everything had arrived; -1: at finish */
    int partner, crosses;      /* butterfly: partner learner, in another site */
    Codec codec;               /* butterfly: the payloads' codec (none in the final exact rounds) */
    int sent_poll;             /* polls before this rank posted its sends (0: at start; test hook) */
} ExchangeReport;

/* A payload's sums over ranks for its report (doubles only: reduced as an
 * array): encoded bytes sent, and the codec's error and signal energies. */
typedef struct {
    double bytes, err2, norm2;
} PayloadSums;
#define PAYLOAD_SUMS (sizeof(PayloadSums) / sizeof(double))

#endif
