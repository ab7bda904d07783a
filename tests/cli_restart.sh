#!/bin/sh
# cli_restart.sh — a checkpoint at any step, exact restarts, and transfers
# in pieces:
#  - streaming with an exchange always in flight (P = H = 8, tau = 2; and
#    P = 2, H = 8, tau = 7), and butterfly with rounds in flight: a
#    checkpoint every checkpoint.every steps that does not change the
#    numbers; a restart from one taken mid-exchange continues exactly; a stop
#    request ends the run within tau + 1 steps (butterfly: 1 + k*H) with
#    exit 0, and the resumed run is bit-identical to a straight one;
#  - the same with sparse (topk) payloads and a decaying residual;
#  - 66 layers as 66 fragments (beyond the old limit of 64): the same;
#  - sync with a lossy codec (int8, error feedback) restarts bit-exactly;
#  - mpi_piece_bytes = 4 KiB (every transfer in many pieces) gives results
#    bit-identical to one piece, in every mode.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
TWO="--set site.a.ranks=1 --set site.b.ranks=1"
ckpt_steps() { ls "$WORK/$1/checkpoints/a" 2>/dev/null | sed -n 's/ckpt-0*\([0-9][0-9]*\)\.h5/\1/p' | sort -n | tr '\n' ' '; }

# stop_case NAME STOP BOUND EVERY MID [args...]: a straight run; one with a
# checkpoint every EVERY steps (the same numbers; resumed from its step-MID
# checkpoint, taken with an exchange in flight, it continues exactly); and
# one stopped after STOP (a checkpoint within BOUND steps, exit 0), resumed.
# NP and LAYOUT give the ranks and sites (default: two sites of one rank).
stop_case() {
    local name=$1 stop=$2 bound=$3 every=$4 mid=$5 np=${NP:-2} layout=${LAYOUT:-$TWO}
    shift 5
    run "$np" "${name}_straight" $layout "$@" || fail "$name straight run failed: $(tail -3 "$WORK/${name}_straight.log")"
    run "$np" "${name}_every" $layout --set checkpoint.every="$every" --set checkpoint.keep=100 "$@" ||
        fail "$name checkpointed run failed: $(tail -3 "$WORK/${name}_every.log")"
    local want="" s=$every
    while [ "$s" -le "$TOTAL" ]; do want="$want$s "; s=$((s + every)); done
    [ "$(ckpt_steps "${name}_every")" = "$want" ] &&
        pass "$name: a checkpoint every $every steps, exchanges in flight or not ($want)" ||
        fail "$name: checkpoints at $(ckpt_steps "${name}_every"), expected $want"
    exact "${name}_straight" "${name}_every"
    local file
    file=$(printf '%s/%s_every/checkpoints/a/ckpt-%08d.h5' "$WORK" "$name" "$mid")
    run "$np" "${name}_mid" $layout --resume "$file" --set checkpoint.dir="$WORK/${name}_every/checkpoints" \
        --set checkpoint.keep=100 "$@" || fail "$name resume from step $mid failed: $(tail -3 "$WORK/${name}_mid.log")"
    if [ "$(losses "$WORK/${name}_mid")" = "$(losses "$WORK/${name}_straight" | awk -v k="$mid" '$1 > k')" ] &&
        h5diff "$WORK/${name}_straight/model.h5" "$WORK/${name}_mid/model.h5" /model /model > /dev/null 2>&1; then
        pass "$name: resumed from the step-$mid checkpoint (taken mid-exchange): losses and weights bit-identical"
    else
        fail "$name: resumed from step $mid: differs from the straight run"
    fi
    local rc=0 at
    ISTHMUS_STOP_AT_STEP=$stop run "$np" "${name}_stopped" $layout "$@" || rc=$?
    at=$(ckpt_steps "${name}_stopped" | awk '{print $NF}')
    if [ "$rc" = 0 ] && [ -n "$at" ] && [ "$at" -gt "$stop" ] && [ "$at" -le $((stop + bound)) ] &&
        [ ! -f "$WORK/${name}_stopped/model.h5" ]; then
        pass "$name: stop after step $stop: exit 0 with a checkpoint at step $at (bound: $bound steps)"
    else
        fail "$name: stop after $stop: exit $rc, checkpoint at '$at': $(grep -E 'stopping|error' "$WORK/${name}_stopped.log" | head -2)"
    fi
    run "$np" "${name}_stopped" $layout --resume auto "$@" ||
        fail "$name resumed run failed: $(tail -3 "$WORK/${name}_stopped.log")"
    exact "${name}_straight" "${name}_stopped"
}

EIGHT="--set model.layers=8 --set model.dim=32 --set model.ffn=32 --set model.context=32 --set train.micro_batch=2"
TOTAL=24
# streaming: tau + 1 steps bound the stop (site vote 1 step, then the next
# finished exchange, at most H/P steps later)
stop_case pheq 9 3 4 8 $EIGHT --set train.steps=$TOTAL --set outer.mode=streaming --set outer.inner_steps=8 \
    --set outer.fragments=8 --set outer.overlap=2 --set outer.codec=int8
stop_case ptau 9 8 4 8 $EIGHT --set train.steps=$TOTAL --set outer.mode=streaming --set outer.inner_steps=8 \
    --set outer.fragments=2 --set outer.overlap=7 --set outer.codec=fp4
# sparse payloads (topk, residual decay 0.95, averaged over senders): the
# decaying residuals are in the checkpoint and the restart is exact
stop_case topk 9 3 4 8 $EIGHT --set train.steps=$TOTAL --set outer.mode=streaming --set outer.inner_steps=8 \
    --set outer.fragments=8 --set outer.overlap=2 --set outer.codec=topk --set outer.topk_chunk=64 \
    --set outer.topk_k=4 --set outer.ef_decay=0.95

# 66 fragments: state beyond the first 64 survives a restart
DEEP="--set model.layers=66 --set model.dim=16 --set model.heads=1 --set model.experts=2 --set model.top_k=1
      --set model.ffn=16 --set model.context=16 --set train.micro_batch=1"
TOTAL=70
stop_case deep 66 2 35 35 $DEEP --set train.steps=$TOTAL --set outer.mode=streaming --set outer.inner_steps=66 \
    --set outer.fragments=66 --set outer.overlap=1

# butterfly over two sites (2 + 2 learners, k = 2): rounds in flight at
# checkpoints 9 and 12 are drained and saved; a stop needs k rounds to reach
# every learner: at most 1 + k*H steps
TOTAL=24
NP=4 LAYOUT="--set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1" \
    stop_case bfly 5 9 3 9 --set train.steps=$TOTAL --set outer.mode=butterfly --set outer.inner_steps=4 \
    --set outer.overlap=2 --set outer.codec=int8

# sync with a lossy codec: the error-feedback residuals are in the checkpoint
run 2 sync8_straight $TWO --set train.steps=10 --set outer.codec=int8 || fail "sync int8 straight failed"
ISTHMUS_STOP_AT_STEP=4 run 2 sync8_stopped $TWO --set train.steps=10 --set outer.codec=int8 || fail "sync int8 stop failed"
grep -q "stopping after step" "$WORK/sync8_stopped.log" && pass "sync int8: stopped early" || fail "sync int8: did not stop"
run 2 sync8_stopped $TWO --resume auto --set train.steps=10 --set outer.codec=int8 || fail "sync int8 resume failed"
exact sync8_straight sync8_stopped

# every transfer in 4 KiB pieces: bit-identical to whole messages
pieces() { # pieces NAME NP [args...]
    local name=$1 np=$2
    shift 2
    run "$np" "${name}_whole" "$@" || fail "$name (one piece) failed: $(tail -3 "$WORK/${name}_whole.log")"
    run "$np" "${name}_pieces" --set train.mpi_piece_bytes=4096 "$@" ||
        fail "$name (4 KiB pieces) failed: $(tail -3 "$WORK/${name}_pieces.log")"
    exact "${name}_whole" "${name}_pieces"
}
THREE="--set site.a.ranks=2 --set site.b.ranks=1"
pieces sync 3 $THREE --set train.steps=6 --set outer.codec=bf16
pieces diloco 4 --set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=2 --set train.steps=8 \
    --set outer.mode=diloco --set outer.inner_steps=4
pieces butterfly 4 --set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=2 \
    --set site.b.learner_ranks=1 --set train.steps=8 --set outer.mode=butterfly --set outer.inner_steps=2
finish || exit 1
