#!/bin/bash
# cli_split_federated.sh — the whole model of a split run ([outer] experts
# = split) in the federated launch (one mpirun per site, joined through
# ompi-server; the same link code as the joint launch, cli_split.sh):
#  - two sites of tiny.ini (a: one rank, experts 0-1; b: two learners of
#    one rank, experts 2-3) write the same model.h5 as the joint launch of
#    the same config, bit for bit, with the same assembly bytes; site b's
#    log says where its experts went;
#  - site b killed mid-run (not started again): a trains on alone and ends
#    with exit 0, one line saying the model cannot be whole, and no
#    model.h5 (its own checkpoint still written);
#  - site b killed and started again: not taken back live (the host's
#    checkpoint holds none of its experts); it gives up after its
#    join_timeout, a trains on.
. "$TOP_SRCDIR/tests/lib.sh"
FED="$TOP_SRCDIR/scripts/federated.sh"
export ISTHMUS MPIRUN_ARGS="-q --oversubscribe"
T="$CONFIGS/tiny.ini"
RUN="--set site.a.ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1 --set outer.mode=diloco
--set outer.inner_steps=4 --set outer.experts=split --set train.steps=12 --set data.eval_bytes=4096
--set outer.join_timeout=60"
SERVER="$WORK/server"
stop_server() { "$FED" stop "$SERVER"; }
trap 'stop_server; rm -rf "$WORK"' EXIT
"$FED" server "$SERVER" || { fail "ompi-server did not start"; finish; exit 1; }
URI="$SERVER/ompi-server.uri"

site() { # site NAME OUT [args...]: one site's mpirun (a one rank, b two), with a deadline against a hang
    local name=$1 out=$2 np=1
    shift 2
    [ "$name" = b ] && np=2
    # shellcheck disable=SC2086
    timeout 240 "$FED" site "$URI" "$name" "$np" "$T" $RUN --set train.out_dir="$out" "$@"
}
assembly() { sed -n 's/^assembly bytes: \([0-9]*\) .*/\1/p' "$1"; }

# 1. federated == joint, the whole model bit for bit
# shellcheck disable=SC2086
mpi 3 "$ISTHMUS" train "$T" $RUN --set train.out_dir="$WORK/joint" > "$WORK/joint.log" 2>&1 ||
    fail "joint launch failed: $(tail -2 "$WORK/joint.log")"
federated_pair "$WORK/fed_a.log" "$WORK/fed_b.log" site "$WORK/fed" --set outer.run_id=split_fed
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -f "$WORK/fed/model.h5" ] &&
    h5diff "$WORK/joint/model.h5" "$WORK/fed/model.h5" /model /model > /dev/null 2>&1 &&
    grep -q "^wrote .*/fed/model.h5 (step 12): the whole model, every site's experts" "$WORK/fed_a.log"; then
    pass "federated split run: model.h5 is the whole model, = the joint launch's, bit for bit"
else
    fail "federated split: exits $ra/$rb; $(grep -h -e error -e model.h5 "$WORK"/fed_?.log | head -3)"
fi
joint=$(assembly "$WORK/joint.log") fed=$(assembly "$WORK/fed_a.log") fed_b=$(assembly "$WORK/fed_b.log")
[ -n "$joint" ] && [ "$joint" = "$fed" ] && [ "$fed" = "$fed_b" ] &&
    grep -q "^model.h5: site b's experts went to site a, which writes the whole model" "$WORK/fed_b.log" &&
    pass "the same assembly bytes in both launches and both sites' logs ($fed); b's log says where its experts went" ||
    fail "assembly bytes: joint '$joint', federated a '$fed', b '$fed_b'"
[ "$(grep -c '^eval .* | the whole model$' "$WORK/fed_a.log")" = 2 ] && pass "site a evaluates the whole model" ||
    fail "no whole-model evaluation in a's log"

# 2. site b lost for good: no whole model
LONG="--set outer.run_id=split_lost --set train.steps=400 --set outer.timeout=3 --set train.log_every=50"
pair_start "$WORK/lost_a.log" "$WORK/lost_b.log" site "$WORK/lost" $LONG
wait_line "$WORK/lost_a.log" '^step  *50/' 60 || fail "site a did not reach step 50"
pids=$(pgrep -f "isthmus train .* --site b .*outer.run_id=split_lost ")
# shellcheck disable=SC2086
[ -n "$pids" ] && kill -KILL $pids
pair_wait
if [ $ra -eq 0 ] && grep -q '^site b lost at step' "$WORK/lost_a.log" && [ ! -e "$WORK/lost/model.h5" ] &&
    grep -q "^$WORK/lost/model.h5: not written: site b was lost, and the whole model needs every site's experts" \
        "$WORK/lost_a.log" && ls "$WORK"/lost/checkpoints/a/ckpt-00000400.h5 > /dev/null 2>&1; then
    pass "site b lost: a trains on, exit 0, says the model cannot be whole and writes no model.h5 (its checkpoint: yes)"
else
    fail "lost site: a exit $ra; $(grep -h -e error -e lost -e model.h5 "$WORK/lost_a.log" | head -3)"
fi
# 3. site b killed and started again: not taken back live (the host's
# checkpoint holds none of b's experts): its knock goes unanswered until its
# join_timeout (5 s here) ends it; a trains on
BACK="--set outer.run_id=split_back --set train.steps=3000 --set outer.timeout=3 --set train.log_every=50"
pair_start "$WORK/back_a.log" "$WORK/back_b.log" site "$WORK/back" $BACK
wait_line "$WORK/back_a.log" '^step  *50/' 60 || fail "site a did not reach step 50"
pids=$(pgrep -f "isthmus train .* --site b .*outer.run_id=split_back ")
# shellcheck disable=SC2086
[ -n "$pids" ] && kill -KILL $pids
wait_line "$WORK/back_a.log" '^site b lost at step' 30
site b "$WORK/back" $BACK --set outer.join_timeout=5 --resume auto > "$WORK/back_b2.log" 2>&1
rb2=$?
still=$(pgrep -f "isthmus train .* --site a .*outer.run_id=split_back " > /dev/null && echo yes || echo no)
pair_wait
if [ $rb2 -ne 0 ] && [ "$still" = yes ] && [ $ra -eq 0 ] && ! grep -q '^site b rejoined' "$WORK/back_a.log" &&
    grep -q 'within 5 s (outer.join_timeout)' "$WORK/back_b2.log"; then
    pass "split: b started again is not taken back live (exit $rb2 after its join_timeout; a trained on to the end)"
else
    fail "split rejoin: b2 exit $rb2, a still training then: $still, a exit $ra; $(grep -h -e error -e rejoin "$WORK"/back_*.log | head -3)"
fi
finish || exit 1
