/* metrics.c — see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "reduce.h"
#include "status.h"

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

int metrics_open(Metrics *mt, const char *out_dir)
{
    CHECK(make_dirs(out_dir));
    snprintf(mt->path, sizeof mt->path, "%s/metrics.jsonl", out_dir);
    mt->f = fopen(mt->path, "a");
    if (!mt->f) return isth_fail(ISTH_EINPUT, "cannot open %s: %s", mt->path, strerror(errno));
    return ISTH_OK;
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

/* A JSON number, or null for NaN/Inf (which JSON cannot hold). */
typedef struct {
    char text[40];
} JsonNum;

static JsonNum jnum(const char *fmt, double v)
{
    JsonNum n;
    if (isfinite(v)) snprintf(n.text, sizeof n.text, fmt, v);
    else snprintf(n.text, sizeof n.text, "null");
    return n;
}

int metrics_step(Metrics *mt, const StepLog *s)
{
    const double bpb = s->loss / M_LN2;
    /* after a site's loss the line says how many are left */
    char sites[48] = "", json_sites[48] = "";
    if (s->sites_present < s->n_sites) {
        snprintf(sites, sizeof sites, " | sites %d/%d", s->sites_present, s->n_sites);
        snprintf(json_sites, sizeof json_sites, ",\"sites_present\":%d", s->sites_present);
    }
    /* and which sites have missed deadlines, how often */
    char missed[160] = "", json_missed[192] = "";
    for (int i = 0; i < s->n_sites && i < CONFIG_MAX_SITES; i++) {
        if (s->misses[i] <= 0 || !s->site_names[i]) continue;
        const size_t a = strlen(missed), b = strlen(json_missed);
        snprintf(missed + a, sizeof missed - a, "%s %s %d", a ? "," : " | missed", s->site_names[i], s->misses[i]);
        snprintf(json_missed + b, sizeof json_missed - b, "%s\"%s\":%d", b ? "," : ",\"deadline_misses\":{",
                 s->site_names[i], s->misses[i]);
    }
    if (json_missed[0]) snprintf(json_missed + strlen(json_missed), sizeof json_missed - strlen(json_missed), "}");
    printf("step %6ld/%ld | loss %.4f | bpb %.4f | lr %.3e | gnorm %.3f | %8.0f tok/s | %7.1f ms"
           " | aux %.4f z %.5f | drop %.1f%% | link %.0f B %.3f s%s%s\n",
           s->step, s->steps, s->loss, bpb, s->lr, s->grad_norm, s->tokens_per_s, s->ms_per_step,
           s->aux_loss, s->z_loss, 100.0 * s->dropped_frac, s->inter_site_bytes, s->link_wait_s, sites, missed);
    fflush(stdout);
    if (!mt->f) return ISTH_OK;
    fprintf(mt->f,
            "{\"step\":%ld,\"loss\":%s,\"bpb\":%s,\"aux_loss\":%s,\"z_loss\":%s,\"lr\":%.6g,"
            "\"grad_norm\":%s,\"tokens_per_s\":%.1f,\"ms_per_step\":%.3f,\"tokens\":%.0f,"
            "\"dropped_frac\":%s,\"a2a_bytes\":%.0f,\"inter_site_bytes\":%.0f,\"link_wait_s\":%.6f,"
            "\"compute_s\":%.6f,\"inter_site_bytes_total\":%.0f%s%s}\n",
            s->step, jnum("%.17g", s->loss).text, jnum("%.6f", bpb).text, jnum("%.6g", s->aux_loss).text,
            jnum("%.6g", s->z_loss).text, s->lr, jnum("%.6g", s->grad_norm).text, s->tokens_per_s,
            s->ms_per_step, s->tokens, jnum("%.6f", s->dropped_frac).text, s->a2a_bytes, s->inter_site_bytes,
            s->link_wait_s, s->compute_s, s->inter_site_total, json_sites, json_missed);
    return metrics_flush(mt);
}

int metrics_eval(Metrics *mt, const char *set, int byte_set, long step, double bpb, double loss, size_t tokens,
                 double bytes, double seconds)
{
    if (byte_set) /* each token a byte */
        printf("eval %-5s step %6ld | bpb %.4f | %zu bytes | %.1f s\n", set, step, bpb, tokens, seconds);
    else
        printf("eval %-5s step %6ld | bpb %.4f | loss %.4f per token | %zu tokens, %.0f bytes | %.1f s\n", set, step, bpb,
               loss, tokens, bytes, seconds);
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    fprintf(mt->f, "{\"eval\":\"%s\",\"step\":%ld,\"bpb\":%s,\"loss\":%s,\"tokens\":%zu,\"bytes\":%.0f,\"seconds\":%.3f}\n",
            set, step, jnum("%.9f", bpb).text, jnum("%.9f", loss).text, tokens, bytes, seconds);
    return metrics_flush(mt);
}

int metrics_outer(Metrics *mt, long outer_step, int fragment, long started, long step, const void *report)
{
    const ReduceReport *r = report;
    printf("outer %5ld | fragment %d | started after step %ld, applied after step %ld | payload %.0f B | "
           "codec rel err %.4f | sites %d/%d%s%s | sent after %d step(s) | arrived %s\n",
           outer_step, fragment, started, step, r->payload_bytes, r->codec_rel_error, r->accepted_sites,
           r->n_sites, r->rejected[0] ? " | rejected: " : "", r->rejected, r->sent_poll,
           r->arrived_poll >= 0 ? "while training" : "at completion");
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    fprintf(mt->f,
            "{\"outer\":%ld,\"fragment\":%d,\"started_step\":%ld,\"step\":%ld,\"payload_bytes\":%.0f,"
            "\"codec_rel_error\":%s,\"accepted_sites\":%d,\"sites\":%d,\"sent_after_polls\":%d,\"arrived_after_polls\":%d,"
            "\"rejected\":\"%s\"}\n",
            outer_step, fragment, started, step, r->payload_bytes, jnum("%.6g", r->codec_rel_error).text,
            r->accepted_sites, r->n_sites, r->sent_poll, r->arrived_poll, r->rejected);
    return metrics_flush(mt);
}

int metrics_mix(Metrics *mt, long round, int fragment, int partner, int crosses, long started, long step,
                 const void *report, double pair_distance)
{
    const ReduceReport *r = report;
    printf("mix %5ld | fragment %d | partner learner %d%s | started after step %ld, applied after step %ld | "
           "payload %.0f B %s | codec rel err %.4f | pair distance %.5f%s%s\n",
           round, fragment, partner, crosses ? " (other site)" : "", started, step, r->payload_bytes,
           codec_name(r->codec), r->codec_rel_error, pair_distance, r->rejected[0] ? " | rejected: " : "", r->rejected);
    fflush(stdout);
    if (!mt || !mt->f) return ISTH_OK;
    fprintf(mt->f,
            "{\"mix\":%ld,\"fragment\":%d,\"partner\":%d,\"crossed_sites\":%d,\"started_step\":%ld,\"step\":%ld,"
            "\"payload_bytes\":%.0f,\"codec\":\"%s\",\"codec_rel_error\":%s,\"pair_distance\":%s,"
            "\"accepted\":%d,\"rejected\":\"%s\"}\n",
            round, fragment, partner, crosses, started, step, r->payload_bytes, codec_name(r->codec),
            jnum("%.6g", r->codec_rel_error).text, jnum("%.6g", pair_distance).text,
            r->accepted_sites == 2, r->rejected);
    return metrics_flush(mt);
}
