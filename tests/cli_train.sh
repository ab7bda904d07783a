#!/bin/sh
# cli_train.sh — end to end on the bundled corpus with tiny.ini:
#  - a few hundred steps lower the training loss and both eval bpb clearly;
#  - the same config and seed twice give bit-identical losses and weights,
#    and so does train.recompute = attention or layer (also on a learner
#    of two ranks, whose recomputation exchanges expert rows again);
#  - `isthmus eval` on the written model reproduces the final bpb;
#  - a uint16 token shard of the same bytes trains the same model; model.vocab
#    sizes the embedding; bad shards and too small a vocabulary: exit 2;
#  - [eval.NAME] sets: a byte file and a shard of its bytes score the same;
#    mismatched kinds and missing keys: exit 2;
#  - a truncated or corrupted model file is rejected with exit 2.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
long_run() { # long_run NAME [--set ...]: 300 steps on one process, evaluated at steps 0 and 300
    local name=$1
    shift
    timeout 300 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/$name" --set train.log_every=1 \
        --set train.eval_every=300 --set train.steps=300 "$@" > "$WORK/$name.log" 2>&1
}

long_run a || fail "training run a failed: $(tail -5 "$WORK/a.log")"
long_run b || fail "training run b failed: $(tail -5 "$WORK/b.log")"
M="$WORK/a/metrics.jsonl"

# loss: mean of the first 10 steps vs the last 10 (nats per byte; lib.sh's losses: "step loss" lines)
first=$(losses "$WORK/a" | head -10 | awk '{s+=$2} END {print s/NR}')
last=$(losses "$WORK/a" | tail -10 | awk '{s+=$2} END {print s/NR}')
note "training loss: first 10 steps $first, last 10 steps $last"
if awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < f - 1.5)}'; then pass "loss fell by more than 1.5 nats"; else fail "loss $first -> $last"; fi

# eval bpb at step 0 (untrained) and at the end
for set in prose tech; do
    b0=$(eval_bpb "$M" "$set" 0)
    b1=$(eval_bpb "$M" "$set" 300)
    note "eval $set: bpb $b0 -> $b1"
    if awk -v a="$b0" -v b="$b1" 'BEGIN {exit !(b < a - 2.0 && b < 5.0)}'; then pass "$set bpb fell"; else fail "$set bpb $b0 -> $b1"; fi
done

# determinism: identical per-step losses and identical final weights
if [ -n "$(losses "$WORK/a")" ] && [ "$(losses "$WORK/a")" = "$(losses "$WORK/b")" ]; then
    pass "two runs: bit-identical losses"
else
    fail "two runs with the same seed differ"
fi
if h5diff "$WORK/a/model.h5" "$WORK/b/model.h5" /model /model >/dev/null 2>&1; then pass "two runs: identical model.h5 tensors"; else fail "model files differ"; fi
if [ "$(h5ls -r "$WORK/a/model.h5" | grep -c Dataset)" -eq 12 ]; then pass "model.h5 holds 12 /model datasets"; else fail "model.h5 datasets: $(h5ls -r "$WORK/a/model.h5")"; fi
h5ls "$WORK/a/model.h5/model/w_gate" | grep -q '{2, 4, 64, 128}' && pass "w_gate canonical shape [L,E,D,F]" || fail "w_gate shape: $(h5ls "$WORK/a/model.h5/model/w_gate")"

# recomputing the attention in backward changes no bit
long_run r --set train.recompute=attention || fail "training run with train.recompute=attention failed: $(tail -3 "$WORK/r.log")"
if [ "$(losses "$WORK/a")" = "$(losses "$WORK/r")" ] && h5diff "$WORK/a/model.h5" "$WORK/r/model.h5" /model /model >/dev/null 2>&1; then
    pass "train.recompute = attention: the same losses and model.h5, bit for bit"
else
    fail "train.recompute = attention changes the numbers"
fi
# and recomputing each whole layer, on one rank and on a learner of two
# ranks (the recomputation exchanges the expert rows again)
long_run l --set train.recompute=layer || fail "training run with train.recompute=layer failed: $(tail -3 "$WORK/l.log")"
if [ "$(losses "$WORK/a")" = "$(losses "$WORK/l")" ] && h5diff "$WORK/a/model.h5" "$WORK/l/model.h5" /model /model >/dev/null 2>&1; then
    pass "train.recompute = layer: the same losses and model.h5, bit for bit"
else
    fail "train.recompute = layer changes the numbers"
fi
for r in none layer; do
    mpi 2 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/ep_$r" --set train.log_every=1 --set train.steps=20 \
        --set train.eval_every=0 --set data.eval_bytes=4096 --set train.recompute=$r > "$WORK/ep_$r.log" 2>&1 ||
        fail "two-rank learner, recompute $r: $(tail -3 "$WORK/ep_$r.log")"
done
if [ -n "$(losses "$WORK/ep_none")" ] &&
    [ "$(losses "$WORK/ep_none")" = "$(losses "$WORK/ep_layer")" ] &&
    h5diff "$WORK/ep_none/model.h5" "$WORK/ep_layer/model.h5" /model /model >/dev/null 2>&1; then
    pass "train.recompute = layer on a learner of two ranks (experts split): the same losses and model.h5, bit for bit"
else
    fail "train.recompute = layer changes a two-rank learner's numbers"
fi

# token shards (llm.c's format, written here with perl): a uint16 shard of
# the same bytes as a byte file trains the same model bit for bit (one file:
# the same window starts); model.vocab sizes the embedding; bad shards and a
# vocabulary too small for the data are one-line errors
head -c 200000 "$CONFIGS/../data/train.txt" > "$WORK/piece.txt"
perl -e 'local $/; open F, "<", $ARGV[0] or die; binmode F; $d = <F>; binmode STDOUT;
    print pack("l<256", 20240520, 1, length $d), pack("v*", unpack("C*", $d))' "$WORK/piece.txt" > "$WORK/piece.bin"
short() { # short NAME [--set ...]: 30 steps, no evaluation
    local name=$1
    shift
    timeout 300 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/$name" --set train.steps=30 --set train.eval_every=0 \
        --set data.eval_bytes=4096 "$@" > "$WORK/$name.log" 2>&1
}
short bytes --set data.train="$WORK/piece.txt" || fail "training on piece.txt failed: $(tail -2 "$WORK/bytes.log")"
short shard --set data.train="$WORK/piece.bin" || fail "training on piece.bin failed: $(tail -2 "$WORK/shard.log")"
grep -q "^data: 1 file(s) of uint16 tokens, 200000 tokens" "$WORK/shard.log" && pass "a uint16 shard is read as 200,000 tokens" ||
    fail "shard not read as tokens: $(grep '^data:' "$WORK/shard.log")"
if h5diff "$WORK/bytes/model.h5" "$WORK/shard/model.h5" /model /model >/dev/null 2>&1; then
    pass "a uint16 shard of the same bytes trains the same model, bit for bit"
else
    fail "shard and byte file of the same tokens train different models"
fi
short vocab --set model.vocab=300 --set data.train="$WORK/piece.bin" || fail "model.vocab = 300 failed: $(tail -2 "$WORK/vocab.log")"
h5ls "$WORK/vocab/model.h5/model/embed" | grep -q '{300, 64}' && pass "model.vocab = 300: embedding [300, 64]" ||
    fail "embedding shape with model.vocab = 300: $(h5ls "$WORK/vocab/model.h5/model/embed")"
expect_exit 2 "model.vocab = 100: the training data \\(.*piece.txt\\) are raw bytes, which need 256" -- \
    "$ISTHMUS" train "$T" --set model.vocab=100 --set data.train="$WORK/piece.txt" --set train.out_dir="$WORK/v100"
head -c 5000 "$WORK/piece.bin" > "$WORK/cut.bin"
expect_exit 2 "data file .*cut.bin: its header \\(byte 8\\) says 200000 tokens" -- \
    "$ISTHMUS" train "$T" --set data.train="$WORK/cut.bin" --set train.out_dir="$WORK/cut"
expect_exit 2 "piece.txt holds raw bytes and .*piece.bin uint16 tokens: one kind per run" -- \
    "$ISTHMUS" train "$T" --set data.train="$WORK/piece.bin $WORK/piece.txt" --set train.out_dir="$WORK/mixed"

# named eval sets: a byte set and a token shard of the same bytes (with the
# bytes it stands for) give the same bits per byte, each model on its own
# kind; the names reach metrics.jsonl; a set of the other kind, a shard
# without its bytes, a section without a path: one line, exit 2
short ebytes --set data.train="$WORK/piece.txt" --set eval.piece.path="$WORK/piece.txt" --set data.eval_bytes=0 ||
    fail "byte run with [eval.piece] failed: $(tail -2 "$WORK/ebytes.log")"
short etokens --set data.train="$WORK/piece.bin" --set eval.piece.path="$WORK/piece.bin" --set eval.piece.bytes=200000 ||
    fail "token run with [eval.piece] failed: $(tail -2 "$WORK/etokens.log")"
b1=$(last_bpb "$WORK/ebytes/metrics.jsonl" piece)
b2=$(last_bpb "$WORK/etokens/metrics.jsonl" piece)
if [ -n "$b1" ] && [ "$b1" = "$b2" ] && ! grep -q '"eval":"prose"' "$WORK/ebytes/metrics.jsonl"; then
    pass "[eval.piece]: the byte file and the uint16 shard of its bytes (bytes = 200000) score the same, bpb $b1"
else
    fail "[eval.piece]: byte set bpb '$b1', token set '$b2' (or prose still evaluated)"
fi
grep -q '"eval":"piece".*"loss":.*"tokens":199999,"bytes":199999' "$WORK/etokens/metrics.jsonl" &&
    pass "a token set reports loss per token, tokens predicted and the bytes they stand for" ||
    fail "token set's eval record: $(grep '"eval":"piece"' "$WORK/etokens/metrics.jsonl" | tail -1)"
"$ISTHMUS" eval --model "$WORK/etokens/model.h5" --set train.out_dir="$WORK/etokens-eval" > "$WORK/etokens-eval.log" 2>&1 &&
    [ "$(eval_bpb "$WORK/etokens-eval/metrics.jsonl" piece)" = "$b2" ] &&
    pass "isthmus eval of the token model: the stored [eval.piece], the same bpb" ||
    fail "isthmus eval of the token model: $(tail -2 "$WORK/etokens-eval.log")"
expect_exit 2 "\\[eval.p\\] .*piece.txt holds raw bytes, the training data uint16 tokens" -- \
    "$ISTHMUS" train "$T" --set data.train="$WORK/piece.bin" --set eval.p.path="$WORK/piece.txt" --set train.out_dir="$WORK/e1"
expect_exit 2 "\\[eval.p\\] .*piece.bin holds tokens: give bytes" -- \
    "$ISTHMUS" train "$T" --set data.train="$WORK/piece.bin" --set eval.p.path="$WORK/piece.bin" --set train.out_dir="$WORK/e2"
expect_exit 2 "\\[eval.p\\] path is required" -- "$ISTHMUS" train "$T" --set eval.p.bytes=5 --set train.out_dir="$WORK/e3"

# a different seed changes the numbers (the check above is not vacuous)
long_run c --set train.seed=7 || fail "training run c failed"
if [ "$(losses "$WORK/a")" != "$(losses "$WORK/c")" ]; then pass "another seed differs"; else fail "seed has no effect"; fi
if h5diff "$WORK/a/model.h5" "$WORK/c/model.h5" /model /model >/dev/null 2>&1; then fail "h5diff sees no difference for another seed"; else pass "h5diff detects another seed's weights"; fi

# isthmus eval reproduces the in-training final evaluation
"$ISTHMUS" eval --model "$WORK/a/model.h5" --set train.out_dir="$WORK/evalout" > "$WORK/eval.log" 2>&1 || fail "eval failed: $(cat "$WORK/eval.log")"
for set in prose tech; do
    want=$(eval_bpb "$M" "$set" 300)
    got=$(eval_bpb "$WORK/evalout/metrics.jsonl" "$set")
    if [ -n "$want" ] && [ "$want" = "$got" ]; then pass "eval $set = $got"; else fail "eval $set: $got vs training's $want"; fi
done

# damaged model files
size=$(stat -c %s "$WORK/a/model.h5")
head -c $((size / 2)) "$WORK/a/model.h5" > "$WORK/truncated.h5"
expect_exit 2 "model .*truncated.h5: invalid: " -- "$ISTHMUS" eval --model "$WORK/truncated.h5"
cp "$WORK/a/model.h5" "$WORK/flipped.h5"
# overwrite 64 bytes inside the raw data of the last quarter of the file
printf '%064d' 0 | dd of="$WORK/flipped.h5" bs=1 seek=$((size * 3 / 4)) conv=notrunc 2>/dev/null
expect_exit 2 "model .*flipped.h5: invalid: dataset /model/.*: checksum mismatch" -- "$ISTHMUS" eval --model "$WORK/flipped.h5"
expect_exit 2 "eval: --set model.dim=32: only" -- "$ISTHMUS" eval --model "$WORK/a/model.h5" --set model.dim=32
finish || exit 1
