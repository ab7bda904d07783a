#!/bin/bash
# results.sh — the cross-site comparison of docs/results.md: small.ini on two
# sites of 2 learners each (4 ranks, one thread each), equal steps and tokens
# for every mode; prints a markdown table of final bpb and inter-site bytes.
#   scripts/results.sh [OUT_DIR] [STEPS]       (needs a built ./isthmus)
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-runs/results}
STEPS=${2:-400}
ISTHMUS=${ISTHMUS:-./isthmus}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_mpi_yield_when_idle=1
COMMON="--set train.steps=$STEPS --set train.micro_batch=4 --set train.warmup=20 --set train.threads=1
 --set train.log_every=50 --set train.eval_every=0 --set data.eval_bytes=262144
 --set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1"
run() { # run NAME [--set ...]
    local name=$1
    shift
    [ -f "$OUT/$name/model.h5" ] && return 0
    mkdir -p "$OUT/$name"
    echo "== $name" >&2
    # shellcheck disable=SC2086
    mpirun -q -np 4 "$ISTHMUS" train share/configs/small.ini --set train.out_dir="$OUT/$name" $COMMON "$@" \
        > "$OUT/$name/log" 2>&1
}
run sync
run diloco_h50 --set outer.mode=diloco --set outer.inner_steps=50
run diloco_h100 --set outer.mode=diloco --set outer.inner_steps=100
run diloco_h50_fp4 --set outer.mode=diloco --set outer.inner_steps=50 --set outer.codec=fp4
run diloco_h100_fp4 --set outer.mode=diloco --set outer.inner_steps=100 --set outer.codec=fp4
for codec in none bf16 int8 fp4; do
    run "streaming_h50_$codec" --set outer.mode=streaming --set outer.inner_steps=50 --set outer.codec=$codec
done

field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$1"; }
sync_prose=$(grep '"eval":"prose"' "$OUT/sync/metrics.jsonl" | tail -1 | sed 's/.*"bpb":\([^,]*\),.*/\1/')
sync_tech=$(grep '"eval":"tech"' "$OUT/sync/metrics.jsonl" | tail -1 | sed 's/.*"bpb":\([^,]*\),.*/\1/')
echo "| run | prose bpb | vs sync | tech bpb | vs sync | inter-site bytes | fewer bytes than sync |"
echo "|---|---|---|---|---|---|---|"
for d in "$OUT"/*/; do
    name=$(basename "$d")
    m="$d/metrics.jsonl"
    [ -f "$m" ] || continue
    p=$(grep '"eval":"prose"' "$m" | tail -1 | sed 's/.*"bpb":\([^,]*\),.*/\1/')
    t=$(grep '"eval":"tech"' "$m" | tail -1 | sed 's/.*"bpb":\([^,]*\),.*/\1/')
    s=$(grep '"summary":"traffic"' "$m" | tail -1)
    bytes=$(field "$s" inter_site_bytes)
    red=$(field "$s" reduction)
    awk -v n="$name" -v p="$p" -v t="$t" -v sp="$sync_prose" -v st="$sync_tech" -v b="$bytes" -v r="$red" \
        'BEGIN { printf "| %s | %.4f | %+.2f%% | %.4f | %+.2f%% | %.3g | %.0fx |\n", n, p, 100*(p-sp)/sp, t, 100*(t-st)/st, b, r }'
done
