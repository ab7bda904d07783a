#!/bin/bash
# shellcheck disable=SC2154 # ra, rb: set by federated_pair (scripts/lib.sh)
# wan_bench.sh — a two-site federated run across the emulated wide-area
# link (tests/wan/wan.sh), or over loopback for comparison; one rank per
# site, each site pinned to its own core. Root only (network namespaces).
#
#   scripts/wan_bench.sh OUT CONFIG LINK [train args...]
#     LINK: RATE,ONE_WAY_MS (e.g. 8.6mbit,75: 150 ms round trips), or
#           "loopback" (the same launch without the emulated link)
#
# Writes OUT/a.log, OUT/b.log, OUT/run (out_dir: metrics.jsonl of site a,
# site-b/metrics.jsonl of b), OUT/wan_check (the link's measured RTT and
# rate) and prints one line per site: compute utilisation, link wait,
# tokens/s, final bpb. Environment: WAN_MPIRUN_ARGS (extra mpirun options,
# e.g. "--mca btl_tcp_progress_thread 1"), WAN_CORES ("0 1": the cores of
# sites a and b).
set -u
cd "$(dirname "$0")/.." || exit 2
tree=$(pwd)
die() { echo "wan_bench.sh: $*" >&2; exit 2; }
. scripts/lib.sh # last_bpb, federated_pair
[ $# -ge 3 ] || die "usage: scripts/wan_bench.sh OUT CONFIG LINK [train args...]"
out=$1 config=$2 link=$3
shift 3
[ -x ./isthmus ] || die "build isthmus first (scripts/build.sh)"
make -s tests/wan/tundelay tests/wan/wanprobe > /dev/null || die "cannot build tests/wan"
mkdir -p "$out" && out=$(cd "$out" && pwd)
rm -rf "$out/run" "$out/server"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
read -r core_a core_b <<< "${WAN_CORES:-0 1}"
run_id=wan-$$
common=(--set site.a.ranks=1 --set site.b.ranks=1 --set train.threads=1 --set outer.run_id="$run_id"
    --set train.out_dir="$out/run")
wan=$tree/tests/wan/wan.sh
if [ "$link" = loopback ]; then
    in_a=() in_b=()
    export MPIRUN_ARGS="-q --bind-to none --mca btl self,tcp ${WAN_MPIRUN_ARGS:-}"
else
    rate=${link%,*} delay=${link#*,}
    [ "$rate" != "$link" ] || die "LINK '$link': RATE,ONE_WAY_MS or loopback"
    trap '"$wan" down "$out/wan"' EXIT
    "$wan" up "$out/wan" "$rate" "$delay" > /dev/null || exit 2
    "$wan" check "$out/wan" > "$out/wan_check" || echo "wan_bench.sh: the link is off its settings: $(cat "$out/wan_check")" >&2
    in_a=("$wan" exec "$out/wan" a) in_b=("$wan" exec "$out/wan" b)
    export MPIRUN_ARGS="-q --bind-to none --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 ${WAN_MPIRUN_ARGS:-}"
fi
"${in_a[@]}" scripts/federated.sh server "$out/server" || die "ompi-server did not start"
uri=$out/server/ompi-server.uri
site() { # site NAME [train args...]: one site on its core (in its namespace across the emulated link)
    local name=$1 core=$core_a pre=("${in_a[@]}")
    shift
    if [ "$name" = b ]; then
        core=$core_b
        pre=("${in_b[@]}")
    fi
    "${pre[@]}" taskset -c "$core" scripts/federated.sh site "$uri" "$name" 1 "$config" "${common[@]}" "$@"
}
start=$(date +%s.%N)
federated_pair "$out/a.log" "$out/b.log" site "$@"
wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
"${in_a[@]}" scripts/federated.sh stop "$out/server"
[ -f "$out/wan_check" ] && echo "link: $(cat "$out/wan_check")"
for s in a b; do
    m=$out/run/metrics.jsonl
    [ $s = b ] && m=$out/run/site-b/metrics.jsonl
    util=$(sed -n 's/.*"summary":"compute".*"utilisation":\([0-9.]*\).*"link_wait_s":\([0-9.]*\).*/\1 \2/p' "$m" | tail -1)
    tps=$(grep '^{"step"' "$m" | tail -1 | sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/')
    steps=$(grep -c '^{"step"' "$m")
    prose=$(last_bpb "$m" prose)
    tech=$(last_bpb "$m" tech)
    echo "site $s: exit $([ $s = a ] && echo $ra || echo $rb), utilisation ${util% *}, link wait ${util#* } s," \
        "last logged tokens/s $tps ($steps step lines), bpb prose ${prose:-?} tech ${tech:-?}, wall ${wall} s"
done
[ $ra -eq 0 ] && [ $rb -eq 0 ]
