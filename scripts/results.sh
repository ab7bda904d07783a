#!/bin/bash
# results.sh — the cross-site comparisons of docs/results/ (choosing-a-mode.md,
# learning-rate.md, butterfly-mixing.md) on small.ini, equal
# steps and tokens for every mode (16 sequences of 256 bytes per step in all);
# prints a markdown table of final bpb and inter-site bytes per suite.
#   scripts/results.sh [OUT_DIR] [STEPS] [SUITE...]     (needs a built ./isthmus)
#   RUNS="name ..." limits the runs made to those names (tables show every run present)
# Suites (default: all):
#   learners4   two sites x 2 learners of 1 rank (4 ranks): sync, DiLoCo, Streaming, codecs
#   learners2   two sites x 1 learner of 2 ranks (experts sharded 2-way): sync (two data
#               orders), DiLoCo and Streaming with fp4 at H=64 (>= 400x fewer bytes), with
#               the published outer settings and with plain averaging, and with the inner
#               lr scaled by sqrt(2) (Adam's square-root rule for the half batch), 1/sqrt(2) and 1/2
#   learners8   two sites x 4 learners of 1 rank (8 ranks): sync, DiLoCo, butterfly with
#               and without outer Nesterov, butterfly codecs, mixing every 2 steps, a
#               lower inner lr
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-runs/results}
STEPS=${2:-400}
shift $(($# < 2 ? $# : 2))
SUITES=${*:-learners4 learners2 learners8}
ISTHMUS=${ISTHMUS:-./isthmus}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_mpi_yield_when_idle=1
COMMON="--set train.steps=$STEPS --set train.warmup=20 --set train.threads=1
 --set train.log_every=50 --set train.eval_every=0 --set data.eval_bytes=262144"

run() { # run SUITE NAME NP [--set ...]
    local dir=$OUT/$1/$2 name=$2 np=$3
    shift 3
    [ -f "$dir/model.h5" ] && return 0
    [ -n "${RUNS:-}" ] && case " $RUNS " in *" $name "*) ;; *) return 0 ;; esac
    mkdir -p "$dir"
    echo "== $dir" >&2
    # shellcheck disable=SC2086
    mpirun -q -np "$np" "$ISTHMUS" train share/configs/small.ini --set train.out_dir="$dir" $COMMON "$@" \
        > "$dir/log" 2>&1
}

. scripts/lib.sh # last_bpb FILE SET
field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$1"; }

table() { # table SUITE — every run of the suite against its own sync run
    local suite=$OUT/$1 sp st
    sp=$(last_bpb "$suite/sync/metrics.jsonl" prose)
    st=$(last_bpb "$suite/sync/metrics.jsonl" tech)
    echo
    echo "### $1"
    echo
    echo "| run | prose bpb | vs sync | tech bpb | vs sync | inter-site bytes | fewer bytes than sync | most learners one exchange waited on |"
    echo "|---|---|---|---|---|---|---|---|"
    for d in "$suite"/*/; do
        local name m p t s bytes red peers
        name=$(basename "$d")
        m="$d/metrics.jsonl"
        [ -f "$m" ] || continue
        p=$(last_bpb "$m" prose)
        t=$(last_bpb "$m" tech)
        s=$(grep '"summary":"traffic"' "$m" | tail -1)
        bytes=$(field "$s" inter_site_bytes)
        red=$(field "$s" reduction)
        peers=$(field "$s" max_peer_learners)
        awk -v n="$name" -v p="$p" -v t="$t" -v sp="$sp" -v st="$st" -v b="$bytes" -v r="$red" -v w="${peers:--}" \
            'BEGIN { printf "| %s | %.4f | %+.2f%% | %.4f | %+.2f%% | %.3g | %.0fx | %s |\n", n, p, 100*(p-sp)/sp, t, 100*(t-st)/st, b, r, w }'
    done
}

for suite in $SUITES; do
    case $suite in
    learners4)
        L="--set train.micro_batch=4 --set site.a.ranks=2 --set site.a.learner_ranks=1
           --set site.b.ranks=2 --set site.b.learner_ranks=1"
        run $suite sync 4 $L
        run $suite diloco_h50 4 $L --set outer.mode=diloco --set outer.inner_steps=50
        run $suite diloco_h100 4 $L --set outer.mode=diloco --set outer.inner_steps=100
        run $suite diloco_h50_fp4 4 $L --set outer.mode=diloco --set outer.inner_steps=50 --set outer.codec=fp4
        run $suite diloco_h100_fp4 4 $L --set outer.mode=diloco --set outer.inner_steps=100 --set outer.codec=fp4
        for codec in none bf16 int8 fp4; do
            run $suite "streaming_h50_$codec" 4 $L --set outer.mode=streaming --set outer.inner_steps=50 \
                --set outer.codec=$codec
        done
        ;;
    learners2)
        L="--set train.micro_batch=4 --set site.a.ranks=2 --set site.a.learner_ranks=2
           --set site.b.ranks=2 --set site.b.learner_ranks=2"
        run $suite sync 4 $L
        run $suite diloco_h64_fp4 4 $L --set outer.mode=diloco --set outer.inner_steps=64 --set outer.codec=fp4
        run $suite streaming_h64_fp4 4 $L --set outer.mode=streaming --set outer.inner_steps=64 \
            --set outer.codec=fp4
        # plain averaging of the learners (outer lr 1, no momentum: local SGD / FedAvg)
        run $suite diloco_h64_fp4_avg 4 $L --set outer.mode=diloco --set outer.inner_steps=64 --set outer.codec=fp4 \
            --set outer.lr=1 --set outer.momentum=0
        # the noise floor: sync again with another data order (train.seed)
        run $suite sync_seed43 4 $L --set train.seed=43
        # the best setting again on seed 43's data order, and Streaming DiLoCo with plain averaging
        run $suite diloco_h64_fp4_avg_seed43 4 $L --set outer.mode=diloco --set outer.inner_steps=64 \
            --set outer.codec=fp4 --set outer.lr=1 --set outer.momentum=0 --set train.seed=43
        run $suite streaming_h64_fp4_avg 4 $L --set outer.mode=streaming --set outer.inner_steps=64 \
            --set outer.codec=fp4 --set outer.lr=1 --set outer.momentum=0
        # averaging with a constant extrapolation (outer lr 1.3, no momentum)
        run $suite diloco_h64_fp4_lr1.3 4 $L --set outer.mode=diloco --set outer.inner_steps=64 --set outer.codec=fp4 \
            --set outer.lr=1.3 --set outer.momentum=0
        # inner lr x sqrt(2): Adam's square-root rule for the learners' half batch; sync with it too
        run $suite diloco_h64_fp4_avg_lr2.8e-3 4 $L --set outer.mode=diloco --set outer.inner_steps=64 \
            --set outer.codec=fp4 --set outer.lr=1 --set outer.momentum=0 --set train.lr=0.0028 --set train.min_lr=0.00028
        run $suite sync_lr2.8e-3 4 $L --set train.lr=0.0028 --set train.min_lr=0.00028
        # and divided by sqrt(2): less drift between outer steps
        run $suite diloco_h64_fp4_avg_lr1.4e-3 4 $L --set outer.mode=diloco --set outer.inner_steps=64 \
            --set outer.codec=fp4 --set outer.lr=1 --set outer.momentum=0 --set train.lr=0.0014 --set train.min_lr=0.00014
        run $suite sync_lr1.4e-3 4 $L --set train.lr=0.0014 --set train.min_lr=0.00014
        run $suite diloco_h64_fp4_avg_lr1e-3 4 $L --set outer.mode=diloco --set outer.inner_steps=64 \
            --set outer.codec=fp4 --set outer.lr=1 --set outer.momentum=0 --set train.lr=0.001 --set train.min_lr=0.0001
        run $suite sync_lr1e-3 4 $L --set train.lr=0.001 --set train.min_lr=0.0001
        ;;
    learners8)
        L="--set train.micro_batch=2 --set site.a.ranks=4 --set site.a.learner_ranks=1
           --set site.b.ranks=4 --set site.b.learner_ranks=1"
        run $suite sync 8 $L
        run $suite butterfly_r10 8 $L --set outer.mode=butterfly --set outer.inner_steps=10
        run $suite diloco_h50_avg 8 $L --set outer.mode=diloco --set outer.inner_steps=50 --set outer.lr=1 \
            --set outer.momentum=0
        run $suite butterfly_r10_nesterov 8 $L --set outer.mode=butterfly --set outer.inner_steps=10 \
            --set outer.lr=0.7 --set outer.momentum=0.9
        run $suite butterfly_r10_fp4 8 $L --set outer.mode=butterfly --set outer.inner_steps=10 \
            --set outer.codec=fp4
        run $suite butterfly_r10_int8 8 $L --set outer.mode=butterfly --set outer.inner_steps=10 \
            --set outer.codec=int8
        # mixing every 2 steps: how close pairwise mixing alone gets
        run $suite butterfly_r2 8 $L --set outer.mode=butterfly --set outer.inner_steps=2
        # a lower inner lr (less drift between mixes; DiLoCo gains from it in learners2)
        run $suite butterfly_r10_lr1.4e-3 8 $L --set outer.mode=butterfly --set outer.inner_steps=10 \
            --set train.lr=0.0014 --set train.min_lr=0.00014
        run $suite sync_lr1.4e-3 8 $L --set train.lr=0.0014 --set train.min_lr=0.00014
        ;;
    *)
        echo "results.sh: unknown suite '$suite' (learners4, learners2, learners8)" >&2
        exit 2
        ;;
    esac
    table "$suite"
done
