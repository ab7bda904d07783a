/* planner.c — see planner.h; the formulas are derived in docs/planner.md. */
#include "planner.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"
#include "codec.h"
#include "link.h" /* LINK_MAX_FRAGMENTS: the fragments a tag can name */
#include "model.h"
#include "plan.h"
#include "status.h"

/* Dense (no sparsity) peaks per GPU, TFLOP/s, sources in docs/planner.md
 * (vendor datasheets): bf16 on tensor cores, and fp32 on CUDA cores — the
 * CUDA backend's fp32 runs without TF32 (cuda/gemm.cu). Memory per GPU:
 * the vendors' figures (A100 and H100 SXM 80 GB, H200 141 GB; DGX B200
 * 1,440 GB and HGX B300 2.3 TB for 8 GPUs; GB200 NVL72 13.4 TB for 72;
 * GB300 288 GB per GPU; MI300X 192 GB), read as GiB: HBM comes in binary
 * sizes (an H100's 80 GB is 81,559 MiB in nvidia-smi, 79.6 GiB), so a
 * peak within a GiB or two of the figure is already too much. */
static const struct {
    const char *name;
    double bf16, fp32, mem_gib;
    const char *what;
} gpu_types[] = {
    {"a100", 312, 19.5, 80, "NVIDIA A100 SXM 80GB"},
    {"h100", 989, 67, 80, "NVIDIA H100 SXM"},
    {"h200", 989, 67, 141, "NVIDIA H200 SXM"},
    {"b200", 2250, 75, 180, "NVIDIA B200 (HGX)"},
    {"b300", 2250, 75, 288, "NVIDIA B300 (HGX Blackwell Ultra)"},
    {"gb200", 2500, 75, 186, "NVIDIA GB200 (NVL72, per GPU)"},
    {"gb300", 2500, 80, 288, "NVIDIA GB300 (NVL72, per GPU)"},
    {"mi300x", 1307, 163.4, 192, "AMD Instinct MI300X"},
};
#define N_GPU_TYPES ((int)(sizeof gpu_types / sizeof gpu_types[0]))

void planner_print_gpus(void)
{
    for (int i = 0; i < N_GPU_TYPES; i++)
        printf("  %-7s %6.0f TFLOP/s bf16, %5.1f fp32, %3.0f GiB  %s\n", gpu_types[i].name, gpu_types[i].bf16,
               gpu_types[i].fp32, gpu_types[i].mem_gib, gpu_types[i].what);
}

int planner_parse_site(const char *text, PlanSite *out)
{
    memset(out, 0, sizeof *out);
    char buf[256];
    if (strlen(text) >= sizeof buf) return isth_fail(ISTH_EINPUT, "plan: --site '%.40s...': too long", text);
    snprintf(buf, sizeof buf, "%s", text);
    char *gpu = strchr(buf, ':'), *count = gpu ? strchr(gpu + 1, ':') : NULL;
    if (!gpu || !count || gpu == buf)
        return isth_fail(ISTH_EINPUT, "plan: --site '%s': expected NAME:GPU:COUNT (e.g. east:gb300:64)", text);
    *gpu++ = '\0';
    *count++ = '\0';
    if (strlen(buf) >= sizeof out->name) return isth_fail(ISTH_EINPUT, "plan: --site '%s': name too long", text);
    snprintf(out->name, sizeof out->name, "%s", buf);
    char *end;
    const long n = strtol(count, &end, 10);
    if (*end || end == count || n < 1 || n > 1 << 24)
        return isth_fail(ISTH_EINPUT, "plan: --site '%s': GPU count '%s' is not a positive integer", text, count);
    out->gpus = (int)n;
    for (int i = 0; i < N_GPU_TYPES; i++)
        if (!strcasecmp(gpu, gpu_types[i].name)) {
            snprintf(out->gpu, sizeof out->gpu, "%s", gpu_types[i].name);
            out->peak_bf16 = gpu_types[i].bf16;
            out->peak_fp32 = gpu_types[i].fp32;
            out->mem_gib = gpu_types[i].mem_gib;
            return ISTH_OK;
        }
    const double peak = strtod(gpu, &end);
    if (*end || end == gpu || !(peak > 0) || !isfinite(peak))
        return isth_fail(ISTH_EINPUT, "plan: --site '%s': GPU '%s' is neither a known type (isthmus plan --help lists "
                         "them) nor a peak in TFLOP/s", text, gpu);
    snprintf(out->gpu, sizeof out->gpu, "custom");
    out->peak_bf16 = out->peak_fp32 = peak; /* measured or given for the config's precision */
    return ISTH_OK;
}

/* A number with a unit suffix; the unit's factor, or -1 when unknown. */
static double with_unit(const char *s, const char *const *units, const double *factors, int n, double *value)
{
    char *end;
    *value = strtod(s, &end);
    if (end == s || !isfinite(*value)) return -1;
    while (isspace((unsigned char)*end)) end++;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(end, units[i])) return factors[i];
    return -1;
}

int planner_parse_link(const char *text, PlanLink *out)
{
    char buf[128];
    if (strlen(text) >= sizeof buf) return isth_fail(ISTH_EINPUT, "plan: --link '%.40s...': too long", text);
    snprintf(buf, sizeof buf, "%s", text);
    char *comma = strchr(buf, ',');
    if (!comma) return isth_fail(ISTH_EINPUT, "plan: --link '%s': expected RATE,RTT (e.g. 25Gbps,150ms)", text);
    *comma = '\0';
    static const char *const rates[] = {"bps", "kbps", "mbps", "gbps", "tbps", "bit/s", "kbit/s", "mbit/s", "gbit/s"};
    static const double rate_f[] = {1, 1e3, 1e6, 1e9, 1e12, 1, 1e3, 1e6, 1e9};
    static const char *const times[] = {"s", "ms", "us"};
    static const double time_f[] = {1, 1e-3, 1e-6};
    double v;
    const double rf = with_unit(buf, rates, rate_f, 9, &v);
    if (rf < 0 || !(v > 0))
        return isth_fail(ISTH_EINPUT, "plan: --link '%s': rate '%s' (a positive number with bps, Kbps, Mbps, Gbps "
                         "or Tbps)", text, buf);
    out->bits_per_s = v * rf;
    const double tf = with_unit(comma + 1, times, time_f, 3, &v);
    if (tf < 0 || v < 0)
        return isth_fail(ISTH_EINPUT, "plan: --link '%s': round trip '%s' (a number with s, ms or us)", text, comma + 1);
    out->rtt_s = v * tf;
    return ISTH_OK;
}

int planner_parse_storage(const char *text, double *bytes_per_s)
{
    static const char *const units[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s"};
    static const double f[] = {1, 1e3, 1e6, 1e9, 1e12};
    double v;
    const double uf = with_unit(text, units, f, 5, &v);
    if (uf < 0 || !(v > 0))
        return isth_fail(ISTH_EINPUT, "plan: --storage '%s': a positive rate with B/s, KB/s, MB/s, GB/s or TB/s "
                         "(e.g. 5GB/s)", text);
    *bytes_per_s = v * uf;
    return ISTH_OK;
}

const PlanSite *planner_site_of(const Config *cfg, int s, const PlanSite *sites, int n_sites)
{
    for (int i = 0; i < n_sites; i++)
        if (!strcmp(sites[i].name, cfg->sites[s].name)) return &sites[i];
    return NULL;
}

/* The config with each planned site's ranks set to its GPU count (the
 * layout planner_layout_sets made fits them: checked again here). */
static int planned_config(const Config *cfg, const PlanSite *sites, int n, Config *out)
{
    *out = *cfg;
    if (cfg->n_sites == 0) {
        if (n != 1)
            return isth_fail(ISTH_EINPUT, "plan: %s has no [site.*] sections: give one --site", cfg->source);
    } else if (n != cfg->n_sites) {
        return isth_fail(ISTH_EINPUT, "plan: %s has %d site(s); give one --site per [site.NAME]", cfg->source,
                         cfg->n_sites);
    }
    for (int i = 0; i < n; i++) {
        int s = -1;
        for (int j = 0; j < cfg->n_sites; j++)
            if (!strcmp(cfg->sites[j].name, sites[i].name)) s = j;
        if (cfg->n_sites == 0) {
            out->n_sites = 1;
            s = 0;
            memset(&out->sites[0], 0, sizeof out->sites[0]);
            snprintf(out->sites[0].name, sizeof out->sites[0].name, "%s", sites[i].name);
            out->sites[0].learner_ranks = sites[i].gpus;
            out->sites[0].micro_batch = cfg->train.micro_batch;
            out->sites[0].grad_accum = cfg->train.grad_accum;
            out->sites[0].speed = 1;
        }
        if (s < 0) return isth_fail(ISTH_EINPUT, "plan: --site %s: %s has no [site.%s]", sites[i].name, cfg->source,
                                    sites[i].name);
        SiteConfig *sc = &out->sites[s];
        if (sites[i].gpus % sc->learner_ranks != 0)
            return isth_fail(ISTH_EINPUT, "plan: --site %s: %d GPUs are not a whole number of learners of "
                             "[site.%s] learner_ranks = %d", sites[i].name, sites[i].gpus, sc->name, sc->learner_ranks);
        sc->ranks = sites[i].gpus;
    }
    return ISTH_OK;
}

/* Canonical values of each fragment (values[p], p < P) and all of them,
 * and their encoded bytes under the codec, chunk by chunk as the
 * payloads are encoded (bytes[p], *all_bytes). */
static int fragment_values(const ModelConfig *mc, int P, Codec codec, CodecParams cp, double *values, double *all,
                           double *bytes, double *all_bytes)
{
    Model m;
    model_describe(&m, mc, 0, mc->experts);
    ChunkTable ct;
    CHECK(chunk_table_create(&ct, &m, P));
    for (int p = 0; p < P; p++) values[p] = bytes[p] = 0;
    *all = *all_bytes = 0;
    for (int c = 0; c < ct.n_chunks; c++) {
        const double b = (double)codec_encoded_size(codec, ct.chunks[c].size, cp);
        values[ct.chunks[c].fragment] += (double)ct.chunks[c].size;
        bytes[ct.chunks[c].fragment] += b;
        *all += (double)ct.chunks[c].size;
        *all_bytes += b;
    }
    chunk_table_destroy(&ct);
    return ISTH_OK;
}

/* The compute of a step against the model FLOPs that MFU counts:
 * train.recompute = layer runs the forward pass (a third of 6 x params)
 * twice. Recomputed attention probabilities are left out: the CUDA
 * attention recomputes them whatever the setting, inside its MFU. */
static double plan_recompute_factor(const TrainConfig *t) { return config_recompute(t) == RECOMPUTE_LAYER ? 4.0 / 3.0 : 1.0; }

double planner_wire_s(double bytes, PlanLink l) { return bytes * 8.0 / (l.bits_per_s * PLAN_TCP_EFFICIENCY); }
double planner_link_rtts(const OuterConfig *oc) { return strcmp(oc->transport, "mpi") ? PLAN_LINK_RTTS_TCP : PLAN_LINK_RTTS_MPI; }
static double transfer_s(double bytes, PlanLink l, double rtts) { return planner_wire_s(bytes, l) + rtts * l.rtt_s; }

/* Utilisation and idle time of every site for a period of `steps` inner
 * steps paced by the slowest site, plus `stall` of waiting for the link. */
static void fill_mode(PlanMode *pm, const PlanResult *r, double steps, double stall, double link_busy)
{
    double slowest = 0;
    for (int s = 0; s < r->n_sites; s++) slowest = fmax(slowest, r->step_s[s]);
    pm->steps = steps;
    pm->link_stall_s = stall;
    pm->link_busy_s = link_busy;
    pm->period_s = steps * slowest + stall;
    pm->link_bound = link_busy > steps * slowest;
    if (pm->link_bound) { /* the link cannot carry a period's bytes in its compute time: it sets the pace */
        pm->link_stall_s = link_busy - steps * slowest;
        pm->period_s = link_busy;
    }
    for (int s = 0; s < r->n_sites; s++) {
        pm->utilisation[s] = steps * r->step_s[s] / pm->period_s;
        pm->idle_s[s] = steps * (slowest - r->step_s[s]);
    }
}

int planner_compute(const Config *cfg0, const PlanSite *sites, int n_sites, PlanLink link, double mfu,
                    PlanResult *r)
{
    memset(r, 0, sizeof *r);
    if (!(mfu > 0 && mfu <= 1)) return isth_fail(ISTH_EINPUT, "plan: --mfu %g: a fraction in (0, 1]", mfu);
    Config cfg;
    CHECK(planned_config(cfg0, sites, n_sites, &cfg));
    const ModelConfig *mc = &cfg.model;
    const OuterConfig *oc = &cfg.outer;
    const Codec codec = (Codec)codec_from_name(oc->codec);
    const CodecParams cp = config_codec_params(oc);
    const int H = oc->inner_steps, tau = oc->overlap;
    r->n_sites = cfg.n_sites;
    r->flops_per_token = model_flops_per_token(mc);
    const double rtts = r->rtts = planner_link_rtts(oc);
    int learners = 0;
    for (int s = 0; s < cfg.n_sites; s++) {
        const SiteConfig *sc = &cfg.sites[s];
        const PlanSite *ps = planner_site_of(&cfg, s, sites, n_sites);
        r->tokens_per_step[s] = (double)sc->ranks * sc->micro_batch * sc->grad_accum * mc->context;
        r->peak_tflops[s] = !strcmp(cfg.train.precision, "bf16") ? ps->peak_bf16 : ps->peak_fp32;
        r->step_s[s] = r->tokens_per_step[s] * r->flops_per_token * plan_recompute_factor(&cfg.train) /
                       (ps->gpus * r->peak_tflops[s] * 1e12 * mfu);
        learners += sc->ranks / sc->learner_ranks;
    }
    double slowest = 0;
    for (int s = 0; s < r->n_sites; s++) slowest = fmax(slowest, r->step_s[s]);
    const int S = r->n_sites, peers = S > 1 ? S - 1 : 0; /* every pair of sites has such a link */
    double frag[LINK_MAX_FRAGMENTS], all, fbytes[LINK_MAX_FRAGMENTS], all_bytes;

    /* sync: every step, the summed gradient of every parameter (the codec applies) */
    CHECK(fragment_values(mc, 1, codec, cp, frag, &all, fbytes, &all_bytes));
    PlanMode *m = &r->sync;
    m->payload_bytes = all_bytes;
    m->transfer_s = peers ? transfer_s(m->payload_bytes, link, rtts) : 0;
    fill_mode(m, r, 1, m->transfer_s, 0);
    m->link_busy_s = peers ? planner_wire_s(m->payload_bytes, link) : 0;

    /* diloco: every H steps, the whole pseudo-gradient, blocking */
    m = &r->diloco;
    m->payload_bytes = all_bytes;
    m->transfer_s = peers ? transfer_s(m->payload_bytes, link, rtts) : 0;
    fill_mode(m, r, H, m->transfer_s, 0);
    m->link_busy_s = peers ? planner_wire_s(m->payload_bytes, link) : 0;

    /* streaming: P fragments, each once per H steps, each exchange hidden
     * behind tau inner steps; what it does not hide stalls the step */
    const int P = oc->mode_id == MODE_STREAMING ? oc->fragments : mc->layers;
    CHECK(fragment_values(mc, P, codec, cp, frag, &all, fbytes, &all_bytes));
    m = &r->streaming;
    double stall = 0, busy = 0, largest = 0;
    for (int p = 0; p < P; p++) {
        const double bytes = fbytes[p], x = peers ? transfer_s(bytes, link, rtts) : 0;
        stall += fmax(0.0, x - tau * slowest);
        busy += peers ? planner_wire_s(bytes, link) : 0;
        if (bytes > largest) largest = bytes;
    }
    m->payload_bytes = largest;
    m->transfer_s = peers ? transfer_s(largest, link, rtts) : 0;
    fill_mode(m, r, H, stall, busy);

    /* butterfly: 2^k learners, one round every H steps, each learner
     * trading one fragment with its partner; with the sites' learners in
     * contiguous blocks, the rounds whose bit splits the sites cross the
     * link, each carrying every learner of the site's fragment */
    r->butterfly_learners = (learners >= 2 && (learners & (learners - 1)) == 0) ? learners : 0;
    if (r->butterfly_learners && S > 1) {
        int k = 0;
        while ((1 << k) < learners) k++;
        const int Pb = oc->mode_id == MODE_BUTTERFLY ? oc->fragments : 1;
        CHECK(fragment_values(mc, Pb, codec, cp, frag, &all, fbytes, &all_bytes));
        const int per_site = learners / S;
        int crossing = 0; /* rounds of k whose partner is at another site */
        for (int j = 0; j < k; j++) crossing += (1 << j) >= per_site;
        m = &r->butterfly;
        m->payload_bytes = fbytes[0] * per_site;
        m->transfer_s = transfer_s(m->payload_bytes, link, rtts);
        const double x_stall = fmax(0.0, m->transfer_s - tau * slowest);
        fill_mode(m, r, (double)H * k, crossing * x_stall, crossing * planner_wire_s(m->payload_bytes, link));
    }
    return ISTH_OK;
}

long planner_smallest_h(const Config *cfg0, const PlanSite *sites, int n, PlanLink link, double mfu, double target,
                        int streaming)
{
    Config c = *cfg0;
    for (long H = 1; H <= 1L << 20; H = H < 16 ? H + 1 : H + H / 8) {
        if (streaming && (H <= c.outer.overlap || H < c.outer.fragments)) continue;
        c.outer.inner_steps = (int)H;
        PlanResult r;
        const int was = status_set_quiet(1);
        const int rc = planner_compute(&c, sites, n, link, mfu, &r);
        status_set_quiet(was);
        if (rc != ISTH_OK) return -1;
        /* the slowest site's: with the sites balanced (the line before says
         * how) every site does as well; a faster site's idle time is the
         * imbalance, not the link's */
        const PlanMode *m = streaming ? &r.streaming : &r.diloco;
        double u = 1;
        for (int s = 0; s < r.n_sites; s++) u = fmin(u, m->utilisation[s] + m->idle_s[s] / m->period_s);
        if (u >= target) return H;
    }
    return -1;
}
