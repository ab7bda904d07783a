#!/bin/bash
# bench_optim.sh — the step time of each inner optimiser against AdamW's, in one
# run (docs/benchmarks.md, "Optimisers"): one rank holding the whole learner
# (all of its matrices' Shampoo blocks and roots), train.threads 1, the same
# tokens per step as a learner of the horizon runs (small.ini: 8 x 256).
#   scripts/bench_optim.sh [CONFIG [STEPS]] [--set section.key=value]...
#                                                   (needs a built ./isthmus)
# Each optimiser is timed over STEPS (default 40) after WARMUP (default 41)
# untimed steps: Shampoo's window then has its steady share of roots (every
# 20 updates: two in 40 steps; with shampoo-e40, one) and no step before its
# first roots. VARIANTS (default "adamw shampoo muon") may name Shampoo's
# variants (shampoo-b64, shampoo-e40, ...: scripts/optim_variant.sh).
# Prints each bench line, then ms/step and CPU ms/step against AdamW's; the CPU
# time is the figure to read on a shared machine (wall time moves with other
# jobs' load, one thread's CPU time much less). Run it twice: it still moves.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=share/configs/small.ini
STEPS=40
case ${1-} in --* | '') ;; *) CONFIG=$1; shift ;; esac
case ${1-} in --* | '') ;; *) STEPS=$1; shift ;; esac
WARMUP=${WARMUP:-41}
ISTHMUS=${ISTHMUS:-./isthmus}
VARIANTS=${VARIANTS:-"adamw shampoo muon"}

. scripts/optim_variant.sh # optim_flags: Shampoo's variants (shampoo-b64, shampoo-e40)

declare -A wall cpu
for v in $VARIANTS; do
    flags=$(optim_flags "$v") || exit 2
    # shellcheck disable=SC2086
    line=$("$ISTHMUS" bench "$CONFIG" --threads 1 --warmup "$WARMUP" --steps "$STEPS" \
        --set train.optimizer="${v%%-*}" $flags "$@" | awk '$1 == 1')
    [ -n "$line" ] || { echo "bench_optim.sh: $v: no result from isthmus bench" >&2; exit 1; }
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
