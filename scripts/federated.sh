#!/bin/bash
# federated.sh — the federated launch: one mpirun per site, joined at run
# time through ompi-server (docs/architecture.md, "Launch forms").
#
#   federated.sh server DIR             start ompi-server; DIR/ompi-server.uri, .pid
#   federated.sh site SERVER SITE NP CONFIG [train args...]
#                                       one site's mpirun
#   federated.sh stop DIR               stop the ompi-server started in DIR
#   federated.sh check SERVER           exit 0 when that server answers
#   federated.sh uri SERVER             print the server's URI (what mpirun's --ompi-server takes)
#   federated.sh run DIR CONFIG SITE:NP [SITE:NP...] [-- train args...]
#                                       all of it on this machine: the server,
#                                       every site (logs DIR/SITE.log), then stop
#
# SERVER names the server three ways, none needing a filesystem the sites
# share: the URI file ompi-server wrote (or a copy of it), the URI itself
# (its one line, e.g. '2147483648.0;tcp://10.1.2.3:20000'), or HOST:PORT
# (the server's address and port as this site reaches it; ISTHMUS_PORTS
# fixes the port). HOST:PORT is turned into the URI by asking the server
# its process name (a one-rank mpirun the server answers with it), so it
# also finds a server started again at that address; a URI names one start
# of the server (a later one at its address is refused: another name), a
# file whatever URI it holds then. `site` resolves SERVER at every start,
# checks that the server answers before it starts mpirun (Open MPI's mpirun
# would wait for it forever) and says so in one line, exit 2, and gives the
# ranks its address (ISTHMUS_NAME_SERVER: isthmus leaves a server that
# went away alone, src/nameserver.h). A site
# the live run dropped, or whose join broke inside Open MPI (isthmus exits
# 3), is started again, with --resume auto, and (re)joins; ISTHMUS_REJOINS
# (default 3) bounds how often; ISTHMUS_START numbers the starts (1, 2, ...);
# a start again waits up to ISTHMUS_SERVER_WAIT s (300) for the server.
# Environment: ISTHMUS (the executable; default: the one in the tree, or
# installed with this script, or on PATH),
# MPIRUN_ARGS (extra mpirun options, e.g. --oversubscribe), ISTHMUS_PORTS,
# ISTHMUS_SERVER_WAIT.
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

# some tcp://HOST[,HOST...]:PORT of an ompi-server URI answers within 3 s
# (its HOST:PORT printed)
reachable() {
    local entry hosts port host
    for entry in $(echo "$1" | tr ';' '\n' | sed -n 's|^tcp://\(.*\):\([0-9]*\)$|\1:\2|p'); do
        hosts=${entry%:*}
        port=${entry##*:}
        for host in $(echo "$hosts" | tr ',' ' '); do
            timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null && echo "$host:$port" && return 0
        done
    done
    return 1
}

# The kind of SERVER: file (an existing file, or a name that is neither of
# the others), uri (the URI itself), hostport (HOST:PORT)
server_kind() {
    if [ -e "$1" ]; then echo file
    elif [[ $1 == *";tcp://"* || $1 == *";tcp6://"* ]]; then echo uri
    elif [[ $1 =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]]; then echo hostport
    else echo file
    fi
}

# The server's name from HOST:PORT: Open MPI checks the process name of the
# server it connects to against the URI's (the name changes at each start
# of the server: it hashes the host and the pid), and when they differ
# prints the name it got ("received unexpected process identifier
# [[FAMILY,LOCAL],VPID]"). A one-rank mpirun given a name no server has
# (jobid 1: no mpirun or server is named so) reads it from there; the URI
# is that name, the jobid FAMILY x 65536 + LOCAL, and the address.
# Only the out-of-band settings of MPIRUN_ARGS go on to it. probe_name
# ADDR:PORT prints the name; probe_uri HOST:PORT the URI.
probe_name() {
    local out name oob=() words i
    read -r -a words <<< "${MPIRUN_ARGS:-}"
    for ((i = 0; i < ${#words[@]}; i++)); do
        if [[ (${words[i]} == --mca || ${words[i]} == -mca) && ${words[i + 1]:-} == oob_* ]]; then
            oob+=(--mca "${words[i + 1]}" "${words[i + 2]:-}")
        fi
    done
    out=$(timeout 30 mpirun -q --mca plm isolated --mca ras ^slurm "${oob[@]}" -np 1 \
        --ompi-server "1.0;tcp://$1" true 2>&1 < /dev/null)
    name=$(echo "$out" | sed -n 's/.*received unexpected process identifier \[\[\([0-9]*\),\([0-9]*\)\],\([0-9]*\)\].*/\1 \2 \3/p' | head -1)
    if [ -z "$name" ]; then
        probe_said=$(echo "$out" | grep . | head -1)
        return 1
    fi
    # shellcheck disable=SC2086 # FAMILY LOCAL VPID
    set -- $name
    echo "$(($1 * 65536 + $2)).$3"
}

probe_uri() {
    local port=${1##*:} ip name
    ip=$(host_ip "${1%:*}") || { echo "federated.sh: ompi-server $1: no IPv4 address for ${1%:*}" >&2; return 2; }
    reachable "tcp://$ip:$port" > /dev/null ||
        { echo "federated.sh: ompi-server at $1 (tcp://$ip:$port) does not answer: is it running?" >&2; return 2; }
    name=$(probe_name "$ip:$port") || {
        echo "federated.sh: ompi-server at $1 answers, but did not tell its name (Open MPI said: ${probe_said:-nothing}); give its URI instead" >&2
        return 2
    }
    echo "$name;tcp://$ip:$port"
}

# HOST's IPv4 address (Open MPI's URI holds addresses, not names)
host_ip() {
    if [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then echo "$1"; return; fi
    getent ahostsv4 "$1" 2>/dev/null | awk 'NR == 1 { print $1; found = 1 } END { exit !found }'
}

# The URI of SERVER (a file's first line, the URI, or HOST:PORT asked);
# one line naming what is wrong and exit 2 when there is none, the server
# does not answer, or (file, URI) the server there is another start of it
# than the URI names (mpirun would end at once: "unexpected process
# identifier"): a server started again takes a new name
server_uri() {
    local uri at name
    case $(server_kind "$1") in
    hostport) probe_uri "$1"; return ;;
    uri) uri=$1 ;;
    file)
        [ -s "$1" ] || { echo "federated.sh: ompi-server URI file $1 is missing or empty: start the server first (federated.sh server DIR)" >&2; return 2; }
        uri=$(head -1 "$1") ;;
    esac
    at=$(reachable "$uri") || { echo "federated.sh: ompi-server at $(echo "$uri" | cut -d';' -f2) (from $1) does not answer: is it running?" >&2; return 2; }
    if name=$(probe_name "$at") && [ "$name" != "${uri%%;*}" ]; then
        echo "federated.sh: the ompi-server at $at is not the one $1 names (its name is $name, not ${uri%%;*}: started again since?): give its new URI, or HOST:PORT" >&2
        return 2
    fi
    echo "$uri"
}

# The server that URI names is still there: it answers, under that name
server_same() {
    local at name
    at=$(reachable "$1") || return 1
    name=$(probe_name "$at") || return 0 # no name learned: nothing to say
    [ "$name" = "${1%%;*}" ]
}

# SERVER answers (a TCP connection to its address; HOST:PORT is not asked its name)
server_answers() {
    case $(server_kind "$1") in
    hostport) reachable "tcp://$(host_ip "${1%:*}"):${1##*:}" > /dev/null ;;
    uri) reachable "$1" > /dev/null ;;
    file) [ -s "$1" ] && reachable "$(head -1 "$1")" > /dev/null ;;
    esac
}

# Wait up to ISTHMUS_SERVER_WAIT s (300) for SERVER to answer, or until a
# signal (the job's stop); the caller then says what is wrong
wait_server() {
    local start=$SECONDS stop=
    trap 'stop=1' TERM INT HUP USR1 USR2
    while [ -z "$stop" ] && [ $((SECONDS - start)) -lt "${ISTHMUS_SERVER_WAIT:-300}" ] && ! server_answers "$1"; do
        sleep 1
    done
    trap - TERM INT HUP USR1 USR2
    [ -z "$stop" ] || die "stopped by a signal while waiting for ompi-server $1 to answer"
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
        [ -s "$dir/ompi-server.uri" ] && reachable "$(cat "$dir/ompi-server.uri")" > /dev/null && return 0
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
    [ $# -ge 4 ] || die "usage: federated.sh site SERVER SITE NP CONFIG [train args...]"
    local server=$1 site=$2 np=$3 config=$4 uri
    shift 4
    ports_split
    # exit 3: the live run dropped this site (it stalled past the other
    # site's deadline) or its join broke inside Open MPI; started again, it
    # (re)joins (ISTHMUS_REJOINS times)
    local tries=0 rc child extra=() pinned=()
    [ -n "$port_server" ] && pinned=(--mca oob_tcp_dynamic_ipv4_ports "$port_oob" --mca btl_tcp_port_min_v4 "$port_btl_min"
        --mca btl_tcp_port_range_v4 "$port_btl_count")
    while :; do
        # at every start: a server started again since has another URI; a
        # start again waits for it (ISTHMUS_SERVER_WAIT s, 300), as the job
        # scripts do before the first
        [ $tries -gt 0 ] && wait_server "$server"
        uri=$(server_uri "$server") || exit 2
        # the address isthmus watches, to leave a server that went away alone (src/nameserver.h)
        ISTHMUS_NAME_SERVER=$(reachable "$uri") || ISTHMUS_NAME_SERVER=
        export ISTHMUS_NAME_SERVER
        # shellcheck disable=SC2086
        ISTHMUS_START=$((tries + 1)) mpirun ${MPIRUN_ARGS:-} "${pinned[@]}" -x ISTHMUS_START -x ISTHMUS_NAME_SERVER -np "$np" --ompi-server "$uri" "$isthmus" train "$config" \
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
        # Open MPI's mpirun ends with exit 1 when the server it was given
        # was replaced (it tells the server of the job's end), whatever the
        # ranks' own status: say so, the log's isthmus lines tell the rest
        if [ $rc -ne 0 ] && [ $rc -ne 3 ] && ! server_same "$uri"; then
            echo "federated.sh: site $site: mpirun exit $rc, and the ompi-server it was given (${uri%%;*}) is gone or was started again: Open MPI ends so then, also after isthmus ended well (see isthmus's lines above)" >&2
        fi
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
check) shift; [ $# -eq 1 ] && server_answers "$1" ;;
uri) shift; [ $# -eq 1 ] || die "usage: federated.sh uri SERVER"; server_uri "$1" ;;
run) shift; cmd_run "$@" ;;
*) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
