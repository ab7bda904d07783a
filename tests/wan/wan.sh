#!/bin/bash
# wan.sh — an emulated wide-area link between two network namespaces, one
# per site, on this machine (root only). Not part of isthmus: the harness
# that tests and benchmarks run the sites through.
#
#   wan.sh up DIR RATE ONE_WAY_MS [LOSS]
#       namespaces A and B joined by two TUN devices and tests/wan/tundelay
#       (every packet held ONE_WAY_MS each way: RTT = 2 x ONE_WAY_MS), each
#       direction shaped to RATE (tc tbf: "25mbit", "1gbit", ...) before
#       the delay, LOSS (a probability) dropping packets; site A is
#       10.77.0.1, site B 10.77.0.2. Writes DIR/wan.env (names, addresses).
#   wan.sh exec DIR a|b COMMAND...   run COMMAND inside site A's / B's namespace
#   wan.sh check DIR                 RTT (median of 20 round trips) and the steady
#                                    rate of a 20 s TCP stream A -> B, against the settings
#   wan.sh cut DIR | mend DIR        drop every packet either way from now on (a dead
#                                    uplink: connections stay open, nothing passes) | pass them again
#   wan.sh down DIR                  remove the namespaces and stop the forwarder
#                                    (also what a failed `up` does)
#
# Environment: WAN_SLOW_START_AFTER_IDLE (0 or 1, the namespaces' TCP
# setting; default 1 as on a stock host).
# The namespaces' names carry DIR's own id, so several harnesses may run at
# once; every address lives only inside them, and `down` leaves nothing
# behind (the TUN devices go with the forwarder, the routes with the
# namespaces). Callers trap EXIT to run `down` even after a failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "wan.sh: $*" >&2; exit 2; }

load() { # load DIR: the harness's settings
    [ -f "$1/wan.env" ] || die "$1/wan.env missing: run 'wan.sh up $1 ...' first"
    # shellcheck disable=SC1091
    . "$1/wan.env"
}

# tc's rate in bits per second ("25mbit" -> 25000000)
rate_bps() {
    echo "$1" | awk '{ r = $0; m = 1
        if (r ~ /[kK]bit$/) { m = 1e3; sub(/[kK]bit$/, "", r) }
        else if (r ~ /[mM]bit$/) { m = 1e6; sub(/[mM]bit$/, "", r) }
        else if (r ~ /[gG]bit$/) { m = 1e9; sub(/[gG]bit$/, "", r) }
        else if (r ~ /bit$/) { sub(/bit$/, "", r) }
        else { exit 1 }
        if (r !~ /^[0-9.]+$/ || r + 0 <= 0) exit 1
        printf "%.0f\n", r * m }'
}

cmd_up() {
    [ $# -ge 3 ] || die "usage: wan.sh up DIR RATE ONE_WAY_MS [LOSS]"
    local dir=$1 rate=$2 delay=$3 loss=${4:-0} bps id
    [ "$(id -u)" = 0 ] || die "network namespaces need root"
    command -v ip > /dev/null && command -v tc > /dev/null || die "ip and tc missing (apt-get install iproute2)"
    bps=$(rate_bps "$rate") || die "RATE '$rate': a tc rate such as 25mbit or 1gbit"
    echo "$delay" | grep -Eq '^[0-9]+(\.[0-9]+)?$' || die "ONE_WAY_MS '$delay': milliseconds"
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    id=$(printf '%s' "$dir" | cksum | cut -c1-6)
    local ns_a=isthmus-wan-$id-a ns_b=isthmus-wan-$id-b dev_a=iw${id}a dev_b=iw${id}b
    cat > "$dir/wan.env" << ENV
WAN_NS_A=$ns_a
WAN_NS_B=$ns_b
WAN_DEV_A=$dev_a
WAN_DEV_B=$dev_b
WAN_ADDR_A=10.77.0.1
WAN_ADDR_B=10.77.0.2
WAN_RATE=$rate
WAN_RATE_BPS=$bps
WAN_ONE_WAY_MS=$delay
WAN_LOSS=$loss
ENV
    [ -x "$here/tundelay" ] || die "$here/tundelay is not built (make tests/wan/tundelay)"
    ip netns add "$ns_a" && ip netns add "$ns_b" || { cmd_down "$dir"; die "ip netns add failed"; }
    rm -f "$dir/tundelay.ready"
    # the forwarder is the link: it runs at a real-time priority where it
    # may (as root), so a loaded machine delays its packets no more than
    # the setting (a late packet would be a longer round trip)
    local rt=()
    command -v chrt > /dev/null && chrt -f 10 true 2> /dev/null && rt=(chrt -f 10)
    "${rt[@]}" "$here/tundelay" "$dev_a" "$dev_b" "$delay" --loss "$loss" --ready "$dir/tundelay.ready" \
        2> "$dir/tundelay.log" &
    echo $! > "$dir/tundelay.pid"
    for _ in $(seq 1 100); do [ -s "$dir/tundelay.ready" ] && break; sleep 0.05; done
    [ -s "$dir/tundelay.ready" ] || { cmd_down "$dir"; die "tundelay did not start: $(cat "$dir/tundelay.log")"; }
    # the queue of each direction's shaper holds one round trip at the
    # rate (a router's buffer of one bandwidth-delay product), at least 64 kB;
    # its burst 5 ms of the rate, at least 32 kB
    local limit burst
    limit=$(awk -v b="$bps" -v d="$delay" 'BEGIN { l = b / 8 * 2 * d / 1000; printf "%d", l < 65536 ? 65536 : l }')
    burst=$(awk -v b="$bps" 'BEGIN { l = b / 8 * 0.005; printf "%d", l < 32768 ? 32768 : l }')
    local side ns dev me peer
    for side in a b; do
        if [ $side = a ]; then ns=$ns_a dev=$dev_a me=10.77.0.1 peer=10.77.0.2
        else ns=$ns_b dev=$dev_b me=10.77.0.2 peer=10.77.0.1; fi
        ip link set "$dev" netns "$ns" &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" addr add "$me" peer "$peer" dev "$dev" &&
            ip -n "$ns" link set "$dev" up &&
            tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" limit "$limit" ||
            { cmd_down "$dir"; die "configuring $dev in $ns failed"; }
        # TCP may grow its windows to the bandwidth-delay product and more;
        # WAN_SLOW_START_AFTER_IDLE=0 keeps a connection's window across the
        # idle time between two exchanges (Linux's default, 1, starts over)
        ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_rmem="4096 131072 268435456" \
            net.ipv4.tcp_wmem="4096 65536 268435456" \
            net.ipv4.tcp_slow_start_after_idle="${WAN_SLOW_START_AFTER_IDLE:-1}" 2> /dev/null || true
    done
    echo "wan.sh: sites a ($ns_a, 10.77.0.1) and b ($ns_b, 10.77.0.2): $rate each way, ${delay} ms one way, loss $loss"
}

cmd_down() {
    [ $# -eq 1 ] || die "usage: wan.sh down DIR"
    local dir=$1
    [ -f "$dir/wan.env" ] || return 0
    # shellcheck disable=SC1091
    . "$dir/wan.env"
    local ns pid
    for ns in "$WAN_NS_A" "$WAN_NS_B"; do
        # what still runs inside (a site left behind by a failed test)
        for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null; done
        ip netns del "$ns" 2> /dev/null
    done
    if [ -f "$dir/tundelay.pid" ]; then
        pid=$(cat "$dir/tundelay.pid")
        kill -TERM "$pid" 2> /dev/null
        for _ in $(seq 1 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.05; done
        kill -KILL "$pid" 2> /dev/null
        rm -f "$dir/tundelay.pid"
    fi
    rm -f "$dir/wan.env" "$dir/tundelay.ready"
    return 0
}

cmd_exec() {
    [ $# -ge 3 ] || die "usage: wan.sh exec DIR a|b COMMAND..."
    load "$1"
    local ns
    case $2 in a) ns=$WAN_NS_A ;; b) ns=$WAN_NS_B ;; *) die "site '$2': a or b" ;; esac
    shift 2
    exec ip netns exec "$ns" "$@"
}

cmd_check() {
    [ $# -eq 1 ] || die "usage: wan.sh check DIR"
    load "$1"
    local probe=$here/wanprobe port=47011 rtt mbps want_rtt want_mbps
    [ -x "$probe" ] || die "$probe is not built (make tests/wan/wanprobe)"
    ip netns exec "$WAN_NS_B" "$probe" serve $port &
    local server=$!
    sleep 0.3
    rtt=$(ip netns exec "$WAN_NS_A" "$probe" ping "$WAN_ADDR_B" $port 20)
    mbps=$(ip netns exec "$WAN_NS_A" "$probe" stream "$WAN_ADDR_B" $port 20)
    kill "$server" 2> /dev/null
    wait "$server" 2> /dev/null
    want_rtt=$(awk -v d="$WAN_ONE_WAY_MS" 'BEGIN { print 2 * d }')
    want_mbps=$(awk -v b="$WAN_RATE_BPS" 'BEGIN { print b / 1e6 }')
    echo "rtt_ms $rtt (set $want_rtt) throughput_mbit $mbps (set $want_mbps)"
    # within 10% of the settings (the stream's rate counts TCP payload,
    # the shaper IP packets: 1448 of 1500 bytes, 3.5% below)
    awk -v r="$rtt" -v wr="$want_rtt" -v m="$mbps" -v wm="$want_mbps" \
        'BEGIN { exit !(r != "" && m != "" && r >= 0.9 * wr && r <= 1.1 * wr && m >= 0.9 * wm && m <= 1.1 * wm) }'
}

cmd_cut() { # cmd_cut DIR SIGNAL: tundelay cuts (USR1) or mends (USR2) the link
    [ $# -eq 2 ] || die "usage: wan.sh cut|mend DIR"
    load "$1"
    [ -f "$1/tundelay.pid" ] && kill -"$2" "$(cat "$1/tundelay.pid")" || die "no forwarder running for $1"
}

case "${1:-}" in
up) shift; cmd_up "$@" ;;
down) shift; cmd_down "$@" ;;
exec) shift; cmd_exec "$@" ;;
check) shift; cmd_check "$@" ;;
cut) shift; cmd_cut "$@" USR1 ;;
mend) shift; cmd_cut "$@" USR2 ;;
*) sed -n '2,24p' "$0" >&2; exit 2 ;;
esac
