#!/bin/bash
# shellcheck disable=SC2154 # ra, rb: set by federated_pair (scripts/lib.sh)
# cli_wan.sh — the emulated wide-area link (tests/wan/wan.sh) and a
# federated run across it:
#  - two namespaces joined by tundelay (75 ms each way) and tbf (20 Mbit/s):
#    a plain TCP connection measures a round trip and a steady rate within
#    10% of the settings;
#  - a two-site federated run (one mpirun per namespace, ompi-server in
#    site a's) trains across it: every inter-site byte crossed the
#    forwarder (its counters), and the model is the one of the same run
#    over loopback, bit for bit;
#  - `wan.sh down` leaves no namespace, device or forwarder behind, also
#    when the sites are still running (a failed test);
#  - bad settings are one line and exit 2.
# Skipped (visibly) where network namespaces cannot be made (not root, or
# a sandbox without them).
. "$TOP_SRCDIR/tests/lib.sh"
WAN="$TOP_SRCDIR/tests/wan/wan.sh"
export PATH="$(dirname "$ISTHMUS")/tests/wan:$PATH"
need_netns
D="$WORK/wan"
trap '"$WAN" down "$D"; "$TOP_SRCDIR/scripts/federated.sh" stop "$WORK/server" 2> /dev/null; rm -rf "$WORK"' EXIT

if "$WAN" up "$D" 20mbit 75 > "$WORK/up.log" 2>&1; then
    pass "wan.sh up: two namespaces, tundelay 75 ms each way, tbf 20 Mbit/s each way"
else
    fail "wan.sh up failed: $(tail -2 "$WORK/up.log")"
    finish
    exit 1
fi
# shellcheck disable=SC1091
. "$D/wan.env"
if "$WAN" check "$D" > "$WORK/check.log" 2>&1; then
    pass "a plain TCP connection across it: $(cat "$WORK/check.log") (within 10%)"
else
    fail "the link is off its settings: $(cat "$WORK/check.log")"
fi

# a federated tiny run across the link, and the same over loopback
T="$CONFIGS/tiny.ini"
RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=streaming --set outer.inner_steps=8
 --set outer.fragments=2 --set outer.overlap=3 --set outer.codec=fp4 --set train.steps=24 --set data.eval_bytes=4096"
FED="$TOP_SRCDIR/scripts/federated.sh"
site() { # site NAME OUT [lo]: one site's mpirun, in namespace NAME (its end of the link), or on loopback
    local name=$1 out=$2 pre=()
    [ "${3:-}" != lo ] && pre=("$WAN" exec "$D" "$name")
    # shellcheck disable=SC2086
    timeout 180 "${pre[@]}" "$FED" site "$URI" "$name" 1 "$T" $RUN --set train.out_dir="$out" \
        --set outer.run_id="$(basename "$out")"
}
link_bytes() { # received + sent bytes of site a's end of the link
    "$WAN" exec "$D" a sh -c "echo \$((\$(cat /sys/class/net/$WAN_DEV_A/statistics/rx_bytes) + \$(cat /sys/class/net/$WAN_DEV_A/statistics/tx_bytes)))"
}
before=$(link_bytes)
"$WAN" exec "$D" a "$FED" server "$WORK/server" > /dev/null 2>&1 || fail "ompi-server in site a's namespace did not start"
URI="$WORK/server/ompi-server.uri"
export MPIRUN_ARGS="-q --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24"
federated_pair "$WORK/wan_a.log" "$WORK/wan_b.log" site "$WORK/over_wan"
after=$(link_bytes)
"$WAN" exec "$D" a "$FED" stop "$WORK/server"
bytes=$(sed -n 's/^inter-site traffic: \([0-9]*\) bytes.*/\1/p' "$WORK/wan_a.log")
# the traffic line counts every byte twice (sent by one rank, received by
# another): half of it crossed site a's end of the link, with TCP/IP headers
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -n "$bytes" ] && awk -v w=$((after - before)) -v b="$bytes" 'BEGIN { exit !(w >= b / 2) }'; then
    pass "federated run across the link: exit 0/0, its $((bytes / 2)) inter-site bytes crossed the emulated link ($((after - before)) bytes there in all)"
else
    fail "federated run across the link: exits $ra/$rb, $bytes bytes counted, $((after - before)) on the link: $(grep -h error "$WORK"/wan_?.log | head -2)"
fi
export MPIRUN_ARGS="-q --oversubscribe"
"$FED" server "$WORK/server" > /dev/null 2>&1 || fail "ompi-server on loopback did not start"
federated_pair "$WORK/lo_a.log" "$WORK/lo_b.log" site "$WORK/over_lo" lo
"$FED" stop "$WORK/server"
h5diff "$WORK/over_wan/model.h5" "$WORK/over_lo/model.h5" /model /model > /dev/null 2>&1 &&
    pass "the run across the emulated link ends on the loopback run's model, bit for bit" ||
    fail "the model across the link differs from the loopback run's"

# down with a site still running inside: everything goes
"$WAN" exec "$D" b sleep 300 &
sleeper=$!
sleep 0.5
"$WAN" down "$D"
sleep 0.5
left=$(ip netns list | grep -c "$WAN_NS_A\|$WAN_NS_B")
if [ "$left" -eq 0 ] && ! kill -0 $sleeper 2> /dev/null && ! ip link show "$WAN_DEV_A" > /dev/null 2>&1 &&
    ! pgrep -f "tundelay $WAN_DEV_A" > /dev/null; then
    pass "wan.sh down: namespaces, devices, the forwarder and a process left inside are gone"
else
    fail "wan.sh down left: $left namespace(s), sleeper $(kill -0 $sleeper 2> /dev/null && echo alive)"
fi
expect_exit 2 "RATE 'fast': a tc rate" -- "$WAN" up "$WORK/bad" fast 75
expect_exit 2 "ONE_WAY_MS 'soon': milliseconds" -- "$WAN" up "$WORK/bad" 10mbit soon
finish || exit 1
