#!/bin/bash
# shellcheck disable=SC2154 # ra, rb: set by federated_pair (scripts/lib.sh)
# cli_ports.sh — a federated run through a firewall that opens one port
# range (jobs/README.md, "Cross-site networking"), in two network
# namespaces joined by tests/wan/wan.sh:
#  - each namespace drops every inbound TCP connection but those to
#    ISTHMUS_PORTS (nftables); with ISTHMUS_PORTS given to ompi-server and
#    to both sites (scripts/federated.sh pins ompi-server, Open MPI's
#    out-of-band and TCP transports and isthmus's wire inside it), the run
#    forms and trains on both sites, and the firewall dropped nothing;
#  - the same sites with only Open MPI's out-of-band channel in the range
#    (its TCP transport and the wire on ephemeral ports) are blocked by
#    that firewall: they fail within the join deadline with a line naming
#    what did not arrive (exit 1, no hang), and the firewall counted the
#    dropped connections;
#  - a malformed range is one line, exit 2.
# Skipped (visibly) without root, network namespaces or nft (nftables).
. "$TOP_SRCDIR/tests/lib.sh"
WAN="$TOP_SRCDIR/tests/wan/wan.sh"
FED="$TOP_SRCDIR/scripts/federated.sh"
export PATH="$(dirname "$ISTHMUS")/tests/wan:$PATH"
need_netns
if ! command -v nft > /dev/null; then
    echo "1..0 # SKIP nft missing (apt-get install nftables; scripts/setup.sh installs it)"
    exit 0
fi
D="$WORK/wan"
trap '"$FED" stop "$WORK/server" 2> /dev/null; "$WAN" down "$D"; rm -rf "$WORK"' EXIT
"$WAN" up "$D" 1gbit 1 > "$WORK/up.log" 2>&1 || {
    fail "wan.sh up failed: $(tail -2 "$WORK/up.log")"
    finish
    exit 1
}
# shellcheck disable=SC1091
. "$D/wan.env"

RANGE=20000-20015
# firewall NS: inbound TCP only to RANGE (and what this host itself began)
firewall() {
    ip netns exec "$1" nft -f - << NFT
table inet isthmus_test {
  chain input {
    type filter hook input priority 0; policy drop;
    iif lo accept
    ct state established,related accept
    ip protocol icmp accept
    tcp dport $RANGE accept
    tcp flags & (syn | ack) == syn counter
  }
}
NFT
}
dropped() { # connection attempts (SYNs) the firewall of NS dropped so far
    ip netns exec "$1" nft list table inet isthmus_test | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
}
if firewall "$WAN_NS_A" && firewall "$WAN_NS_B"; then
    pass "nftables in both namespaces: inbound TCP to $RANGE only"
else
    fail "nft could not load the firewall"
    finish
    exit 1
fi

export ISTHMUS
export MPIRUN_ARGS="-q --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24"
T="$CONFIGS/tiny.ini"
RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.inner_steps=4
 --set outer.codec=fp4 --set train.steps=16 --set data.eval_bytes=4096 --set outer.timeout=10"
ISTHMUS_PORTS=$RANGE "$WAN" exec "$D" a "$FED" server "$WORK/server" > "$WORK/server.log" 2>&1 ||
    fail "ompi-server in site a's namespace did not start: $(cat "$WORK/server.log")"
URI="$WORK/server/ompi-server.uri"
grep -q "tcp://10.77.0.1:20000" "$URI" && pass "ompi-server listens on the range's first port ($(cut -d';' -f2 "$URI"))" ||
    fail "ompi-server's URI: $(cat "$URI")"

site() { # site NAME OUT PORTS JOIN_TIMEOUT: one site's mpirun, in namespace NAME behind its firewall
    # shellcheck disable=SC2086
    ISTHMUS_PORTS=$3 timeout -k 20 120 "$WAN" exec "$D" "$1" "$FED" site "$URI" "$1" 1 "$T" $RUN \
        --set outer.join_timeout="$4" --set train.out_dir="$2" --set outer.run_id="$(basename "$2")"
}
pair() { # pair OUT PORTS JOIN_TIMEOUT [MPIRUN_ARGS]: both sites through the firewall; sets ra rb secs
    # shellcheck disable=SC2034 # pa, pb: set by federated_pair
    local out=$1 ports=$2 join=$3 t0 pa pb
    local MPIRUN_ARGS="$MPIRUN_ARGS ${4:-}"
    t0=$(date +%s)
    federated_pair "$out.a.log" "$out.b.log" site "$out" "$ports" "$join"
    secs=$(($(date +%s) - t0))
}

before_a=$(dropped "$WAN_NS_A") before_b=$(dropped "$WAN_NS_B")
pair "$WORK/pinned" "$RANGE" 60
drops=$(($(dropped "$WAN_NS_A") - before_a + $(dropped "$WAN_NS_B") - before_b))
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && grep -q "sites 2/2" "$WORK/pinned.a.log" && ! grep -q "lost" "$WORK/pinned.a.log" &&
    [ -f "$WORK/pinned/model.h5" ] && [ "$drops" -eq 0 ]; then
    pass "ISTHMUS_PORTS=$RANGE: the run forms through the firewall and both sites train (every exchange 2/2 sites), nothing dropped"
else
    fail "pinned: exits $ra/$rb, $drops packets dropped: $(grep -h 'error\|lost' "$WORK"/pinned.?.log | head -3 | tr '\n' '|')"
fi

before_a=$(dropped "$WAN_NS_A") before_b=$(dropped "$WAN_NS_B")
# Open MPI's out-of-band channel kept in the range (else the join waits for
# its watchdog, a minute more), its TCP transport and the wire not
pair "$WORK/ephemeral" "" 5 "--mca oob_tcp_dynamic_ipv4_ports 20001-20003"
drops=$(($(dropped "$WAN_NS_A") - before_a + $(dropped "$WAN_NS_B") - before_b))
if [ $ra -eq 1 ] && [ $rb -eq 1 ] && [ $secs -lt 100 ] && [ "$drops" -gt 0 ] &&
    grep -q "error: " "$WORK/ephemeral.a.log" && grep -q "error: " "$WORK/ephemeral.b.log"; then
    pass "Open MPI's transport and the wire on ephemeral ports: the firewall blocks them ($drops packets dropped), exit 1/1 after $secs s: $(grep -h -m1 'error: ' "$WORK/ephemeral.a.log" | cut -c1-120)"
else
    fail "ephemeral ports through the firewall: exits $ra/$rb after $secs s, $drops dropped: $(grep -h 'error' "$WORK"/ephemeral.?.log | head -2 | tr '\n' '|')"
fi
"$WAN" exec "$D" a "$FED" stop "$WORK/server"

expect_exit 2 "ISTHMUS_PORTS='20000': a range LO-HI" -- env ISTHMUS_PORTS=20000 "$FED" site "$URI" a 1 "$T"
expect_exit 2 "ISTHMUS_PORTS='20000-20003': LO-HI within 1024-65535 and at least 6 ports" -- \
    env ISTHMUS_PORTS=20000-20003 "$FED" site "$URI" a 1 "$T"
finish || exit 1
