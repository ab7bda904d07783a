/* config_keys.h — the key table: every configuration key a user can
 * write, its type, default, range and one-line meaning, and the conversion
 * between a value's text and its field in Config.
 *
 * Names are a stable interface: add freely, rename never.
 * docs/configuration.md documents each key, and tests/docs_keys.sh checks
 * it against `isthmus config --keys` (config_print_keys, here).
 * Owns: the tables of [model] [train] [data] [outer] [checkpoint], of
 * [site.NAME] and of [eval.NAME] keys; reading a value into its field
 * (type, range and choices checked, the message naming the key); the
 * resolved text (config_to_text) and the key list (config_print_keys).
 * Must not: parse INI syntax (config_ini.h), or apply a rule between keys
 * or a default that depends on another key (config.c).
 */
#ifndef ISTHMUS_CONFIG_KEYS_H
#define ISTHMUS_CONFIG_KEYS_H

#include "config_types.h"

typedef struct KeySpec KeySpec;

/* A key of the fixed sections, or NULL. */
const KeySpec *config_schema_find(const char *section, const char *key);
/* Some key of the fixed sections is in [section]. */
int config_section_known(const char *section);
/* A key of a [site.NAME] (fields of SiteConfig) or an [eval.NAME] section
 * (fields of EvalConfig), or NULL. */
const KeySpec *config_site_key_find(const char *key);
const KeySpec *config_eval_key_find(const char *key);

/* Parse one value into the struct at `base` according to its spec; `where`
 * names the origin and `section` the section as the user wrote it. */
int config_apply_value_in(void *base, const KeySpec *s, const char *section, const char *value, const char *where);
/* The same for a key of the fixed sections, into cfg. */
int config_apply_value(Config *cfg, const KeySpec *s, const char *value, const char *where);
/* Every key of the fixed sections to its default (some are sentinels that
 * config.c resolves: -1, 0, ""). */
int config_apply_defaults(Config *cfg);

/* The resolved configuration as INI text, every key, schema order.
 * Returns a malloc'd string. */
char *config_to_text(const Config *cfg);
/* Print "[section] key" for every public key, one per line (for docs/tests). */
void config_print_keys(void);

#endif
