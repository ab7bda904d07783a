/* cmd_prepare.c — the commands before a run: `isthmus config` (the
 * resolved configuration, its keys, the memory a rank needs, the device
 * each rank of a launch computes on), `isthmus
 * plan` (what a run would achieve on given sites) and `isthmus keygen`
 * (a run key for the federated launch).
 *
 * Owns: their --help texts and options, checked before anything runs.
 * Must not: compute a plan or a memory figure itself (planner.c,
 * memory.c), or write a key (runkey.c).
 */
#include "cmd_prepare.h"

#include "cli.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "backend_choose.h"
#include "config.h"
#include "config_keys.h"
#include "expert_split_report.h"
#include "runkey.h"
#include "memory.h"
#include "planner_report.h"
#include "status.h"

static const char *const usage_config =
    "usage: isthmus config [CONFIG.ini] [--set section.key=value]... [--keys]\n"
    "                      [--memory [--ranks N] [--rank R]] [--devices]\n"
    "\n"
    "Validates and prints the resolved configuration (every key, defaults filled in).\n"
    "--keys lists every configuration key instead, one a line: \"[section] key\", its\n"
    "type and accepted values, \"default X\" (in words where a mode or another key\n"
    "decides) and a one-line meaning (docs/configuration.md has the full text);\n"
    "columns are separated by two spaces or more.\n"
    "--memory prints what world rank R (default 0; max: the rank that holds the\n"
    "most) of an N-rank job (default: the [site.*] ranks) allocates, by category,\n"
    "computed from the layout without allocating the model; `isthmus train`\n"
    "prints the measured peak of rank 0.\n"
    "--devices, run under the job's launcher (srun, mpirun) as `train` would be,\n"
    "prints one line per rank: its host, local rank and the device it would compute\n"
    "on (GPU index, PCI bus id, name, CUDA_VISIBLE_DEVICES; or cpu), as `train`\n"
    "prints at its start: the check that each rank has a GPU of its own.\n";

int cmd_config(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_config, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    const char *keys = NULL, *memory = NULL, *ranks = NULL, *rank = NULL, *devices = NULL;
    const CliOption opts[] = {{"--keys", 0, &keys}, {"--memory", 0, &memory}, {"--ranks", 1, &ranks}, {"--rank", 1, &rank},
                              {"--devices", 0, &devices}};
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, opts, 5));
    if (keys) {
        config_print_keys();
        return ISTH_OK;
    }
    Config cfg;
    CHECK(config_load(&cfg, n_pos ? pos[0] : NULL, overrides, n_over));
    if ((ranks || rank) && !memory) return isth_fail(ISTH_EINPUT, "--ranks and --rank go with --memory");
    if (devices && memory) return isth_fail(ISTH_EINPUT, "--devices and --memory: one at a time");
    if (devices) return backend_print_devices(&cfg, NULL); /* under the job's launcher: each rank's GPU */
    if (memory) {
        char *end;
        const long n = ranks ? strtol(ranks, &end, 10) : 0;
        if (ranks && (*end || n < 1 || n > 1 << 24)) return isth_fail(ISTH_EINPUT, "--ranks %s: expected 1..16777216", ranks);
        const int largest = rank && !strcmp(rank, "max");
        long r = rank && !largest ? strtol(rank, &end, 10) : 0;
        if (rank && !largest && (*end || r < 0))
            return isth_fail(ISTH_EINPUT, "--rank %s: expected a rank number or max", rank);
        int world = (int)n;
        if (!world)
            for (int s = 0; s < cfg.n_sites; s++) world += cfg.sites[s].ranks;
        if (!world) world = 1;
        MemoryPlan plan;
        if (largest) /* the rank that holds the most: what a GPU must fit */
            CHECK(memory_plan_largest(&cfg, world, 0, world, &plan, &r));
        else
            CHECK(memory_plan(&cfg, world, (int)r, &plan));
        memory_print(&plan, world, (int)r);
        return ISTH_OK;
    }
    char *text = config_to_text(&cfg);
    CHECK_ALLOC(text);
    fputs(text, stdout);
    isth_free(text);
    if (expert_split_on(&cfg)) { /* comments: the text still loads */
        putchar('\n');
        CHECK(expert_split_print(&cfg, stdout));
    }
    return ISTH_OK;
}

static const char *const usage_plan =
    "usage: isthmus plan CONFIG.ini --site NAME:GPU:COUNT [--site ...] --link RATE,RTT\n"
    "                    [--mfu F] [--target U] [--storage RATE] [--set section.key=value]...\n"
    "\n"
    "Plans a run of CONFIG on the given sites without running it: one --site per\n"
    "[site.NAME] of the config (COUNT ranks, one per GPU), GPU a type below or a peak\n"
    "in TFLOP/s (e.g. a CPU's rate from `isthmus bench`, with --mfu 1); --link the\n"
    "rate and round trip between every pair of sites (e.g. 25Gbps,150ms).\n"
    "The layout follows the counts: a site's learner_ranks that no longer divides its\n"
    "COUNT (or the experts) becomes the largest that does, and the plan prints the\n"
    "--set lines it applied. Prints the parameters, each site's inner step (tokens x\n"
    "FLOP per token / (GPUs x peak x MFU), MFU default 0.4), each site's largest rank's\n"
    "memory against its GPU's (exit 2 when one does not fit), the utilisation of sync,\n"
    "diloco, streaming and butterfly with each site's idle time, the grad_accum that\n"
    "balances the sites (--set lines), the smallest H reaching --target (default\n"
    "0.95), the socket buffers the link needs, the codecs compared on the link with\n"
    "their measured bpb cost, and the run's totals: wall time for train.steps, each\n"
    "site's checkpoint size and write time at --storage (default 5GB/s per site) and\n"
    "the checkpoint.every they allow. docs/planner.md derives the model.\n"
    "GPU types (dense peaks, memory; a plan uses the peak of the config's train.precision):\n";

int cmd_plan(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        fputs(usage_plan, stdout);
        planner_print_gpus();
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *config = NULL, *link_text = NULL, *mfu_text = NULL, *target_text = NULL,
               *storage_text = "5GB/s";
    PlanSite sites[PLAN_MAX_SITES];
    int n_over = 0, n_sites = 0;
    for (int i = 0; i < argc; i++) { /* --site repeats, so not parse_common */
        const char *a = argv[i], *eq = strchr(a, '=');
        const size_t name_len = a[0] == '-' && eq ? (size_t)(eq - a) : strlen(a);
        const char *v = a[0] == '-' && eq ? eq + 1 : NULL;
        static const char *const with_value[] = {"--site", "--link", "--mfu", "--target", "--set", "--storage"};
        int known = -1;
        for (int k = 0; k < 6; k++)
            if (strlen(with_value[k]) == name_len && !strncmp(a, with_value[k], name_len)) known = k;
        if (a[0] == '-' && a[1] && known < 0) return isth_fail(ISTH_EINPUT, "plan: unknown option '%s' (see --help)", a);
        if (known < 0) {
            if (config) return isth_fail(ISTH_EINPUT, "plan: unexpected argument '%s' (see --help)", a);
            config = a;
            continue;
        }
        if (!v && i + 1 < argc) v = argv[++i];
        if (!v) return isth_fail(ISTH_EINPUT, "plan: %s needs a value", with_value[known]);
        if (known == 0) {
            if (n_sites == PLAN_MAX_SITES) return isth_fail(ISTH_EINPUT, "plan: more than %d --site", PLAN_MAX_SITES);
            CHECK(planner_parse_site(v, &sites[n_sites]));
            for (int j = 0; j < n_sites; j++)
                if (!strcmp(sites[j].name, sites[n_sites].name))
                    return isth_fail(ISTH_EINPUT, "plan: --site %s given twice", sites[j].name);
            n_sites++;
        } else if (known == 1) {
            link_text = v;
        } else if (known == 2) {
            mfu_text = v;
        } else if (known == 3) {
            target_text = v;
        } else if (known == 5) {
            storage_text = v;
        } else {
            if (n_over == CLI_MAX_OVERRIDES) return isth_fail(ISTH_EINPUT, "too many --set options");
            overrides[n_over++] = v;
        }
    }
    if (!config) return isth_fail(ISTH_EINPUT, "plan: missing CONFIG.ini (see isthmus plan --help)");
    if (!n_sites) return isth_fail(ISTH_EINPUT, "plan: no --site NAME:GPU:COUNT (see isthmus plan --help)");
    if (!link_text) return isth_fail(ISTH_EINPUT, "plan: no --link RATE,RTT (e.g. --link 25Gbps,150ms)");
    PlanInputs in = {0};
    CHECK(planner_parse_link(link_text, &in.link));
    CHECK(planner_parse_storage(storage_text, &in.storage_bytes_per_s));
    char *end;
    in.mfu = mfu_text ? strtod(mfu_text, &end) : 0.4;
    if (mfu_text && (*end || !(in.mfu > 0 && in.mfu <= 1)))
        return isth_fail(ISTH_EINPUT, "plan: --mfu '%s': a fraction in (0, 1]", mfu_text);
    in.target = target_text ? strtod(target_text, &end) : 0.95;
    if (target_text && (*end || !(in.target > 0 && in.target < 1)))
        return isth_fail(ISTH_EINPUT, "plan: --target '%s': a fraction in (0, 1)", target_text);
    /* the config as the user's --set make it; where their [site.*] keys
     * are meant for the --site counts and do not load with the file's,
     * without those. Then the layout the counts give (planner_layout_sets:
     * ranks, and a learner that fits them unless the user set one), loaded
     * with every --set and validated as `train --set ...` would be: a
     * layout training refuses is refused the same way (names the config
     * lacks are reported by the planner) */
    Config cfg;
    const int was = status_set_quiet(1);
    const int as_given = config_load(&cfg, config, overrides, n_over);
    status_set_quiet(was);
    if (as_given != ISTH_OK) {
        const char *plain[CLI_MAX_OVERRIDES];
        int n_plain = 0;
        for (int i = 0; i < n_over; i++)
            if (strncmp(overrides[i], "site.", 5)) plain[n_plain++] = overrides[i];
        CHECK(config_load(&cfg, config, plain, n_plain));
    }
    static PlanSet layout[PLAN_MAX_SETS];
    int n_layout = 0;
    CHECK(planner_layout_sets(&cfg, sites, n_sites, overrides, n_over, layout, &n_layout));
    int n_all = n_over;
    for (int i = 0; i < n_layout && n_all < CLI_MAX_OVERRIDES; i++) overrides[n_all++] = layout[i].text;
    CHECK(config_load(&cfg, config, overrides, n_all));
    in.layout = layout;
    in.n_layout = n_layout;
    return planner_run(&cfg, sites, n_sites, &in);
}

static const char *const usage_keygen =
    "usage: isthmus keygen FILE\n"
    "\n"
    "Write a new run key to FILE: 32 random bytes in hex, mode 0600, missing directories made.\n"
    "An existing FILE is never overwritten. Make the key before submitting the sites' jobs, copy it\n"
    "to every site (scp; the same mode) and name it in [outer] key_file: the federated join proves\n"
    "it, and every frame between the sites is authenticated and encrypted under keys derived from\n"
    "it (docs/architecture.md). One rank only.\n";

int cmd_keygen(int argc, char **argv)
{
    const char *path;
    CHECK(cli_one_file(argc, argv, "keygen", usage_keygen, &path));
    if (!path) return ISTH_OK;
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 1) return isth_fail(ISTH_EINPUT, "keygen: run it as one process, not under mpirun -np %d", size);
    return runkey_keygen(path);
}
