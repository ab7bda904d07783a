#!/bin/sh
# cli_butterfly.sh — butterfly mixing through mpirun: 8 learners over two
# sites (4 + 4, the reference setup) train, each round pairs every learner
# with exactly one partner (i XOR 2^(r mod 3)), some rounds cross the sites,
# the pairs' distance and the learners' spread stay bounded, every learner ends on the exact mean
# (the final averaging rounds go uncompressed whatever the codec);
# learners of different expert-parallel degrees mix through canonical plans;
# a learner count that is not a power of two exits 2; restart is bit-exact.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
BF="--set outer.mode=butterfly --set outer.inner_steps=2" # every run here (lib.sh's run NP NAME [args...])

EIGHT="--set site.a.ranks=4 --set site.a.learner_ranks=1 --set site.b.ranks=4 --set site.b.learner_ranks=1"
run 8 eight $BF $EIGHT --set train.steps=24 --set train.check_replicas=24 || run_failed eight
M="$WORK/eight/metrics.jsonl"
partners=$(grep '^{"mix"' "$M" | head -3 | sed 's/.*"partner":\([0-9]*\),.*/\1/' | tr '\n' ' ')
[ "$partners" = "1 2 4 " ] && pass "learner 0's partners in rounds 0,1,2: $partners(0 XOR 1, 2, 4)" || fail "partners: $partners"
grep '^{"mix"' "$M" | head -3 | grep -q '"partner":4,"crossed_sites":1' && grep '^{"mix"' "$M" | head -3 | grep -q '"partner":1,"crossed_sites":0' &&
    pass "rounds inside a site and across the link" || fail "crossed_sites flags"
maxd=$(grep '^{"mix"' "$M" | sed 's/.*"pair_distance":\([^,]*\),.*/\1/' | sort -g | tail -1)
awk -v d="$maxd" 'BEGIN {exit !(d > 0 && d < 0.3)}' && pass "pair distance bounded over the run (max $maxd)" || fail "pair distance $maxd"
n=$(grep -c '^{"spread"' "$M")
maxs=$(grep '^{"spread"' "$M" | sed 's/.*"max_rel_dist_to_mean":\([^,}]*\).*/\1/' | sort -g | tail -1)
[ "$n" = 12 ] && awk -v d="$maxs" 'BEGIN {exit !(d > 0 && d < 0.3)}' &&
    pass "spread (max distance to the 8 learners' mean) logged for all 12 rounds, bounded (max $maxs)" || fail "spread: $n lines, max '$maxs'"
grep -q "replicas identical at step 24: 8 learner(s)" "$WORK/eight.log" && pass "8 learners end on the same (exact mean) model" || fail "final replicas"
[ -f "$WORK/eight/model.h5" ] && pass "model written" || fail "no model"
grep -q '"summary":"traffic".*"max_peer_learners":1[,}]' "$M" && pass "no exchange waited on more than its one partner" ||
    fail "peers waited on: $(grep '"summary":"traffic"' "$M")"

# different expert-parallel degrees: 2 learners of 2 ranks + 2 learners of 1
run 6 mixed $BF --set site.a.ranks=4 --set site.a.learner_ranks=2 --set site.b.ranks=2 --set site.b.learner_ranks=1 \
    --set site.b.micro_batch=4 --set outer.codec=int8 --set train.steps=12 --set train.check_replicas=12 || run_failed mixed
grep -q "replicas identical at step 12: 4 learner(s)" "$WORK/mixed.log" && pass "learners of 2 and 1 ranks mix (int8) and end equal" || fail "mixed layouts"
# the final exact rounds (k = 2, one fragment) go uncompressed, the regular ones through int8
codecs=$(grep '^{"mix"' "$WORK/mixed/metrics.jsonl" | sed 's/.*"codec":"\([a-z0-9]*\)".*/\1/' | uniq -c | awk '{print $2 "x" $1}' | tr '\n' ' ')
[ "$codecs" = "int8x6 nonex2 " ] && pass "final averaging rounds uncompressed (mix codecs: $codecs)" || fail "mix codecs: $codecs"

expect_exit 2 "butterfly needs a power-of-two number of learners .* give 3" -- \
    mpirun -q --oversubscribe -np 3 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/three" --set outer.mode=butterfly \
    --set site.a.ranks=3 --set site.a.learner_ranks=1

# exact restart (stopped between rounds)
B="--set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1 --set train.steps=12 --set outer.codec=fp4"
run 4 straight $BF $B || run_failed straight
ISTHMUS_STOP_AT_STEP=4 run 4 stopped $BF $B || run_failed stopped
run 4 stopped $BF $B --resume auto || run_failed stopped
[ "$(losses "$WORK/straight")" = "$(losses "$WORK/stopped")" ] && h5diff "$WORK/straight/model.h5" "$WORK/stopped/model.h5" /model /model >/dev/null 2>&1 &&
    pass "butterfly restart: losses and weights bit-identical" || fail "butterfly restart differs"
finish || exit 1
