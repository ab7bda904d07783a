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
# jobs' load, one thread's CPU time much less, but still by 10%): ROUNDS=N
# (default 1) runs every variant N times in turn and reports the median of each
# round's ratio to that round's AdamW, and every round's ratio. LAUNCH (e.g.
# "mpirun -q -np 4", with a layout's --set flags) runs each bench on several
# ranks: then the wall time is the figure (ranks share the cores).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=share/configs/small.ini
STEPS=40
case ${1-} in --* | '') ;; *) CONFIG=$1; shift ;; esac
case ${1-} in --* | '') ;; *) STEPS=$1; shift ;; esac
WARMUP=${WARMUP:-41}
ROUNDS=${ROUNDS:-1}
case $ROUNDS in '' | 0 | *[!0-9]*) echo "bench_optim.sh: ROUNDS '$ROUNDS': expected a positive integer" >&2; exit 2 ;; esac
LAUNCH=${LAUNCH:-}
ISTHMUS=${ISTHMUS:-./isthmus}
VARIANTS=${VARIANTS:-"adamw shampoo muon"}

. scripts/optim_variant.sh # optim_flags: Shampoo's variants (shampoo-b64, shampoo-e40)

declare -A wall cpu ratio wratio
for round in $(seq "$ROUNDS"); do
    for v in $VARIANTS; do
        flags=$(optim_flags "$v") || exit 2
        # shellcheck disable=SC2086
        line=$($LAUNCH "$ISTHMUS" bench "$CONFIG" --threads 1 --warmup "$WARMUP" --steps "$STEPS" \
            --set train.optimizer="${v%%-*}" $flags "$@" | awk '$1 == 1')
        [ -n "$line" ] || { echo "bench_optim.sh: $v: no result from isthmus bench" >&2; exit 1; }
        echo "round $round $v: $line"
        wall[$v]="${wall[$v]-} $(echo "$line" | awk '{ print $2 }')"
        cpu[$v]="${cpu[$v]-} $(echo "$line" | awk '{ print $3 }')"
    done
    # each round's ratio to that round's AdamW: the load of the moment divides out
    c0=$(echo "${cpu[adamw]-}" | awk '{ print $NF }')
    w0=$(echo "${wall[adamw]-}" | awk '{ print $NF }')
    for v in $VARIANTS; do
        ratio[$v]="${ratio[$v]-} $(echo "${cpu[$v]}" | awk -v c0="${c0:-0}" '{ if (c0 > 0) printf "%.4f", $NF / c0 }')"
        wratio[$v]="${wratio[$v]-} $(echo "${wall[$v]}" | awk -v w0="${w0:-0}" '{ if (w0 > 0) printf "%.4f", $NF / w0 }')"
    done
done
median() { echo "$*" | tr ' ' '\n' | grep . | sort -g | awk '{ x[NR] = $1 } END { if (NR) print (NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2) }'; }
x() { [ -n "$1" ] && printf '%.2fx' "$1" || echo -; }
echo
echo "| optimiser | ms/step | vs AdamW | CPU ms/step | vs AdamW | wall vs AdamW, each round | CPU vs AdamW, each round |"
echo "|---|---|---|---|---|---|---|"
for v in $VARIANTS; do
    echo "| $v | $(median "${wall[$v]}") | $(x "$(median "${wratio[$v]}")") | $(median "${cpu[$v]}") |" \
        "$(x "$(median "${ratio[$v]}")") | ${wratio[$v]# } | ${ratio[$v]# } |"
done
echo "(medians of $ROUNDS round(s); each ratio is against the same round's AdamW)"
