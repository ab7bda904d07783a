#!/bin/bash
# horizon.sh — the inner optimiser and the training horizon (docs/results/:
# optimisers.md, horizon.md, butterfly-mixing.md, sparse-payloads.md,
# shampoo-step-time.md): small.ini, 16 sequences of 256 bytes per
# step in every run, two sites, AdamW against the matrix optimisers.
#   scripts/horizon.sh OUT_DIR PHASE...      (needs a built ./isthmus; each run is
#                                             skipped when its model.h5 exists)
# Phases:
#   sweep     400 steps: sync with adamw, shampoo and muon, diloco with each,
#             then butterfly-sweep, at the inner learning rates listed below
#   butterfly-sweep
#             400 steps of butterfly with adamw and shampoo at lr 1e-3 and 1.4e-3
#   400 | 1600 | 6400
#             sync, diloco, butterfly with adamw and shampoo at the lr the sweep
#             chose for each (LR_<mode>_<optimizer>, below)
#   step-time Shampoo with 64 x 64 blocks, and with roots every 40 updates, in sync
#   seeds     the longest horizon again with another data order (train.seed = 43)
#   MODE:OPTIMIZER:STEPS[:SEED]
#             one run at the chosen lr (e.g. sync:shampoo:400; seed 42 unless given);
#             MODE is sync, diloco, butterfly or a variant (topk topkh32 topkh16 topkh8 topkall topknest topkm5
#             nesterov nesterovh32 snooh32 splitlocal splitdrop bflyfp4 bflymom: below), which takes its base mode's
#             inner lr
#   table     the markdown tables of every run present
#   gap       the gap to sync against tokens: for each run at its mode's chosen lr,
#             bpb against sync with the same optimiser, steps and seed, and against
#             sync with AdamW (a markdown table); with gnuplot, also OUT/gap.png.
#             Runs OUT does not hold are taken from docs/data/horizon-recorded.tsv
#             (RECORDED=FILE another; RECORDED=/dev/null none)
# MODEL=d384 trains the larger model instead (6 layers, D=384, 6 heads,
# F=768: 3.3x the active matrix work per token) with everything else the same;
# an OUT_DIR holds one model only (OUT_DIR/model, written by its first run,
# records which; a mismatch is refused; without MODEL, table and gap take it).
# Runs are resumable: each writes a checkpoint every 400 steps (the newest one
# kept; removed when the run is done) and starts with --resume auto, so a run
# that was stopped (or whose session ended) goes on from its newest checkpoint
# when the same phase is given again (bit-identical). USR1, INT or TERM to this
# script stop the run at hand the same way (checkpoint) and end the script (exit 3).
# Layouts (as scripts/results.sh): sync and diloco on two sites x 1 learner of 2
# ranks (diloco: H=64, fp4, plain averaging: outer lr 1, no momentum), butterfly
# on two sites x 4 learners of 1 rank (mixing every 10 steps).
set -eu
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/horizon.sh OUT_DIR PHASE...}
shift
ISTHMUS=${ISTHMUS:-./isthmus}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_mpi_yield_when_idle=1
L2="--set train.micro_batch=4 --set site.a.ranks=2 --set site.a.learner_ranks=2 --set site.b.ranks=2
 --set site.b.learner_ranks=2"
L8="--set train.micro_batch=2 --set site.a.ranks=4 --set site.a.learner_ranks=1 --set site.b.ranks=4
 --set site.b.learner_ranks=1"
# shellcheck disable=SC2034 # read through eval (run, best)
{
    MODE_sync="$L2"
    MODE_diloco="$L2 --set outer.mode=diloco --set outer.inner_steps=64 --set outer.codec=fp4 --set outer.lr=1
     --set outer.momentum=0"
    MODE_butterfly="$L8 --set outer.mode=butterfly --set outer.inner_steps=10"
    NP_sync=4 NP_diloco=4 NP_butterfly=8
    # DiLoCo with SparseLoCo's payloads (outer.codec = topk: 64 of 4,096 values
    # at 2 bits, residual decay 0.95, each value averaged over its senders, no
    # outer momentum, outer lr 1) at H = 64 and 32, 32 of 4,096 at H = 16 and 16 at H = 8; at H = 16 also with the
    # averaging over all learners, and with outer Nesterov momentum (0.9, lr 0.7) on top; and DiLoCo
    # fp4 with outer Nesterov momentum (SNOO's outer optimiser) at H = 64 and 32
    TOPK="--set outer.mode=diloco --set outer.codec=topk --set outer.ef_decay=0.95 --set outer.topk_mean=senders --set outer.lr=1
     --set outer.momentum=0"
    MODE_topk="$L2 $TOPK --set outer.inner_steps=64"
    MODE_topkh32="$L2 $TOPK --set outer.inner_steps=32"
    MODE_topkh16="$L2 $TOPK --set outer.inner_steps=16 --set outer.topk_k=32" # H=32's bytes
    MODE_topkh8="$L2 $TOPK --set outer.inner_steps=8 --set outer.topk_k=16" # H=16's bytes again
    MODE_topkall="$MODE_topkh16 --set outer.topk_mean=all"
    MODE_topknest="$MODE_topkh16 --set outer.lr=0.7 --set outer.momentum=0.9"
    # and with a gentle outer Nesterov momentum (0.5, lr 0.5: the same step as plain averaging
    # once the momentum has built up)
    MODE_topkm5="$MODE_topkh16 --set outer.lr=0.5 --set outer.momentum=0.5"
    MODE_nesterov="$L2 --set outer.mode=diloco --set outer.inner_steps=64 --set outer.codec=fp4 --set outer.lr=0.7
     --set outer.momentum=0.9"
    MODE_nesterovh32="$L2 --set outer.mode=diloco --set outer.inner_steps=32 --set outer.codec=fp4 --set outer.lr=0.7
     --set outer.momentum=0.9"
    # and with the outer lr scaled down to the momentum (0.15 with 0.9: a steady step 1.5x plain
    # averaging's where 0.7 takes 7x; the overshoot the runs above suggest)
    MODE_snooh32="$L2 --set outer.mode=diloco --set outer.inner_steps=32 --set outer.codec=fp4 --set outer.lr=0.15
     --set outer.momentum=0.9"
    NP_topk=4 NP_topkh32=4 NP_topkh16=4 NP_topkh8=4 NP_topkall=4 NP_topknest=4 NP_topkm5=4 NP_nesterov=4 NP_nesterovh32=4
    NP_snooh32=4
    # butterfly with fp4 payloads and rounds every 20 steps (8x smaller payloads, 2x fewer
    # rounds than butterfly's 10), alone and with per-learner outer Nesterov momentum
    MODE_bflyfp4="$L8 --set outer.mode=butterfly --set outer.inner_steps=20 --set outer.codec=fp4"
    MODE_bflymom="$MODE_bflyfp4 --set outer.lr=1 --set outer.momentum=0.5"
    NP_bflyfp4=8 NP_bflymom=8
    # DiLoCo with the experts split across the two sites (issue 56): each site trains its
    # four experts, only the dense part crosses; the router over the site's experts (local)
    # or the full router with the other site's copies dropped (drop). The bpb the tables
    # read is the last evaluation's: the whole model's, assembled into model.h5
    # (no joint router phase: the recorded runs had none; isthmus tune-router measures it apart)
    MODE_splitlocal="$MODE_diloco --set outer.experts=split --set outer.expert_routing=local --set outer.router_steps=0"
    MODE_splitdrop="$MODE_diloco --set outer.experts=split --set outer.expert_routing=drop --set outer.router_steps=0"
    NP_splitlocal=4 NP_splitdrop=4
}
# every mode but sync; a variant takes its base mode's inner lr (best)
DILOCO_VARIANTS="topk topkh32 topkh16 topkh8 topkall topknest topkm5 nesterov nesterovh32 snooh32 splitlocal splitdrop"
BUTTERFLY_VARIANTS="bflyfp4 bflymom"
OUTER_MODES="diloco $DILOCO_VARIANTS butterfly $BUTTERFLY_VARIANTS"
# the model of OUT's runs: its marker; runs from before the marker are the small model's
HELD=
if [ -f "$OUT/model" ]; then HELD=$(cat "$OUT/model"); elif compgen -G "$OUT/*_lr*_s*/" > /dev/null; then HELD=small; fi
: "${MODEL:=${HELD:-small}}"
case $MODEL in
small) MODEL_FLAGS="" ;;
d384) MODEL_FLAGS="--set model.layers=6 --set model.dim=384 --set model.heads=6 --set model.ffn=768" ;;
*) echo "horizon.sh: MODEL '$MODEL' is not small or d384" >&2; exit 2 ;;
esac
[ -z "$HELD" ] || [ "$HELD" = "$MODEL" ] || { echo "horizon.sh: $OUT holds runs of the $HELD model, not MODEL=$MODEL" >&2; exit 2; }
# the learning rates the 400-step sweep chose (docs/results/learning-rate.md; butterfly from 1e-3 and
# 1.4e-3 only, by the mean of the two evals' bpb)
# shellcheck disable=SC2034 # read through eval (run, best)
{
    LR_sync_adamw=${LR_sync_adamw:-0.001} LR_sync_shampoo=${LR_sync_shampoo:-0.001}
    LR_diloco_adamw=${LR_diloco_adamw:-0.001} LR_diloco_shampoo=${LR_diloco_shampoo:-0.001}
    LR_butterfly_adamw=${LR_butterfly_adamw:-0.001} LR_butterfly_shampoo=${LR_butterfly_shampoo:-0.0014}
}

. scripts/optim_variant.sh # optim_flags: Shampoo's variants (shampoo-b64, shampoo-e40)
. jobs/lib.sh              # isthmus_run: USR1 passed on to the run as USR1, INT and TERM as USR2
. scripts/lib.sh           # last_bpb

run() { # run MODE OPTIMIZER LR STEPS SEED
    local mode=$1 opt=$2 lr=$3 steps=$4 seed=$5 np layout dir min extra
    extra=$(optim_flags "$opt") || exit 2
    np=$(eval echo "\$NP_$mode")
    layout=$(eval echo "\$MODE_$mode")
    dir=$OUT/${mode}_${opt}_lr${lr}_${steps}_s${seed}
    [ -f "$dir/model.h5" ] && return 0
    mkdir -p "$dir"
    [ -f "$OUT/model" ] || { echo "$MODEL" > "$OUT/model.tmp" && mv "$OUT/model.tmp" "$OUT/model"; }
    min=$(awk -v l="$lr" 'BEGIN { print l / 10 }')
    echo "== $dir $(date +%T)" | tee -a "$dir/log" >&2
    # a stop goes on to mpirun as USR1 or USR2, which it forwards to the ranks: checkpoint, exit 0
    local rc=0
    # shellcheck disable=SC2086
    ISTHMUS_REQUEUE=0 isthmus_run mpirun -q -np "$np" "$ISTHMUS" train share/configs/small.ini $MODEL_FLAGS $layout --set train.out_dir="$dir" \
        --set checkpoint.every=400 --set checkpoint.keep=1 --resume auto \
        --set train.steps="$steps" --set train.warmup=20 --set train.threads=1 --set train.log_every=50 \
        --set train.eval_every=0 --set data.eval_bytes=262144 --set train.optimizer="${opt%%-*}" $extra --set train.lr="$lr" \
        --set train.min_lr="$min" --set train.seed="$seed" >> "$dir/log" 2>&1 || rc=$?
    trap - USR1 INT TERM # isthmus_run leaves them ignored
    if [ -f "$dir/model.h5" ]; then
        rm -rf "$dir/checkpoints" # done: the results are model.h5 and metrics.jsonl
    elif [ "$rc" -eq 0 ]; then
        echo "horizon.sh: $dir stopped at its checkpoint; give the phase again to go on" >&2
        exit 3
    else
        echo "horizon.sh: $dir failed (exit $rc)" >&2
    fi
}

butterfly_sweep() { # butterfly's own lr (8 ranks; 15-30 min per run here)
    for lr in 0.001 0.0014; do
        for opt in adamw shampoo; do run butterfly $opt $lr 400 42; done
    done
}

best() { # the inner lr of MODE OPTIMIZER: a variant takes its base mode's
    local v base=diloco
    case " $BUTTERFLY_VARIANTS " in *" $1 "*) base=butterfly ;; esac
    v=$(eval echo "\${LR_$1_$2:-}")
    [ -n "$v" ] || v=$(eval echo "\${LR_${base}_$2:-}")
    echo "$v"
}

# the bpb of runs reported in docs/results/ whose directories this machine does not hold
RECORDED=${RECORDED:-docs/data/horizon-recorded.tsv}

bpb_of() { # bpb_of RUN_DIR SET: the last evaluation's bpb; else RECORDED's; empty when neither
    local v
    v=$(last_bpb "$1/metrics.jsonl" "$2" 2> /dev/null)
    if [ -z "$v" ] && [ ! -f "$1/metrics.jsonl" ] && [ -f "$RECORDED" ]; then
        v=$(awk -v m="$MODEL" -v n="$(basename "$1")" -v c="$([ "$2" = prose ] && echo 3 || echo 4)" \
            '!/^#/ && $1 == m && $2 == n { print $c }' "$RECORDED")
    fi
    echo "$v"
}

run_names() { # the runs of OUT's model: OUT's directories and RECORDED's lines, once each
    {
        for d in "$OUT"/*_lr*_*_s*/; do [ -d "$d" ] && basename "$d"; done
        [ -f "$RECORDED" ] && awk -v m="$MODEL" '!/^#/ && $1 == m { print $2 }' "$RECORDED"
    } | sort -u
}

table() {
    echo "| run | steps | prose bpb | tech bpb | inter-site bytes | ms/step (training wall / steps) | compute utilisation |"
    echo "|---|---|---|---|---|---|---|"
    for d in "$OUT"/*/; do
        local m=$d/metrics.jsonl p t b s w n f
        [ -f "$m" ] || continue
        p=$(bpb_of "$d" prose) t=$(bpb_of "$d" tech)
        b=$(grep '"summary":"traffic"' "$m" | tail -1 | sed -n 's/.*"inter_site_bytes":\([0-9]*\).*/\1/p')
        s=$(grep '"summary":"compute"' "$m" | tail -1)
        n=$(echo "$s" | sed -n 's/.*"steps":\([0-9]*\).*/\1/p')
        w=$(echo "$s" | sed -n 's/.*"wall_s":\([0-9.]*\).*/\1/p' | awk -v n="${n:-0}" '{ if (n > 0) printf "%.0f", 1000 * $1 / n }')
        # a resumed run's summaries cover its last part only (from_step; older builds' did not say)
        f=$(echo "$s" | sed -n 's/.*"from_step":\([0-9]*\).*/\1/p')
        if [ "${f:-0}" -gt 0 ]; then n="$n after step $f"; elif grep -q '^resumed from' "$d/log" 2> /dev/null; then n="$n (resumed: bytes and ms/step of the last part)"; fi
        echo "| $(basename "$d") | ${n:-?} | ${p:-?} | ${t:-?} | ${b:-0} | ${w:-?} | $(echo "$s" | sed -n 's/.*"utilisation":\([0-9.]*\).*/\1/p') |"
    done
}

gap() {
    local data=$OUT/gap.dat d name mode opt lr steps seed p t ref sp st ap at
    mkdir -p "$OUT"
    echo "| mode | optimiser | seed | steps | tokens | prose bpb | vs sync | tech bpb | vs sync | vs sync AdamW (prose / tech) |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    : > "$data.tmp"
    : > "$data.rows"
    for name in $(run_names); do
        d=$OUT/$name
        IFS=_ read -r mode opt lr steps seed <<< "$name"
        lr=${lr#lr} seed=${seed#s}
        case " sync $OUTER_MODES " in *" $mode "*) ;; *) continue ;; esac
        case $opt in adamw | shampoo) ;; *) continue ;; esac # variants are step-time rows, muon has no horizon
        [ "$lr" = "$(best "$mode" "$opt")" ] || continue # sweep rows at other lrs
        p=$(bpb_of "$d" prose) t=$(bpb_of "$d" tech)
        [ -n "$p" ] && [ -n "$t" ] || continue # not finished
        ref=$OUT/sync_${opt}_lr$(best sync "$opt")_${steps}_s$seed
        sp=$(bpb_of "$ref" prose) st=$(bpb_of "$ref" tech)
        ref=$OUT/sync_adamw_lr$(best sync adamw)_${steps}_s$seed
        ap=$(bpb_of "$ref" prose) at=$(bpb_of "$ref" tech)
        awk -v m="$mode" -v o="$opt" -v s="$seed" -v n="$steps" -v p="$p" -v t="$t" -v sp="$sp" -v st="$st" \
            -v ap="$ap" -v at="$at" -v dat="$data.tmp" >> "$data.rows" 'function rel(x, y) { return y == "" ? "–" : sprintf("%+.2f%%", 100 * (x / y - 1)) }
        BEGIN {
            tokens = n * 16 * 256
            same = m == "sync" ? "– | " t " | –" : rel(p, sp) " | " t " | " rel(t, st)
            vs = o == "adamw" ? "–" : rel(p, ap) " / " rel(t, at)
            printf "%s %s %s %d | %s | %s | %s | %d | %.2f M | %s | %s | %s |\n", m, o, s, n, m, o, s, n, tokens / 1e6, p, same, vs
            if (m != "sync" && sp != "" && st != "")
                printf "%s-%s-s%s %d %.4f %.4f\n", m, o, s, tokens, 100 * (p / sp - 1), 100 * (t / st - 1) >> dat
        }'
    done
    sort -k1,3 -k4,4n "$data.rows" | cut -d' ' -f5-
    sort -k1,1 -k2,2n "$data.tmp" > "$data" && rm -f "$data.tmp" "$data.rows"
    command -v gnuplot > /dev/null && [ -s "$data" ] || return 0
    local series
    series=$(cut -d' ' -f1 "$data" | uniq | tr '\n' ' ')
    gnuplot <<-PLOT || echo "horizon.sh: gnuplot failed; $data has the numbers" >&2
	set terminal pngcairo size 1100,420 noenhanced font 'sans,10'
	set output '$OUT/gap.png.tmp'
	set multiplot layout 1,2
	set logscale x 2
	set format x '%g'
	set offsets graph 0.08, graph 0.08, 0, 0
	set xzeroaxis lt -1
	set xlabel 'training tokens (millions)'
	set ylabel 'bpb vs sync, same optimiser (%)'
	set grid
	set key top right
	set title 'prose'
	plot for [k in '$series'] sprintf("< grep '^%s ' '$data'", k) using (\$2 / 1e6):3 with linespoints title k
	set title 'tech'
	plot for [k in '$series'] sprintf("< grep '^%s ' '$data'", k) using (\$2 / 1e6):4 with linespoints title k
	unset multiplot
	PLOT
    if [ -s "$OUT/gap.png.tmp" ]; then mv "$OUT/gap.png.tmp" "$OUT/gap.png"; else rm -f "$OUT/gap.png.tmp"; fi
}

for phase in "$@"; do
    case $phase in
    sweep) # in order of what the comparison needs first (each run ~10 min here)
        run sync adamw 0.001 400 42
        run sync shampoo 0.001 400 42
        run sync shampoo 0.002 400 42
        run sync muon 0.001 400 42
        run diloco shampoo 0.001 400 42
        run sync muon 0.002 400 42
        run diloco adamw 0.001 400 42
        run diloco muon 0.001 400 42
        run sync adamw 0.002 400 42
        run sync shampoo 0.004 400 42
        butterfly_sweep
        ;;
    butterfly-sweep) butterfly_sweep ;;
    step-time) # Shampoo's blocks and root period against its step time (sync, 400 steps; the
        # baseline is the sweep's sync_shampoo_lr0.001 run, at the lr the sweep chose)
        run sync shampoo-b64 0.001 400 42
        run sync shampoo-e40 0.001 400 42
        ;;
    400 | 1600 | 6400)
        for mode in sync diloco butterfly; do
            for opt in adamw shampoo; do run $mode $opt "$(best $mode $opt)" "$phase" 42; done
        done
        ;;
    seeds)
        for mode in sync diloco butterfly; do
            for opt in adamw shampoo; do run $mode $opt "$(best $mode $opt)" 6400 43; done
        done
        ;;
    table) table ;;
    gap) gap ;;
    *:*:*)
        IFS=: read -r mode opt steps seed <<< "$phase"
        case " sync $OUTER_MODES " in *" $mode "*) ;; *) echo "horizon.sh: unknown mode '$mode'" >&2; exit 2 ;; esac
        case $steps in '' | *[!0-9]*) echo "horizon.sh: '$phase': steps '$steps' is not a number" >&2; exit 2 ;; esac
        lr=$(best "$mode" "${opt%%-*}")
        [ -n "$lr" ] || { echo "horizon.sh: '$phase': no lr chosen for $mode with ${opt%%-*} (set LR_${mode}_${opt%%-*})" >&2; exit 2; }
        run "$mode" "$opt" "$lr" "$steps" "${seed:-42}"
        ;;
    *) echo "horizon.sh: unknown phase '$phase'" >&2; exit 2 ;;
    esac
done
