/* export.h — a trained model as files other programs load: safetensors and
 * a config.json (docs/architecture.md, "Where the model leaves").
 *
 * DIR/model.safetensors: an 8-byte little-endian header length, a JSON
 * header, then every tensor of the model table (model.h) as little-endian
 * float32 in its canonical shape (all experts), under its /model name:
 * embed (V,D), attn_norm (L,D), wq wk wv wo (L,D,D) stored (in, out),
 * moe_norm (L,D), router (L,D,E), final_norm (D), w_gate w_up (L,E,D,F),
 * w_down (L,E,F,D). DIR/config.json: the dimensions and the constants the
 * forward needs (rope base, RMSNorm epsilon). DIR/tokenizer.model: the
 * sentencepiece model, when the run had one. python/isthmus_model.py loads
 * the directory into PyTorch.
 * Owns: those formats. Must not: compute, or read model files (the caller
 * passes a loaded host model).
 */
#ifndef ISTHMUS_EXPORT_H
#define ISTHMUS_EXPORT_H

#include "config.h"
#include "h5io.h"
#include "model.h"

/* Write DIR (created when missing) from a host model holding every
 * expert; each file is written under a temporary name and renamed, so a
 * failure leaves no half file. tokenizer: a path to copy, or "" none. */
int export_model(const char *dir, const Model *m, const H5Meta *meta, const char *tokenizer);

#endif
