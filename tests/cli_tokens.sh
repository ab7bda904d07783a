#!/bin/sh
# cli_tokens.sh — a tokenized model end to end, and the model leaving isthmus:
#  - scripts/prepare_data.py trains a 4,096-piece BPE tokenizer on the bundled
#    corpus and writes shards; the eval set's byte count is the text's;
#  - tiny.ini trains on the shards on two sites (DiLoCo): bits per byte fall, and
#    the reported bytes are the text's bytes x predicted / tokens;
#  - train.sample_every prints samples; generate is deterministic for a seed,
#    goes through sentencepiece, refuses a tokenizer of another vocabulary;
#  - export: safetensors + config.json + tokenizer.model; python/isthmus_model.py
#    (Debian's python3-torch) gives isthmus eval's loss within 1e-5 relative on
#    the token set and on a byte model's eval bytes, and generate's greedy
#    continuation token for token.
# Needs Debian's python3-sentencepiece (scripts/setup.sh installs it); the
# PyTorch checks need python3-torch and are skipped, visibly, without it.
. "$TOP_SRCDIR/tests/lib.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
if ! "$PY" -c "import sentencepiece" 2>/dev/null; then
    echo "1..0 # SKIP python3-sentencepiece is not installed (scripts/setup.sh installs it)"
    exit 0
fi
if ! "$ISTHMUS" --version | grep -q "sentencepiece: yes"; then
    echo "1..0 # SKIP this isthmus was built without libsentencepiece (configure found no libsentencepiece-dev)"
    exit 0
fi
HAVE_TORCH=0
"$PY" -c "import torch" 2>/dev/null && HAVE_TORCH=1
D="$DATA_DIR"
TOK="$WORK/tok"
# the eval set: the first 1,500 lines of the technical text (whole lines keep it UTF-8)
head -n 1500 "$D/eval_tech.txt" > "$WORK/tech.txt"
if timeout 600 "$PY" "$TOP_SRCDIR/scripts/prepare_data.py" --out "$TOK" --vocab 4096 --sample-bytes 4000000 \
    --eval tech="$WORK/tech.txt" --config "$CONFIGS/tiny.ini" "$D/train.txt" > "$WORK/prep.log" 2>&1; then
    pass "prepare_data.py: 4,096-piece BPE tokenizer and shards of the bundled corpus"
else
    fail "prepare_data.py failed: $(tail -3 "$WORK/prep.log")"
fi
text_bytes=$(wc -c < "$WORK/tech.txt")
if [ "$(cat "$TOK/eval_tech.bytes" 2>/dev/null)" = "$text_bytes" ]; then pass "eval_tech.bytes = the text's $text_bytes bytes"
else fail "eval_tech.bytes $(cat "$TOK/eval_tech.bytes" 2>/dev/null) != $text_bytes"; fi
grep -q "^vocab = 4096" "$TOK/tiny.ini" && pass "the written config has model.vocab = 4096" || fail "tiny.ini: $(cat "$TOK/tiny.ini")"

# two sites, DiLoCo, samples every 60 steps
mpi 2 "$ISTHMUS" train "$TOK/tiny.ini" --set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco \
    --set outer.inner_steps=20 --set train.steps=180 --set train.eval_every=180 --set train.sample_every=90 \
    --set train.sample_tokens=24 --set train.out_dir="$WORK/run" > "$WORK/train.log" 2>&1 ||
    fail "training on the shards failed: $(tail -5 "$WORK/train.log")"
M="$WORK/run/metrics.jsonl"
b0=$(eval_bpb "$M" tech 0)
b1=$(eval_bpb "$M" tech 180)
note "tech bpb $b0 -> $b1"
if awk -v a="$b0" -v b="$b1" 'BEGIN {exit !(b < a - 0.5)}'; then pass "bits per byte fell on the token set"; else fail "bpb $b0 -> $b1"; fi
# bytes: the set's bytes x predicted / tokens (every token after the first is predicted)
line=$(grep '"eval":"tech","step":180,' "$M")
ntok=$("$PY" -c "import struct; print(struct.unpack('<3i', open('$TOK/eval_tech.bin','rb').read(12))[2])")
rep_tokens=$(echo "$line" | sed 's/.*"tokens":\([^,]*\),.*/\1/')
rep_bytes=$(echo "$line" | sed 's/.*"bytes":\([^,]*\),.*/\1/')
want=$(awk -v b="$text_bytes" -v n="$ntok" 'BEGIN { printf "%.0f", b * (n - 1) / n }')
if [ "$rep_tokens" = "$((ntok - 1))" ] && [ "$rep_bytes" = "$want" ]; then
    pass "reported $rep_tokens tokens for $rep_bytes bytes (the text's $text_bytes x $((ntok - 1))/$ntok)"
else
    fail "reported tokens $rep_tokens bytes $rep_bytes, expected $((ntok - 1)) and $want"
fi
if [ "$(grep -c '^sample step \(90\|180\) | .' "$WORK/train.log")" = 2 ]; then pass "train.sample_every printed two samples"
else fail "samples: $(grep '^sample' "$WORK/train.log")"; fi

# each site its own copy (paths differ through ${TD}): the same data trains; a copy
# that differs in one byte is refused when the sites meet
mkdir -p "$WORK/copy"
cp "$TOK"/train_*.bin "$WORK/copy/"
two_copies() { # two_copies OUT: site a reads $TOK, site b $WORK/copy
    local args="$TOK/tiny.ini --set data.train=\${TD}/train_*.bin --set site.a.ranks=1 --set site.b.ranks=1 --set train.steps=2 --set train.out_dir=$1"
    # shellcheck disable=SC2086
    timeout -k 20 300 mpirun -q --oversubscribe -np 1 -x TD="$TOK" "$ISTHMUS" train $args : \
        -np 1 -x TD="$WORK/copy" "$ISTHMUS" train $args
}
if two_copies "$WORK/copies" > "$WORK/copies.log" 2>&1; then pass "each site reads its own copy of the shards (other paths)"
else fail "two copies: $(tail -3 "$WORK/copies.log")"; fi
printf 'x' | dd of="$WORK/copy/train_000000.bin" bs=1 seek=3000 conv=notrunc 2>/dev/null
rc=0
two_copies "$WORK/differ" > "$WORK/differ.log" 2>&1 || rc=$?
if [ "$rc" = 2 ] && grep -q "data: world rank 1 (site b) reads other training data than world rank 0 (site a)" "$WORK/differ.log"; then
    pass "a site whose copy differs in one byte is refused (exit 2)"
else
    fail "differing copies: exit $rc: $(tail -3 "$WORK/differ.log")"
fi

MODEL="$WORK/run/model.h5"
g() { "$ISTHMUS" generate --model "$MODEL" --tokens 24 "$@" 2>"$WORK/gen.err"; }
g --prompt "The package" --seed 5 > "$WORK/g1" && g --prompt "The package" --seed 5 > "$WORK/g2" &&
    g --prompt "The package" --seed 6 > "$WORK/g3" || fail "generate failed: $(cat "$WORK/gen.err")"
if cmp -s "$WORK/g1" "$WORK/g2" && ! cmp -s "$WORK/g1" "$WORK/g3" && grep -q "^The package" "$WORK/g1" &&
    grep -q "sentencepiece" "$WORK/gen.err"; then
    pass "generate: text through sentencepiece, same seed same text, another seed another"
else
    fail "generate: $(cat "$WORK/g1" "$WORK/g3" "$WORK/gen.err")"
fi

# a byte model for the byte side and for a tokenizer that does not fit
timeout 300 "$ISTHMUS" train "$CONFIGS/tiny.ini" --set train.steps=60 --set train.out_dir="$WORK/bytes" \
    > "$WORK/bytes.log" 2>&1 || fail "byte training failed: $(tail -3 "$WORK/bytes.log")"
expect_exit 2 "tokenizer .*4096 pieces, the model's is 256" -- \
    "$ISTHMUS" generate --model "$WORK/bytes/model.h5" --tokenizer "$TOK/tokenizer.model"
expect_exit 2 "prompt: '99999' is not a token id below the vocabulary's 4096" -- \
    "$ISTHMUS" generate --model "$MODEL" --tokenizer "" --prompt "1 99999"
expect_exit 2 "needs --model FILE and -o DIR" -- "$ISTHMUS" export --model "$MODEL"
# a token model's eval set of bytes (a vocabulary mismatch between model and data)
expect_exit 2 "\[eval.tech\] .*tech.txt holds raw bytes, the training data uint16 tokens" -- \
    "$ISTHMUS" eval --model "$MODEL" --set eval.tech.path="$WORK/tech.txt" --set eval.tech.bytes=0

for m in run bytes; do
    "$ISTHMUS" export --model "$WORK/$m/model.h5" -o "$WORK/export-$m" > "$WORK/export.log" 2>&1 ||
        fail "export $m: $(cat "$WORK/export.log")"
done
if [ -s "$WORK/export-run/model.safetensors" ] && [ -s "$WORK/export-run/config.json" ] &&
    cmp -s "$WORK/export-run/tokenizer.model" "$TOK/tokenizer.model" && [ ! -e "$WORK/export-bytes/tokenizer.model" ]; then
    pass "export wrote model.safetensors, config.json and (token model) tokenizer.model"
else
    fail "export: $(ls -l "$WORK/export-run" "$WORK/export-bytes")"
fi

if [ "$HAVE_TORCH" = 0 ]; then
    note "SKIP: python3-torch is not installed: the PyTorch checks did not run (ISTHMUS_SETUP_TORCH=1 sh scripts/test.sh installs it)"
    echo "ok $((NCHECK + 1)) # SKIP PyTorch loader: python3-torch not installed"
    NCHECK=$((NCHECK + 1))
    finish || exit 1
    exit 0
fi
# isthmus eval's figures, then the same windows in PyTorch; greedy ids both ways, 100 tokens
# (past the context of 64: the restart rule too)
"$ISTHMUS" eval --model "$MODEL" --set train.out_dir="$WORK/eval-run" > /dev/null 2>&1 || fail "isthmus eval (tokens)"
"$ISTHMUS" eval --model "$WORK/bytes/model.h5" --set eval.prose.path="$D/eval_prose.txt" --set data.eval_bytes=20000 \
    --set train.out_dir="$WORK/eval-bytes" > /dev/null 2>&1 || fail "isthmus eval (bytes)"
"$ISTHMUS" generate --model "$MODEL" --prompt "The package" --tokens 100 --temperature 0 --ids > "$WORK/greedy-run" 2>/dev/null
"$ISTHMUS" generate --model "$WORK/bytes/model.h5" --prompt "The " --tokens 100 --temperature 0 --ids \
    > "$WORK/greedy-bytes" 2>/dev/null
cat > "$WORK/check.py" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from isthmus_model import IsthmusModel, read_shard
work, tok = sys.argv[2], sys.argv[3]
def isthmus_loss(d, name):
    for line in open(f"{work}/{d}/metrics.jsonl"):
        r = json.loads(line)
        if r.get("eval") == name:
            return r["loss"], r["tokens"]
cases = [("run", "eval-run", "tech", read_shard(f"{tok}/eval_tech.bin")),
         ("bytes", "eval-bytes", "prose", list(open(sys.argv[4], "rb").read()[:20000]))]
for name, ev, s, tokens in cases:
    m = IsthmusModel.from_dir(f"{work}/export-{name}")
    total, n = m.eval_loss(tokens)
    want, want_n = isthmus_loss(ev, s)
    rel = abs(total / n - want) / want
    ok = rel <= 1e-5 and n == want_n
    print(("ok" if ok else "not ok") + f" loss {name}: torch {total / n:.9f} over {n}, isthmus {want} over {want_n} (rel {rel:.1e})")
    ids = [int(x) for x in open(f"{work}/greedy-{name}").read().split()]
    prompt = len(ids) - 100
    got = m.generate(ids[:prompt], 100)  # past the context of 64: two restarts
    print(("ok" if got == ids[prompt:] else "not ok") + f" greedy {name}: torch {got[:8]}... isthmus {ids[prompt:prompt + 8]}...")
EOF
"$PY" "$WORK/check.py" "$TOP_SRCDIR/python" "$WORK" "$TOK" "$D/eval_prose.txt" > "$WORK/check.out" 2>&1
verdicts "$WORK/check.out" 4 "the PyTorch checks" "PyTorch: "
finish || exit 1
