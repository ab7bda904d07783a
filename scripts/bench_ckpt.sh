#!/bin/bash
# bench_ckpt.sh — checkpoint write rate against the disk's sequential write
# rate, measured in the same run, in the same directory, alternately:
#   scripts/bench_ckpt.sh [CONFIG] [RANKS] [REPEATS]    (needs a built ./isthmus)
#   SETS="--set key=value ..." scripts/bench_ckpt.sh ...  (overrides for the config)
# Each repeat trains CONFIG for one step on RANKS ranks (one learner, its
# checkpoint written by every rank for its share) and times the checkpoint
# (the log's line: create, write, fsync, rename), then writes a file of the
# same size with `dd bs=1M conv=fdatasync`. Prints both per repeat and the
# medians; the ratio is what docs/benchmarks.md records.
# A config of several sites writes one file per site at the same step, at
# once, to the same disk: the rate compared with dd is then the disk's, as
# isthmus logs it: every site's megabytes over the time from the first
# site's start to the last site's completion (the site's own rate is
# printed too).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-share/configs/small.ini}
RANKS=${2:-2}
REPEATS=${3:-5}
OUT=${OUT:-runs/bench-ckpt}
export OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
ours=() theirs=() ratios=()
dd_rate() { # MB/s of writing $1 MB with dd ... conv=fdatasync
    dd if=/dev/zero of="$OUT/dd" bs=1M count="$(awk -v m="$1" 'BEGIN { printf "%d", m * 1e6 / 1048576 + 1 }')" \
        conv=fdatasync 2>&1 | awk '/copied/ { r = $(NF-1); u = $NF; if (u == "GB/s") r *= 1000; if (u == "kB/s") r /= 1000; print r }'
    rm -f "$OUT/dd"
}
checkpoint() { # one step and its checkpoint's log line
    # shellcheck disable=SC2086
    mpirun -q -np "$RANKS" ./isthmus train "$CONFIG" ${SETS:-} --set train.steps=1 --set train.eval_every=0 \
        --set data.eval_bytes=1024 --set train.threads=1 --set train.out_dir="$OUT/run" | grep '^checkpoint:' ||
        { echo "bench_ckpt.sh: no checkpoint line from isthmus train $CONFIG" >&2; exit 1; }
}
# the checkpoint line -> "MB MB/s OWN_MB/s": every site's file when there
# are several (the part after ';'), else the one file
summarise() {
    local line own
    line=$(cat)
    own=$(echo "$line" | sed 's/.*MB) in [0-9.]* s, \([0-9.]*\) MB\/s.*/\1/')
    case $line in
    *"every site's file"*) echo "$line" | sed "s/.*every site's file: \([0-9.]*\) MB in [0-9.]* s, \([0-9.]*\) MB\/s.*/\1 \2 $own/" ;;
    *) echo "$line" | sed "s/.*(\([0-9.]*\) MB).*/\1 $own $own/" ;;
    esac
}

# a first, uncounted checkpoint gives the size the dd runs write
mb=$(checkpoint | summarise | cut -d' ' -f1)
for i in $(seq "$REPEATS"); do
    # Every timed write goes to space that the write before it has just
    # freed, with nothing else in flight (sync): this VM's disk writes at
    # ~2 GB/s into space freed moments ago but at ~330 MB/s into space not
    # written for a while (measured with dd alone), so a dd into fresh
    # space beside a checkpoint into freed space compares two disks.
    # (A run that keeps K checkpoints writes each into what the pruning of
    # the oldest freed.)
    rm -rf "$OUT/run"
    sync
    before=$(dd_rate "$mb")
    sync
    read -r _ rate own < <(checkpoint | summarise)
    rm -rf "$OUT/run"
    sync
    after=$(dd_rate "$mb")
    dd=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.0f", (a + b) / 2 }')
    ratio=$(awk -v a="$rate" -v b="$dd" 'BEGIN { printf "%.2f", a / b }')
    echo "repeat $i: checkpoint $mb MB at $rate MB/s (the first site alone: $own MB/s); dd $before MB/s before, $after MB/s after; ratio $ratio"
    ours+=("$rate")
    theirs+=("$dd")
    ratios+=("$ratio")
done
rm -rf "$OUT/run" "$OUT/dd"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_ours=$(median "${ours[@]}")
m_dd=$(median "${theirs[@]}")
echo "median: checkpoint $m_ours MB/s, dd $m_dd MB/s, ratio $(median "${ratios[@]}") (median of the per-repeat ratios)"
