#!/bin/sh
# cli_ckpt.sh — HDF5 checkpoints through the executable:
#  - exact restart: N steps straight = K steps, stop, --resume auto, the rest:
#    identical losses and weights (sync with expert parallelism, diloco
#    stopped between outer steps, streaming over two sites of different layouts);
#    the resumed run's summaries cover its own steps (from_step);
#  - resharded restart (4 ranks per learner -> 2): identical weights at load,
#    training continues within tolerance; every rank's experts are saved;
#  - truncated, flipped, missing-dataset and wrong-version files are detected
#    by name and reason; --resume auto falls back to the previous valid file
#    (also when only one site's file is damaged: both sites fall back);
#  - a config that contradicts the checkpoint is refused (exit 2);
#  - SIGTERM during training leaves a valid checkpoint and exit 0.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
TAMPER=$(dirname "$ISTHMUS")/tests/h5tamper
resume_case() { # resume_case NP NAME STOP [args...]
    local np=$1 name=$2 stop=$3
    shift 3
    run "$np" "${name}_straight" "$@" || fail "$name straight run failed: $(tail -3 "$WORK/${name}_straight.log")"
    ISTHMUS_STOP_AT_STEP=$stop run "$np" "${name}_stopped" "$@" || fail "$name stopped run failed"
    grep -q "stopping after step" "$WORK/${name}_stopped.log" && [ ! -f "$WORK/${name}_stopped/model.h5" ] &&
        pass "$name: stop request after step $stop: checkpoint written, run ended early" || fail "$name: did not stop"
    run "$np" "${name}_stopped" --resume auto "$@" || fail "$name resumed run failed: $(tail -3 "$WORK/${name}_stopped.log")"
    grep -q "resumed from .*ckpt-" "$WORK/${name}_stopped.log" && pass "$name: resumed from the checkpoint" || fail "$name: not resumed"
    exact "${name}_straight" "${name}_stopped"
}

resume_case 2 sync 5 --set train.steps=12 --set train.micro_batch=4
resume_case 2 diloco 5 --set train.steps=12 --set site.a.ranks=1 --set site.b.ranks=1 \
    --set outer.mode=diloco --set outer.inner_steps=4 --set outer.codec=int8
# a resumed run's summaries cover the steps it trained, and say from where
# (the link's byte counters are not in checkpoints: the whole run's total
# would be wrong, its own part is right)
from=$(sed -n 's/^resumed from .*: step \([0-9]*\),.*/\1/p' "$WORK/diloco_stopped.log" | tail -1)
summary_field() { sed -n "s/.*\"summary\":\"$2\".*\"$3\":\([0-9.]*\).*/\1/p" "$WORK/$1/metrics.jsonl" | tail -1; }
all=$(summary_field diloco_straight traffic sync_equivalent_bytes) part=$(summary_field diloco_stopped traffic sync_equivalent_bytes)
if [ -n "$from" ] && [ "$from" -gt 0 ] &&
    grep -q "\"summary\":\"traffic\",\"steps\":$((12 - from)),\"from_step\":$from," "$WORK/diloco_stopped/metrics.jsonl" &&
    grep -q "\"summary\":\"compute\",\"steps\":$((12 - from)),\"from_step\":$from," "$WORK/diloco_stopped/metrics.jsonl" &&
    grep -q '"summary":"traffic","steps":12,"from_step":0,' "$WORK/diloco_straight/metrics.jsonl" &&
    awk -v a="$all" -v p="$part" -v f="$from" 'BEGIN { exit !(a > 0 && p * 12 == a * (12 - f)) }' &&
    awk -v a="$(summary_field diloco_straight traffic inter_site_bytes)" -v p="$(summary_field diloco_stopped traffic inter_site_bytes)" \
        'BEGIN { exit !(p > 0 && p < a) }'; then
    pass "resumed at step $from: traffic and compute summaries cover steps $((from + 1))-12 (from_step $from)"
else
    fail "resumed summaries (from step '$from'): $(grep '"summary"' "$WORK/diloco_stopped/metrics.jsonl" | tr '\n' ' ')"
fi
resume_case 6 streaming 9 --set train.steps=20 --set site.a.ranks=2 --set site.b.ranks=4 \
    --set site.b.learner_ranks=2 --set outer.mode=streaming --set outer.inner_steps=8 --set outer.overlap=2 \
    --set outer.codec=fp4
# stop requested after step 9: the site agrees after step 10, the sites learn
# it from the verdicts of the next exchange to finish (fragment 1's, started
# at 12, finished at 14), and checkpoint there with nothing lost
grep -q '"checkpoint":.*"step":14,' "$WORK/streaming_stopped/metrics.jsonl" &&
    pass "streaming: stop requested after step 9 agreed with the next finished exchange (checkpoint at step 14)" ||
    fail "streaming checkpoint step: $(grep '"checkpoint"' "$WORK/streaming_stopped/metrics.jsonl")"

# resharding: 4 ranks per learner -> 2
run 4 g4 --set train.steps=6 --set train.micro_batch=2 || fail "g4 run failed"
C="$WORK/g4/checkpoints/default/ckpt-00000006.h5"
h5diff "$C" "$WORK/g4/model.h5" /model /model > /dev/null 2>&1 &&
    pass "every rank's expert shards are in the checkpoint (equal to the model file)" || fail "checkpoint /model != model.h5"
mkdir -p "$WORK/g2"
run 2 g2 --set train.steps=6 --set train.micro_batch=4 --resume "$C" || fail "resharded load failed: $(tail -3 "$WORK/g2.log")"
h5diff "$C" "$WORK/g2/model.h5" /model /model > /dev/null 2>&1 &&
    pass "resharded load (4 -> 2 ranks per learner): parameters identical" || fail "resharded parameters differ"
run 4 g4 --set train.steps=10 --set train.micro_batch=2 --resume auto || fail "g4 continuation failed"
run 2 g2 --set train.steps=10 --set train.micro_batch=4 --resume "$C" || fail "g2 continuation failed"
ok=1
for s in 7 8 9 10; do
    a=$(step_field "$WORK/g4/metrics.jsonl" $s loss); b=$(step_field "$WORK/g2/metrics.jsonl" $s loss)
    close_to "$b" "$a" 1e-5 || { ok=0; note "step $s: $b vs $a"; }
done
[ $ok = 1 ] && pass "resharded run continues with the same losses (1e-5)" || fail "resharded losses differ"

# damaged files: each detected with its reason; inspect exits 2
D="$WORK/g4/checkpoints/default"
"$ISTHMUS" inspect "$C" > "$WORK/inspect.log" 2>&1 && grep -q "verdict: valid" "$WORK/inspect.log" &&
    grep -q "/inner/v/w_gate \[2, 4, 64, 128\]" "$WORK/inspect.log" && pass "inspect: valid file, datasets listed" || fail "inspect valid: $(tail -3 "$WORK/inspect.log")"
size=$(stat -c %s "$C")
head -c $((size / 2)) "$C" > "$WORK/trunc.h5"
expect_exit 2 "trunc.h5: invalid: not a readable HDF5 file" -- "$ISTHMUS" inspect "$WORK/trunc.h5"
cp "$C" "$WORK/flip.h5"
printf '%064d' 0 | dd of="$WORK/flip.h5" bs=1 seek=$((size * 3 / 4)) conv=notrunc 2>/dev/null
expect_exit 2 "flip.h5: invalid: dataset /.*: checksum mismatch" -- "$ISTHMUS" inspect "$WORK/flip.h5"
cp "$C" "$WORK/missing.h5" && "$TAMPER" "$WORK/missing.h5" delete /model/w_gate
expect_exit 2 "missing.h5: invalid: missing dataset /model/w_gate" -- "$ISTHMUS" inspect "$WORK/missing.h5"
cp "$C" "$WORK/version.h5" && "$TAMPER" "$WORK/version.h5" version 99
expect_exit 2 "version.h5: invalid: format_version 99, this build reads 3" -- "$ISTHMUS" inspect "$WORK/version.h5"
expect_exit 2 "checkpoint .*flip.h5: invalid: dataset" -- "$ISTHMUS" train "$T" --set train.out_dir="$WORK/x" --resume "$WORK/flip.h5"
# two ranks: whichever rank reads the damaged chunk, one line
expect_exit 2 "checkpoint .*flip.h5: invalid: dataset" -- mpirun -q --oversubscribe -np 2 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/x2" \
    --set train.micro_batch=4 --resume "$WORK/flip.h5"

# auto falls back past a corrupted newest checkpoint (a run of 12 steps: one
# whose newest step ended it, model written, is complete and trains nothing)
N="$D/ckpt-00000010.h5"
printf '%064d' 0 | dd of="$N" bs=1 seek=$(( $(stat -c %s "$N") * 3 / 4 )) conv=notrunc 2>/dev/null
run 4 g4 --set train.steps=12 --set train.micro_batch=2 --resume auto || fail "fallback run failed"
grep -q "warning: checkpoint .*ckpt-00000010.h5: invalid: dataset .*checksum mismatch.*falling back" "$WORK/g4.log" &&
    grep -q "resumed from .*ckpt-00000006.h5" "$WORK/g4.log" && pass "auto: corrupted newest reported, previous valid one used" ||
    fail "fallback: $(grep -E 'warning|resumed' "$WORK/g4.log" | tail -3)"

# two sites: site b's newest file is damaged; the load finds it (the file is
# read once: choosing checks structure only) and both sites pass over that step
SITES="--set site.a.ranks=2 --set site.b.ranks=1 --set site.a.learner_ranks=2 --set site.a.micro_batch=4 \
--set outer.mode=diloco --set outer.inner_steps=2 --set checkpoint.every=2 --set checkpoint.keep=3"
run 3 fb $SITES --set train.steps=6 || fail "two-site checkpointed run failed: $(tail -3 "$WORK/fb.log")"
N="$WORK/fb/checkpoints/b/ckpt-00000006.h5"
printf '%064d' 0 | dd of="$N" bs=1 seek=$(( $(stat -c %s "$N") * 3 / 4 )) conv=notrunc 2>/dev/null
run 3 fb $SITES --set train.steps=8 --resume auto || fail "two-site fallback run failed: $(tail -3 "$WORK/fb.log")"
if [ "$(grep -c "warning: checkpoint .*b/ckpt-00000006.h5: invalid: dataset .*falling back" "$WORK/fb.log")" = 1 ] &&
    grep -q "resumed from .*a/ckpt-00000004.h5: step 4" "$WORK/fb.log"; then
    pass "two sites: a damaged value at one site, both resume from the previous common step"
else
    fail "two-site fallback: $(grep -E 'warning|resumed|error' "$WORK/fb.log" | tail -3)"
fi

# a config that contradicts the checkpoint
expect_exit 2 "checkpoint .*: \[model\] dim = 64 in the checkpoint, 32 in the config" -- \
    "$ISTHMUS" train "$T" --set train.out_dir="$WORK/y" --set model.dim=32 --resume "$C"

# SIGTERM (what Slurm sends) during training: checkpoint, exit 0
mpirun -q --oversubscribe -np 2 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/sig" --set train.steps=100000 \
    --set train.log_every=1 --set data.eval_bytes=4096 > "$WORK/sig.log" 2>&1 &
mp=$!
for i in $(seq 1 100); do grep -q "^step .*5/" "$WORK/sig.log" && break; sleep 0.2; done
# signal the ranks, as Slurm does, not mpirun (whose own SIGTERM handling aborts the job)
for pid in $(pgrep -f "out_dir=$WORK/sig "); do
    case "$(cat /proc/$pid/comm 2>/dev/null)" in mpirun | orted) ;; *) kill -TERM "$pid" ;; esac
done
rc=0
wait $mp || rc=$?
ck=$(ls "$WORK/sig/checkpoints/default/"ckpt-*.h5 2>/dev/null | tail -1)
if [ "$rc" = 0 ] && [ -n "$ck" ] && "$ISTHMUS" inspect "$ck" > /dev/null 2>&1 && ! ls "$WORK/sig/checkpoints/default/"*.tmp >/dev/null 2>&1; then
    pass "SIGTERM: exit 0 and a valid checkpoint ($(basename "$ck"))"
else
    fail "SIGTERM: exit $rc, checkpoint '$ck': $(tail -3 "$WORK/sig.log")"
fi
finish || exit 1
