/* metrics.c — see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "codec.h"
#include "status.h"
#include "version.h"

int make_dirs(const char *path)
{
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return isth_fail(ISTH_EINPUT, "directory path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return isth_fail(ISTH_EINPUT, "cannot create directory %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return isth_fail(ISTH_EINPUT, "%s exists and is not a directory", path);
    return ISTH_OK;
}

/* --- one record: begin, its fields in order, end (the time last, then flushed) --- */

/* A JSON string: quotes, backslashes and control characters escaped, bytes
 * that are not UTF-8 as U+FFFD; NULL as null. */
static void put_string(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            p++;
        } else if (c < 0x20) {
            switch (c) {
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            case '\b': fputs("\\b", f); break;
            case '\f': fputs("\\f", f); break;
            default: fprintf(f, "\\u%04x", c);
            }
            p++;
        } else if (c < 0x80) {
            fputc((int)c, f);
            p++;
        } else {
            /* a well-formed UTF-8 sequence is copied; anything else is one U+FFFD per byte */
            int n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
            unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f; /* no surrogates */
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
            for (int i = 1; i < n; i++)
                if (p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xbf)) n = 0;
            if (n) {
                fwrite(p, 1, (size_t)n, f);
                p += n;
            } else {
                fputs("\\ufffd", f);
                p++;
            }
        }
    }
    fputc('"', f);
}

static void begin(Metrics *mt)
{
    mt->fields = 0;
    fputc('{', mt->f);
}

static void key(Metrics *mt, const char *name)
{
    fprintf(mt->f, "%s\"%s\":", mt->fields++ ? "," : "", name);
}

static void field_str(Metrics *mt, const char *name, const char *v)
{
    key(mt, name);
    put_string(mt->f, v);
}

static void field_long(Metrics *mt, const char *name, long v)
{
    key(mt, name);
    fprintf(mt->f, "%ld", v);
}

static void field_bool(Metrics *mt, const char *name, int v)
{
    key(mt, name);
    fputs(v ? "true" : "false", mt->f);
}

/* A number in printf's `fmt`, or null for NaN/Inf (which JSON cannot hold). */
static void field_num(Metrics *mt, const char *name, const char *fmt, double v)
{
    key(mt, name);
    if (isfinite(v)) fprintf(mt->f, fmt, v);
    else fputs("null", mt->f);
}

/* The record's last field, "time": the wall clock in Unix seconds, to the
 * millisecond; then the line is flushed (checked). */
static int end(Metrics *mt)
{
    key(mt, "time");
    fprintf(mt->f, "%.3f}\n", wall_s());
    return metrics_flush(mt);
}

int metrics_open(Metrics *mt, const char *out_dir, const MetricsStart *st)
{
    CHECK(make_dirs(out_dir));
    snprintf(mt->path, sizeof mt->path, "%s/metrics.jsonl", out_dir);
    mt->f = fopen(mt->path, "a");
    if (!mt->f) return isth_fail(ISTH_EINPUT, "cannot open %s: %s", mt->path, strerror(errno));
    const char *job = NULL;
    const char *vars[] = {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"};
    for (int i = 0; i < 3 && !job; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) job = v;
    }
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    char fp[24];
    snprintf(fp, sizeof fp, "%016llx", st->fingerprint);
    begin(mt);
    field_num(mt, "start", "%.3f", wall_s());
    field_str(mt, "command", st->command);
    field_str(mt, "job_id", job);
    field_str(mt, "build", isthmus_build());
    field_str(mt, "configure", isthmus_configure_args());
    field_str(mt, "config", st->config);
    field_str(mt, "fingerprint", fp);
    field_str(mt, "run_id", st->run_id);
    field_str(mt, "site", st->site);
    field_long(mt, "ranks", st->ranks);
    field_str(mt, "host", host[0] ? host : NULL);
    field_long(mt, "pid", (long)getpid());
    key(mt, "resumed_from_step");
    if (st->resumed_from_step >= 0) fprintf(mt->f, "%ld", st->resumed_from_step);
    else fputs("null", mt->f);
    return end(mt);
}

int metrics_close(Metrics *mt)
{
    int rc = ISTH_OK;
    if (mt->f && fclose(mt->f) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "metrics %s: closing failed: %s (disk full?)", mt->path, strerror(errno));
    mt->f = NULL;
    return rc;
}

int metrics_flush(Metrics *mt)
{
    if (!mt || !mt->f) return ISTH_OK;
    if (fflush(mt->f) != 0 || ferror(mt->f))
        return isth_fail(ISTH_ERUNTIME, "metrics %s: write failed: %s (disk full?)", mt->path, strerror(errno));
    return ISTH_OK;
}

/* A duration for a person: 42s, 7m05s, 3h12m, 2d04h. */
static void duration_text(double secs, char *out, size_t cap)
{
    if (!isfinite(secs) || secs < 0 || secs >= 1e15) { /* beyond a long's range after the cast: another site's
                                                       * summary can say anything (progress.h) */
        snprintf(out, cap, "?");
        return;
    }
    const long s = (long)(secs + 0.5);
    if (s < 60) snprintf(out, cap, "%lds", s);
    else if (s < 3600) snprintf(out, cap, "%ldm%02lds", s / 60, s % 60);
    else if (s < 86400) snprintf(out, cap, "%ldh%02ldm", s / 3600, s % 3600 / 60);
    else snprintf(out, cap, "%ldd%02ldh", s / 86400, s % 86400 / 3600);
}

int metrics_step(Metrics *mt, const StepLog *s)
{
    /* bits per token (per byte only for a byte model): "bpt", never "bpb",
     * which the eval records keep for bits per byte of text */
    const double bpt = s->loss / M_LN2;
    /* after a site's loss the line says how many are left, and which sites
     * have missed deadlines, how often */
    char sites[48] = "", missed[160] = "";
    if (s->sites_present < s->n_sites) snprintf(sites, sizeof sites, " | sites %d/%d", s->sites_present, s->n_sites);
    int n_missed = 0;
    for (int i = 0; i < s->n_sites && i < CONFIG_MAX_SITES; i++) {
        if (s->misses[i] <= 0 || !s->site_names[i]) continue;
        const size_t a = strlen(missed);
        snprintf(missed + a, sizeof missed - a, "%s %s %d", a ? "," : " | missed", s->site_names[i], s->misses[i]);
        n_missed++;
    }
    char eta[32];
    duration_text(s->eta_s, eta, sizeof eta);
    printf("step %6ld/%ld | loss %.4f | bpt %.4f | lr %.3e | gnorm %.3f | %8.0f tok/s | %7.1f ms"
           " | aux %.4f z %.5f | drop %.1f%% | link %.0f B %.3f s | eta %s%s%s\n",
           s->step, s->steps, s->loss, bpt, s->lr, s->grad_norm, s->tokens_per_s, s->ms_per_step,
           s->aux_loss, s->z_loss, 100.0 * s->dropped_frac, s->inter_site_bytes, s->link_wait_s, eta, sites, missed);
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_long(mt, "step", s->step);
    field_num(mt, "loss", "%.17g", s->loss);
    field_num(mt, "bpt", "%.6f", bpt);
    field_num(mt, "aux_loss", "%.6g", s->aux_loss);
    field_num(mt, "z_loss", "%.6g", s->z_loss);
    field_num(mt, "lr", "%.6g", s->lr);
    field_num(mt, "grad_norm", "%.6g", s->grad_norm);
    field_num(mt, "tokens_per_s", "%.1f", s->tokens_per_s);
    field_num(mt, "ms_per_step", "%.3f", s->ms_per_step);
    field_num(mt, "tokens", "%.0f", s->tokens);
    field_num(mt, "dropped_frac", "%.6f", s->dropped_frac);
    field_num(mt, "remote_frac", "%.6f", s->remote_frac);
    field_num(mt, "a2a_bytes", "%.0f", s->a2a_bytes);
    field_num(mt, "inter_site_bytes", "%.0f", s->inter_site_bytes);
    field_num(mt, "link_wait_s", "%.6f", s->link_wait_s);
    field_num(mt, "compute_s", "%.6f", s->compute_s);
    field_num(mt, "inter_site_bytes_total", "%.0f", s->inter_site_total);
    field_num(mt, "eta_s", "%.3f", s->eta_s);
    if (s->sites_present < s->n_sites) field_long(mt, "sites_present", s->sites_present);
    if (n_missed) {
        key(mt, "deadline_misses");
        int k = 0;
        for (int i = 0; i < s->n_sites && i < CONFIG_MAX_SITES; i++) {
            if (s->misses[i] <= 0 || !s->site_names[i]) continue;
            fputs(k++ ? "," : "{", mt->f);
            put_string(mt->f, s->site_names[i]);
            fprintf(mt->f, ":%d", s->misses[i]);
        }
        fputc('}', mt->f);
    }
    return end(mt);
}

int metrics_eval(Metrics *mt, const char *set, int byte_set, long step, double bpb, double loss, size_t tokens,
                 double bytes, double seconds, const char *model)
{
    const char *which = !model ? "" : !strcmp(model, "whole") ? " | the whole model" : " | the site's model";
    if (byte_set) /* each token a byte */
        printf("eval %-5s step %6ld | bpb %.4f | %zu bytes | %.1f s%s\n", set, step, bpb, tokens, seconds, which);
    else
        printf("eval %-5s step %6ld | bpb %.4f | loss %.4f per token | %zu tokens, %.0f bytes | %.1f s%s\n", set, step,
               bpb, loss, tokens, bytes, seconds, which);
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "eval", set);
    field_long(mt, "step", step);
    field_num(mt, "bpb", "%.9f", bpb);
    field_num(mt, "loss", "%.9f", loss);
    key(mt, "tokens");
    fprintf(mt->f, "%zu", tokens);
    field_num(mt, "bytes", "%.0f", bytes);
    field_num(mt, "seconds", "%.3f", seconds);
    if (model) field_str(mt, "model", model);
    return end(mt);
}

int metrics_site_step(Metrics *mt, const char *site, long step, long steps, int averaged, double loss,
                      double tokens_per_s, double ms_per_step, long at_step)
{
    const double eta = step < steps ? (double)(steps - step) * ms_per_step / 1e3 : 0.0;
    char eta_text[32];
    duration_text(eta, eta_text, sizeof eta_text);
    printf("site %s step %ld/%ld | loss %.4f (mean of %d steps) | %8.0f tok/s | %7.1f ms | eta %s | heard after "
           "step %ld\n", site, step, steps, loss, averaged, tokens_per_s, ms_per_step, eta_text, at_step);
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "site_step", site);
    field_long(mt, "step", step);
    field_long(mt, "steps_averaged", averaged);
    field_num(mt, "loss", "%.7g", loss);
    field_num(mt, "tokens_per_s", "%.1f", tokens_per_s);
    field_num(mt, "ms_per_step", "%.3f", ms_per_step);
    field_num(mt, "eta_s", "%.3f", eta);
    field_long(mt, "heard_after_step", at_step);
    return end(mt);
}

int metrics_outer(Metrics *mt, long outer_step, int fragment, long started, long step, const ExchangeReport *r)
{
    printf("outer %5ld | fragment %d | started after step %ld, applied after step %ld | payload %.0f B | "
           "codec rel err %.4f | sites %d/%d%s%s | sent after %d step(s) | arrived %s\n",
           outer_step, fragment, started, step, r->payload_bytes, r->codec_rel_error, r->accepted_sites,
           r->n_sites, r->rejected[0] ? " | rejected: " : "", r->rejected, r->sent_poll,
           r->arrived_poll >= 0 ? "while training" : "at completion");
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_long(mt, "outer", outer_step);
    field_long(mt, "fragment", fragment);
    field_long(mt, "started_step", started);
    field_long(mt, "step", step);
    field_num(mt, "payload_bytes", "%.0f", r->payload_bytes);
    field_num(mt, "codec_rel_error", "%.6g", r->codec_rel_error);
    field_long(mt, "accepted_sites", r->accepted_sites);
    field_long(mt, "sites", r->n_sites);
    field_long(mt, "sent_after_polls", r->sent_poll);
    field_long(mt, "arrived_after_polls", r->arrived_poll);
    field_str(mt, "rejected", r->rejected);
    return end(mt);
}

int metrics_mix(Metrics *mt, long round, int fragment, int partner, int crosses, long started, long step,
                 const ExchangeReport *r, double pair_distance)
{
    printf("mix %5ld | fragment %d | partner learner %d%s | started after step %ld, applied after step %ld | "
           "payload %.0f B %s | codec rel err %.4f | pair distance %.5f%s%s\n",
           round, fragment, partner, crosses ? " (other site)" : "", started, step, r->payload_bytes,
           codec_name(r->codec), r->codec_rel_error, pair_distance, r->rejected[0] ? " | rejected: " : "", r->rejected);
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_long(mt, "mix", round);
    field_long(mt, "fragment", fragment);
    field_long(mt, "partner", partner);
    field_long(mt, "crossed_sites", crosses);
    field_long(mt, "started_step", started);
    field_long(mt, "step", step);
    field_num(mt, "payload_bytes", "%.0f", r->payload_bytes);
    field_str(mt, "codec", codec_name(r->codec));
    field_num(mt, "codec_rel_error", "%.6g", r->codec_rel_error);
    field_num(mt, "pair_distance", "%.6g", pair_distance);
    field_long(mt, "accepted", r->accepted_sites == 2);
    field_str(mt, "rejected", r->rejected);
    return end(mt);
}

int metrics_run(Metrics *mt, const char *site, const char *mode, const char *codec, int sites, int learners,
                long steps)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "run", "start");
    field_str(mt, "site", site);
    field_str(mt, "mode", mode);
    field_str(mt, "codec", codec);
    field_long(mt, "sites", sites);
    field_long(mt, "learners", learners);
    field_long(mt, "steps", steps);
    return end(mt);
}

int metrics_site_lost(Metrics *mt, const char *site, long step, const char *what, double after_s, int sites_left)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "site_lost", site);
    field_long(mt, "step", step);
    field_str(mt, "what", what);
    field_num(mt, "after_s", "%.3f", after_s);
    field_long(mt, "sites_left", sites_left);
    return end(mt);
}

int metrics_site_rejoined(Metrics *mt, const char *site, long step, long lost_at, double tokens_lost,
                          double tokens_lost_total, double rejoin_s)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "site_rejoined", site);
    field_long(mt, "step", step);
    field_long(mt, "lost_at", lost_at);
    field_num(mt, "tokens_lost", "%.0f", tokens_lost);
    field_num(mt, "tokens_lost_total", "%.0f", tokens_lost_total);
    field_num(mt, "rejoin_s", "%.3f", rejoin_s);
    return end(mt);
}

int metrics_summary_traffic(Metrics *mt, long steps, long from_step, double inter_site_bytes,
                            double sync_equivalent_bytes, double reduction, int same_start, int max_peer_learners,
                            double auth_failures, double assembly_bytes, double refresh_bytes)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "summary", "traffic");
    field_long(mt, "steps", steps);
    field_long(mt, "from_step", from_step);
    field_num(mt, "inter_site_bytes", "%.0f", inter_site_bytes);
    field_num(mt, "sync_equivalent_bytes", "%.0f", sync_equivalent_bytes);
    field_num(mt, "reduction", "%.3f", reduction);
    field_bool(mt, "same_start", same_start);
    field_long(mt, "max_peer_learners", max_peer_learners);
    field_num(mt, "auth_failures", "%.0f", auth_failures);
    if (assembly_bytes >= 0) field_num(mt, "assembly_bytes", "%.0f", assembly_bytes);
    if (refresh_bytes >= 0) field_num(mt, "refresh_bytes", "%.0f", refresh_bytes);
    return end(mt);
}

int metrics_summary_compute(Metrics *mt, long steps, long from_step, double wall_s, double compute_s,
                            double utilisation, double link_wait_s, double paused_s, double final_outer_s,
                            double utilisation_before_final)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "summary", "compute");
    field_long(mt, "steps", steps);
    field_long(mt, "from_step", from_step);
    field_num(mt, "wall_s", "%.3f", wall_s);
    field_num(mt, "compute_s", "%.3f", compute_s);
    field_num(mt, "utilisation", "%.5f", utilisation);
    field_num(mt, "link_wait_s", "%.3f", link_wait_s);
    field_num(mt, "paused_s", "%.3f", paused_s);
    field_num(mt, "final_outer_s", "%.3f", final_outer_s);
    field_num(mt, "utilisation_before_final", "%.5f", utilisation_before_final);
    return end(mt);
}

int metrics_checkpoint(Metrics *mt, const char *path, long step, double mb, double seconds, double mb_all_sites,
                       double seconds_all_sites)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_str(mt, "checkpoint", path);
    field_long(mt, "step", step);
    field_num(mt, "mb", "%.3f", mb);
    field_num(mt, "seconds", "%.3f", seconds);
    field_num(mt, "mb_all_sites", "%.3f", mb_all_sites);
    field_num(mt, "seconds_all_sites", "%.3f", seconds_all_sites);
    return end(mt);
}

int metrics_link_late(Metrics *mt, unsigned long long exchange, int fragment, int steps, int window,
                      double arrived_fraction, double elapsed_s, double eta_s, double window_left_s)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    key(mt, "link_late");
    fprintf(mt->f, "%llu", exchange);
    field_long(mt, "fragment", fragment);
    field_long(mt, "steps", steps);
    field_long(mt, "window", window);
    field_num(mt, "arrived_fraction", "%.4f", arrived_fraction);
    field_num(mt, "elapsed_s", "%.3f", elapsed_s);
    field_num(mt, "eta_s", "%.3f", isfinite(eta_s) ? eta_s : -1.0);
    field_num(mt, "window_left_s", "%.3f", window_left_s);
    return end(mt);
}

int metrics_spread(Metrics *mt, long round, long step, int learners, int samples, double max_rel_dist_to_mean)
{
    if (!mt || !mt->f) return ISTH_OK;
    begin(mt);
    field_long(mt, "spread", round);
    field_long(mt, "step", step);
    field_long(mt, "learners", learners);
    field_long(mt, "samples", samples);
    field_num(mt, "max_rel_dist_to_mean", "%.6g", max_rel_dist_to_mean);
    return end(mt);
}
