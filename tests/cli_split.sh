#!/bin/sh
# cli_split.sh — [outer] experts = split through the executable, two sites
# in one mpirun (tiny.ini: E = 4, each site two experts): only the dense
# part crosses (its payload worked out here from the model's sizes), the
# learners of a site agree on everything and the sites on the dense part,
# the drop policy counts the copies it drops, a resume is bit-exact, and a
# site's file is never read as the whole model.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
SPLIT="--set site.a.ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1 --set outer.mode=diloco
 --set outer.inner_steps=4 --set outer.experts=split --set data.eval_bytes=4096 --set train.log_every=4"
train() { # train NAME STEPS [--set ...]
    local name=$1 steps=$2
    shift 2
    # shellcheck disable=SC2086
    mpi 3 "$ISTHMUS" train "$T" $SPLIT --set train.out_dir="$WORK/$name" --set train.steps="$steps" "$@" \
        > "$WORK/$name.log" 2>&1
}

# tiny.ini: V=256 D=64 L=2 E=4 F=128; the dense part is the embedding, per
# layer the attention (4 D^2), the router (D E) and two norms (2 D), and the
# final norm: 49,984 values, float32 (codec none), and a 96-byte frame
dense=$(awk 'BEGIN { V = 256; D = 64; L = 2; E = 4; print (V*D + L*(4*D*D + D*E + 2*D) + D) * 4 + 96 }')
if train local 12 --set train.check_replicas=4; then
    payloads=$(sed -n 's/^outer .* payload \([0-9]*\) B .*/\1/p' "$WORK/local.log" | sort -u)
    [ "$payloads" = "$dense" ] && pass "split: each outer step's payload is the dense part, $dense B" ||
        fail "split payloads '$payloads' B, the dense part is $dense B"
    grep -q "^  site a .*(experts 0-1, 2 experts per rank)" "$WORK/local.log" &&
        grep -q "^  site b .*(experts 2-3, 2 experts per rank)" "$WORK/local.log" &&
        pass "the layout names each site's experts" || fail "layout: $(grep '^  site' "$WORK/local.log")"
    [ "$(grep -c "^replicas identical at step .*: 3 learner(s); the site's fingerprint .*, the dense part's" \
        "$WORK/local.log")" -ge 3 ] && pass "b's two learners hold the same model, a and b the same dense part" ||
        fail "replica check: $(grep -i 'replica' "$WORK/local.log" | head -2)"
    grep -q "model.h5: not written: the experts are split across sites" "$WORK/local.log" && [ ! -e "$WORK/local/model.h5" ] &&
        pass "no model.h5 of one site's experts" || fail "model.h5 written by a split run"
    expect_exit 2 "the run split its experts across sites" -- \
        "$ISTHMUS" eval --model "$(ls "$WORK"/local/checkpoints/a/ckpt-*.h5 | tail -1)"
else
    fail "split training failed: $(tail -3 "$WORK/local.log")"
fi

# drop: the full router; copies routed to the other site's experts are
# dropped and counted (about half of them with two sites of two experts)
if train drop 8 --set outer.expert_routing=drop; then
    frac=$(metric remote_frac "$WORK/drop/metrics.jsonl" | tail -1)
    awk -v f="$frac" 'BEGIN { exit !(f > 0.2 && f < 0.8) }' && pass "drop: $frac of the copies went to the other site's experts" ||
        fail "drop: remote_frac '$frac'"
else
    fail "drop training failed: $(tail -3 "$WORK/drop.log")"
fi

# a resume: 8 steps straight against 4, then 4 more from the checkpoint;
# every site's last checkpoint the same, bit for bit
train straight 8 --set checkpoint.every=4 &&
    train halves 4 --set checkpoint.every=4 &&
    train halves 8 --set checkpoint.every=4 --resume auto || fail "resume runs failed: $(tail -2 "$WORK/halves.log")"
same=1
for s in a b; do
    h5diff "$WORK/straight/checkpoints/$s/ckpt-00000008.h5" "$WORK/halves/checkpoints/$s/ckpt-00000008.h5" /model /model \
        > /dev/null 2>&1 || same=0
done
[ $same = 1 ] && grep -q "resum" "$WORK/halves.log" && pass "split: a resume at step 4 ends on the same bits at both sites" ||
    fail "split resume differs from the straight run"
finish || exit 1
