#!/bin/sh
# cli_optim.sh — the matrix optimisers (train.optimizer = shampoo | muon)
# through the executable, on tiny.ini:
#  - Shampoo trains (the loss falls) and computes its inverse roots;
#  - stop and --resume auto are bit-identical to a straight run: shampoo in
#    sync with expert parallelism (2 ranks, each preconditioning the
#    matrices it owns), shampoo in diloco over two sites (the statistics
#    and roots per learner in the checkpoint; statistics every other
#    update), muon in sync;
#  - the checkpoint holds the statistics and roots in canonical shape;
#  - a checkpoint of one optimiser is refused by a run of another (its
#    state would be missing) and a precond_block that does not tile the
#    matrices is refused, as are statistics rarer than the roots, each in
#    one line with exit 2.
. "$TOP_SRCDIR/tests/lib.sh"
T="$CONFIGS/tiny.ini"
SH="--set train.optimizer=shampoo --set train.precond_block=32 --set train.precond_every=3"

resume_case() { # resume_case NP NAME STOP [args...]
    local np=$1 name=$2 stop=$3
    shift 3
    run "$np" "${name}_straight" "$@" || fail "$name straight run failed: $(tail -3 "$WORK/${name}_straight.log")"
    ISTHMUS_STOP_AT_STEP=$stop run "$np" "${name}_stopped" "$@" || fail "$name stopped run failed"
    grep -q "stopping after step" "$WORK/${name}_stopped.log" && [ ! -f "$WORK/${name}_stopped/model.h5" ] &&
        pass "$name: stop request after step $stop: checkpoint written, run ended early" || fail "$name: did not stop"
    run "$np" "${name}_stopped" --resume auto "$@" || fail "$name resumed run failed: $(tail -3 "$WORK/${name}_stopped.log")"
    grep -q "resumed from .*ckpt-" "$WORK/${name}_stopped.log" && pass "$name: resumed from the checkpoint" ||
        fail "$name: not resumed"
    exact "${name}_straight" "${name}_stopped"
}

# shellcheck disable=SC2086
resume_case 2 shampoo_sync 7 --set train.steps=14 --set train.micro_batch=4 $SH
first=$(losses "$WORK/shampoo_sync_straight" | head -1 | cut -d' ' -f2)
last=$(losses "$WORK/shampoo_sync_straight" | tail -1 | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' &&
    pass "shampoo trains: loss $first -> $last in 14 steps" || fail "shampoo loss $first -> $last"
# shellcheck disable=SC2086
resume_case 2 shampoo_diloco 5 --set train.steps=12 --set site.a.ranks=1 --set site.b.ranks=1 \
    --set outer.mode=diloco --set outer.inner_steps=4 --set outer.codec=int8 $SH --set train.precond_stats_every=2
resume_case 2 muon_sync 7 --set train.steps=14 --set train.micro_batch=4 --set train.optimizer=muon

# the statistics and roots in the checkpoint, canonical shapes (like /model)
ck=$(ls "$WORK"/shampoo_sync_stopped/checkpoints/default/ckpt-*.h5 | tail -1)
if h5ls -r "$ck" 2> /dev/null | grep -q '^/inner/shampoo_lroot/w_gate  *Dataset {2, 4, 64, 128}' &&
    h5ls -r "$ck" 2> /dev/null | grep -q '^/inner/shampoo_r/wq  *Dataset {2, 64, 64}'; then
    pass "the checkpoint holds shampoo_l/r/lroot/rroot in the model's canonical shapes"
else
    fail "shampoo state missing from $ck: $(h5ls -r "$ck" 2>&1 | grep shampoo | head -3)"
fi
# the dataset's raw values (no header lines): some byte of them not zero
h5dump -d /inner/shampoo_lroot/wq -b LE -o "$WORK/lroot.bin" "$ck" > /dev/null 2>&1
roots=$(tr -d '\000' < "$WORK/lroot.bin" 2> /dev/null | wc -c)
[ -s "$WORK/lroot.bin" ] && [ "${roots:-0}" -gt 0 ] && pass "the roots in the checkpoint are not zero (computed at steps 3 and 6)" ||
    fail "the roots in $ck are all zero"

ck_adam=$(ls "$WORK"/muon_sync_straight/checkpoints/default/ckpt-*.h5 | tail -1)
# shellcheck disable=SC2086
expect_exit 2 "optimizer = muon in the checkpoint, shampoo in the config" -- \
    "$ISTHMUS" train "$T" $SH --set train.out_dir="$WORK/switch" --resume "$ck_adam"
expect_exit 2 "precond_block = 48 must divide \[model\] dim = 64 and ffn = 128" -- \
    "$ISTHMUS" train "$T" --set train.optimizer=shampoo --set train.precond_block=48 --set train.out_dir="$WORK/bad"
# shellcheck disable=SC2086
expect_exit 2 "precond_stats_every = 4 exceeds precond_every = 3" -- \
    "$ISTHMUS" train "$T" $SH --set train.precond_stats_every=4 --set train.out_dir="$WORK/bad"
finish || exit 1
