/* config.h — the run configuration as a run loads it: defaults, the file,
 * --set overrides, and the rules between keys.
 *
 * Owns: the order of a load (text and overrides read by config_ini.h,
 * values by config_keys.h's table), the [site.*] and [eval.*] sections, the
 * rules between keys and the values derived from them (the codec's
 * parameters, the eval sets). The types are config_types.h's; every key a
 * user can write is in config_keys.h's table, and nothing else in the
 * program reads INI text.
 * Must not: allocate model memory, touch MPI, or read data files.
 */
#ifndef ISTHMUS_CONFIG_H
#define ISTHMUS_CONFIG_H

#include "codec.h"
#include "config_types.h"

/* The eval sets of a config: its [eval.*] sections, or prose and tech. */
int config_eval_sets(const Config *cfg, EvalConfig out[CONFIG_MAX_EVALS]);

/* Load `path` (may be NULL: defaults only), apply overrides in order, validate.
 * Returns ISTH_OK or ISTH_EINPUT after printing one line naming the key. */
int config_load(Config *cfg, const char *path, const char *const *overrides, int n_overrides);

/* Same, from INI text held in memory (e.g. the config stored in a model file);
 * `origin` names it in messages. */
int config_load_text(Config *cfg, const char *text, const char *origin,
                     const char *const *overrides, int n_overrides);

/* train.recompute as the backends take it. */
Recompute config_recompute(const TrainConfig *t);

/* The [outer] codec's parameters: the block is codec_block, or topk_chunk
 * for topk; the decay is ef_decay. */
CodecParams config_codec_params(const OuterConfig *o);

#endif
