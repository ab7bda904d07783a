/* cli.c — see cli.h. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

int cli_wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

int cli_parse(int argc, char **argv, const char **overrides, int *n_overrides, const char **pos, int max_pos,
              int *n_pos, const CliOption *opts, int n_opts)
{
    *n_overrides = 0;
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return isth_fail(ISTH_EINPUT, "--set needs section.key=value");
            if (*n_overrides == CLI_MAX_OVERRIDES) return isth_fail(ISTH_EINPUT, "too many --set options");
            overrides[(*n_overrides)++] = v;
            continue;
        }
        int matched = 0;
        for (int e = 0; e < n_opts && !matched; e++) {
            const size_t len = strlen(opts[e].name);
            if (strncmp(a, opts[e].name, len) || (a[len] != '\0' && a[len] != '=')) continue;
            matched = 1;
            if (!opts[e].takes_value) {
                *opts[e].value = "1";
                continue;
            }
            const char *v = a[len] == '=' ? a + len + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return isth_fail(ISTH_EINPUT, "%s needs a value", opts[e].name);
            *opts[e].value = v;
        }
        if (matched) continue;
        if (a[0] == '-' && a[1]) return isth_fail(ISTH_EINPUT, "unknown option '%s' (see --help)", a);
        if (*n_pos == max_pos) return isth_fail(ISTH_EINPUT, "unexpected argument '%s' (see --help)", a);
        pos[(*n_pos)++] = a;
    }
    return ISTH_OK;
}

int cli_one_file(int argc, char **argv, const char *cmd, const char *usage, const char **path)
{
    *path = NULL;
    if (cli_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return ISTH_OK;
    }
    const char *overrides[CLI_MAX_OVERRIDES], *pos[1];
    int n_over, n_pos;
    CHECK(cli_parse(argc, argv, overrides, &n_over, pos, 1, &n_pos, NULL, 0));
    if (n_pos != 1 || n_over)
        return isth_fail(ISTH_EINPUT, "%s: expected one FILE (see isthmus %s --help)", cmd, cmd);
    *path = pos[0];
    return ISTH_OK;
}

int cli_number(const char *name, const char *text, double lo, double hi, int integer, double *out)
{
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    if (end == text || *end || errno || !(v >= lo && v <= hi) || (integer && v != floor(v)))
        return isth_fail(ISTH_EINPUT, "%s %s: expected %s in [%g, %g]", name, text, integer ? "an integer" : "a number",
                         lo, hi);
    *out = v;
    return ISTH_OK;
}
