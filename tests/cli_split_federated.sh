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
#  - site b killed and started again before any refresh of the copies:
#    not taken back live (the host holds no copy of its experts yet); it
#    gives up after its join_timeout, a trains on;
#  - copies refreshed every 2 outer periods (codec none), site b failing
#    at step 52 (a NaN loss: its job ends): a trains on and writes the
#    whole model, b's experts from a's copy of the refresh at step 48,
#    equal to b's first learner's weights in its checkpoint of step 48 (up
#    to the refresh's float rounding); the refreshes' bytes counted apart;
#  - copies refreshed every 2 outer periods, b killed and started again:
#    taken back live, its experts from a's copy of them.
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
# 3. site b killed and started again before any refresh of the copies (every
# 128 steps here): not taken back live (the host holds no copy of b's
# experts yet): its knock goes unanswered until its
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
# 4. copies: b killed after refreshes and started again: taken back live,
# its experts from a's copy of them (the refresh before the kill), a's
# experts' copy from a's mirror; both train to the end, the whole model
BACK2="--set outer.run_id=split_back2 --set train.steps=3000 --set outer.timeout=5 --set outer.expert_refresh=2
--set train.log_every=50"
pair_start "$WORK/back2_a.log" "$WORK/back2_b.log" site "$WORK/back2" $BACK2
wait_line "$WORK/back2_a.log" '^step  *50/' 60 || fail "site a did not reach step 50"
pids=$(pgrep -f "isthmus train .* --site b .*outer.run_id=split_back2 ")
# shellcheck disable=SC2086
[ -n "$pids" ] && kill -KILL $pids
wait "$pb"
wait_line "$WORK/back2_a.log" '^site b lost at step' 30
site b "$WORK/back2" $BACK2 --resume auto > "$WORK/back2_b2.log" 2>&1 &
pb=$!
pair_wait
# the copy is of the last refresh b logged before it was killed (or one it
# completed without logging it): a multiple of 8 steps, at least that
last=$(sed -n 's/^copies    | refresh [0-9]* after step \([0-9]*\) .*/\1/p' "$WORK/back2_b.log" | tail -1)
got=$(sed -n "s/^rejoin: site b's experts from site a's copy of them (the refresh at step \([0-9]*\)).*/\1/p" \
    "$WORK/back2_b2.log")
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && grep -q '^site b rejoined' "$WORK/back2_a.log" && [ -n "$last" ] &&
    [ -n "$got" ] && [ "$got" -ge "$last" ] && [ $((got % 8)) -eq 0 ] &&
    grep -q "^wrote .*/back2/model.h5 (step 3000): the whole model" "$WORK/back2_a.log" &&
    [ "$(grep -c '^eval .* | the whole model$' "$WORK/back2_a.log")" = 2 ]; then
    pass "split with copies: b killed and started again is taken back live, its experts from a's copy (refresh at step $got, b's last logged $last); the whole model at the end"
else
    fail "split live rejoin: exits $ra/$rb, b's last refresh '$last', the copy's '$got'; $(grep -h -e error -e rejoin "$WORK"/back2_*.log | head -4)"
fi
# 5. copies: b lost after a refresh, the whole model from a's copy
COPY="--set outer.run_id=split_copy --set train.steps=120 --set outer.timeout=10 --set outer.expert_refresh=2
--set outer.codec=none --set checkpoint.every=48 --set train.log_every=8"
ISTHMUS_NAN_AT=b:52 federated_pair "$WORK/copy_a.log" "$WORK/copy_b.log" site "$WORK/copy" $COPY
# values of an expert tensor's experts 2-3 (both layers), one per line, into a file
slice() { h5dump -d "$2" -s 0,2,0,0 -c "$3" -y -w 0 -m "%.9g" -o "$4.raw" "$1" > /dev/null &&
    tr ', ' '\n\n' < "$4.raw" | sed '/^$/d' > "$4"; }
off=""
for x in w_gate:2,2,64,128 w_up:2,2,64,128 w_down:2,2,128,64; do
    slice "$WORK/copy/model.h5" "/model/${x%%:*}" "${x#*:}" "$WORK/whole.txt"
    slice "$WORK/copy/checkpoints/b/ckpt-00000048.h5" "/learner_1/model/${x%%:*}" "${x#*:}" "$WORK/b48.txt"
    a=$(grep -c . "$WORK/whole.txt") b=$(grep -c . "$WORK/b48.txt")
    d=$(paste "$WORK/whole.txt" "$WORK/b48.txt" |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ } END { if (n == 0) print "none"; else print m }')
    [ "$a" -eq $((2 * 2 * 64 * 128)) ] && [ "$b" -eq "$a" ] && [ "$d" != none ] &&
        awk -v d="$d" 'BEGIN { exit !(d <= 1e-6) }' || off="$off ${x%%:*}:$d($a/$b values)"
done
refresh=$(sed -n 's/^refresh bytes: \([0-9]*\) .*/\1/p' "$WORK/copy_a.log")
if [ $ra -eq 0 ] && [ $rb -ne 0 ] && [ -f "$WORK/copy/model.h5" ] && [ -z "$off" ] &&
    grep -q "^$WORK/copy/model.h5: site b was lost; its experts are their copy from the refresh at step 48 (held by site a)" \
        "$WORK/copy_a.log" && grep -q '^copies    | refresh 6 after step 48 ' "$WORK/copy_a.log" &&
    grep -q "^wrote .*/copy/model.h5 (step 120): the whole model" "$WORK/copy_a.log" && [ "${refresh:-0}" -gt 0 ]; then
    pass "copies: b lost at step 52, a writes the whole model with b's experts from the refresh at step 48, = b's weights then (max difference under 1e-6); refresh bytes $refresh"
else
    fail "copies: exits $ra/$rb, differences:${off:- none}, refresh bytes '$refresh'; $(grep -h -e error -e model.h5 -e 'refresh' "$WORK"/copy_?.log | head -4)"
fi
finish || exit 1
