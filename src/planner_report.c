/* planner_report.c — see planner_report.h; docs/planner.md explains each
 * figure. */
#include "planner_report.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt.h"
#include "codec.h"
#include "expert_split_report.h"
#include "memory.h"
#include "model.h"
#include "outer.h"
#include "plan.h"
#include "status.h"

#define GIB 1073741824.0

/* The bpb each codec cost where it was measured (docs/results/; the test
 * recomputes each figure from the rows cited). bf16, int8 and fp4 against
 * codec none in one suite, the same runs otherwise; topk against sync,
 * beside fp4 DiLoCo of the same suite, since no run set it beside none. */
static const struct {
    const char *codec, *cost, *where;
} codec_costs[] = {
    {"none", "the reference", "choosing-a-mode.md, four learners: streaming_h50_none"},
    {"bf16", "-0.55% / +0.02% against none", "choosing-a-mode.md, four learners: streaming_h50_bf16"},
    {"int8", "+0.12% / +0.10% against none", "choosing-a-mode.md, four learners: streaming_h50_int8"},
    {"fp4", "+0.71% / -1.18% against none", "choosing-a-mode.md, four learners: streaming_h50_fp4"},
    {"topk", "+3.02% / +1.84% against sync (fp4 DiLoCo there: +2.04% / -0.50%)",
     "sparse-payloads.md: topkh16_adamw_lr0.001_1600_s42 (32 of 4,096, H = 16; diloco_adamw_lr0.001_1600_s42)"},
};
#define N_CODECS ((int)(sizeof codec_costs / sizeof codec_costs[0]))

/* The config's own mode's figures (butterfly without a power of two of
 * learners cannot run: diloco's). */
static const PlanMode *mode_of(const PlanResult *r, OuterMode mode)
{
    switch (mode) {
    case MODE_SYNC: return &r->sync;
    case MODE_STREAMING: return &r->streaming;
    case MODE_BUTTERFLY: return r->butterfly_learners ? &r->butterfly : &r->diloco;
    default: return &r->diloco;
    }
}

static double slowest_step(const PlanResult *r)
{
    double t = 0;
    for (int s = 0; s < r->n_sites; s++) t = fmax(t, r->step_s[s]);
    return t;
}

static void print_mode(const char *name, const char *shape, const PlanMode *m, const PlanResult *r, const Config *cfg)
{
    double worst = 1;
    for (int s = 0; s < r->n_sites; s++) worst = fmin(worst, m->utilisation[s]);
    printf("  %-10s %-24s %12.6g MB %9.3f s %9.3f s %8.1f%%", name, shape, m->payload_bytes / 1e6, m->transfer_s,
           m->period_s, 100.0 * worst);
    for (int s = 0; s < r->n_sites; s++) printf(" | %s %5.1f%% idle %.2f s", cfg->sites[s].name, 100 * m->utilisation[s],
                                                 m->idle_s[s] + m->link_stall_s);
    printf("%s\n", m->link_bound ? " | link-bound" : "");
}

/* The layout's --set lines that change the config, a line per site. */
static void print_layout(const Config *cfg, const PlanInputs *in)
{
    int any = 0;
    for (int i = 0; i < in->n_layout; i++) any |= in->layout[i].changed;
    if (!any) {
        printf("layout: the config's [site.*] sections fit the --site counts as they are\n");
        return;
    }
    printf("layout for the --site counts (applied in this plan; put them in the config, or pass them to train):\n");
    for (int s = 0; s < cfg->n_sites; s++) {
        char prefix[PLAN_SET_MAX];
        snprintf(prefix, sizeof prefix, "site.%s.", cfg->sites[s].name);
        int shown = 0;
        for (int i = 0; i < in->n_layout; i++)
            if (in->layout[i].changed && !strncmp(in->layout[i].text, prefix, strlen(prefix)))
                printf("%s--set %s", shown++ ? " " : "  ", in->layout[i].text);
        if (shown)
            printf("   (%d learner(s) of %d, %d expert(s) per rank)\n", cfg->sites[s].ranks / cfg->sites[s].learner_ranks,
                   cfg->sites[s].learner_ranks, cfg->model.experts / cfg->sites[s].learner_ranks);
    }
}

/* Each site's largest rank against its GPU; the table of the largest of
 * all. `refusal` (cap bytes): what does not fit, "" when every site does. */
static int print_memory(const Config *cfg0, const PlanSite *sites, int n_sites, char *refusal, size_t cap_bytes)
{
    Config cfg = *cfg0;
    if (!strcmp(cfg.train.backend, "auto")) /* on the sites' GPUs, auto is the CUDA backend */
        snprintf(cfg.train.backend, sizeof cfg.train.backend, "cuda");
    int world = 0;
    for (int s = 0; s < cfg.n_sites; s++) world += cfg.sites[s].ranks;
    printf("memory per GPU (%s mode; %s), each site's largest rank against its GPU:\n", cfg.outer.mode,
           memory_on_gpu(&cfg.train) ? "the CUDA backend's buffers" : "the CPU backend's buffers: train.backend = cpu");
    MemoryPlan most = {0};
    long most_rank = 0;
    size_t used = 0;
    refusal[0] = '\0';
    for (int s = 0, first = 0; s < cfg.n_sites; first += cfg.sites[s].ranks, s++) {
        MemoryPlan mp;
        long rank;
        CHECK(memory_plan_largest(&cfg, world, first, cfg.sites[s].ranks, &mp, &rank));
        const double gib = memory_total(&mp) / GIB;
        if (memory_total(&mp) > memory_total(&most)) most = mp, most_rank = rank;
        const PlanSite *ps = planner_site_of(&cfg, s, sites, n_sites);
        const double cap = ps ? ps->mem_gib : 0;
        printf("  %-8s %-7s world rank %-6ld %8.2f GiB", cfg.sites[s].name, ps ? ps->gpu : "?", rank, gib);
        if (!(cap > 0)) {
            printf(" (the GPU's memory is unknown: a peak given as a number)\n");
            continue;
        }
        printf(" of %.0f GiB (%.0f%%)%s\n", cap, 100 * gib / cap,
               gib > cap         ? ": does not fit"
               : gib > 0.9 * cap ? ": tight, under 10% left for what is not predicted (CUDA context, NCCL and cuBLAS "
                                   "workspaces, fragmentation)"
                                 : "");
        if (gib > cap && used < cap_bytes) {
            const int G = cfg.sites[s].learner_ranks, N = cfg.sites[s].ranks, E = cfg.model.experts;
            int gmax = N < E ? N : E;
            while (gmax > 1 && (N % gmax || E % gmax)) gmax--;
            int w = snprintf(refusal + used, cap_bytes - used,
                             "%ssite %s: %.1f GiB per GPU (world rank %ld) does not fit its %s's %.0f GiB", used ? "; " : "",
                             cfg.sites[s].name, gib, rank, ps->gpu, cap);
            if (w > 0 && (size_t)w < cap_bytes - used && gmax > G)
                w += snprintf(refusal + used + w, cap_bytes - used - w,
                              " (learner_ranks = %d would hold %d expert(s) per rank, not %d)", gmax, E / gmax, E / G);
            if (w > 0) used = used + (size_t)w < cap_bytes ? used + (size_t)w : cap_bytes;
        }
    }
    memory_print(&most, world, (int)most_rank);
    return ISTH_OK;
}

/* The batches that balance the sites, and what they change. */
static int print_balance(const Config *cfg, const PlanSite *sites, int n_sites, const PlanInputs *in,
                         const PlanResult *r)
{
    const double slowest = slowest_step(r);
    double fastest = 1e300;
    for (int s = 0; s < r->n_sites; s++) fastest = fmin(fastest, r->step_s[s]);
    if (r->n_sites < 2 || slowest <= fastest * 1.001) return ISTH_OK;
    printf("the sites' steps differ (%.4g s against %.4g s): the faster idles %.1f%% of each period; give it %.3gx "
           "the tokens per step (micro_batch or grad_accum) to balance", fastest, slowest,
           100.0 * (1 - fastest / slowest), slowest / fastest);
    PlanSet sets[PLAN_MAX_SETS];
    int n = 0;
    Config balanced;
    planner_balance_sets(cfg, r, sets, &n, &balanced);
    if (!n) {
        printf(" (no whole grad_accum comes nearer)\n");
        return ISTH_OK;
    }
    printf(" (micro_batch kept, so the memory above holds):\n ");
    for (int i = 0; i < n; i++) printf(" --set %s", sets[i].text);
    printf("\n");
    PlanResult b;
    CHECK(planner_compute(&balanced, sites, n_sites, in->link, in->mfu, &b));
    const PlanMode *m0 = mode_of(r, cfg->outer.mode_id), *m1 = mode_of(&b, cfg->outer.mode_id);
    printf("  with it:");
    for (int s = 0; s < r->n_sites; s++)
        printf("%s %s step %.4g s, %.0f tokens, %s utilisation %.1f%% -> %.1f%%", s ? ";" : "", cfg->sites[s].name,
               b.step_s[s], b.tokens_per_step[s], cfg->outer.mode, 100 * m0->utilisation[s], 100 * m1->utilisation[s]);
    printf("\n");
    return ISTH_OK;
}

/* The largest share of one fragment's encoded bytes that one rank of a
 * site's first learner owns (it goes to the other site over that rank's
 * connections), over the sites' learner sizes. */
static int busiest_share(const Config *cfg, double *share, int *site, int *rank)
{
    const OuterConfig *oc = &cfg->outer;
    const Codec codec = (Codec)codec_from_name(oc->codec);
    const CodecParams cp = config_codec_params(oc);
    const int P = oc->mode_id == MODE_STREAMING ? oc->fragments : 1;
    Model m;
    model_describe(&m, &cfg->model, 0, cfg->model.experts);
    ChunkTable ct;
    CHECK(chunk_table_create(&ct, &m, P));
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[512];
    const int split = expert_split_on(cfg) && !expert_split_assign(cfg, &x, why, sizeof why, &bad);
    *share = 0;
    *site = *rank = 0;
    int rc = ISTH_OK;
    for (int s = 0; s < cfg->n_sites && rc == ISTH_OK; s++) {
        const int G = cfg->sites[s].learner_ranks;
        if (split) chunk_table_set_experts(&ct, x.begin[s], x.count[s]); /* its payload: the dense part only */
        for (int f = 0; f < P && rc == ISTH_OK; f++) {
            double total = 0, most = 0;
            int who = 0;
            for (int j = 0; j < G && rc == ISTH_OK; j++) {
                Owned own;
                rc = owned_build(&own, &ct, f, G, j, codec, cp);
                if (rc != ISTH_OK) break;
                total += (double)own.enc_size;
                if ((double)own.enc_size > most) most = (double)own.enc_size, who = j;
                owned_free(&own);
            }
            if (total > 0 && most / total > *share) *share = most / total, *site = s, *rank = who;
        }
    }
    chunk_table_destroy(&ct);
    return rc;
}

static void print_buffers(const Config *cfg, PlanLink link)
{
    const OuterConfig *oc = &cfg->outer;
    const double bdp = link.bits_per_s * link.rtt_s / 8;
    double share;
    int site, rank;
    if (busiest_share(cfg, &share, &site, &rank) != ISTH_OK) return;
    const double need = bdp * share; /* in flight on the busiest pair, to carry its share at the link's rate */
    const int tcp = strcmp(oc->transport, "mpi") != 0, streams = tcp ? oc->streams : 1;
    const double per = need / streams;
    printf("socket buffers (outer.transport = %s): the link holds %.4g MB in flight (rate x round trip); the busiest "
           "rank pair carries %.3g%% of a payload (site %s, rank %d of its first learner), so it needs %.4g MB in "
           "flight: %.4g MB per connection's buffer over %d connection(s)\n", oc->transport, bdp / 1e6, 100 * share,
           cfg->sites[site].name, rank, need / 1e6, per / 1e6, streams);
    if (!tcp) {
        printf("  Open MPI's TCP: --mca btl_tcp_sndbuf / btl_tcp_rcvbuf >= %.0f, or 0 (autotuning) with the sysctls "
               "below\n", ceil(per));
    } else if (oc->socket_buffer > 0) {
        if (oc->socket_buffer >= per)
            printf("  outer.socket_buffer = %ld is enough (SO_SNDBUF/SO_RCVBUF of each connection)\n", oc->socket_buffer);
        else
            printf("  outer.socket_buffer = %ld is too small: that pair moves at most %.4g Gbit/s; set it >= %.0f\n",
                   oc->socket_buffer, oc->socket_buffer * streams * 8 / link.rtt_s / 1e9, ceil(per));
    } else {
        printf("  outer.socket_buffer = 0 (the kernel's autotuning) grows to it if the third field of "
               "net.ipv4.tcp_wmem and tcp_rmem allows: Linux's default (4 MiB, 6 MiB) %s; or set "
               "outer.socket_buffer >= %.0f (SO_SNDBUF/SO_RCVBUF, within net.core.wmem_max / rmem_max unless run "
               "as root)\n", per <= PLAN_LINUX_WMEM_MAX ? "is enough" : "is too small: raise both",
               ceil(per));
    }
    printf("  and net.ipv4.tcp_slow_start_after_idle = 0 on both ends, or every exchange starts from ten segments "
           "(docs/planner.md)\n");
}

/* Every codec on this link, in the config's mode. */
static int print_codecs(const Config *cfg, const PlanSite *sites, int n_sites, const PlanInputs *in)
{
    const OuterConfig *oc = &cfg->outer;
    printf("codecs on this link (%s, H = %d; the config's is %s; link busy: its share of the period; slowest: that "
           "site's utilisation; bpb: prose / tech, measured in docs/results/ as cited):\n", oc->mode, oc->inner_steps,
           oc->codec);
    printf("  %-6s %10s %14s %10s %9s %9s  %s\n", "codec", "bits/value", "payload", "transfer", "link busy", "slowest",
           "bpb cost (where measured)");
    for (int i = 0; i < N_CODECS; i++) {
        Config c = *cfg;
        snprintf(c.outer.codec, sizeof c.outer.codec, "%s", codec_costs[i].codec);
        if (!strcmp(codec_costs[i].codec, "topk") && oc->mode_id == MODE_BUTTERFLY) {
            printf("  %-6s (not with butterfly: it sends parameter values)\n", codec_costs[i].codec);
            continue;
        }
        PlanResult r;
        CHECK(planner_compute(&c, sites, n_sites, in->link, in->mfu, &r));
        const PlanMode *m = mode_of(&r, oc->mode_id);
        double worst = 1; /* the slowest site's: the link's cost, not the sites' imbalance */
        for (int s = 0; s < r.n_sites; s++)
            if (r.step_s[s] == slowest_step(&r)) worst = fmin(worst, m->utilisation[s]);
        printf("  %-6s %10.3g %11.6g MB %8.3f s %8.1f%% %8.1f%%  %s (%s)\n", codec_costs[i].codec,
               8 * r.sync.payload_bytes / model_total_params(&c.model), m->payload_bytes / 1e6, m->transfer_s,
               100 * m->link_busy_s / m->period_s, 100 * worst, codec_costs[i].cost, codec_costs[i].where);
    }
    return ISTH_OK;
}

static const char *groups_words(OuterMode mode)
{
    if (mode == MODE_SYNC) return "model, AdamW m and v (+ residual)";
    if (mode == MODE_BUTTERFLY) return "model; per learner anchor, momentum, residual, weights, AdamW m, v (+ pending, sent)";
    return "anchor, outer momentum, residual (+ pending); per learner weights, AdamW m, v";
}

/* The run's total: training, checkpoints, the interval their cost allows. */
static void print_totals(const Config *cfg, const PlanResult *r, const PlanInputs *in)
{
    const OuterConfig *oc = &cfg->outer;
    const PlanMode *m = mode_of(r, oc->mode_id);
    const double per_step = m->period_s / m->steps, steps = (double)cfg->train.steps;
    const double train_s = steps * per_step, P = model_total_params(&cfg->model), group = 4.0 * P;
    double tokens = 0;
    for (int s = 0; s < r->n_sites; s++) tokens += r->tokens_per_step[s];
    /* checkpoints during the run, and how many with an exchange in flight */
    const long every = cfg->checkpoint.every;
    /* steps every, 2 every, ... before the end (none in a run of no steps: (0 - 1) / 1 is -1) */
    const long n_ckpt = every > 0 && cfg->train.steps > 0 ? (cfg->train.steps - 1) / every : 0;
    long n_flight = 0;
    /* whether an exchange is in flight at step k repeats every H steps once
     * k >= overlap: the checkpoints' pattern repeats every H / gcd(every, H)
     * of them; counted once, not train.steps / every times */
    long a = every > 0 ? every : 1, b = oc->inner_steps;
    while (b) {
        const long t = a % b;
        a = b;
        b = t;
    }
    const long cycle = oc->inner_steps / a, head = oc->overlap / (every > 0 ? every : 1) + 1;
    long period = 0;
    for (long i = 1; i <= n_ckpt && i <= head + cycle; i++) {
        const int f = outer_in_flight_at(oc, i * every);
        n_flight += f;
        if (i > head) period += f;
    }
    if (n_ckpt > head + cycle) { /* whole cycles after the first, then the start of one */
        const long rest = n_ckpt - head - cycle;
        n_flight += rest / cycle * period;
        for (long i = head + 1; i <= head + rest % cycle; i++) n_flight += outer_in_flight_at(oc, i * every);
    }
    const int codec_lossy = strcmp(oc->codec, "none") != 0;
    const int residual = !strcmp(oc->error_feedback, "on") && codec_lossy && cfg->n_sites > 1;
    const int shampoo = !strcmp(cfg->train.optimizer, "shampoo");
    printf("checkpoints (each site its own file, written at %.4g GB/s: --storage; %s):\n", in->storage_bytes_per_s / 1e9,
           groups_words(oc->mode_id));
    double write_s = 0, write_flight_s = 0, final_s = 0, largest = 0;
    for (int s = 0; s < cfg->n_sites; s++) {
        const int learners = cfg->sites[s].ranks / cfg->sites[s].learner_ranks;
        const int g = ckpt_groups(oc->mode_id, learners, shampoo, residual, 0);
        const int gf = ckpt_groups(oc->mode_id, learners, shampoo, residual, 1);
        const double b = g * group, bf = gf * group;
        printf("  %-8s %d group(s) of %.4g GB = %.4g GB (%.0f B), %.4g s", cfg->sites[s].name, g, group / 1e9, b / 1e9,
               b, b / in->storage_bytes_per_s);
        if (n_flight && gf != g) printf("; with an exchange in flight %.4g GB, %.4g s", bf / 1e9, bf / in->storage_bytes_per_s);
        printf("\n");
        write_s = fmax(write_s, b / in->storage_bytes_per_s);
        write_flight_s = fmax(write_flight_s, bf / in->storage_bytes_per_s);
        final_s = fmax(final_s, (b + group) / in->storage_bytes_per_s); /* the last one and the model file */
        largest = fmax(largest, n_flight ? bf : b);
    }
    /* each stops every site: the slowest write, its completion confirmed
     * across the link (a round trip), an exchange in flight drained first */
    const double rt = cfg->n_sites > 1 ? in->link.rtt_s : 0;
    const double cost = write_s + rt, cost_flight = write_flight_s + rt + (cfg->n_sites > 1 ? m->transfer_s : 0);
    const double ckpt_total = (n_ckpt - n_flight) * cost + n_flight * cost_flight + final_s;
    const double wall = train_s + ckpt_total;
    printf("run total (train.steps = %d, %s at the slowest site's pace, %.4g s per step): %.4g h training (%.4g tokens)",
           cfg->train.steps, oc->mode, per_step, train_s / 3600, steps * tokens);
    if (every > 0)
        printf(" + %ld checkpoint(s) every %ld steps (%.3g min; %ld with an exchange in flight, drained first: up to "
               "%.4g s each, else %.4g s)", n_ckpt, every, every * per_step / 60, n_flight, cost_flight, cost);
    printf(" + the final checkpoint and model file (%.4g s) = %.4g h; checkpoints %.1f%% of it (evaluations not "
           "counted)\n", final_s, wall / 3600, 100 * ckpt_total / wall);
    /* the interval at which checkpoints cost PLAN_CKPT_SHARE of the time */
    const double worst = n_flight ? cost_flight : cost;
    const long H = oc->mode_id == MODE_SYNC ? 1 : oc->inner_steps;
    /* within the key's range (checkpoint.every <= INT_MAX): a step of
     * nanoseconds (a peak given as a number) must not overflow the cast */
    const double steps_apart = ceil(worst * (1 - PLAN_CKPT_SHARE) / (PLAN_CKPT_SHARE * per_step));
    long want = steps_apart < (double)(INT_MAX - H) ? (long)steps_apart : INT_MAX - H;
    want = (want + H - 1) / H * H;
    printf("checkpoint.every for checkpoints at <= %.0f%% of the wall time: %ld (%.3g h apart%s)\n",
           100 * PLAN_CKPT_SHARE, want, want * per_step / 3600, H > 1 ? "; a multiple of H" : "");
    if (cfg->n_sites > 1)
        printf("a live rejoin sends the host's checkpoint through the link: %.4g GB in %.3g min\n", largest / 1e9,
               planner_wire_s(largest, in->link) / 60);
}

/* The experts split across the sites against replicated: the assignment
 * (with the learner_ranks that give every rank whole experts, halved from
 * the layout's until they do), the bytes a site sends per outer period,
 * and diloco's blocking exchange at this link either way. */
static int print_split(const Config *cfg0, const PlanResult *r, PlanLink link)
{
    Config cfg = *cfg0;
    snprintf(cfg.outer.experts, sizeof cfg.outer.experts, "split");
    if (cfg.outer.mode_id != MODE_STREAMING) cfg.outer.mode_id = MODE_DILOCO; /* the modes split runs in */
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[512], sets[512] = "";
    int halved = 0;
    while (expert_split_assign(&cfg, &x, why, sizeof why, &bad) && bad.key && !strcmp(bad.key, "experts") &&
           halved < 24) { /* whole experts per rank: smaller learners */
        int changed = 0;
        for (int s = 0; s < cfg.n_sites; s++)
            if (cfg.sites[s].learner_ranks % 2 == 0) cfg.sites[s].learner_ranks /= 2, changed = 1;
        if (!changed) break;
        halved++;
    }
    printf("experts split across sites (outer.experts = split, %s, codec %s):", cfg.outer.mode_id == MODE_STREAMING
           ? "streaming" : "diloco", cfg.outer.codec);
    if (expert_split_assign(&cfg, &x, why, sizeof why, &bad)) {
        printf(" not with this layout: %s\n", why);
        return ISTH_OK;
    }
    for (int s = 0; halved && s < cfg.n_sites; s++)
        if (cfg.sites[s].learner_ranks != cfg0->sites[s].learner_ranks)
            snprintf(sets + strlen(sets), sizeof sets - strlen(sets), " --set site.%s.learner_ranks=%d",
                     cfg.sites[s].name, cfg.sites[s].learner_ranks);
    printf("%s%s\n ", sets[0] ? " with" : "", sets);
    for (int s = 0; s < cfg.n_sites; s++)
        printf(" %s experts %d-%d (%d);", cfg.sites[s].name, x.begin[s], x.begin[s] + x.count[s] - 1, x.count[s]);
    printf(" each held by %d site(s), copies refreshed every %d outer periods\n", x.replicas, cfg.outer.expert_refresh);
    ExpertSplitSizes z;
    CHECK(expert_split_sizes(&cfg, &z));
    double copies = 0;
    for (int s = 0; s < cfg.n_sites; s++) copies = fmax(copies, expert_split_refresh_bytes(&cfg, &x, &z, s));
    const double sent = z.dense_bytes + copies;
    printf("  per outer period a site sends %.4g MB (the dense part) + %.4g MB (copies, averaged) = %.4g MB against "
           "%.4g MB replicated: %.1fx fewer (%.1fx without the copies)\n", z.dense_bytes / 1e6, copies / 1e6,
           sent / 1e6, z.all_bytes / 1e6, z.all_bytes / sent, z.all_bytes / z.dense_bytes);
    /* diloco's exchange blocks: H steps of the slowest site, then the transfer */
    const double work = cfg.outer.inner_steps * slowest_step(r);
    const double t_split = planner_wire_s(sent, link) + r->rtts * link.rtt_s,
                 t_rep = planner_wire_s(z.all_bytes, link) + r->rtts * link.rtt_s;
    printf("  diloco at this link (H = %d): transfer %.4g s against %.4g s, utilisation %.2f%% against %.2f%%, the "
           "link busy %.2f%% of the period against %.2f%%\n", cfg.outer.inner_steps, t_split, t_rep,
           100 * work / (work + t_split), 100 * work / (work + t_rep), 100 * planner_wire_s(sent, link) / (work + t_split),
           100 * planner_wire_s(z.all_bytes, link) / (work + t_rep));
    return ISTH_OK;
}

int planner_run(const Config *cfg, const PlanSite *sites, int n_sites, const PlanInputs *in)
{
    PlanResult r;
    CHECK(planner_compute(cfg, sites, n_sites, in->link, in->mfu, &r));
    const ModelConfig *mc = &cfg->model;
    const OuterConfig *oc = &cfg->outer;
    const PlanLink link = in->link;
    const double total = model_total_params(mc);
    const double active = total - (double)mc->layers * (mc->experts - mc->top_k) * 3.0 * mc->dim * mc->ffn;
    if (!strcmp(oc->codec, "topk"))
        printf("plan: %s (mode %s, H = %d, fragments %d, overlap %d, codec topk: %d of %d values at %d bits, "
               "%.3f bits per value)\n", cfg->source, oc->mode, oc->inner_steps, oc->fragments, oc->overlap,
               oc->topk_k, oc->topk_chunk, oc->topk_bits, 8.0 * r.sync.payload_bytes / total);
    else
        printf("plan: %s (mode %s, H = %d, fragments %d, overlap %d, codec %s/%d)\n", cfg->source, oc->mode,
               oc->inner_steps, oc->fragments, oc->overlap, oc->codec, oc->codec_block);
    printf("model: %.4g B parameters, %.4g B active per token (%.1fx expert sparsity), %.4g GFLOP per token "
           "trained\n", total / 1e9, active / 1e9, (double)mc->experts / mc->top_k, r.flops_per_token / 1e9);
    printf("link: %.4g Gbit/s, %.4g ms round trip between every pair of sites (%.4g MB in flight per round trip); "
           "outer.transport = %s: an exchange costs bytes / (rate x %.3f TCP payload per wire byte) + %.0f round "
           "trip(s)\n", link.bits_per_s / 1e9, link.rtt_s * 1e3, link.bits_per_s * link.rtt_s / 8e6, oc->transport,
           PLAN_TCP_EFFICIENCY, r.rtts);
    print_layout(cfg, in);
    const int layer = config_recompute(&cfg->train) == RECOMPUTE_LAYER;
    printf("sites (inner step = tokens x FLOP per token%s / (GPUs x %s peak x MFU %.2f)):\n",
           layer ? " x 4/3 for train.recompute = layer's second forward pass" : "", cfg->train.precision, in->mfu);
    for (int s = 0; s < cfg->n_sites; s++) {
        const PlanSite *ps = planner_site_of(cfg, s, sites, n_sites);
        printf("  %-8s %-7s %8.4g TFLOP/s x %5d GPUs, %4d learner(s) of %d, %10.0f tokens/step, step %.4g s\n",
               cfg->sites[s].name, ps->gpu, r.peak_tflops[s], ps->gpus, cfg->sites[s].ranks / cfg->sites[s].learner_ranks,
               cfg->sites[s].learner_ranks, r.tokens_per_step[s], r.step_s[s]);
    }
    char refusal[768];
    CHECK(print_memory(cfg, sites, n_sites, refusal, sizeof refusal));
    printf("per mode (utilisation: inner-step time / wall time; idle: per period, waiting for a slower site or "
           "the link):\n");
    printf("  %-10s %-24s %15s %11s %11s %9s\n", "mode", "shape", "payload", "transfer", "period", "lowest");
    char shape[64];
    print_mode("sync", "every step", &r.sync, &r, cfg);
    snprintf(shape, sizeof shape, "H=%d", oc->inner_steps);
    print_mode("diloco", shape, &r.diloco, &r, cfg);
    snprintf(shape, sizeof shape, "H=%d P=%d overlap=%d", oc->inner_steps,
             oc->mode_id == MODE_STREAMING ? oc->fragments : mc->layers, oc->overlap);
    print_mode("streaming", shape, &r.streaming, &r, cfg);
    if (r.butterfly_learners && r.n_sites > 1 && !strcmp(oc->codec, "topk")) {
        printf("  butterfly  (not with codec topk: butterfly sends parameter values)\n");
    } else if (r.butterfly_learners && r.n_sites > 1) {
        snprintf(shape, sizeof shape, "%d learners, H=%d", r.butterfly_learners, oc->inner_steps);
        print_mode("butterfly", shape, &r.butterfly, &r, cfg);
    }
    CHECK(print_balance(cfg, sites, n_sites, in, &r));
    const double slowest = slowest_step(&r);
    const long hd = planner_smallest_h(cfg, sites, n_sites, link, in->mfu, in->target, 0);
    const long hs = planner_smallest_h(cfg, sites, n_sites, link, in->mfu, in->target, 1);
    printf("smallest H for >= %.0f%% utilisation (beside the sites' imbalance): diloco ", 100 * in->target);
    if (hd > 0) printf("%ld", hd); else printf("none up to 2^20");
    printf(", streaming ");
    if (hs > 0) printf("%ld", hs); else printf("none up to 2^20");
    printf(" (P=%d, overlap %d); overlap that hides a streaming fragment: >= %.0f steps\n",
           oc->mode_id == MODE_STREAMING ? oc->fragments : mc->layers, oc->overlap, ceil(r.streaming.transfer_s / slowest));
    if (r.n_sites > 1) { /* each rank of a site's first learner seals its share of a payload once for every
                          * other site (a key per pair) and opens each other site's share: the whole model's
                          * bytes once per H steps in diloco and streaming */
        int G = cfg->sites[0].learner_ranks;
        for (int s = 1; s < cfg->n_sites; s++) G = G < cfg->sites[s].learner_ranks ? G : cfg->sites[s].learner_ranks;
        const double seal_s = r.diloco.payload_bytes / G * 2.0 * (r.n_sites - 1) / PLAN_SEAL_BYTES_PER_S;
        printf("link seal (%s, %.2g GB/s per core): %.3g s per rank every H steps, %.2f%% of the H steps' "
               "compute\n", strcmp(oc->encrypt, "on") ? "authenticated" : "encrypted and authenticated",
               PLAN_SEAL_BYTES_PER_S / 1e9, seal_s, 100.0 * seal_s / (oc->inner_steps * slowest));
        print_buffers(cfg, link);
        CHECK(print_codecs(cfg, sites, n_sites, in));
        CHECK(print_split(cfg, &r, link));
    }
    print_totals(cfg, &r, in);
    fflush(stdout);
    /* after the plan, so that what would fit instead can be read above it */
    if (refusal[0]) return isth_fail(ISTH_EINPUT, "plan: %s", refusal);
    return ISTH_OK;
}
