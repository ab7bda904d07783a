/* config.c — see config.h. The order of a load (defaults, the text, the
 * overrides), the [site.NAME] and [eval.NAME] sections, and the rules
 * between keys; the INI syntax is in config_ini.c, the key table in
 * config_keys.c. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "config_ini.h"
#include "config_keys.h"
#include "expert_split.h"
#include "status.h"
#include "wire.h"

/* Rules that involve several keys. `config_origin_of` finds where a key was set so
 * that the message points at the line to fix. */
static int validate(const Config *c, EntryList *l)
{
    const ModelConfig *m = &c->model;
    if (m->dim % m->heads)
        return isth_fail(ISTH_EINPUT, "config %s: [model] heads = %d does not divide dim = %d",
                         config_origin_of(l, "model", "heads"), m->heads, m->dim);
    if (config_head_dim(m) % 2)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [model] head dim = dim/heads = %d must be even (rotary pairs)",
                         config_origin_of(l, "model", "heads"), config_head_dim(m));
    if (m->top_k > m->experts)
        return isth_fail(ISTH_EINPUT, "config %s: [model] top_k = %d exceeds experts = %d",
                         config_origin_of(l, "model", "top_k"), m->top_k, m->experts);
    if (c->train.min_lr > c->train.lr)
        return isth_fail(ISTH_EINPUT, "config %s: [train] min_lr = %g exceeds lr = %g",
                         config_origin_of(l, "train", "min_lr"), c->train.min_lr, c->train.lr);
    if (!strcmp(c->train.optimizer, "shampoo") &&
        (m->dim % c->train.precond_block || m->ffn % c->train.precond_block))
        return isth_fail(ISTH_EINPUT,
                         "config %s: [train] precond_block = %d must divide [model] dim = %d and ffn = %d "
                         "(Shampoo's blocks tile every matrix)", config_origin_of(l, "train", "precond_block"),
                         c->train.precond_block, m->dim, m->ffn);
    if (!strcmp(c->train.optimizer, "shampoo") && c->train.precond_stats_every > c->train.precond_every)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [train] precond_stats_every = %d exceeds precond_every = %d (every root needs "
                         "statistics newer than the last)", config_origin_of(l, "train", "precond_stats_every"),
                         c->train.precond_stats_every, c->train.precond_every);
    if (!c->train.out_dir[0])
        return isth_fail(ISTH_EINPUT, "config %s: [train] out_dir is empty",
                         config_origin_of(l, "train", "out_dir"));
    return ISTH_OK;
}

static SiteConfig *site_get(Config *cfg, const char *name, const char *origin, int *rc)
{
    for (int i = 0; i < cfg->n_sites; i++)
        if (!strcmp(cfg->sites[i].name, name)) return &cfg->sites[i];
    *rc = ISTH_OK;
    if (strlen(name) >= CONFIG_NAME_MAX || !*name) {
        *rc = isth_fail(ISTH_EINPUT, "config %s: site name '%s' is empty or longer than %d characters",
                        origin, name, CONFIG_NAME_MAX - 1);
        return NULL;
    }
    /* a site name becomes a directory name (checkpoints): no '/', '.', '..' */
    if (strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(name)) {
        *rc = isth_fail(ISTH_EINPUT, "config %s: site name '%s' may only hold letters, digits, '_' and '-'", origin,
                        name);
        return NULL;
    }
    if (cfg->n_sites == CONFIG_MAX_SITES) {
        *rc = isth_fail(ISTH_EINPUT, "config %s: more than %d [site.*] sections", origin, CONFIG_MAX_SITES);
        return NULL;
    }
    SiteConfig *site = &cfg->sites[cfg->n_sites++];
    memset(site, 0, sizeof *site);
    strcpy(site->name, name);
    site->learner_ranks = site->micro_batch = site->grad_accum = -1; /* inherit */
    site->speed = 1.0;
    return site;
}

static int apply_eval_key(Config *cfg, const Entry *e)
{
    const char *name = e->section + 5;
    const KeySpec *spec = config_eval_key_find(e->key);
    if (!spec)
        return isth_fail(ISTH_EINPUT, "config %s: unknown key '%s' in [%s] (eval keys: path bytes)", e->origin, e->key,
                         e->section);
    EvalConfig *ev = NULL;
    for (int i = 0; i < cfg->n_evals; i++)
        if (!strcmp(cfg->evals[i].name, name)) ev = &cfg->evals[i];
    if (!ev) {
        /* a name becomes a metrics field and a plot's title: letters, digits, '_' and '-' */
        if (!*name || strlen(name) >= CONFIG_NAME_MAX ||
            strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(name))
            return isth_fail(ISTH_EINPUT, "config %s: eval set name '%s': 1 to %d letters, digits, '_' or '-'",
                             e->origin, name, CONFIG_NAME_MAX - 1);
        if (cfg->n_evals == CONFIG_MAX_EVALS)
            return isth_fail(ISTH_EINPUT, "config %s: more than %d [eval.*] sections", e->origin, CONFIG_MAX_EVALS);
        ev = &cfg->evals[cfg->n_evals++];
        memset(ev, 0, sizeof *ev);
        snprintf(ev->name, sizeof ev->name, "%s", name);
    }
    return config_apply_value_in(ev, spec, e->section, e->value, e->origin);
}

int config_eval_sets(const Config *cfg, EvalConfig out[CONFIG_MAX_EVALS])
{
    if (cfg->n_evals) {
        memcpy(out, cfg->evals, sizeof *out * (size_t)cfg->n_evals);
        return cfg->n_evals;
    }
    const char *names[2] = {"prose", "tech"}, *files[2] = {"eval_prose.txt", "eval_tech.txt"};
    for (int i = 0; i < 2; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", names[i]);
        snprintf(out[i].path, sizeof out[i].path, "%s", files[i]);
    }
    return 2;
}

static int apply_site_key(Config *cfg, const Entry *e)
{
    int rc = ISTH_OK;
    const char *name = e->section + 5;
    const KeySpec *spec = config_site_key_find(e->key);
    if (!spec)
        return isth_fail(ISTH_EINPUT, "config %s: unknown key '%s' in [%s] (site keys: ranks "
                         "learner_ranks micro_batch grad_accum speed experts)", e->origin, e->key, e->section);
    SiteConfig *site = site_get(cfg, name, e->origin, &rc);
    if (!site) return rc;
    return config_apply_value_in(site, spec, e->section, e->value, e->origin);
}

/* [outer] values whose default depends on the mode, and rules between keys. */
static int validate_outer(Config *cfg, EntryList *l)
{
    OuterConfig *o = &cfg->outer;
    const int streaming = !strcmp(o->mode, "streaming"), butterfly = !strcmp(o->mode, "butterfly");
    o->mode_id = streaming ? MODE_STREAMING : butterfly ? MODE_BUTTERFLY : !strcmp(o->mode, "diloco") ? MODE_DILOCO
                                                                                                   : MODE_SYNC;
    /* topk (SparseLoCo): the decaying error-feedback buffer carries past
     * pseudo-gradients forward, so plain averaging (lr 1, no momentum) and
     * a decay of 0.95; outer momentum on top of it lost (docs/results/sparse-payloads.md) */
    const int topk = !strcmp(o->codec, "topk");
    if (o->lr < 0) {
        if (config_entries_find(l, "outer", "lr"))
            return isth_fail(ISTH_EINPUT, "config %s: [outer] lr = %g must be > 0", config_origin_of(l, "outer", "lr"), o->lr);
        o->lr = topk ? 1.0 : streaming ? 0.4 : !strcmp(o->mode, "diloco") ? 0.7 : 1.0;
    } else if (o->lr == 0) {
        return isth_fail(ISTH_EINPUT, "config %s: [outer] lr = 0 must be > 0", config_origin_of(l, "outer", "lr"));
    }
    if (o->momentum < 0) {
        if (config_entries_find(l, "outer", "momentum"))
            return isth_fail(ISTH_EINPUT, "config %s: [outer] momentum = %g must be in [0, 1)",
                             config_origin_of(l, "outer", "momentum"), o->momentum);
        o->momentum = butterfly || topk ? 0.0 : 0.9; /* butterfly: plain pairwise averaging unless asked */
    }
    if (o->ef_decay < 0) {
        if (config_entries_find(l, "outer", "ef_decay"))
            return isth_fail(ISTH_EINPUT, "config %s: [outer] ef_decay = %g must be in [0, 1]",
                             config_origin_of(l, "outer", "ef_decay"), o->ef_decay);
        o->ef_decay = topk ? 0.95 : 1.0;
    }
    if (cfg->data.eval_bytes == 1)
        return isth_fail(ISTH_EINPUT, "config %s: [data] eval_bytes = 1 leaves no byte to predict; use 0 (whole "
                         "files) or at least 2", config_origin_of(l, "data", "eval_bytes"));
    if (o->fragments == 0 && config_entries_find(l, "outer", "fragments"))
        return isth_fail(ISTH_EINPUT, "config %s: [outer] fragments = 0: at least 1 (leave the key out for the "
                         "mode's default)", config_origin_of(l, "outer", "fragments"));
    if (o->fragments == 0) o->fragments = streaming ? cfg->model.layers : 1;
    if (!streaming && !butterfly && o->fragments != 1)
        return isth_fail(ISTH_EINPUT, "config %s: [outer] fragments = %d needs mode = streaming or butterfly (mode is %s)",
                         config_origin_of(l, "outer", "fragments"), o->fragments, o->mode);
    if (butterfly && o->overlap >= o->inner_steps)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] overlap = %d must be less than inner_steps = %d (a round must finish "
                         "before the next one starts)",
                         config_origin_of(l, "outer", "overlap"), o->overlap, o->inner_steps);
    if (o->fragments > cfg->model.layers)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] fragments = %d exceeds [model] layers = %d (fragments are strided over layers)",
                         config_origin_of(l, "outer", "fragments"), o->fragments, cfg->model.layers);
    if (streaming && o->overlap >= o->inner_steps)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] overlap = %d must be less than inner_steps = %d (an exchange must "
                         "finish before the fragment's next one starts)",
                         config_origin_of(l, "outer", "overlap"), o->overlap, o->inner_steps);
    if (!strcmp(o->codec, "topk") && o->topk_k > o->topk_chunk)
        return isth_fail(ISTH_EINPUT, "config %s: [outer] topk_k = %d exceeds topk_chunk = %d (values sent per chunk)",
                         config_origin_of(l, "outer", "topk_k"), o->topk_k, o->topk_chunk);
    if (!strcmp(o->codec, "topk") && butterfly)
        return isth_fail(ISTH_EINPUT,
                         "config %s: [outer] codec = topk needs mode = diloco, streaming or sync (butterfly sends "
                         "parameter values, which a sparse payload cannot carry; use bf16, int8 or fp4)",
                         config_origin_of(l, "outer", "codec"));
    if (streaming && o->fragments > o->inner_steps)
        return isth_fail(ISTH_EINPUT, "config %s: [outer] fragments = %d exceeds inner_steps = %d (offsets would collide)",
                         config_origin_of(l, "outer", "fragments"), o->fragments, o->inner_steps);
    int lo, hi;
    if (wire_parse_ports(o->ports, &lo, &hi))
        return isth_fail(ISTH_EINPUT, "config %s: [outer] ports = %s: give 0 (any free port), a port, or a range "
                         "LO-HI within 1-65535", config_origin_of(l, "outer", "ports"), o->ports);
    return ISTH_OK;
}

static int validate_sites(Config *cfg, EntryList *l)
{
    for (int i = 0; i < cfg->n_sites; i++) {
        SiteConfig *s = &cfg->sites[i];
        char section[CONFIG_NAME_MAX + 8];
        snprintf(section, sizeof section, "site.%s", s->name);
        if (s->ranks <= 0)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] ranks is required", cfg->source, section);
        if (s->learner_ranks < 0) s->learner_ranks = s->ranks;
        if (s->micro_batch < 0) s->micro_batch = cfg->train.micro_batch;
        if (s->grad_accum < 0) s->grad_accum = cfg->train.grad_accum;
        if (s->ranks % s->learner_ranks)
            return isth_fail(ISTH_EINPUT,
                             "config %s: [%s] learner_ranks = %d does not divide ranks = %d",
                             config_origin_of(l, section, "learner_ranks"), section, s->learner_ranks, s->ranks);
        if (cfg->model.experts % s->learner_ranks && !expert_split_on(cfg)) /* split: its own experts (below) */
            return isth_fail(ISTH_EINPUT,
                             "config %s: [%s] learner_ranks = %d does not divide [model] experts = %d "
                             "(experts are sharded evenly over a learner's ranks)",
                             config_origin_of(l, section, "learner_ranks"), section, s->learner_ranks,
                             cfg->model.experts);
        if (s->experts[0] && !expert_split_on(cfg))
            return isth_fail(ISTH_EINPUT, "config %s: [%s] experts = %s needs [outer] experts = split (experts are "
                             "%s: every site trains every expert)", config_origin_of(l, section, "experts"), section,
                             s->experts, cfg->outer.experts);
    }
    if (cfg->outer.expert_replicas == 0) /* the key's range holds -1, the default's sentinel, and so 0 */
        return isth_fail(ISTH_EINPUT, "config %s: [outer] expert_replicas = 0: at least 1 (the owner)",
                         config_origin_of(l, "outer", "expert_replicas"));
    if (cfg->outer.expert_replicas < 0) cfg->outer.expert_replicas = cfg->n_sites < 2 ? 1 : 2;
    /* the joint router phase: 200 steps with split experts unless set (docs/results/split-experts.md) */
    if (cfg->outer.router_steps < 0) cfg->outer.router_steps = expert_split_on(cfg) ? 200 : 0;
    if (cfg->outer.router_steps > 0 && !expert_split_on(cfg))
        return isth_fail(ISTH_EINPUT, "config %s: [outer] router_steps = %d needs [outer] experts = split (the router "
                         "of a replicated run was trained over every expert)",
                         config_origin_of(l, "outer", "router_steps"), cfg->outer.router_steps);
    if (!expert_split_on(cfg)) return ISTH_OK;
    ExpertSplit x;
    ExpertSplitFault bad;
    char why[512], section[CONFIG_NAME_MAX + 8] = "outer";
    if (!expert_split_assign(cfg, &x, why, sizeof why, &bad)) return ISTH_OK;
    if (bad.site >= 0) snprintf(section, sizeof section, "site.%s", cfg->sites[bad.site].name);
    /* a site's range not given: where split was asked for */
    const char *origin = config_entries_find(l, section, bad.key) ? config_origin_of(l, section, bad.key)
                                                                  : config_origin_of(l, "outer", "experts");
    return isth_fail(ISTH_EINPUT, "config %s: %s", origin, why);
}

static int load_entries(Config *cfg, EntryList *l, const char *const *overrides, int n_overrides)
{
    for (int i = 0; i < n_overrides; i++) CHECK(config_parse_override(l, overrides[i]));

    memset(&cfg->model, 0, sizeof cfg->model);
    memset(&cfg->train, 0, sizeof cfg->train);
    memset(&cfg->data, 0, sizeof cfg->data);
    memset(&cfg->outer, 0, sizeof cfg->outer);
    memset(&cfg->checkpoint, 0, sizeof cfg->checkpoint);
    cfg->n_sites = 0;
    cfg->n_evals = 0;
    CHECK(config_apply_defaults(cfg));

    for (int i = 0; i < l->n; i++) {
        Entry *e = &l->v[i];
        const KeySpec *s = config_schema_find(e->section, e->key);
        if (s) {
            CHECK(config_apply_value(cfg, s, e->value, e->origin));
            continue;
        }
        if (!strncmp(e->section, "site.", 5)) {
            CHECK(apply_site_key(cfg, e));
            continue;
        }
        if (!strncmp(e->section, "eval.", 5)) {
            CHECK(apply_eval_key(cfg, e));
            continue;
        }
        if (!config_section_known(e->section))
            return isth_fail(ISTH_EINPUT, "config %s: unknown section [%s]", e->origin, e->section);
        return isth_fail(ISTH_EINPUT, "config %s: unknown key '%s' in [%s]", e->origin, e->key,
                         e->section);
    }
    CHECK(validate(cfg, l));
    CHECK(validate_outer(cfg, l));
    for (int i = 0; i < cfg->n_evals; i++)
        if (!cfg->evals[i].path[0])
            return isth_fail(ISTH_EINPUT, "config %s: [eval.%s] path is required", cfg->source, cfg->evals[i].name);
    return validate_sites(cfg, l);
}

CodecParams config_codec_params(const OuterConfig *o)
{
    const int topk = !strcmp(o->codec, "topk");
    return (CodecParams){topk ? o->topk_chunk : o->codec_block, o->topk_k, o->topk_bits, (float)o->ef_decay};
}

int config_load_text(Config *cfg, const char *text, const char *origin,
                     const char *const *overrides, int n_overrides)
{
    EntryList l = {0};
    snprintf(cfg->source, sizeof cfg->source, "%s", origin);
    int rc = text ? config_parse_ini(&l, text, origin) : ISTH_OK;
    if (rc == ISTH_OK) rc = load_entries(cfg, &l, overrides, n_overrides);
    config_entries_free(&l);
    return rc;
}


int config_load(Config *cfg, const char *path, const char *const *overrides, int n_overrides)
{
    if (!path) return config_load_text(cfg, NULL, "(defaults)", overrides, n_overrides);
    char *text;
    CHECK(config_read_ini_file(path, &text));
    int rc = config_load_text(cfg, text, path, overrides, n_overrides);
    isth_free(text);
    return rc;
}

Recompute config_recompute(const TrainConfig *t)
{
    if (!strcmp(t->recompute, "layer")) return RECOMPUTE_LAYER;
    return strcmp(t->recompute, "attention") ? RECOMPUTE_NONE : RECOMPUTE_ATTENTION;
}
