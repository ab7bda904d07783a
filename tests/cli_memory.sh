#!/bin/sh
# cli_memory.sh — `isthmus config CONFIG --memory` against what a run really
# allocated (alloc.h's counters, printed as rank 0's measured peaks at the
# end of training), for tiny and small layouts in every mode:
#  - every predicted category (weights, grads, optimizer, outer, residuals,
#    staging, activations) within 5% + 16 KiB of the measured peak (malloc's
#    usable size exceeds a request by at most a page per large block and a
#    few bytes per small one; 16 KiB covers four pages), and their total
#    within 5%;
#  - expert rows (grown with the routing) between 0.5x and 2x the balanced
#    estimate: the estimate is the routing's mean, not a bound;
#  - train.recompute = attention saves exactly the other layers' attention
#    probabilities, predicted and measured; train.recompute = layer (one
#    rank, and a learner of two) is predicted as measured and keeps less;
#  - outer state and residuals only where the mode uses them; staging in
#    one-rank sync only what a file write stages (one tensor at a time);
#  - bad --ranks / --rank values are one-line errors.
. "$TOP_SRCDIR/tests/lib.sh"

PREDICTED="weights grads optimizer outer residuals staging activations"
field() { # field FILE NAME: predicted bytes of a category
    awk -v n="$2" '$1 == n && $3 == "B" { print $2 }' "$1"
}
measured() { # measured FILE NAME
    sed -n "s/.*measured peak bytes:.* $2=\([0-9]*\).*/\1/p" "$1" | head -1
}

check() { # check NAME NP CONFIG [args...]
    local name=$1 np=$2 cfg=$3
    shift 3
    "$ISTHMUS" config "$cfg" "$@" --memory --ranks "$np" > "$WORK/$name.plan" 2>&1 || { fail "$name: config --memory failed: $(cat "$WORK/$name.plan")"; return; }
    mpi "$np" "$ISTHMUS" train "$cfg" --set train.out_dir="$WORK/$name" --set train.eval_every=0 --set data.eval_bytes=4096 \
        --set train.check_replicas=0 "$@" > "$WORK/$name.log" 2>&1 || { fail "$name: training failed: $(tail -3 "$WORK/$name.log")"; return; }
    local ok=1 p m sum_p=0 sum_m=0 c
    for c in $PREDICTED; do
        p=$(field "$WORK/$name.plan" "$c")
        m=$(measured "$WORK/$name.log" "$c")
        if [ -z "$p" ] || [ -z "$m" ]; then
            fail "$name: no $c figure (plan '$p', measured '$m')"
            return
        fi
        sum_p=$((sum_p + p))
        sum_m=$((sum_m + m))
        if ! awk -v p="$p" -v m="$m" 'BEGIN { d = m - p; if (d < 0) d = -d; exit !(d <= 0.05 * p + 16384) }'; then
            fail "$name: $c predicted $p, measured $m"
            ok=0
        fi
    done
    if awk -v p="$sum_p" -v m="$sum_m" 'BEGIN { d = m - p; if (d < 0) d = -d; exit !(d <= 0.05 * p) }'; then
        [ $ok = 1 ] && pass "$name: every category and the total ($sum_p predicted, $sum_m measured) within 5%"
    else
        fail "$name: total predicted $sum_p, measured $sum_m"
    fi
    p=$(field "$WORK/$name.plan" expert_rows)
    m=$(measured "$WORK/$name.log" expert_rows)
    if awk -v p="$p" -v m="$m" 'BEGIN { exit !(m >= 0.5 * p && m <= 2 * p) }'; then
        pass "$name: expert rows $m within 0.5x..2x of the balanced $p"
    else
        fail "$name: expert rows measured $m, balanced estimate $p"
    fi
}

T="$CONFIGS/tiny.ini"
S="$CONFIGS/small.ini"
SHORT="--set train.steps=9 --set train.log_every=9"
TWO="--set site.east.ranks=2 --set site.west.ranks=2 --set site.east.learner_ranks=2 --set site.west.learner_ranks=1 \
--set site.east.micro_batch=4 --set site.west.micro_batch=2 --set site.west.grad_accum=2 --set outer.inner_steps=4"

check tiny_1rank 1 "$T" $SHORT
check tiny_learner2 2 "$T" $SHORT
check tiny_sync_int8 4 "$T" $SHORT $TWO --set outer.mode=sync --set outer.codec=int8
check tiny_diloco_fp4 4 "$T" $SHORT $TWO --set outer.mode=diloco --set outer.codec=fp4
check tiny_streaming 4 "$T" $SHORT $TWO --set outer.mode=streaming --set outer.fragments=2 --set outer.overlap=2 \
    --set outer.codec=fp4
check tiny_butterfly 4 "$T" $SHORT $TWO --set site.east.learner_ranks=1 --set outer.mode=butterfly --set outer.overlap=1 \
    --set outer.codec=int8
check small_1rank 1 "$S" --set train.steps=2 --set train.log_every=2 --set train.threads=1 --set data.eval_bytes=4096
check small_recompute 1 "$S" --set train.steps=2 --set train.log_every=2 --set train.threads=1 --set data.eval_bytes=4096 \
    --set train.recompute=attention
check small_layer 1 "$S" --set train.steps=2 --set train.log_every=2 --set train.threads=1 --set data.eval_bytes=4096 \
    --set train.recompute=layer
check tiny_learner2_layer 2 "$T" $SHORT --set train.recompute=layer
# recomputed attention keeps one layer's probabilities (B,H,T,T floats) instead of every layer's
a0=$(field "$WORK/small_1rank.plan" activations) a1=$(field "$WORK/small_recompute.plan" activations)
want=$("$ISTHMUS" config "$S" | awk '$1 == "layers" { L = $3 } $1 == "heads" { H = $3 } $1 == "context" { T = $3 }
    $1 == "micro_batch" && !B { B = $3 } END { printf "%.0f", (L - 1) * B * H * T * T * 4 }')
[ -n "$a0" ] && [ -n "$a1" ] && [ $((a0 - a1)) = "$want" ] && pass "train.recompute = attention: activations $a0 -> $a1 B (the other layers' attention probabilities, $want B)" ||
    fail "train.recompute = attention: activations $a0 -> $a1, expected $want fewer"
# recomputed layers keep the residual stream and one layer's buffers: less
# again, in activations and in expert rows
a2=$(field "$WORK/small_layer.plan" activations)
r0=$(field "$WORK/small_1rank.plan" expert_rows) r2=$(field "$WORK/small_layer.plan" expert_rows)
[ -n "$a2" ] && [ -n "$r2" ] && [ "$a2" -lt "$a1" ] && [ "$r2" -lt "$r0" ] &&
    pass "train.recompute = layer: activations $a1 -> $a2 B, expert rows $r0 -> $r2 B" ||
    fail "train.recompute = layer: activations $a1 -> $a2, expert rows $r0 -> $r2"

# what a mode does not use is not allocated (one-rank sync stages only the
# tensor a checkpoint or the model file is writing, checked above)
for c in outer residuals; do
    [ "$(field "$WORK/tiny_1rank.plan" $c)" = 0 ] && [ "$(measured "$WORK/tiny_1rank.log" $c)" = 0 ] \
        && pass "sync on one rank: no $c" || fail "sync on one rank allocates $c"
done
[ "$(measured "$WORK/tiny_sync_int8.log" outer)" = 0 ] && pass "sync: no outer state" || fail "sync allocates outer state"
# --rank max names the rank that holds the most (here a west rank: one
# learner of 1 rank holds all 4 experts)
best=-1 best_total=-1
for r in 0 1 2 3; do
    tot=$("$ISTHMUS" config "$T" $TWO --memory --rank $r | awk '$1 == "total" { print $2 }')
    if [ "$tot" -gt "$best_total" ]; then best=$r best_total=$tot; fi
done
got=$("$ISTHMUS" config "$T" $TWO --memory --rank max | sed -n 's/^memory of world rank \([0-9]*\) .*/\1/p')
[ "$got" = "$best" ] && [ "$best" -ge 2 ] && pass "--rank max: rank $got, the largest of the four ($best_total bytes)" ||
    fail "--rank max gave rank '$got', the largest is $best"

# a bf16 config is planned for the GPU whatever the build (only the CUDA
# backend runs bf16): the bytes of backend = cuda, not the CPU backend's
# (what fp32 with backend auto still plans), as `isthmus plan` does
M="$CONFIGS/moe-32b.ini"
total() { awk '$1 == "total" && $3 == "B" { print $2 }'; }
b16=$("$ISTHMUS" config "$M" --memory --rank max | total)
cuda=$("$ISTHMUS" config "$M" --set train.backend=cuda --memory --rank max | total)
cpu32=$("$ISTHMUS" config "$M" --set train.precision=fp32 --memory --rank max | total)
[ -n "$b16" ] && [ "$b16" = "$cuda" ] && [ "$b16" != "$cpu32" ] &&
    pass "bf16 moe-32b: $b16 B per GPU, as with train.backend = cuda (fp32 on the CPU backend: $cpu32 B)" ||
    fail "bf16 moe-32b: '$b16' B, backend = cuda '$cuda' B, fp32 CPU '$cpu32' B"
"$ISTHMUS" config "$M" --memory | grep -q "the CUDA backend's buffers" && pass "config --memory says whose buffers it lays out" ||
    fail "config --memory does not say whose buffers"

# bad planning input: one line, exit 2
expect_exit 2 "--ranks abc: expected" -- "$ISTHMUS" config "$T" --memory --ranks abc
expect_exit 2 "memory: rank 9 is not in a job of 4 ranks" -- "$ISTHMUS" config "$T" --memory --ranks 4 --rank 9
expect_exit 2 "--ranks and --rank go with --memory" -- "$ISTHMUS" config "$T" --ranks 4
expect_exit 2 "layout: the \[site.\*\] sections describe 4 ranks" -- "$ISTHMUS" config "$T" $TWO --memory --ranks 3
finish || exit 1
