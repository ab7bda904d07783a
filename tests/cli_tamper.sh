#!/bin/bash
# shellcheck disable=SC2154 # ra, rb: set by federated_pair (scripts/lib.sh)
# cli_tamper.sh — an attacker on the path between two federated sites
# (tests/wan/tamper: a TCP proxy in front of site b's port, through which
# site a connects; ISTHMUS_WIRE_PORT_SHIFT points a at it). Two sites of
# tiny.ini, diloco H=4, fp4, 3 exchanges; a's 2nd payload frame to b is:
#  - flipped (one bit), replayed (exchange 1's authentic frame in its
#    place), or injected (the same frame of another run, recorded): b
#    rejects it (failed authentication, or not the frame expected), counts
#    it, and both sites leave a's payload out of that outer step — the
#    model is bit-identical to the run whose payload the link's own test
#    hook corrupts at that exchange (ISTHMUS_LINK_CORRUPT=a:2), and differs
#    from the undisturbed run's;
#  - a verdict forged (one bit flipped): the run cannot agree on what it
#    applied, so b ends with one line naming the verdict, exit 1, and a
#    logs b lost and trains on.
. "$TOP_SRCDIR/tests/lib.sh"
FED="$TOP_SRCDIR/scripts/federated.sh"
TAMPER=$(dirname "$ISTHMUS")/tests/wan/tamper
export ISTHMUS MPIRUN_ARGS="-q --oversubscribe"
T="$CONFIGS/tiny.ini"
RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.codec=fp4
--set outer.inner_steps=4 --set train.steps=12 --set data.eval_bytes=4096 --set outer.join_timeout=60
--set outer.timeout=30"
SERVER="$WORK/server"
proxy=
trap '[ -n "$proxy" ] && kill $proxy 2> /dev/null; "$FED" stop "$SERVER"; rm -rf "$WORK"' EXIT
"$FED" server "$SERVER" || { fail "ompi-server did not start"; finish; exit 1; }
URI="$SERVER/ompi-server.uri"
PB=$((20000 + $$ % 10000)) # b's port, below Linux's ephemeral range; the proxy listens 1000 above it
SHIFT=1000

# site NAME RUN: one site's mpirun; a connects through the proxy while one
# runs, b listens on port PB
site() {
    local pre=() post=()
    [ "$1" = a ] && [ -n "$proxy" ] && pre=(env "ISTHMUS_WIRE_PORT_SHIFT=a:$SHIFT")
    [ "$1" = b ] && post=(--set "outer.ports=$PB")
    # shellcheck disable=SC2086
    timeout 240 "${pre[@]}" "$FED" site "$URI" "$1" 1 "$T" $RUN --set train.out_dir="$WORK/$2" \
        --set outer.run_id="$2" "${post[@]}"
}
# both NAME [MODE K [FILE]]: both sites, through the proxy when a mode is given
both() {
    # shellcheck disable=SC2034 # pa, pb: set by federated_pair
    local name=$1 mode=${2:-} k=${3:-} file=${4:-} pa pb
    if [ -n "$mode" ]; then
        "$TAMPER" $((PB + SHIFT)) "$PB" "$mode" "$k" $file 2> "$WORK/$name.tamper" &
        proxy=$!
    fi
    federated_pair "$WORK/$name.a" "$WORK/$name.b" site "$name"
    [ -n "$proxy" ] && kill $proxy 2> /dev/null && wait $proxy 2> /dev/null
    proxy=
}
same() { h5diff "$WORK/$1/model.h5" "$WORK/$2/model.h5" /model /model > /dev/null 2>&1; }

both clean record 2 "$WORK/frame2"
[ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -s "$WORK/frame2" ] &&
    pass "through the proxy, untouched: both sites exit 0, a's 2nd payload frame recorded ($(stat -c %s "$WORK/frame2") bytes)" ||
    fail "untouched run: exits $ra/$rb: $(grep -h error "$WORK"/clean.? | head -2)"
ISTHMUS_LINK_CORRUPT=a:2 both hooked
[ $ra -eq 0 ] && [ $rb -eq 0 ] && ! same clean hooked &&
    pass "the link's own corruption of a's 2nd payload: exit 0/0, a model other than the clean run's" ||
    fail "hooked run: exits $ra/$rb, or its model equals the clean one"

for attack in "flip 2" "replay 2" "inject 2 $WORK/frame2"; do
    set -- $attack
    name=$1
    both "$name" "$@"
    said=$(grep -h "tamper:" "$WORK/$name.tamper" | head -1)
    why=$(grep -h '"outer":2,' "$WORK/$name"/site-b/metrics.jsonl 2> /dev/null | sed -n 's/.*"rejected":"\([^"]*\)".*/\1/p')
    auth=$(sed -n 's/^link: \([0-9]*\) frame(s) rejected.*/\1/p' "$WORK/$name.b" | head -1)
    if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -n "$said" ] && [ -n "$why" ] && [ "${auth:-0}" -ge 1 ] && same "$name" hooked; then
        pass "$name: '$said'; b rejected '$why'$([ -n "$auth" ] && echo ", $auth frame(s) counted"); the model = the hooked run's, bit for bit"
    else
        fail "$name: exits $ra/$rb; proxy: '$said'; b: '$why'; same as hooked: $(same "$name" hooked && echo yes || echo no)"
    fi
done

both verdict verdict 2
errors=$(grep -c "^isthmus: error" "$WORK/verdict.b")
if [ $rb -ne 0 ] && grep -q "verdict from world rank 0 .* unreadable: failed authentication" "$WORK/verdict.b" &&
    [ "$errors" -eq 1 ] && grep -q "^site b lost at step" "$WORK/verdict.a"; then
    pass "a forged verdict: b ends with one line (exit $rb): $(grep "^isthmus: error" "$WORK/verdict.b"); a logs b lost and trains on (exit $ra)"
else
    fail "forged verdict: exits $ra/$rb, $errors error line(s) on b: $(grep -h "error\|lost" "$WORK"/verdict.? | head -3)"
fi
finish || exit 1
