#!/usr/bin/python3
"""prepare_data.py — text files in, token shards out: what `isthmus train` reads
for a tokenized model (docs/tokens.md).

  scripts/prepare_data.py --out DIR [--vocab N | --tokenizer FILE.model]
                          [--eval NAME=FILE]... [--config BASE.ini] [--shard-tokens N]
                          [--sample-bytes N] TRAIN_TEXT...

Trains a sentencepiece BPE tokenizer of N pieces (default 4096) on the training
text (Debian's python3-sentencepiece; or applies FILE.model), then writes:

  DIR/tokenizer.model          the tokenizer (when trained here)
  DIR/train_NNNNNN.bin         llm.c token shards: a 1,024-byte header of int32
                               (magic 20240520, version 1, token count), then the
                               tokens as little-endian uint16 (uint32 with magic
                               20240801, version 7, when the vocabulary exceeds 65,536)
  DIR/eval_NAME.bin            each eval set, one shard
  DIR/eval_NAME.bytes          the UTF-8 bytes the set's tokens decode to
  DIR/data.ini                 [model] vocab, [data] train and tokenizer, [eval.NAME]
  DIR/BASE.ini                 with --config: BASE with data.ini's keys set

The tokenizer round-trips text exactly (identity normalisation, no added
prefix, byte fallback for anything outside its pieces): decoding an eval shard
gives the file back, byte for byte, which the script checks before it writes
the byte count that bits per byte divide by. Text is read and encoded a
batch of lines at a time (each line keeps its newline; no file is held whole);
a line is never split across shards. Exit 2 with one line on bad input (a
--vocab too small for the text's characters included: the tokenizer needs a
piece for each, 256 byte pieces and <unk>); a run that fails leaves nothing
behind (no output directory it made, no file it wrote).
"""
import argparse
import configparser
import glob
import io
import os
import shutil
import struct
import sys

HEADER_INTS = 256
META_PIECES = 257  # byte fallback's 256 pieces and <unk>: beside one piece per character
MADE = []  # what this run created (its output directory, or the files in one that existed), undone on failure


def undo():
    for path in reversed(MADE):
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except OSError:
            pass
    MADE.clear()


def fail(msg):
    undo()
    print(f"prepare_data: error: {msg}", file=sys.stderr)
    sys.exit(2)


def made(path):
    """path is this run's: removed if the run fails (inside a directory this run made, already). A file
    that was there before this run (an earlier run's output) is not this run's to remove."""
    inside = MADE and os.path.isdir(MADE[0]) and path.startswith(MADE[0] + os.sep)
    if not inside and not os.path.lexists(path):
        MADE.append(path)
    return path


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 at byte {e.start}")


def read_lines(path, batch=65536):
    """The file's lines (each with its newline), in batches: a corpus is never held whole."""
    try:
        with open(path, "r", encoding="utf-8", newline="") as f:
            lines, n = [], 0
            for line in f:
                lines.append(line)
                n += 1
                if len(lines) == batch:
                    yield lines
                    lines = []
            if lines:
                yield lines
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 (after line {n}, byte {e.start} of a read block)")


def write_shard(path, tokens, vocab):
    wide = vocab > 65536
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = (20240801, 7, len(tokens)) if wide else (20240520, 1, len(tokens))
    import array
    body = array.array("I" if wide else "H", tokens)
    if sys.byteorder != "little":
        body.byteswap()
    tmp = made(path + ".tmp")
    made(path)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(body.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def make_out(out, given):
    """The output directory, made (and made this run's) when it does not exist."""
    if os.path.isdir(out):
        return
    top = out
    while not os.path.exists(os.path.dirname(top)):  # the first missing parent is what to remove
        top = os.path.dirname(top)
    try:
        os.makedirs(out)
    except OSError as e:
        fail(f"--out {given}: cannot create the directory: {e.strerror}")
    MADE.insert(0, top)  # this run's (it was not there): made() keeps what is inside it


def encode_lines(sp, text):
    """text encoded line by line, split as read_lines splits a file (at \\n, \\r\\n, \\r)."""
    lines = list(io.StringIO(text, newline=""))
    return sp.encode(lines) if lines else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("train", nargs="+", help="training text files (globs allowed)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--vocab", type=int, default=4096, help="pieces of the tokenizer to train (default 4096)")
    ap.add_argument("--tokenizer", help="an existing sentencepiece model to apply instead of training one")
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=FILE", help="an eval set")
    ap.add_argument("--config", help="a config to copy into DIR with the data's keys set")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per train shard (default 1e8)")
    ap.add_argument("--sample-bytes", type=int, default=50_000_000,
                    help="text the tokenizer trains on, at most (default 50 MB)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    try:
        import sentencepiece as spm
    except ImportError:
        fail("python3 cannot import sentencepiece: install the Debian package python3-sentencepiece")

    files = []
    for pattern in a.train:
        found = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        if not found:
            fail(f"{pattern}: no file matches")
        files += found
    evals = []
    for e in a.eval:
        name, sep, path = e.partition("=")
        if not sep or not name or not path or not all(c.isalnum() or c in "_-" for c in name):
            fail(f"--eval {e}: expected NAME=FILE (NAME of letters, digits, _ and -)")
        evals.append((name, path))
    if a.vocab < 260 or a.vocab > (1 << 24):
        fail(f"--vocab {a.vocab}: expected 260 .. 16777216 (byte fallback needs 256 pieces)")
    if a.shard_tokens < 1024 or a.shard_tokens > 2**31 - 1:
        fail(f"--shard-tokens {a.shard_tokens}: expected 1024 .. 2147483647 (a shard's header counts in int32)")
    for p in files:
        if not os.path.isfile(p):
            fail(f"{p}: not a regular file")
    out = os.path.abspath(a.out)
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out {a.out}: exists and is not a directory")
    if a.tokenizer:
        tok_path = os.path.abspath(a.tokenizer)
        try:
            sp = spm.SentencePieceProcessor(model_file=tok_path)
        except (OSError, RuntimeError) as e:
            fail(f"{a.tokenizer}: not a sentencepiece model: {e}")
        make_out(out, a.out)
    else:
        # the trainer reads lines; the sample is the files' first lines up to --sample-bytes
        sample, size = [], 0
        for p in files:
            for batch in read_lines(p):
                for line in batch:
                    if size < a.sample_bytes and line.strip():
                        sample.append(line.rstrip("\r\n"))
                        size += len(line)
                if size >= a.sample_bytes:
                    break
            if size >= a.sample_bytes:
                break
        if not sample:
            fail("the training text has no lines to learn a tokenizer from")
        # every character of the sample is a piece (character_coverage 1.0; a
        # space is U+2581), beside the meta pieces: a smaller vocabulary is
        # the user's to change, found before anything is written
        chars = {"\u2581" if c == " " else c for line in sample if len(line.encode("utf-8")) <= 1 << 20 for c in line}
        if a.vocab < len(chars) + META_PIECES:
            fail(f"--vocab {a.vocab}: the training text has {len(chars)} distinct characters, each a piece beside "
                 f"{META_PIECES} others (256 bytes, <unk>): give --vocab {len(chars) + META_PIECES} or more")
        make_out(out, a.out)
        prefix = os.path.join(out, "tokenizer")
        made(prefix + ".model")
        made(prefix + ".vocab")
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sample), model_prefix=prefix, vocab_size=a.vocab, model_type="bpe",
                character_coverage=1.0, byte_fallback=True, normalization_rule_name="identity",
                add_dummy_prefix=False, remove_extra_whitespaces=False, split_digits=True,
                allow_whitespace_only_pieces=True, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
                max_sentence_length=1 << 20, num_threads=a.threads, minloglevel=2)
        except RuntimeError as e:  # its own check of the same (and anything else it refuses), as one line
            fail(f"--vocab {a.vocab}: sentencepiece cannot train the tokenizer: {str(e).strip().splitlines()[-1]}")
        tok_path = prefix + ".model"
        sp = spm.SentencePieceProcessor(model_file=tok_path)
        os.remove(prefix + ".vocab")
    vocab = sp.get_piece_size()

    # train shards: lines in order, a new shard when the next line would pass --shard-tokens
    shard, n_shard, total, names = [], 0, 0, []

    def flush():
        nonlocal shard, n_shard
        if shard:
            name = f"train_{n_shard:06d}.bin"
            write_shard(os.path.join(out, name), shard, vocab)
            names.append(name)
            n_shard += 1
            shard = []

    for path in files:
        for batch in read_lines(path):
            for ids in sp.encode(batch):
                if len(shard) + len(ids) > a.shard_tokens:
                    flush()
                shard.extend(ids)
                total += len(ids)
    flush()
    train_bytes = sum(os.path.getsize(p) for p in files)

    ini = configparser.ConfigParser(interpolation=None)
    ini.optionxform = str
    ini["model"] = {"vocab": str(vocab)}
    ini["data"] = {"train": os.path.join(out, "train_*.bin"), "tokenizer": tok_path}
    for name, path in evals:
        text = read_text(path)
        ids = [i for line in encode_lines(sp, text) for i in line]
        if len(ids) > 2**31 - 1:
            fail(f"{path}: {len(ids)} tokens, more than a shard's int32 count holds: split the set")
        if sp.decode(ids) != text:
            fail(f"{path}: the tokenizer does not give the text back (not a tokenizer that round-trips; "
                 "train one here)")
        nbytes = len(text.encode("utf-8"))
        write_shard(os.path.join(out, f"eval_{name}.bin"), ids, vocab)
        with open(made(os.path.join(out, f"eval_{name}.bytes")), "w") as f:
            f.write(f"{nbytes}\n")
        ini[f"eval.{name}"] = {"path": os.path.join(out, f"eval_{name}.bin"), "bytes": str(nbytes)}
        print(f"prepare_data: eval {name}: {len(ids)} tokens for {nbytes} bytes ({nbytes / max(1, len(ids)):.2f} "
              "bytes per token)")
    with open(made(os.path.join(out, "data.ini")), "w") as f:
        f.write("# written by scripts/prepare_data.py\n")
        ini.write(f)
    if a.config:
        base = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
        base.optionxform = str
        try:
            with open(a.config) as f:
                base.read_file(f)
        except (OSError, configparser.Error) as e:
            fail(f"{a.config}: {e}")
        for section in ini.sections():
            if not base.has_section(section):
                base.add_section(section)
            for k, v in ini[section].items():
                base[section][k] = v
        dest = os.path.join(out, os.path.basename(a.config))
        with open(made(dest), "w") as f:
            f.write(f"# {os.path.basename(a.config)} with the token data of scripts/prepare_data.py\n")
            base.write(f)
        print(f"prepare_data: config {dest}")
    print(f"prepare_data: {len(names)} train shard(s), {total} tokens for {train_bytes} bytes "
          f"({train_bytes / max(1, total):.2f} bytes per token), vocabulary {vocab}, tokenizer {tok_path}")


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # an error of its own (a traceback) or an interrupt: nothing half-made is left
        undo()
        raise
