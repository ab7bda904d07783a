#!/bin/bash
# site_failures.sh — docs/results/losing-a-site.md: small.ini, streaming
# (H=20, 4 fragments, tau=1, fp4) over two federated sites of one rank each
# (one mpirun per site through ompi-server, scripts/federated.sh), once
# undisturbed and once with site b SIGKILLed after each KILL_STEP and
# started again (--resume auto) RESTART_DELAY seconds after site a logged
# the loss, so that it rejoins the live run.
#   scripts/site_failures.sh [OUT_DIR] [STEPS] [KILL_STEP...]   (a built ./isthmus)
# Defaults: runs/site_failures, 200 steps, kills after steps 50 100 150.
# Prints one markdown row per run (final bpb of both evals, wall time,
# tokens trained) and the failures' detection, rejoin and tokens lost.
# On the 2-core VM each site is pinned to its own core (taskset).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${1:-runs/site_failures}
STEPS=${2:-200}
shift $(($# < 2 ? $# : 2))
KILLS=${*:-50 100 150}
DELAY=${RESTART_DELAY:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_mpi_yield_when_idle=1 MPIRUN_ARGS="-q --bind-to none"
CFG=share/configs/small.ini
SET="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=streaming --set outer.inner_steps=20
 --set outer.fragments=4 --set outer.overlap=1 --set outer.codec=fp4 --set outer.timeout=10
 --set train.steps=$STEPS --set train.threads=1 --set train.log_every=10 --set train.eval_every=0
 --set data.eval_bytes=65536 --set outer.join_timeout=120"
FED=scripts/federated.sh
. scripts/lib.sh # last_bpb, wait_line, pair_start

site() { # site NAME RUN_DIR [args...]: site a on core 0, b on core 1
    local name=$1 dir=$2 core=0
    shift 2
    [ "$name" = b ] && core=1
    # shellcheck disable=SC2086
    taskset -c "$core" "$FED" site "$OUT/server/ompi-server.uri" "$name" 1 "$CFG" $SET \
        --set train.out_dir="$dir" --set outer.run_id="$(basename "$dir")" "$@"
}

wait_for() { # wait_for FILE PATTERN COUNT: wait_line's 10 min, saying so when they pass
    wait_line "$1" "$2" 600 "$3" || { echo "site_failures.sh: no '$2' x$3 in $1 within 10 min" >&2; return 1; }
}

run() { # run NAME KILL_STEP...
    local name=$1 dir=$OUT/$1 i=0 pa pb t0
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    t0=$(date +%s.%N)
    pair_start "$dir/a.log" "$dir/b0.log" site "$dir"
    for k in "$@"; do
        wait_for "$dir/a.log" "^step  *$k/" 1
        pkill -KILL -f "isthmus train .* --site b .*outer.run_id=$name"
        wait $pb
        i=$((i + 1))
        wait_for "$dir/a.log" '^site b lost at step' $i
        sleep "$DELAY"
        site b "$dir" --resume auto > "$dir/b$i.log" 2>&1 &
        pb=$!
        wait_for "$dir/a.log" '^site b rejoined at step' $i
    done
    wait $pa
    echo "a exit $?" >> "$dir/a.log"
    wait $pb
    echo "b exit $?" >> "$dir/b$i.log"
    awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.0f\n", t1 - t0}' > "$dir/wall_s"
}

"$FED" server "$OUT/server" || exit 2
trap '"$FED" stop "$OUT/server"' EXIT
# shellcheck disable=SC2086
run failures $KILLS
run undisturbed
tokens=$(awk -v s="$STEPS" 'BEGIN {print 2 * s * 8 * 256}')
echo "| run | prose bpb | tech bpb | wall s | tokens trained |"
echo "|---|---|---|---|---|"
for r in undisturbed failures; do
    lost=$(sed -n 's/^{"site_rejoined".*"tokens_lost_total":\([0-9]*\),.*/\1/p' "$OUT/$r/metrics.jsonl" | tail -1)
    echo "| $r | $(last_bpb "$OUT/$r/metrics.jsonl" prose) | $(last_bpb "$OUT/$r/metrics.jsonl" tech) | $(cat "$OUT/$r/wall_s") | $((tokens - ${lost:-0})) of $tokens |"
done
echo
grep -h '^{"site_lost"\|^{"site_rejoined"' "$OUT/failures/metrics.jsonl"
grep -h '^rejoined the live run' "$OUT"/failures/b[1-9]*.log
