/* export.h — a trained model as files other programs load: safetensors and
 * a config.json (docs/architecture.md, "Where the model leaves").
 *
 * One file (the default): DIR/model.safetensors, an 8-byte little-endian
 * header length, a JSON header, then every tensor of the model table
 * (model.h) in its canonical shape (all experts), under its /model name:
 * embed (V,D), attn_norm (L,D), wq wk wv wo (L,D,D) stored (in, out),
 * moe_norm (L,D), router (L,D,E), final_norm (D), w_gate w_up (L,E,D,F),
 * w_down (L,E,F,D).
 * Sharded (a largest file size given): DIR/model-00001-of-0000N.safetensors
 * ... and DIR/model.safetensors.index.json ({"metadata": {"total_size"},
 * "weight_map": {name: file}}: the layout PyTorch and Hugging Face loaders
 * read), the tensors split by layer: embed, then per layer l
 * "layers.l.NAME" (the canonical tensor's slice l: attn_norm (D), wq (D,D)
 * ..., w_gate (E,D,F) ...), then final_norm; in that order, as many to a
 * file as fit the size (one larger than it alone). Files and their bytes
 * depend only on the model and the options, never on the ranks that wrote
 * them. Values little-endian float32 (F32) or bfloat16 (BF16: rounded to
 * nearest, ties to even; NaN stays NaN).
 * DIR/config.json: the dimensions, the constants the forward needs (rope
 * base, RMSNorm epsilon) and the dtype. DIR/tokenizer.model: the
 * sentencepiece model, when the run had one. python/isthmus_model.py loads
 * either layout into PyTorch.
 * Owns: those formats, which rank writes which bytes, and the files' order
 * of appearance (temporary names, renamed when every rank has written).
 * Must not: compute, or read model files (the caller passes loaded host
 * models).
 */
#ifndef ISTHMUS_EXPORT_H
#define ISTHMUS_EXPORT_H

#include <mpi.h>

#include "config.h"
#include "h5io.h"
#include "model.h"

typedef enum { EXPORT_F32, EXPORT_BF16 } ExportDtype;

typedef struct {
    ExportDtype dtype;
    double max_shard_bytes;   /* 0: one file; else the sharded layout, files up to this many bytes */
} ExportOptions;

typedef struct {
    int files;                /* safetensors files written */
    double bytes;             /* their tensors' bytes */
} ExportResult;

/* Collective over comm: write DIR (created when missing; every rank must
 * see it: a shared filesystem under mpirun) from the ranks' host models:
 * every rank holds every dense tensor and the experts [expert_begin,
 * expert_begin + experts_local), together every expert exactly once
 * (one rank: all of them). Each rank writes the bytes of the experts it
 * holds, the first rank the dense tensors, the headers, the index and the
 * small files. Every file goes under a temporary name and is renamed when
 * every rank has written it, so a failure leaves no half file; files of
 * the other layout left in DIR by an earlier export are removed.
 * tokenizer: a path to copy, or "" none. */
int export_model(const char *dir, const Model *m, const H5Meta *meta, const char *tokenizer, const ExportOptions *o,
                 MPI_Comm comm, ExportResult *res);

#endif
