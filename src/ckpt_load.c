/* ckpt_load.c — see ckpt_load.h. */
#include "ckpt_load.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckpt_lineage.h"
#include "ckpt_state.h"
#include "clock.h"
#include "coll.h"
#include "config_keys.h"
#include "expert_split.h"
#include "fault.h"
#include "h5io.h"
#include "expert_copies.h"
#include "status.h"

/* The weights: each rank reads the chunks it owns, then the dense ones are
 * shared inside the learner (the file is read once per site). */
static int read_params(H5File *f, Trainer *tr, CkptScratch *sc, const char *group)
{
    CHECK(ckpt_transfer_state(f, tr, sc, group, STATE_PARAMS, 1, 1));
    return shard_share_params(&tr->shard, tr->be);
}

/* Each owner reads its moments; nobody else holds them. */
static int read_moments(H5File *f, Trainer *tr, CkptScratch *sc, const char *group, StateKind which)
{
    return ckpt_transfer_state(f, tr, sc, group, which, 1, 1);
}

/* The checkpoint's stored config (into *saved) against the run's. */
static int compare_configs(Trainer *tr, const char *saved_text, const char *path, Config *saved)
{
    int rc = config_load_text(saved, saved_text, path, NULL, 0);
    if (rc != ISTH_OK) return isth_fail(ISTH_EINPUT, "checkpoint %s: stored config unreadable", path);
    const ModelConfig *a = &saved->model, *b = &tr->cfg.model;
    struct { const char *key; double was, now; } fields[] = {
        {"layers", a->layers, b->layers}, {"dim", a->dim, b->dim}, {"heads", a->heads, b->heads},
        {"experts", a->experts, b->experts}, {"top_k", a->top_k, b->top_k}, {"ffn", a->ffn, b->ffn},
        {"context", a->context, b->context}, {"vocab", a->vocab, b->vocab},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (fields[i].was != fields[i].now)
            return isth_fail(ISTH_EINPUT, "checkpoint %s: [model] %s = %g in the checkpoint, %g in the config (a different model)",
                             path, fields[i].key, fields[i].was, fields[i].now);
    /* each optimiser's state means something of its own (muon's momentum is
     * not AdamW's first moment; shampoo's statistics are laid out by its block) */
    if (strcmp(saved->train.optimizer, tr->cfg.train.optimizer))
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [train] optimizer = %s in the checkpoint, %s in the config", path,
                         saved->train.optimizer, tr->cfg.train.optimizer);
    if (ckpt_uses_shampoo(tr) && saved->train.precond_block != tr->cfg.train.precond_block)
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [train] precond_block = %d in the checkpoint, %d in the config",
                         path, saved->train.precond_block, tr->cfg.train.precond_block);
    if (strcmp(saved->outer.mode, tr->cfg.outer.mode))
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [outer] mode = %s in the checkpoint, %s in the config", path,
                         saved->outer.mode, tr->cfg.outer.mode);
    if (tr->mode != MODE_SYNC && saved->outer.fragments != tr->cfg.outer.fragments)
        return isth_fail(ISTH_EINPUT, "checkpoint %s: [outer] fragments = %d in the checkpoint, %d in the config", path,
                         saved->outer.fragments, tr->cfg.outer.fragments);
    /* a split run's file holds this site's experts only (never another
     * site's, nor a replicated run's every expert): the checkpoint's
     * assignment of this site is the only one it can continue */
    if (expert_split_on(saved)) {
        const SiteInfo *me = &tr->topo.sites[tr->topo.site];
        ExpertSplit x;
        ExpertSplitFault bad;
        char why[512];
        int s = 0;
        while (s < saved->n_sites && strcmp(saved->sites[s].name, me->name)) s++;
        if (!tr->topo.experts_split)
            return isth_fail(ISTH_EINPUT, "checkpoint %s: [outer] experts = split in the checkpoint, %s in the config: "
                             "each site's file holds its own experts only", path, tr->cfg.outer.experts);
        /* the copies a site's file holds are those of its replicas' rule */
        if (saved->outer.expert_replicas != tr->cfg.outer.expert_replicas)
            return isth_fail(ISTH_EINPUT, "checkpoint %s: [outer] expert_replicas = %d in the checkpoint, %d in the "
                             "config: each site's file holds the copies of the old rule (it cannot change on resume)",
                             path, saved->outer.expert_replicas, tr->cfg.outer.expert_replicas);
        if (s < saved->n_sites && !expert_split_assign(saved, &x, why, sizeof why, &bad) &&
            (x.begin[s] != me->expert_begin || x.count[s] != me->experts))
            return isth_fail(ISTH_EINPUT, "checkpoint %s: site %s trained experts %d-%d, the config gives it %d-%d: a "
                             "site's experts are in its own checkpoints only (the assignment cannot change on resume)",
                             path, me->name, x.begin[s], x.begin[s] + x.count[s] - 1, me->expert_begin,
                             me->expert_begin + me->experts - 1);
    }
    if (tr->log) { /* allowed changes: list them */
        char *now = config_to_text(&tr->cfg), *was = config_to_text(saved);
        const char *p = now && was ? now : NULL; /* out of memory: list nothing */
        while (p && *p) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            char line[CONFIG_FILE_PATH_MAX + 64]; /* a key = value line: a path at most */
            snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), p);
            if (line[0] && line[0] != '[' && !strstr(was, line)) printf("resume: changed: %s\n", line);
            p = nl ? nl + 1 : NULL;
        }
        isth_free(now);
        isth_free(was);
    }
    return ISTH_OK;
}

/* The counters and names a checkpoint's attributes hold must agree with its
 * config, the layout and each other: a tampered or mixed-up file is bad
 * input, not a run that silently continues differently. */
static int check_attributes(Trainer *tr, H5File *f, const char *path, int from_site, long long step,
                            long long adam_t, long long data_step, const char *saved_optimizer)
{
    const SiteInfo *site = &tr->topo.sites[from_site >= 0 ? from_site : tr->topo.site];
    char *mode = NULL, *name = NULL;
    int rc = h5_attr_read_string(f, "/", "mode", &mode);
    if (rc == ISTH_OK) rc = h5_attr_read_string(f, "/", "site", &name);
    if (rc == ISTH_OK && strcmp(mode, tr->cfg.outer.mode))
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute mode = '%s', the config has [outer] mode = %s", path, mode,
                       tr->cfg.outer.mode);
    if (rc == ISTH_OK && strcmp(name, site->name))
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute site = '%s', but this is site %s's file", path, name,
                       site->name);
    isth_free(mode);
    isth_free(name);
    /* AdamW counts one step per optimiser step; plain SGD none */
    const long long want_t = !strcmp(saved_optimizer, "sgd") ? 0 : step;
    if (rc == ISTH_OK && adam_t != want_t)
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute adam_t = %lld, expected %lld for step %lld", path, adam_t,
                       want_t, step);
    if (rc == ISTH_OK && data_step != step)
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: attribute data_step = %lld, expected the step, %lld", path,
                       data_step, step);
    return rc;
}

static int load_checkpoint(Trainer *tr, const char *path, int from_site, int *damaged);
static int load_reported(Trainer *tr, const char *path, int from_site, int fallback, int *damaged);

int ckpt_load(Trainer *tr, const char *path, int fallback, int *damaged)
{
    return load_reported(tr, path, -1, fallback, damaged);
}

int ckpt_load_copy(Trainer *tr, const char *path, int from_site)
{
    int damaged = 0;
    return load_reported(tr, path, from_site, 0, &damaged);
}

int ckpt_load_from(Trainer *tr, const char *path, int from_site, int fallback, int *damaged)
{
    return load_reported(tr, path, from_site, fallback, damaged);
}

static int load_reported(Trainer *tr, const char *path, int from_site, int fallback, int *damaged)
{
    fault_watchdog_arm(tr->cfg.checkpoint.timeout, "loading the checkpoint", FAULT_HINT_IO);
    int site_rank = 0;
    MPI_Comm_rank(tr->topo.site_comm, &site_rank);
    /* what is wrong with this site's file only its ranks see, and any of
     * them may see it (the rank reading a damaged chunk): every rank holds
     * its line until the outcome is known, then the site's lowest rank that
     * has one prints it, once — as a warning when a damaged value makes
     * --resume auto pass over the step */
    const int was = status_set_quiet(1);
    *damaged = 0;
    int rc = load_checkpoint(tr, path, from_site, damaged);
    if (!fallback) *damaged = 0; /* an explicit file: damage is an error */
    status_set_quiet(was);
    if (rc != ISTH_OK) {
        int me = status_has_suppressed() ? site_rank : 1 << 30;
        if (MPI_Allreduce(MPI_IN_PLACE, &me, 1, MPI_INT, MPI_MIN, tr->topo.site_comm) != MPI_SUCCESS) me = -1;
        if (me == site_rank) status_print_held(*damaged, "; falling back to an older one");
        status_discard_suppressed();
    }
    fault_watchdog_disarm();
    return rc;
}

/* from_site >= 0: the file is that site's (a rejoin): this site's
 * learners take copies of its learners' states, residuals start at zero
 * (error feedback is a site's own: another site's would be counted twice). */
static int load_checkpoint(Trainer *tr, const char *path, int from_site, int *damaged)
{
    const double t0 = now_s();
    const Topology *t = &tr->topo;
    const SiteInfo *site = &t->sites[t->site];
    Backend *be = tr->be;
    CkptScratch sc;
    CHECK(ckpt_scratch_alloc(tr, &sc));
    /* nothing of an earlier, failed attempt stays: held results go back to
     * the pool, residuals start at zero (a file without them keeps them so) */
    for (int p = 0; p < tr->shard.fragments; p++)
        if (shard_result(&tr->shard, p)) shard_release(&tr->shard, p);
    shard_zero_residuals(&tr->shard);
    /* a split run's rejoin: the live site's file holds none of this site's
     * experts (its groups' chunks for them were never written): only the
     * dense chunks are read from it; the experts' state comes below */
    tr->load_dense_only = from_site >= 0 && t->experts_split;
    /* a file this site cannot open still goes to the agreement below, so
     * the other sites hear of it instead of waiting for a deadline */
    H5File f;
    int rc = h5_open(&f, path, t->site_comm);
    const int opened = rc == ISTH_OK;
    f.label = "checkpoint";
    char *text = NULL;
    long long step = 0, outer_steps = 0, exchanges = 0, adam_t = 0, first = 0, learners = 0, data_step = 0;
    double tokens = 0;
    if (rc == ISTH_OK) rc = h5_attr_read_string(&f, "/", "config", &text);
    Config saved;
    if (rc == ISTH_OK) rc = compare_configs(tr, text, path, &saved);
    isth_free(text);
    const char *saved_optimizer = rc == ISTH_OK ? saved.train.optimizer : "";
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "step", &step);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "outer_steps", &outer_steps);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "exchanges", &exchanges);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "adam_t", &adam_t);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "first_learner", &first);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "learners", &learners);
    if (rc == ISTH_OK) rc = h5_attr_read_long(&f, "/", "data_step", &data_step);
    if (rc == ISTH_OK) rc = h5_attr_read_double(&f, "/", "tokens", &tokens);
    /* files written before lineages have neither: a fresh start's lineage, no step kept */
    char *text_lineage = NULL, lineage[CKPT_LINEAGE_CAP] = "";
    long long every_site = -1;
    if (rc == ISTH_OK && H5Aexists(f.file, "lineage") > 0) rc = h5_attr_read_string(&f, "/", "lineage", &text_lineage);
    if (text_lineage) snprintf(lineage, sizeof lineage, "%s", text_lineage);
    isth_free(text_lineage);
    if (rc == ISTH_OK && H5Aexists(f.file, "every_site") > 0) rc = h5_attr_read_long(&f, "/", "every_site", &every_site);
    if (rc == ISTH_OK) rc = check_attributes(tr, &f, path, from_site, step, adam_t, data_step, saved_optimizer);
    if (rc == ISTH_OK && from_site >= 0 && (first != t->sites[from_site].first_learner ||
                                            learners != t->sites[from_site].learners))
        rc = isth_fail(ISTH_EINPUT, "checkpoint %s: learners %lld..%lld, site %s has %d..%d", path, first,
                       first + learners - 1, t->sites[from_site].name, t->sites[from_site].first_learner,
                       t->sites[from_site].first_learner + t->sites[from_site].learners - 1);
    if (rc == ISTH_OK && from_site < 0 && tr->mode != MODE_SYNC &&
        (first != site->first_learner || learners != site->learners))
        rc = isth_fail(ISTH_EINPUT,
                       "checkpoint %s: site %s had learners %lld..%lld, the layout gives %d..%d (an outer-mode "
                       "checkpoint keeps one state per learner; change ranks per learner, not the learner count)",
                       path, site->name, first, first + learners - 1, site->first_learner,
                       site->first_learner + site->learners - 1);
    const int P = tr->cfg.outer.fragments;
    double *frag = sc.frag;
    if (rc == ISTH_OK) rc = h5_read_doubles(&f, "/state/fragments", frag, P);
    if (rc == ISTH_OK) rc = h5_read_doubles(&f, "/state/started", frag + P, P);
    int in_flight = 0;
    for (int p = 0; rc == ISTH_OK && tr->mode != MODE_SYNC && p < P; p++) in_flight |= frag[P + p] >= 0;
    if (rc == ISTH_OK && tr->mode == MODE_SYNC) {
        rc = read_params(&f, tr, &sc, "/model");
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, "/inner/m", STATE_ADAM_M);
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, "/inner/v", STATE_ADAM_V);
        if (rc == ISTH_OK) rc = ckpt_transfer_shampoo(&f, tr, &sc, "/inner", 1, 1);
        /* error feedback of a lossy codec; a checkpoint written with codec
         * none has none, and the residuals start at zero */
        const int has_residual = H5Lexists(f.file, "/outer", H5P_DEFAULT) > 0 &&
                                 H5Lexists(f.file, "/outer/residual", H5P_DEFAULT) > 0;
        if (rc == ISTH_OK && shard_any_residual(&tr->shard) && has_residual && from_site < 0) {
            rc = ckpt_read_residual(&f, tr, "/outer/residual");
        } else if (rc == ISTH_OK && shard_any_residual(&tr->shard) && tr->log && from_site < 0) {
            printf("resume: %s has no error-feedback residuals (written without a lossy codec); they start at 0\n",
                   path);
        }
    } else if (rc == ISTH_OK) {
        char g[64], ga[64], gm[64], gr[64];
        const int bf = tr->mode == MODE_BUTTERFLY;
        /* whose state this learner takes: its own, or on a rejoin one of the live site's learners */
        const int k = from_site < 0 ? t->learner : (int)first + (t->learner - site->first_learner) % (int)learners;
        snprintf(ga, sizeof ga, "/learner_%d/outer/anchor", k);
        snprintf(gm, sizeof gm, "/learner_%d/outer/momentum", k);
        snprintf(gr, sizeof gr, "/learner_%d/outer/residual", k);
        rc = ckpt_read_outer(&f, tr, bf ? ga : "/model", OUTER_ANCHOR);
        if (rc == ISTH_OK) rc = ckpt_read_outer(&f, tr, bf ? gm : "/outer/momentum", OUTER_MOMENTUM);
        if (rc == ISTH_OK && from_site < 0) rc = ckpt_read_residual(&f, tr, bf ? gr : "/outer/residual");
        snprintf(g, sizeof g, "/learner_%d/model", k);
        if (rc == ISTH_OK) rc = read_params(&f, tr, &sc, g);
        snprintf(g, sizeof g, "/learner_%d/inner/m", k);
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, g, STATE_ADAM_M);
        snprintf(g, sizeof g, "/learner_%d/inner/v", k);
        if (rc == ISTH_OK) rc = read_moments(&f, tr, &sc, g, STATE_ADAM_V);
        snprintf(g, sizeof g, "/learner_%d/inner", k);
        if (rc == ISTH_OK) rc = ckpt_transfer_shampoo(&f, tr, &sc, g, 1, 1);
        /* exchanges that were in flight (drained before the checkpoint):
         * their results wait in staging slots until their steps */
        if (rc == ISTH_OK) { /* a staging slot per drained fragment; a rank without memory must not
                              * leave the others inside the next collective read */
            for (int p = 0; rc == ISTH_OK && p < P; p++) {
                float *held = frag[P + p] >= 0 ? shard_hold(&tr->shard, p) : NULL;
                if (frag[P + p] >= 0 && !held) rc = ISTH_ERUNTIME;
                /* zero first: what a dense-only read leaves (experts) is no update */
                else if (held) memset(held, 0, sizeof(float) * shard_row_size(&tr->shard));
            }
            if (!coll_all_ok(t->site_comm, rc == ISTH_OK)) rc = ISTH_ERUNTIME;
        }
        snprintf(g, sizeof g, "/learner_%d/outer/pending", k);
        if (rc == ISTH_OK && in_flight) rc = ckpt_read_outer(&f, tr, bf ? g : "/outer/pending", OUTER_PENDING);
        snprintf(g, sizeof g, "/learner_%d/outer/sent", k);
        if (rc == ISTH_OK && in_flight && bf) rc = ckpt_read_outer(&f, tr, g, OUTER_SENT);
        if (rc == ISTH_OK) outer_restore(&tr->outer, frag, frag + P, t->n_sites, (long)step, (long)outer_steps);
        /* split experts' copies and mirrors: this site's own file only (another
         * site's holds other copies); a file without them (written with
         * expert_replicas = 1): they start again from the initial weights */
        tr->load_dense_only = 0; /* the experts' own reads follow */
        const int has_copies = H5Lexists(f.file, "/copies", H5P_DEFAULT) > 0 &&
                               H5Lexists(f.file, "/mirror", H5P_DEFAULT) > 0 &&
                               H5Lexists(f.file, "/state/copies", H5P_DEFAULT) > 0;
        if (rc == ISTH_OK && tr->copies.on && from_site < 0 && has_copies) {
            CopiesView cv = {&tr->copies, &tr->shard.table, 0};
            rc = h5_read_chunks(&f, "/copies", &tr->model, copies_at, &cv);
            cv.mirror = 1;
            if (rc == ISTH_OK) rc = h5_read_chunks(&f, "/mirror", &tr->model, copies_at, &cv);
            double cs[COPIES_STATE_VALUES(CONFIG_MAX_SITES)];
            if (rc == ISTH_OK) rc = h5_read_doubles(&f, "/state/copies", cs, COPIES_STATE_VALUES(t->n_sites));
            if (rc == ISTH_OK) copies_state_load(&tr->copies, t->n_sites, cs);
        } else if (rc == ISTH_OK && tr->copies.on && from_site >= 0 && has_copies) {
            /* a live rejoin: the live site's file holds none of this site's
             * experts but its copies of them (refreshed while this site was
             * live): they become this site's weights and anchor (their inner
             * moments start at zero), its mirrors; this site's copies of
             * the live site's experts are that site's mirrors */
            rc = ckpt_read_experts(&f, tr, &sc, "/copies", OUTER_ANCHOR);
            CopiesView cv = {&tr->copies, &tr->shard.table, 1};
            if (rc == ISTH_OK) rc = h5_read_chunks(&f, "/copies", &tr->model, copies_at, &cv);
            cv.mirror = 0;
            if (rc == ISTH_OK) rc = h5_read_chunks(&f, "/mirror", &tr->model, copies_at, &cv);
            double cs[COPIES_STATE_VALUES(CONFIG_MAX_SITES)];
            if (rc == ISTH_OK) rc = h5_read_doubles(&f, "/state/copies", cs, COPIES_STATE_VALUES(t->n_sites));
            if (rc == ISTH_OK) {
                const long held_from = (long)cs[4 + t->n_sites + t->site]; /* the live site's copy of mine: its step */
                copies_state_load(&tr->copies, t->n_sites, cs);
                for (int s = 0; s < t->n_sites; s++) tr->copies.from_step[s] = -1;
                /* my copy of the live site's experts is its mirror: of its last refresh that sent */
                tr->copies.from_step[from_site] = tr->copies.mirror_step;
                tr->copies.mirror_step = held_from; /* my mirror is its copy of mine */
                if (tr->log)
                    printf("rejoin: site %s's experts from site %s's copy of them (the refresh at step %ld); their "
                           "inner moments start at zero\n", site->name, t->sites[from_site].name, held_from);
            }
        } else if (rc == ISTH_OK && tr->copies.on && tr->log) {
            printf("resume: %s holds no copies of the experts; they start again from the initial weights\n", path);
        }
    }
    tr->load_dense_only = 0;
    ckpt_scratch_free(&sc);
    int outcome[2] = {rc != ISTH_OK, opened && f.damaged}; /* failed, a value was damaged */
    if (opened) h5_close(&f);
    /* every site must resume the same step: the site agrees on its outcome,
     * then the sites' first ranks compare through the link */
    int agreed = MPI_Allreduce(MPI_IN_PLACE, outcome, 2, MPI_INT, MPI_MAX, t->site_comm);
    if (agreed != MPI_SUCCESS) return isth_fail(ISTH_ERUNTIME, "resume: MPI_Allreduce failed");
    const int fail = outcome[0];
    long mine[3] = {fail ? -1 : (long)step, fail, outcome[1]}, *all = isth_malloc(sizeof mine * (size_t)t->n_sites);
    CHECK_ALLOC(all);
    /* the other sites are loading too, and a load may take as long as the
     * checkpoint deadline, not an exchange's (a rejoining site loads a whole
     * checkpoint it has just received while the host loads its own) */
    const double exchange_deadline = link_timeout(&tr->link);
    if (tr->cfg.checkpoint.timeout > exchange_deadline) link_set_timeout(&tr->link, tr->cfg.checkpoint.timeout);
    int crc = trainer_control(tr, mine, sizeof mine, all, "resume agreement");
    link_set_timeout(&tr->link, exchange_deadline);
    int any_fail = 0, same = 1, other = 0, any_damaged = 0;
    for (int s2 = 0; crc == ISTH_OK && s2 < t->n_sites; s2++) {
        if (link_is_lost(&tr->link, s2)) continue; /* it missed even that: its slot is empty */
        const long *site_outcome = all + 3 * s2;
        any_fail |= site_outcome[1] != 0;
        any_damaged |= site_outcome[2] != 0;
        other |= site_outcome[1] && !site_outcome[2]; /* failed for another reason */
        same &= site_outcome[0] == all[3 * t->site];
    }
    isth_free(all);
    CHECK(crc);
    /* only damaged values (on any site) make the step one to pass over */
    *damaged = any_fail && any_damaged && !other;
    if (any_fail) return rc != ISTH_OK ? rc : ISTH_EINPUT;
    if (!same) return isth_fail(ISTH_EINPUT, "resume: the sites' checkpoints are of different steps");
    tr->step = (long)step;
    /* a resume: every site has this step (ckpt_find; after a fetch every
     * site writes it at once). A copy (a rejoin): the live site's kept
     * step, which this site's own files have too, stays kept until the
     * sites complete a checkpoint together */
    tr->ckpt_every_site = from_site < 0 ? tr->step : (long)every_site;
    ckpt_lineage_set(lineage, t->n_sites);
    tr->cursor.step = (uint64_t)data_step;
    tr->tokens_seen = tokens;
    be->optimizer_t = (long)adam_t;
    shard_restore_exchanges(&tr->shard, (uint64_t)exchanges);
    if (tr->log) {
        printf("resumed from %s: step %lld, %.0f tokens, in %.2f s\n", path, step, tokens, now_s() - t0);
        fflush(stdout);
    }
    return ISTH_OK;
}
