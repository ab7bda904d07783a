/* config_ini.c — see config_ini.h. */
#include "config_ini.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "status.h"

void config_entries_free(EntryList *l)
{
    for (int i = 0; i < l->n; i++) {
        isth_free(l->v[i].section);
        isth_free(l->v[i].key);
        isth_free(l->v[i].value);
    }
    isth_free(l->v);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

Entry *config_entries_find(EntryList *l, const char *section, const char *key)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].section, section) && !strcmp(l->v[i].key, key)) return &l->v[i];
    return NULL;
}

static int entries_put(EntryList *l, const char *section, const char *key, const char *value,
                       const char *origin, int allow_replace)
{
    Entry *e = config_entries_find(l, section, key);
    if (e) {
        if (!allow_replace)
            return isth_fail(ISTH_EINPUT, "config %s: [%s] %s is set twice (first at %s)", origin,
                             section, key, e->origin);
        isth_free(e->value);
        e->value = strdup(value);
        snprintf(e->origin, sizeof e->origin, "%s", origin);
        return e->value ? ISTH_OK : isth_fail(ISTH_ERUNTIME, "out of memory");
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        Entry *v = isth_realloc(l->v, (size_t)cap * sizeof *v);
        CHECK_ALLOC(v);
        l->v = v;
        l->cap = cap;
    }
    e = &l->v[l->n++];
    e->section = strdup(section);
    e->key = strdup(key);
    e->value = strdup(value);
    snprintf(e->origin, sizeof e->origin, "%s", origin);
    if (!e->section || !e->key || !e->value) return isth_fail(ISTH_ERUNTIME, "out of memory");
    return ISTH_OK;
}

static int valid_name(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.' && *s != '-') return 0;
    return 1;
}

int config_parse_ini(EntryList *l, const char *text, const char *name)
{
    char section[256] = "";
    int lineno = 0;
    const char *p = text;
    if (!strncmp(p, "\xEF\xBB\xBF", 3)) p += 3; /* a UTF-8 byte-order mark, as some editors write */
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char buf[4096];
        lineno++;
        if (len >= sizeof buf)
            return isth_fail(ISTH_EINPUT, "config %s:%d: line too long", name, lineno);
        memcpy(buf, p, len);
        buf[len] = '\0';
        p = nl ? nl + 1 : p + len;

        char *hash = strpbrk(buf, "#;");
        if (hash) *hash = '\0';
        char *line = trim(buf);
        if (!*line) continue;
        char origin[CONFIG_PATH_MAX + 32];
        snprintf(origin, sizeof origin, "%s:%d", name, lineno);
        if (*line == '[') {
            char *close = strchr(line, ']');
            if (!close || close[1] != '\0')
                return isth_fail(ISTH_EINPUT, "config %s: malformed section header '%s'", origin, line);
            *close = '\0';
            char *s = trim(line + 1);
            if (!valid_name(s) || strlen(s) >= sizeof section)
                return isth_fail(ISTH_EINPUT, "config %s: bad section name '[%s]'", origin, s);
            strcpy(section, s);
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq)
            return isth_fail(ISTH_EINPUT, "config %s: expected 'key = value', got '%s'", origin, line);
        *eq = '\0';
        char *key = trim(line), *value = trim(eq + 1);
        if (!*section)
            return isth_fail(ISTH_EINPUT, "config %s: key '%s' outside any [section]", origin, key);
        if (!valid_name(key))
            return isth_fail(ISTH_EINPUT, "config %s: bad key name '%s'", origin, key);
        CHECK(entries_put(l, section, key, value, origin, 0));
    }
    return ISTH_OK;
}

int config_parse_override(EntryList *l, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    char lhs[512];
    if (!eq || (size_t)(eq - assignment) >= sizeof lhs)
        return isth_fail(ISTH_EINPUT, "--set '%s': expected section.key=value", assignment);
    memcpy(lhs, assignment, (size_t)(eq - assignment));
    lhs[eq - assignment] = '\0';
    char *dot = strrchr(lhs, '.');
    if (!dot || dot == lhs || !dot[1])
        return isth_fail(ISTH_EINPUT, "--set '%s': expected section.key=value", assignment);
    *dot = '\0';
    char *section = trim(lhs), *key = trim(dot + 1);
    if (!valid_name(section) || !valid_name(key))
        return isth_fail(ISTH_EINPUT, "--set '%s': bad section or key name", assignment);
    char value[4096];
    snprintf(value, sizeof value, "%s", eq + 1);
    char origin[600];
    snprintf(origin, sizeof origin, "--set %s.%s", section, key);
    return entries_put(l, section, key, trim(value), origin, 1);
}

const char *config_origin_of(EntryList *l, const char *section, const char *key)
{
    Entry *e = config_entries_find(l, section, key);
    return e ? e->origin : "(default)";
}

int config_read_ini_file(const char *path, char **text_out)
{
    /* O_NONBLOCK: a FIFO must not block the open; only regular files are read */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return isth_fail(ISTH_EINPUT, "config %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "config %s: not a regular file", path);
    }
    if (st.st_size > (1 << 24)) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "config %s: %lld bytes, larger than 16 MiB (not a config file)", path,
                         (long long)st.st_size);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return isth_fail(ISTH_EINPUT, "config %s: cannot open: %s", path, strerror(errno));
    }
    const long size = (long)st.st_size;
    char *text = isth_malloc((size_t)size + 1);
    if (!text) {
        fclose(f);
        return isth_fail(ISTH_ERUNTIME, "out of memory reading %s", path);
    }
    size_t got = fread(text, 1, (size_t)size, f);
    fclose(f);
    text[got] = '\0';
    if (memchr(text, '\0', got)) {
        isth_free(text);
        return isth_fail(ISTH_EINPUT, "config %s: contains a NUL byte (not an INI text file)", path);
    }
    *text_out = text;
    return ISTH_OK;
}
