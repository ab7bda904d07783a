#!/bin/bash
# federated.sh — the federated launch: one mpirun per site, joined at run
# time through ompi-server (docs/architecture.md, "Launch forms").
#
#   federated.sh server DIR             start ompi-server; DIR/ompi-server.uri, .pid
#   federated.sh site URI SITE NP CONFIG [train args...]
#                                       one site's mpirun (URI: the .uri file)
#   federated.sh stop DIR               stop the ompi-server started in DIR
#   federated.sh check URI              exit 0 when the server of that URI file answers
#   federated.sh run DIR CONFIG SITE:NP [SITE:NP...] [-- train args...]
#                                       all of it on this machine: the server,
#                                       every site (logs DIR/SITE.log), then stop
#
# `site` checks that the server answers before it starts mpirun (Open MPI's
# mpirun would wait for it forever) and says so in one line, exit 2. A site
# the live run dropped, or whose join broke inside Open MPI (isthmus exits
# 3), is started again, with --resume auto, and (re)joins; ISTHMUS_REJOINS
# (default 3) bounds how often; ISTHMUS_START numbers the starts (1, 2, ...).
# Environment: ISTHMUS (the executable; default: the one in the tree, or
# installed with this script, or on PATH),
# MPIRUN_ARGS (extra mpirun options, e.g. --oversubscribe), ISTHMUS_PORTS.
#
# ISTHMUS_PORTS=LO-HI keeps every listening socket that the other site
# connects to inside that range (jobs/README.md, "Cross-site networking"):
# LO is ompi-server's port (`server`), LO+1..LO+3 Open MPI's out-of-band
# channel of each site's mpirun and daemons, then half of the rest Open
# MPI's TCP transport (one port per rank of a node) and the other half
# isthmus's own (`[outer] ports`, one per rank of a node). A firewall
# between the sites opens LO-HI (TCP, inbound, at both ends); the range
# needs at least 4 + 2 x (ranks per node) ports.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
# the tree's isthmus, else (installed: PREFIX/share/isthmus/scripts) the one
# installed with it (its directory written in at install), else PATH's
isthmus=${ISTHMUS:-$here/isthmus}
if [ -z "${ISTHMUS:-}" ] && [ ! -x "$isthmus" ]; then
    if [ -x "@ISTHMUS_BINDIR@/isthmus" ]; then isthmus=@ISTHMUS_BINDIR@/isthmus
    else isthmus=$(command -v isthmus || echo "$here/isthmus")
    fi
fi

die() { echo "federated.sh: $*" >&2; exit 2; }

# ISTHMUS_PORTS split into its parts: port_server, port_oob (LO-HI),
# port_btl_min and port_btl_count, port_wire (LO-HI); nothing when unset
ports_split() {
    port_server=
    [ -n "${ISTHMUS_PORTS:-}" ] || return 0
    local lo hi n half
    echo "$ISTHMUS_PORTS" | grep -Eq '^[0-9]+-[0-9]+$' || die "ISTHMUS_PORTS='$ISTHMUS_PORTS': a range LO-HI"
    lo=${ISTHMUS_PORTS%-*} hi=${ISTHMUS_PORTS#*-}
    [ "$lo" -ge 1024 ] && [ "$hi" -le 65535 ] && [ "$hi" -ge $((lo + 5)) ] ||
        die "ISTHMUS_PORTS='$ISTHMUS_PORTS': LO-HI within 1024-65535 and at least 6 ports (4 + 2 x ranks per node)"
    n=$((hi - lo + 1 - 4))
    half=$((n / 2))
    port_server=$lo
    port_oob="$((lo + 1))-$((lo + 3))"
    port_btl_min=$((lo + 4)) port_btl_count=$half
    port_wire="$((lo + 4 + half))-$hi"
}

# some tcp://HOST[,HOST...]:PORT of an ompi-server URI file answers within 3 s
reachable() {
    local uri entry hosts port host
    uri=$(cat "$1" 2>/dev/null) || return 1
    for entry in $(echo "$uri" | tr ';' '\n' | sed -n 's|^tcp://\(.*\):\([0-9]*\)$|\1:\2|p'); do
        hosts=${entry%:*}
        port=${entry##*:}
        for host in $(echo "$hosts" | tr ',' ' '); do
            timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null && return 0
        done
    done
    return 1
}

cmd_server() {
    local dir=$1
    mkdir -p "$dir" || die "cannot create $dir"
    rm -f "$dir/ompi-server.uri"
    ports_split
    # ompi-server reads its MCA parameters from the environment
    if [ -n "$port_server" ]; then export OMPI_MCA_oob_tcp_static_ipv4_ports=$port_server; fi
    setsid ompi-server --no-daemonize -r "$dir/ompi-server.uri" > "$dir/ompi-server.log" 2>&1 < /dev/null &
    echo $! > "$dir/ompi-server.pid"
    for _ in $(seq 1 100); do
        [ -s "$dir/ompi-server.uri" ] && reachable "$dir/ompi-server.uri" && return 0
        sleep 0.1
    done
    die "ompi-server did not start (see $dir/ompi-server.log)"
}

cmd_stop() {
    local dir=$1 pid
    pid=$(cat "$dir/ompi-server.pid" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null
    rm -f "$dir/ompi-server.pid"
    return 0
}

cmd_site() {
    [ $# -ge 4 ] || die "usage: federated.sh site URI SITE NP CONFIG [train args...]"
    local uri=$1 site=$2 np=$3 config=$4
    shift 4
    ports_split
    [ -s "$uri" ] || die "ompi-server URI file $uri is missing or empty: start the server first (federated.sh server DIR)"
    reachable "$uri" || die "ompi-server at $(cut -d';' -f2 "$uri") (from $uri) does not answer: is it running?"
    # exit 3: the live run dropped this site (it stalled past the other
    # site's deadline) or its join broke inside Open MPI; started again, it
    # (re)joins (ISTHMUS_REJOINS times)
    local tries=0 rc child extra=() pinned=()
    [ -n "$port_server" ] && pinned=(--mca oob_tcp_dynamic_ipv4_ports "$port_oob" --mca btl_tcp_port_min_v4 "$port_btl_min"
        --mca btl_tcp_port_range_v4 "$port_btl_count")
    while :; do
        # shellcheck disable=SC2086
        ISTHMUS_START=$((tries + 1)) mpirun ${MPIRUN_ARGS:-} "${pinned[@]}" -x ISTHMUS_START -np "$np" --ompi-server "file:$uri" "$isthmus" train "$config" \
            --site "$site" "$@" ${port_wire:+--set "outer.ports=$port_wire"} "${extra[@]}" &
        child=$!
        # a signal to this script (timeout, scancel) goes on to mpirun; USR1
        # and USR2 (the job scripts' pause and end: checkpoint and leave) as
        # they are, which mpirun passes on to the ranks
        trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP
        trap 'kill -USR1 "$child" 2>/dev/null' USR1
        trap 'kill -USR2 "$child" 2>/dev/null' USR2
        wait "$child"
        rc=$?
        while kill -0 "$child" 2>/dev/null; do
            wait "$child"
            rc=$?
        done
        trap - TERM INT HUP USR1 USR2
        [ $rc -eq 3 ] && [ $tries -lt "${ISTHMUS_REJOINS:-3}" ] || return $rc
        tries=$((tries + 1))
        echo "federated.sh: site $site was dropped from the run or its join broke (exit 3); starting it again to (re)join ($tries of ${ISTHMUS_REJOINS:-3})" >&2
        case " $* " in *" --resume "*) ;; *) extra=(--resume auto) ;; esac
    done
}

cmd_run() {
    [ $# -ge 3 ] || die "usage: federated.sh run DIR CONFIG SITE:NP [SITE:NP...] [-- train args...]"
    local dir=$1 config=$2
    shift 2
    local sites=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do sites+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    [ ${#sites[@]} -gt 0 ] || die "run: no SITE:NP given"
    cmd_server "$dir"
    local pids=() status=0
    for s in "${sites[@]}"; do
        "$0" site "$dir/ompi-server.uri" "${s%%:*}" "${s##*:}" "$config" "$@" > "$dir/${s%%:*}.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p"
        rc=$?
        [ $rc -gt $status ] && status=$rc
    done
    cmd_stop "$dir"
    return $status
}

case "${1:-}" in
server) shift; cmd_server "$@" ;;
stop) shift; cmd_stop "$@" ;;
site) shift; cmd_site "$@" ;;
check) shift; [ $# -eq 1 ] && reachable "$1" ;;
run) shift; cmd_run "$@" ;;
*) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
