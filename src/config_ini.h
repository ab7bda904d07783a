/* config_ini.h — the configuration's text: an INI file or text, and the
 * `--set section.key=value` overrides, read into a list of entries
 * (section, key, value, and where each was set, for messages).
 *
 * Lines are "[section]" or "key = value"; '#' and ';' start a comment; a
 * UTF-8 byte-order mark is skipped. Names are letters, digits, '_', '.'
 * and '-'. A key set twice in the text is an error; an override replaces
 * what the text set. A file is read only when it is a regular file of at
 * most 16 MiB with no NUL byte.
 * Owns: the syntax, the entries and their origins, reading the file.
 * Must not: know which keys exist, their types or meaning (config_keys.h,
 * config.c).
 */
#ifndef ISTHMUS_CONFIG_INI_H
#define ISTHMUS_CONFIG_INI_H

#include "config_types.h"

typedef struct {
    char *section, *key, *value;
    char origin[CONFIG_PATH_MAX + 32];
} Entry;

typedef struct {
    Entry *v;
    int n, cap;
} EntryList;

void config_entries_free(EntryList *l);
/* The entry of [section] key, or NULL. */
Entry *config_entries_find(EntryList *l, const char *section, const char *key);
/* Where [section] key was set ("file:line", "--set ..."), or "(default)". */
const char *config_origin_of(EntryList *l, const char *section, const char *key);

/* INI text into l; `name` names it in messages. ISTH_EINPUT for bad syntax
 * or a key set twice. */
int config_parse_ini(EntryList *l, const char *text, const char *name);
/* One "section.key=value" into l, replacing any earlier value. */
int config_parse_override(EntryList *l, const char *assignment);

/* The text of the config file at `path` (malloc'd, NUL-terminated). */
int config_read_ini_file(const char *path, char **text);

#endif
