/* planner.h — `isthmus plan`'s arithmetic: what a run of a config would
 * achieve on given sites (GPU type and count) joined by a given link, from
 * the config, a FLOP model and the link's rate and round trip alone.
 *
 * Owns: the table of GPU types, their dense bf16 and fp32 peaks and memory
 * (sourced in docs/planner.md), the parsing of `--site NAME:GPU:COUNT`,
 * `--link RATE,RTT` and `--storage RATE`, and the time model of each mode:
 * inner-step time per site (tokens per step x FLOPs per token / (GPUs x
 * peak x MFU)), the outer payload per fragment after the codec, its
 * transfer time (bytes / (rate x PLAN_TCP_EFFICIENCY) + the transport's
 * round trips), and from those the compute utilisation of each mode, each
 * site's idle time, the link's busy share, and the smallest H for a target
 * utilisation. docs/planner.md derives the formulas; tests/cli_plan.sh
 * checks them against hand arithmetic and docs/results/the-wan.md against
 * measured runs.
 * Must not: print a plan (planner_report.h), change a config's layout
 * (planner_layout.h), allocate a model or talk to other ranks (no MPI);
 * its sizes come from the modules that allocate (model, plan, codec).
 */
#ifndef ISTHMUS_PLANNER_H
#define ISTHMUS_PLANNER_H

#include "config.h"

/* Round trips an exchange costs on top of its bytes. outer.transport = tcp
 * (isthmus's own connections, wire.h): the data's one way and the
 * verdict's way back; a chunk goes as soon as a socket has room, into a
 * receive posted or kept until one is. outer.transport = mpi: one more,
 * the rendezvous of a large MPI message (its request to send and the
 * receiver's answer) before the data flows. */
#define PLAN_LINK_RTTS_TCP 1.0
#define PLAN_LINK_RTTS_MPI 2.0
/* Payload bytes per byte on the wire: a full TCP segment carries 1448 bytes
 * in a 1500-byte IP packet (20 IP + 20 TCP + 12 timestamp option). */
#define PLAN_TCP_EFFICIENCY (1448.0 / 1500.0)
/* Bytes per second one core seals or opens (XChaCha20-Poly1305, seal.h):
 * `isthmus bench` measures it (docs/benchmarks.md: 1.39 GB/s on one core of
 * the 2-core EPYC VM, unloaded); this floor is under half of that. */
#define PLAN_SEAL_BYTES_PER_S 0.6e9
#define PLAN_MAX_SITES CONFIG_MAX_SITES

typedef struct {
    char name[CONFIG_NAME_MAX];
    char gpu[32];       /* a type of the table, or "custom" for a number */
    double peak_bf16, peak_fp32; /* dense, per GPU; a number given: both (a CPU's measured rate) */
    double mem_gib;     /* the GPU's memory (0: unknown, a peak given as a number) */
    int gpus;           /* ranks of the site */
} PlanSite;

typedef struct {
    double bits_per_s;
    double rtt_s;
} PlanLink;

/* "east:gb300:64" (a table type) or "a:0.047:1" (peak TFLOP/s as a number);
 * ISTH_EINPUT naming the text otherwise. */
int planner_parse_site(const char *text, PlanSite *out);
/* "25Gbps,150ms" (rates: bps, Kbps, Mbps, Gbps, Tbps; times: s, ms, us). */
int planner_parse_link(const char *text, PlanLink *out);
/* "5GB/s" (B/s, KB/s, MB/s, GB/s, TB/s; decimal): bytes per second. */
int planner_parse_storage(const char *text, double *bytes_per_s);
/* The known GPU types, one per line (for --help and errors). */
void planner_print_gpus(void);

/* What one mode achieves, per site and overall. */
typedef struct {
    double period_s;                    /* wall time of one outer period (H steps; sync: one step) */
    double steps;                       /* inner steps in that period */
    double utilisation[PLAN_MAX_SITES]; /* inner-step time / wall time, per site */
    double idle_s[PLAN_MAX_SITES];      /* per period: waiting for a slower site */
    double link_stall_s;                /* per period: waiting for the link (every site) */
    double payload_bytes;               /* one site's encoded payload of one exchange */
    double transfer_s;                  /* one exchange: bytes / (rate x TCP efficiency) + the transport's round trips */
    double link_busy_s;                 /* per period: the link's time carrying one site's payloads */
    int link_bound;                     /* the link's busy time exceeds the compute time */
} PlanMode;

typedef struct {
    int n_sites;
    double step_s[PLAN_MAX_SITES];    /* inner step time per site */
    double peak_tflops[PLAN_MAX_SITES]; /* the peak used: the config's precision (train.precision) */
    double tokens_per_step[PLAN_MAX_SITES];
    double flops_per_token;
    PlanMode sync, diloco, streaming, butterfly;
    int butterfly_learners;           /* 0: butterfly not possible (learners not a power of two) */
    double rtts;                      /* round trips an exchange costs (the transport's) */
} PlanResult;

/* The arithmetic alone (no printing): cfg's layout, whose [site.*] ranks
 * are the --site counts (planner_layout_sets makes it so). */
int planner_compute(const Config *cfg, const PlanSite *sites, int n_sites, PlanLink link, double mfu,
                    PlanResult *out);

/* The --site entry of cfg's site s (NULL when none names it). */
const PlanSite *planner_site_of(const Config *cfg, int s, const PlanSite *sites, int n_sites);

/* Seconds on the wire for `bytes` of payload (TCP's headers counted), and
 * with the transport's round trips (planner_link_rtts) added. */
double planner_wire_s(double bytes, PlanLink link);
double planner_link_rtts(const OuterConfig *oc);

/* The smallest H (diloco, or streaming) at which the slowest site reaches
 * `target`, its own imbalance aside; -1 when none up to 2^20. */
long planner_smallest_h(const Config *cfg, const PlanSite *sites, int n, PlanLink link, double mfu, double target,
                        int streaming);

#endif
