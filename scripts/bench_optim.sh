#!/bin/bash
# bench_optim.sh — the step time of each inner optimiser against AdamW's, in one
# run (docs/benchmarks.md, "Optimisers"): one rank holding the whole learner
# (all of its matrices' Shampoo blocks and roots), train.threads 1, the same
# tokens per step as a learner of the horizon runs (small.ini: 8 x 256).
#   scripts/bench_optim.sh [CONFIG] [STEPS] [--set ...]    (needs a built ./isthmus)
# Each optimiser is timed over STEPS (default 20) after WARMUP (default 21)
# untimed steps, so that Shampoo's timed window has its steady share of roots
# (every 20 updates: one in 20 steps; with shampoo-e40, use STEPS 40).
# VARIANTS (default "adamw shampoo muon") may add shampoo-b64, shampoo-e40.
# Prints each bench line, then ms/step and CPU ms/step against AdamW's; the CPU
# time is the figure to read on a shared machine (wall time moves with other
# jobs' load, CPU time much less).
set -eu
cd "$(dirname "$0")/.."
CONFIG=${1:-share/configs/small.ini}
STEPS=${2:-20}
shift $(($# < 2 ? $# : 2))
WARMUP=${WARMUP:-21}
ISTHMUS=${ISTHMUS:-./isthmus}
VARIANTS=${VARIANTS:-"adamw shampoo muon"}
declare -A wall cpu
for v in $VARIANTS; do
    flags="--set train.optimizer=${v%%-*}"
    case $v in
    *-b64*) flags="$flags --set train.precond_block=64" ;;
    esac
    case $v in
    *-e40*) flags="$flags --set train.precond_every=40" ;;
    esac
    # shellcheck disable=SC2086
    line=$("$ISTHMUS" bench "$CONFIG" --threads 1 --warmup "$WARMUP" --steps "$STEPS" $flags "$@" | awk '$1 == 1')
    echo "$v: $line"
    wall[$v]=$(echo "$line" | awk '{ print $2 }')
    cpu[$v]=$(echo "$line" | awk '{ print $3 }')
done
echo
echo "| optimiser | ms/step | vs AdamW | CPU ms/step | vs AdamW |"
echo "|---|---|---|---|---|"
for v in $VARIANTS; do
    awk -v v="$v" -v w="${wall[$v]}" -v c="${cpu[$v]}" -v w0="${wall[adamw]:-0}" -v c0="${cpu[adamw]:-0}" \
        'BEGIN { printf "| %s | %.1f | %s | %.1f | %s |\n", v, w, (w0 > 0 ? sprintf("%.2fx", w / w0) : "-"), c,
                 (c0 > 0 ? sprintf("%.2fx", c / c0) : "-") }'
done
