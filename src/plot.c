/* plot.c — see plot.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "status.h"

#define PLOT_MAX_RUNS 32
#define PLOT_PATH_MAX 4096
#define PLOT_MAX_SITES 8 /* other sites' loss curves per run (site_step records) */

/* The number after "key": in a JSON line, if there is one. */
static int json_number(const char *line, const char *key, double *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return 0;
    char *end;
    *v = strtod(p + strlen(pat), &end);
    return end != p + strlen(pat);
}

/* The string after "key": (no escapes: isthmus writes none in these). */
static int json_string(const char *line, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(line, pat);
    if (!p) return 0;
    p += strlen(pat);
    const char *q = strchr(p, '"');
    if (!q) return 0;
    snprintf(out, cap, "%.*s", (int)(q - p), p);
    return 1;
}

typedef struct {
    char label[256];
    char site[64];      /* the site the file logs (its run record) */
    int steps, evals[2];
    int positive_bytes; /* some step moved bytes between sites (a log scale can show it) */
    int n_sites;        /* other sites with site_step records (the first PLOT_MAX_SITES) */
    char sites[PLOT_MAX_SITES][64];
} RunData;

/* Points (x, y) in two growing arrays. */
typedef struct {
    double *x, *y;
    int n, cap;
} Points;

static int points_add(Points *p, double x, double y)
{
    if (p->n == p->cap) {
        const int cap = p->cap ? 2 * p->cap : 64;
        double *a = isth_realloc(p->x, sizeof(double) * (size_t)cap);
        if (a) p->x = a;
        double *b = a ? isth_realloc(p->y, sizeof(double) * (size_t)cap) : NULL;
        if (b) p->y = b;
        if (!a || !b) return isth_fail(ISTH_ERUNTIME, "plot: out of memory");
        p->cap = cap;
    }
    p->x[p->n] = x;
    p->y[p->n++] = y;
    return ISTH_OK;
}

/* Write the points with x scaled (steps to tokens) into tmp/NAME; frees them. */
static int points_write(Points *p, double scale, const char *tmp, const char *name)
{
    char path[PLOT_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    int ok = f != NULL;
    for (int i = 0; ok && i < p->n; i++) ok = fprintf(f, "%.0f %.9g\n", p->x[i] * scale, p->y[i]) > 0;
    if (f) ok = fclose(f) == 0 && ok;
    isth_free(p->x);
    isth_free(p->y);
    memset(p, 0, sizeof *p);
    return ok ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "plot: writing %s failed", path);
}

/* The two eval sets the plot shows: the first two names met, in run order
 * (prose and tech unless the runs named their own in [eval.*]). */
static char set_names[2][64];

static int set_slot(const char *name)
{
    for (int k = 0; k < 2; k++) {
        if (!set_names[k][0]) snprintf(set_names[k], sizeof set_names[k], "%s", name);
        if (!strcmp(set_names[k], name)) return k;
    }
    return -1; /* a third set: not plotted */
}

/* Read one run's metrics.jsonl into data files in tmp (rI_steps; rI_e0,
 * rI_e1: the two eval sets; rI_s0...: the other sites' losses). */
static int read_run(const char *dir, int index, const char *tmp, RunData *rd)
{
    char path[PLOT_PATH_MAX], out[PLOT_PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return isth_fail(ISTH_EINPUT, "plot: %s: %s (a run directory holds metrics.jsonl)", path, strerror(errno));
    memset(rd, 0, sizeof *rd);
    const char *base = strrchr(dir, '/');
    while (base && base[1] == '\0' && base > dir) { /* a trailing slash */
        const char *b = base - 1;
        while (b > dir && *b != '/') b--;
        base = b;
    }
    base = base && *base == '/' ? base + 1 : dir;
    snprintf(rd->label, sizeof rd->label, "%.*s", (int)strcspn(base, "/"), base);
    snprintf(out, sizeof out, "%s/r%d_steps", tmp, index);
    FILE *fs = fopen(out, "w");
    if (!fs) {
        fclose(f);
        return isth_fail(ISTH_ERUNTIME, "plot: cannot write into %s: %s", tmp, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    int have_run = 0;
    double last_total = 0, offset = 0, summed = 0, last_step = 0, last_tokens = 0;
    /* eval lines may precede the step line of their step, and tokens per
     * step are known at the end: keep them (and the other sites' losses)
     * and place them after */
    Points evals[2] = {{0}}, sites[PLOT_MAX_SITES] = {{0}};
    int rc = ISTH_OK;
    while (rc == ISTH_OK && getline(&line, &cap, f) > 0) {
        double step, v;
        char s[64];
        if (!have_run && json_string(line, "run", s, sizeof s)) {
            char mode[32] = "?", codec[32] = "?";
            json_string(line, "mode", mode, sizeof mode);
            json_string(line, "codec", codec, sizeof codec);
            json_string(line, "site", rd->site, sizeof rd->site);
            const size_t n = strlen(rd->label);
            snprintf(rd->label + n, sizeof rd->label - n, " (%s, %s)", mode, codec);
            have_run = 1;
        } else if (!strncmp(line, "{\"site_step\":", 13) && json_string(line, "site_step", s, sizeof s) &&
                   json_number(line, "step", &step) && json_number(line, "loss", &v)) {
            int k = 0; /* the site's curve: a new one while there is room */
            while (k < rd->n_sites && strcmp(rd->sites[k], s)) k++;
            if (k == rd->n_sites && k < PLOT_MAX_SITES) snprintf(rd->sites[rd->n_sites++], sizeof rd->sites[0], "%s", s);
            if (k < rd->n_sites) rc = points_add(&sites[k], step, v);
        } else if (!strncmp(line, "{\"step\":", 8) && json_number(line, "step", &step)) {
            double tokens = 0, loss = NAN, bytes = 0, total;
            json_number(line, "tokens", &tokens);
            json_number(line, "loss", &loss);
            json_number(line, "inter_site_bytes", &bytes);
            if (json_number(line, "inter_site_bytes_total", &total)) {
                if (total < last_total) offset += last_total; /* a restart counts from 0 again */
                last_total = total;
                summed = offset + total;
            } else {
                summed += bytes; /* an older file: the logged steps' bytes only */
            }
            if (summed > 0) rd->positive_bytes = 1;
            fprintf(fs, "%.0f %.0f %.9g %.0f\n", step, tokens, loss, summed);
            last_step = step;
            last_tokens = tokens;
            rd->steps++;
        } else if (json_string(line, "eval", s, sizeof s) && json_number(line, "step", &step) &&
                   json_number(line, "bpb", &v)) {
            const int k = set_slot(s);
            if (k >= 0) rc = points_add(&evals[k], step, v);
        }
    }
    free(line);
    fclose(f);
    if (fclose(fs) != 0 && rc == ISTH_OK) rc = isth_fail(ISTH_ERUNTIME, "plot: writing into %s failed", tmp);
    /* tokens at an eval's (or another site's) step: every step of a run trains the same number */
    const double per_step = last_step > 0 ? last_tokens / last_step : 0;
    for (int k = 0; k < 2; k++) {
        rd->evals[k] = evals[k].n;
        snprintf(out, sizeof out, "r%d_e%d", index, k);
        const int wrc = points_write(&evals[k], per_step, tmp, out);
        if (rc == ISTH_OK) rc = wrc;
    }
    for (int k = 0; k < PLOT_MAX_SITES; k++) {
        snprintf(out, sizeof out, "r%d_s%d", index, k);
        const int wrc = k < rd->n_sites ? points_write(&sites[k], per_step, tmp, out) : ISTH_OK;
        if (rc == ISTH_OK) rc = wrc;
    }
    if (rc == ISTH_OK && rd->steps == 0 && rd->evals[0] + rd->evals[1] == 0)
        rc = isth_fail(ISTH_EINPUT, "plot: %s has no step or eval lines", path);
    return rc;
}

/* A gnuplot single-quoted string: ' doubled. */
static void quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* One panel: every run that has data for it, or "no data". */
static void panel(FILE *g, const char *title, const char *xlabel, const char *ylabel, const char *file,
                  const char *columns, const RunData *rd, int n, int which /* 0 steps, 1 and 2 the eval sets, 3 bytes */)
{
    fprintf(g, "set title ");
    quoted(g, title);
    fprintf(g, "\nset xlabel ");
    quoted(g, xlabel);
    fprintf(g, "\nset ylabel ");
    quoted(g, ylabel);
    fprintf(g, "\n%s\n", which == 3 ? "set logscale y" : "unset logscale y");
    int any = 0;
    for (int i = 0; i < n; i++) {
        const int has = which == 0 ? rd[i].steps > 0 : which == 3 ? rd[i].positive_bytes : rd[i].evals[which - 1] > 0;
        char label[400];
        /* a run with other sites' curves names its own site too */
        snprintf(label, sizeof label, "%s%s%s", rd[i].label, which == 0 && rd[i].n_sites && rd[i].site[0] ? ": site " : "",
                 which == 0 && rd[i].n_sites ? rd[i].site : "");
        if (has) {
            fprintf(g, "%s'r%d_%s' using %s with %s lw 2 title ", any ? ", \\\n     " : "plot ", i, file, columns,
                    which == 1 || which == 2 ? "linespoints pt 7 ps 0.8" : "lines");
            quoted(g, label);
            any = 1;
        }
        /* training loss: every other site's, from its summaries (the mean over its recent steps) */
        for (int k = 0; which == 0 && k < rd[i].n_sites; k++) {
            fprintf(g, "%s'r%d_s%d' using 1:2 with linespoints pt 6 ps 0.6 lw 1 title ", any ? ", \\\n     " : "plot ", i, k);
            snprintf(label, sizeof label, "%s: site %s (summaries)", rd[i].label, rd[i].sites[k]);
            quoted(g, label);
            any = 1;
        }
    }
    /* an empty panel: fixed ranges and a function outside them (gnuplot refuses a plot of no defined point) */
    if (!any)
        fprintf(g, "set label 1 'no data' at graph 0.45, 0.5\nset xrange [0:1]\nset yrange [1:10]\nplot 100 notitle\n"
                   "unset label 1\nset autoscale x\nset autoscale y");
    fprintf(g, "\n");
}

int plot_runs(const char *const *runs, int n_runs, const char *png, int width, int height)
{
    if (n_runs < 1) return isth_fail(ISTH_EINPUT, "plot: no run directory given");
    if (n_runs > PLOT_MAX_RUNS) return isth_fail(ISTH_EINPUT, "plot: %d runs: at most %d", n_runs, PLOT_MAX_RUNS);
    if (width < 320 || width > 8000 || height < 240 || height > 8000)
        return isth_fail(ISTH_EINPUT, "plot: size %dx%d: 320..8000 x 240..8000 pixels", width, height);
    /* the output's directory must exist and be writable (gnuplot would fail late, with no message) */
    char dir[PLOT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", png);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    struct stat dst;
    if (stat(dir, &dst) != 0 || !S_ISDIR(dst.st_mode))
        return isth_fail(ISTH_EINPUT, "plot: -o %s: the directory %s does not exist", png, dir);
    if (access(dir, W_OK) != 0)
        return isth_fail(ISTH_EINPUT, "plot: -o %s: the directory %s is not writable", png, dir);
    if (system("command -v gnuplot > /dev/null 2>&1") != 0)
        return isth_fail(ISTH_ERUNTIME, "plot: gnuplot not found (apt-get install gnuplot-nox)");
    char tmp[] = "/tmp/isthmus-plot.XXXXXX";
    if (!mkdtemp(tmp)) return isth_fail(ISTH_ERUNTIME, "plot: cannot create a temporary directory: %s", strerror(errno));
    RunData rd[PLOT_MAX_RUNS];
    int rc = ISTH_OK;
    memset(set_names, 0, sizeof set_names);
    for (int i = 0; i < n_runs && rc == ISTH_OK; i++) rc = read_run(runs[i], i, tmp, &rd[i]);
    char script[PLOT_PATH_MAX], partial[PLOT_PATH_MAX + 8], cmd[2 * PLOT_PATH_MAX];
    snprintf(script, sizeof script, "%s/plot.gp", tmp);
    snprintf(partial, sizeof partial, "%s.tmp", png);
    FILE *g = rc == ISTH_OK ? fopen(script, "w") : NULL;
    if (rc == ISTH_OK && !g) rc = isth_fail(ISTH_ERUNTIME, "plot: cannot write %s: %s", script, strerror(errno));
    if (rc == ISTH_OK) {
        char cwd[PLOT_PATH_MAX], abs_png[2 * PLOT_PATH_MAX + 8];
        if (partial[0] != '/' && getcwd(cwd, sizeof cwd)) snprintf(abs_png, sizeof abs_png, "%s/%s", cwd, partial);
        else snprintf(abs_png, sizeof abs_png, "%s", partial);
        fprintf(g, "set terminal pngcairo size %d,%d noenhanced font 'sans,10'\nset output ", width, height);
        quoted(g, abs_png);
        /* tokens from 0: a run evaluated only at its end is one point, and a
         * range around it alone has ticks too close to tell apart */
        fprintf(g, "\nset datafile missing 'nan'\nset grid\nset key top right\nset format x '%%.1s%%c'\n"
                   "set xrange [0:*]\n");
        fprintf(g, "set multiplot layout 2,2 title 'isthmus: %d run(s)'\n", n_runs);
        char title[2][96];
        for (int k = 0; k < 2; k++)
            snprintf(title[k], sizeof title[k], "bits per byte, %s (eval)", set_names[k][0] ? set_names[k] : k ? "tech" : "prose");
        panel(g, title[0], "tokens", "bpb", "e0", "1:2", rd, n_runs, 1);
        panel(g, title[1], "tokens", "bpb", "e1", "1:2", rd, n_runs, 2);
        panel(g, "training loss", "tokens", "loss (nats per token)", "steps", "2:3", rd, n_runs, 0);
        fprintf(g, "set format x '%%g'\nset xrange [*:*]\n");
        panel(g, "inter-site bytes, cumulative (sent + received)", "step", "bytes", "steps", "1:($4 > 0 ? $4 : NaN)",
              rd, n_runs, 3);
        fprintf(g, "unset multiplot\nset output\n");
        if (fclose(g) != 0) rc = isth_fail(ISTH_ERUNTIME, "plot: writing %s failed", script);
    }
    if (rc == ISTH_OK) {
        snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot plot.gp > gnuplot.log 2>&1", tmp);
        if (system(cmd) != 0) {
            char log[512] = "";
            snprintf(cmd, sizeof cmd, "%s/gnuplot.log", tmp);
            FILE *l = fopen(cmd, "r");
            if (l) { /* the last line that says something: gnuplot's warnings come before its error */
                char line[512];
                while (fgets(line, sizeof line, l)) {
                    line[strcspn(line, "\n")] = '\0';
                    const char *p = line + strspn(line, " ^");
                    if (*p) snprintf(log, sizeof log, "%s", p);
                }
                fclose(l);
            }
            log[strcspn(log, "\n")] = '\0';
            unlink(partial);
            rc = isth_fail(ISTH_ERUNTIME, "plot: gnuplot failed writing %s: %s", png, log[0] ? log : "(no message)");
        }
    }
    struct stat st;
    if (rc == ISTH_OK && (stat(partial, &st) != 0 || st.st_size == 0))
        rc = isth_fail(ISTH_ERUNTIME, "plot: gnuplot wrote no %s", partial);
    if (rc == ISTH_OK && rename(partial, png) != 0)
        rc = isth_fail(ISTH_ERUNTIME, "plot: cannot rename %s to %s: %s", partial, png, strerror(errno));
    /* the temporary directory holds only what read_run and the script wrote */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "isthmus: warning: plot: could not remove %s\n", tmp);
    int other_sites = 0;
    for (int i = 0; i < n_runs && rc == ISTH_OK; i++) other_sites += rd[i].n_sites;
    if (rc == ISTH_OK && other_sites)
        printf("wrote %s (%d run(s), %dx%d; the training loss of %d other site(s) from their site_step records)\n", png,
               n_runs, width, height, other_sites);
    else if (rc == ISTH_OK)
        printf("wrote %s (%d run(s), %dx%d)\n", png, n_runs, width, height);
    return rc;
}
