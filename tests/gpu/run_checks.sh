# shellcheck shell=bash disable=SC2154 # (the variables are run.sh's)
# run_checks.sh — the checks of tests/gpu/run.sh, one function per ID of its
# table (sourced by run.sh, which defines row, fits, go, why, verdict, py
# and the run's variables: isthmus, tests, configs, data, work, logs, gpus,
# threads, common, small, S50, PRE, SAN, sanitizer, compute_mode, rerun).
#   section ID      the check: its rows (SKIP without a GPU, the CPU halves run)
#   memcheck_of ID  its GPU commands, short, under compute-sanitizer memcheck
# Every command runs through go (its cap or the budget's end); its log goes
# to $logs, which run.sh packs into gpu-logs.tar.gz.

section() {
    case $1 in
    test_*) gpu_test "$1" ;;
    *) "sec_$1" ;;
    esac
}

# --- the GPU tests: kernels, layers, optimisers, codec, backend ----------------
gpu_test() {
    local t=$1 log=$logs/$1.log ok bad first
    if [ -z "$tests" ] || [ ! -x "$tests/$t" ]; then
        row "$t" "$t" SKIP "not built (no bundle, the tree is configured without --with-cuda)"
        return 0
    fi
    fits 15 "$t" "$t" || return 0
    if [ "$t" = test_backend_gpu ]; then
        go 180 "$log" mpirun -q -np 1 "$tests/$t"
    else
        go 120 "$log" "$tests/$t"
    fi
    ok=$(grep -c '^ok ' "$log")
    bad=$(grep -c '^not ok ' "$log")
    first=$(grep -m1 '^not ok ' "$log" | cut -c1-70)
    if grep -q '^1..0 # SKIP' "$log" && [ "$gpus" -gt 0 ]; then
        row "$t" "$t" FAIL "skipped although nvidia-smi sees $gpus GPU(s): $(sed -n 's/^1..0 # SKIP //p' "$log")"
    elif grep -q '^1..0 # SKIP' "$log"; then
        row "$t" "$t" SKIP "$(sed -n 's/^1..0 # SKIP //p' "$log")"
    elif [ $rc -eq 0 ] && [ "$bad" -eq 0 ] && [ "$ok" -gt 0 ]; then
        row "$t" "$t" PASS "$ok checks"
    elif grep -q '^Bail out!' "$log"; then # a CUDA call failed (gpu_tap.h): its name, not a wrong value
        row "$t" "$t" FAIL "$ok ok, $bad not ok${first:+ ($first)}, then $(sed -n 's/^Bail out! //p' "$log" | head -1)"
    else
        row "$t" "$t" "$(verdict)" "$ok ok, $bad not ok${first:+ ($first)}; $(why "$log")"
    fi
    # how the experts' products ran: grouped, or one call each where cuBLAS refused
    if [ "$t" = test_kernels_gpu ] && grep -q '^# gemm_batch' "$log"; then
        row "$t" "expert products (cublasGemmGroupedBatchedEx)" INFO \
            "$(sed -n 's/^# gemm_batch (\(.*\)): \(.*\)/\1 \2/p' "$log" | paste -sd ';' -)"
    fi
}

# --- small.ini 50 steps, CPU against GPU ----------------------------------------
compare_losses() { # compare_losses DIR_REF DIR TOL -> "max_rel" on stdout, status 0 if within
    py - "$1" "$2" "$3" << 'EOF'
import json, sys
def steps(d):
    try:
        return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
    except OSError:
        return {}
ref, got, tol = steps(sys.argv[1]), steps(sys.argv[2]), float(sys.argv[3])
common = sorted(set(ref) & set(got))
worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in common), default=float("inf"))
print("%.2e over %d steps" % (worst, len(common)))
sys.exit(0 if common and worst <= tol else 1)
EOF
}
ms_per_step() { # the last 20 steps' mean
    grep -o '"ms_per_step":[0-9.]*' "$1/metrics.jsonl" 2> /dev/null | tail -20 |
        awk -F: '{s += $2; n++} END {if (n) printf "%.1f", s / n}'
}
ran() { [ -f "$1/model.h5" ] && echo ok || echo FAILED; }

sec_small50() {
    local p tol fig st
    fits 60 small50 "small.ini 50 steps fp32/bf16 vs CPU" || return 0
    # shellcheck disable=SC2086
    go 240 "$logs/cpu50.log" "$isthmus" train "$small" $common $S50 --set train.backend=cpu \
        --set train.out_dir="$work/cpu50" || say "CPU small.ini run failed: $(why "$logs/cpu50.log")"
    if [ "$gpus" -eq 0 ]; then
        row small50 "small.ini 50 steps fp32/bf16 vs CPU" SKIP "no GPU; CPU run $(ran "$work/cpu50")"
        row small50 "small.ini 50 steps fp32 recompute=layer vs none" SKIP "no GPU"
        return 0
    fi
    for p in fp32 bf16; do
        tol=1e-4
        [ $p = bf16 ] && tol=1e-2
        # shellcheck disable=SC2086
        if go 120 "$logs/gpu50_$p.log" "$isthmus" train "$small" $common $S50 --set train.backend=cuda \
            --set train.precision=$p --set train.out_dir="$work/gpu50_$p"; then
            fig=$(compare_losses "$work/cpu50" "$work/gpu50_$p" $tol)
            st=$?
            row small50 "small.ini 50 steps $p vs CPU (tol $tol)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
                "max rel loss diff $fig; $(ms_per_step "$work/gpu50_$p") ms/step GPU, $(ms_per_step "$work/cpu50") CPU ($threads threads)"
        else
            row small50 "small.ini 50 steps $p vs CPU" "$(verdict)" "$(why "$logs/gpu50_$p.log")"
        fi
    done
    # train.recompute = layer: each layer's forward again before its
    # backward, the same kernels on the same inputs (no float atomics; the
    # plan's histogram adds integers): the same bits as the fp32 run above
    if [ ! -f "$work/gpu50_fp32/model.h5" ]; then
        row small50 "small.ini 50 steps fp32 recompute=layer vs none" SKIP "no GPU fp32 run to compare with"
        return 0
    fi
    # shellcheck disable=SC2086
    if go 120 "$logs/gpu50_layer.log" "$isthmus" train "$small" $common $S50 --set train.backend=cuda \
        --set train.precision=fp32 --set train.recompute=layer --set train.out_dir="$work/gpu50_layer"; then
        fig=$(compare_losses "$work/gpu50_fp32" "$work/gpu50_layer" 0)
        st=$?
        row small50 "small.ini 50 steps fp32 recompute=layer vs none (same bits)" \
            "$([ $st -eq 0 ] && echo PASS || echo FAIL)" "max rel loss diff $fig"
    else
        row small50 "small.ini 50 steps fp32 recompute=layer" "$(verdict)" "$(why "$logs/gpu50_layer.log")"
    fi
}

# bf16 attention runs on tensor cores only: tiny.ini's head dimension (32)
# is refused before the first step, in one line, exit 2
sec_bf16_refused() {
    local c="bf16 at head dim 32 refused (exit 2)" log=$logs/tiny_bf16.log
    if [ "$gpus" -eq 0 ]; then row bf16_refused "$c" SKIP "no GPU"; return 0; fi
    fits 10 bf16_refused "$c" || return 0
    # shellcheck disable=SC2086
    go 60 "$log" "$isthmus" train "$configs/tiny.ini" $common --set train.backend=cuda --set train.precision=bf16 \
        --set train.steps=1 --set train.out_dir="$work/tiny_bf16"
    if [ $rc -eq 2 ] && grep -q "precision = bf16 runs attention on tensor cores" "$log"; then
        row bf16_refused "$c" PASS "exit 2: $(grep -m1 'precision = bf16' "$log" | cut -c1-60)"
    else
        row bf16_refused "$c" "$(verdict)" "$(why "$log")"
    fi
}

# --- the matrix optimisers --------------------------------------------------------
# 12 steps with roots every 3 updates (computed at 3, 6, 9 and 12, used from
# 3 on), fp32. Tolerance 1e-3: their directions on the GPU are within 1e-3
# of an update's RMS of the CPU's (test_optim_gpu: the two eigensolvers, and
# Muon's Newton-Schulz steps, round differently), and in warmup an update
# moves the loss far less than that.
optim_gpu() { # optim_gpu O: the GPU's 12 steps with optimiser O, in $work/gpu_O
    # shellcheck disable=SC2086
    go 120 "$logs/gpu_$1.log" "$isthmus" train "$small" $common $PRE --set train.optimizer=$1 --set train.backend=cuda \
        --set train.precision=fp32 --set train.out_dir="$work/gpu_$1"
}
sec_optim() {
    local o fig st
    fits 40 optim "small.ini 12 steps shampoo/muon vs CPU" || return 0
    for o in shampoo muon; do
        # shellcheck disable=SC2086
        go 240 "$logs/cpu_$o.log" "$isthmus" train "$small" $common $PRE --set train.optimizer=$o \
            --set train.backend=cpu --set train.out_dir="$work/cpu_$o" || say "CPU $o run failed: $(why "$logs/cpu_$o.log")"
        if [ "$gpus" -eq 0 ]; then
            row optim "small.ini 12 steps $o vs CPU" SKIP "no GPU; CPU run $(ran "$work/cpu_$o")"
        elif optim_gpu $o; then
            fig=$(compare_losses "$work/cpu_$o" "$work/gpu_$o" 1e-3)
            st=$?
            row optim "small.ini 12 steps $o fp32 vs CPU (tol 1e-3)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
                "max rel loss diff $fig"
        else
            row optim "small.ini 12 steps $o fp32 vs CPU" "$(verdict)" "$(why "$logs/gpu_$o.log")"
        fi
    done
}

# --- resume across backends ----------------------------------------------------
# resume_on_cpu LABEL STOP REF TOL NAME ARGS...: the GPU trains with ARGS and
# stops after step STOP as if signalled (checkpoint, exit 0); the CPU resumes
# it in $work/NAME: it must start at step STOP + 1 and its losses match the
# GPU-only run REF within TOL
resume_on_cpu() {
    local label=$1 stop=$2 ref=$3 tol=$4 name=$5 dir=$work/$5 fig st first lg
    shift 5
    lg=$logs/$name.gpu.log
    # shellcheck disable=SC2086
    go 60 "$lg" env ISTHMUS_STOP_AT_STEP="$stop" "$isthmus" train "$small" $common "$@" --set train.backend=cuda \
        --set train.out_dir="$dir" && {
        lg=$logs/$name.cpu.log
        # shellcheck disable=SC2086
        go 120 "$lg" "$isthmus" train "$small" $common "$@" --set train.backend=cpu --set train.out_dir="$dir" \
            --resume auto
    }
    if [ $rc -ne 0 ]; then
        row resume "$label" "$(verdict)" "$(basename "$lg"): $(why "$lg")"
    elif ! grep -q "^resumed from .*: step $stop," "$lg"; then
        row resume "$label" FAIL "the CPU did not resume at step $stop: $(grep -m1 'resum' "$lg")"
    else
        fig=$(compare_losses "$ref" "$dir" "$tol")
        st=$?
        first=$(grep '^{"step"' "$dir/metrics.jsonl" | sed -n "$((stop + 1))p" | sed 's/^{"step":\([0-9]*\),.*/\1/')
        [ "$first" = $((stop + 1)) ] || st=1
        row resume "$label ($tol)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
            "resumed at step $stop; the steps after it vs the GPU-only run: $fig"
    fi
}
sec_resume() {
    local c1="GPU checkpoint resumed on the CPU" c2="GPU Shampoo checkpoint resumed on the CPU"
    local R="--set train.steps=30 --set data.eval_bytes=4096 --set train.threads=$threads"
    if [ "$gpus" -eq 0 ]; then
        row resume "$c1" SKIP "no GPU"
        row resume "$c2" SKIP "no GPU"
        return 0
    fi
    fits 40 resume "$c1" || return 0
    # shellcheck disable=SC2086
    if go 60 "$logs/gpu30.log" "$isthmus" train "$small" $common $R --set train.backend=cuda \
        --set train.out_dir="$work/gpu30"; then
        # shellcheck disable=SC2086
        resume_on_cpu "$c1" 15 "$work/gpu30" 1e-4 resume $R
    else
        row resume "$c1" "$(verdict)" "the GPU-only run: $(why "$logs/gpu30.log")"
    fi
    # with Shampoo: stopped after update 7, the checkpoint holds the
    # statistics and the roots of update 6, which the CPU uses at 8 before
    # its own at 9; against the GPU's 12-step Shampoo run (optim's, made
    # here when optim did not run: --rerun resume, or optim skipped)
    fits 20 resume "$c2" || return 0
    [ -f "$work/gpu_shampoo/model.h5" ] || optim_gpu shampoo
    if [ -f "$work/gpu_shampoo/model.h5" ]; then
        # shellcheck disable=SC2086
        resume_on_cpu "$c2" 7 "$work/gpu_shampoo" 1e-3 resume_sh $PRE --set train.optimizer=shampoo \
            --set train.precision=fp32
    else
        row resume "$c2" "$(verdict)" "no GPU Shampoo run to compare with: $(why "$logs/gpu_shampoo.log")"
    fi
}

# --- two sites of one rank on the one GPU ----------------------------------------
TWO="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.codec=fp4 --set outer.inner_steps=10
--set train.steps=40 --set data.eval_bytes=65536 --set train.threads=$((threads / 2)) --set train.gpu_share=1"
sec_two_site() {
    local be=cpu c="two sites x 1 rank on one GPU (diloco fp4)" log=$logs/two_site.log bytes outers hint='' first last
    fits 60 two_site "$c" || return 0
    [ "$gpus" -gt 0 ] && be=cuda
    # shellcheck disable=SC2086
    if go 180 "$log" mpirun -q --bind-to none -np 2 "$isthmus" train "$small" $common $TWO --set train.backend=$be \
        --set train.out_dir="$work/two"; then
        bytes=$(grep -o '"inter_site_bytes":[0-9]*' "$work/two/metrics.jsonl" | tail -1 | cut -d: -f2)
        outers=$(grep -c '^{"outer"' "$work/two/metrics.jsonl")
        if [ "$gpus" -gt 0 ]; then
            row two_site "$c" "$([ "${bytes:-0}" -gt 0 ] && [ "$outers" -ge 4 ] && echo PASS || echo FAIL)" \
                "$outers outer steps, $bytes inter-site bytes"
        else
            row two_site "$c" SKIP "no GPU; the same run on the CPU: $outers outer steps, $bytes bytes"
        fi
    else
        # two processes on one GPU need the default compute mode
        case $compute_mode in Exclusive* | Prohibited) hint=" (compute mode $compute_mode: one process per GPU)" ;; esac
        # the first error (the failing rank's), and the last line when it says more
        first=$(grep -m1 -i error "$log" | cut -c1-160)
        last=$(why "$log")
        case $last in *"$first"*) first= ;; esac
        row two_site "$c" "$(verdict)" "${first:+$first; }$last$hint"
    fi
}

# --- that model on the CPU, the GPU and in PyTorch -----------------------------------
bpb() { grep "\"eval\":\"$2\"" "$1/metrics.jsonl" 2> /dev/null | tail -1 | sed 's/.*"bpb":\([^,]*\),.*/\1/'; }
within() { # within A B TOL: |A - B| <= TOL * |B|, as Python says
    py -c "import sys; a, b, t = map(float, sys.argv[1:]); print(abs(a - b) <= t * abs(b))" "$1" "$2" "$3" 2> /dev/null
}
sec_eval() {
    local c="eval of the two-site model: GPU vs CPU (1e-5)" model=$work/two/model.h5 cpu_bpb gpu_bpb='' tb top_k context
    # --rerun eval: the model first
    [ -n "$rerun" ] && [ ! -f "$model" ] && sec_two_site
    if [ ! -f "$model" ]; then
        if [ -f "$logs/two_site.log" ]; then
            row eval "$c" FAIL "no model: the two-site run failed"
        else
            row eval "$c" SKIP "no model: the two-site run did not run"
        fi
        return 0
    fi
    fits 30 eval "$c" || return 0
    go 120 "$logs/eval_cpu.log" "$isthmus" eval --model "$model" --set data.dir="$data" --set data.eval_bytes=65536 \
        --set train.backend=cpu --set train.threads="$threads" --set train.out_dir="$work/eval_cpu"
    cpu_bpb=$(bpb "$work/eval_cpu" prose)
    if [ "$gpus" -gt 0 ]; then
        go 120 "$logs/eval_gpu.log" "$isthmus" eval --model "$model" --set data.dir="$data" \
            --set data.eval_bytes=65536 --set train.backend=cuda --set train.out_dir="$work/eval_gpu"
        gpu_bpb=$(bpb "$work/eval_gpu" prose)
        row eval "$c" "$([ "$(within "${gpu_bpb:-nan}" "${cpu_bpb:-nan}" 1e-5)" = True ] && echo PASS || verdict)" \
            "prose bpb GPU ${gpu_bpb:-none}, CPU ${cpu_bpb:-none}$([ -z "$gpu_bpb" ] && echo "; $(why "$logs/eval_gpu.log")")"
    else
        row eval "$c" SKIP "no GPU; CPU prose bpb ${cpu_bpb:-none}"
    fi
    if ! py -c 'import torch, h5py' 2> /dev/null; then
        row eval "PyTorch float64 forward of model.h5" SKIP "no torch/h5py in python3"
        return 0
    fi
    top_k=$(sed -n 's/^top_k *= *//p' "$small")
    context=$(sed -n 's/^context *= *//p' "$small")
    go 120 "$logs/torch_check.log" env LD_LIBRARY_PATH="$orig_ld_path" python3 "$top/tests/gpu/torch_check.py" "$model" \
        "$data/eval_prose.txt" 65536 "$context" "$top_k"
    tb=$(sed -n 's/^torch_check: bpb \([0-9.]*\).*/\1/p' "$logs/torch_check.log")
    row eval "PyTorch float64 forward of model.h5 (1e-5)" \
        "$([ "$(within "${cpu_bpb:-nan}" "${tb:-nan}" 1e-5)" = True ] && echo PASS || verdict)" \
        "prose bpb torch ${tb:-none}, isthmus ${gpu_bpb:-${cpu_bpb:-none}}$([ -z "$tb" ] && echo "; $(why "$logs/torch_check.log")")"
}

# --- bench gpu-1b (bf16) --------------------------------------------------------
sec_bench() {
    local log=$logs/bench_gpu1b.log line phases share wait att sdpa ratio
    if [ "$gpus" -eq 0 ]; then row bench "bench gpu-1b.ini bf16" SKIP "no GPU"; return 0; fi
    fits 60 bench "bench gpu-1b.ini bf16" || return 0
    if ! go 150 "$log" "$isthmus" bench "$configs/gpu-1b.ini" --threads 1 --steps 5 --peak-tflops 989 \
        --set train.backend=cuda --set train.precision=bf16 --set data.dir="$data"; then
        row bench "bench gpu-1b.ini bf16" "$(verdict)" "$(why "$log")"
        return 0
    fi
    # threads ms/step cpu-ms/step tokens/s GFLOP/s ... MFU
    line=$(awk '$1 == 1 {printf "%s ms/step, %s tokens/s, %.1f TFLOP/s, MFU %s", $2, $4, $5 / 1000, $NF}' "$log" | tail -1)
    row bench "bench gpu-1b.ini bf16 (MFU vs 989 TFLOP/s)" INFO "$line"
    # the step by phase (CUDA events): the three largest, and the phases'
    # sum against the wall time (within 5%: nothing of the step unmarked)
    phases=$(awk '/^#   / && $2 != "sum" { n = NF; name = ""; for (i = 2; i <= n - 2; i++) name = name (name ? " " : "") $i;
        print $(n - 1), name }' "$log" | sort -rn | head -3 | awk '{ ms = $1; $1 = ""; printf "%s%s %s ms", sep, $0, ms; sep = ";" }')
    share=$(awk '/^#   sum / { sub("%", "", $4); print $4 }' "$log" | tail -1)
    row bench "bench gpu-1b.ini step by phase (sum within 5%)" \
        "$(awk -v s="${share:-0}" 'BEGIN { print (s >= 95 && s <= 105) ? "PASS" : "FAIL" }')" \
        "sum ${share:-?}% of the step;$phases"
    # the MoE layers' one host read: what the GPU idles beyond the work
    # queued behind it (target: never idle; PASS under 0.5% of the step)
    wait=$(awk '/^#   host wait / { sub("%", "", $NF); print $(NF - 1), $NF }' "$log" | tail -1)
    row bench "bench gpu-1b.ini GPU idle on MoE host reads" \
        "$(echo "${wait:-x 100}" | awk '{ print $2 < 0.5 ? "PASS" : "INFO" }')" \
        "$(echo "${wait:-? ?}" | awk '{ printf "%s ms/step, %s%% of the step", $1, $2 }')"
    # for scale: PyTorch's SDPA, causal, bf16, forward + backward on the
    # same shapes (gpu-1b: 8 x 2048 tokens, 16 heads of 64, 16 layers)
    att=$(awk '/^#   attention / { print $3 }' "$log" | tail -1)
    if go 60 "$logs/torch_sdpa.log" env LD_LIBRARY_PATH="$orig_ld_path" python3 "$top/tests/gpu/torch_sdpa.py" \
        8 16 2048 64 16 1 "${att:-0}"; then
        sdpa=$(grep '^sdpa ' "$logs/torch_sdpa.log" | tail -1)
        ratio=$(echo "$sdpa" | sed -n 's/.*ratio \([0-9.]*\).*/\1/p')
        row bench "attention vs PyTorch SDPA (target >= 0.70)" \
            "$(awk -v r="${ratio:-0}" 'BEGIN { print r >= 0.7 ? "PASS" : "INFO" }')" "$sdpa"
    else
        row bench "attention vs PyTorch SDPA" SKIP "$(why "$logs/torch_sdpa.log")"
    fi
}

# --- the rerun's second half: compute-sanitizer memcheck ------------------------------
# memcheck ID WHAT CAP NAME COMMAND...: COMMAND (which holds $SAN where it
# belongs: after mpirun's options) into memcheck_NAME.log; PASS when every
# process's ERROR SUMMARY counts 0 errors (the program's own exit is the
# check's row's business, given in the figure)
memcheck() {
    local id=$1 what="memcheck: $2" cap=$3 log=$logs/memcheck_$4.log n
    shift 4
    if [ "$gpus" -eq 0 ]; then row "$id" "$what" SKIP "no GPU"; return 0; fi
    if [ -z "$sanitizer" ]; then row "$id" "$what" SKIP "no compute-sanitizer (/usr/local/cuda/bin, PATH)"; return 0; fi
    fits 20 "$id" "$what" || return 0
    go "$cap" "$log" "$@"
    n=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | awk '{ s += $1; k++ } END { if (k) print s }')
    if grep -qi 'device not supported' "$log"; then # gVisor's machines: the sanitizer cannot attach
        row "$id" "$what" SKIP "compute-sanitizer refused the device: $(grep -m1 -i 'not supported' "$log" | cut -c1-100)"
    elif [ -z "$n" ]; then
        row "$id" "$what" "$(verdict)" "no ERROR SUMMARY; $(why "$log")"
    elif [ "$n" -eq 0 ]; then
        row "$id" "$what" PASS "0 errors; the program exited $rc"
    else
        row "$id" "$what" FAIL "$n error(s), exit $rc; first: $(grep -m1 -A1 -E '^========= +(Invalid|Program hit|Out-of-range|Misaligned|Malloc|Cuda|Address|Barrier)' "$log" |
            sed 's/^========= *//' | paste -sd ' ' - | cut -c1-200)"
    fi
}
memcheck_of() {
    local p o G="--set data.eval_bytes=4096 --set train.threads=$threads --set train.backend=cuda"
    case $1 in
    test_*)
        if [ -z "$tests" ] || [ ! -x "$tests/$1" ]; then
            row "$1" "memcheck: $1" SKIP "not built"
        elif [ "$1" = test_backend_gpu ]; then
            # shellcheck disable=SC2086
            memcheck "$1" "$1" 400 "$1" mpirun -q -np 1 $SAN "$tests/$1"
        else
            # shellcheck disable=SC2086
            memcheck "$1" "$1" 400 "$1" $SAN "$tests/$1"
        fi ;;
    small50)
        for p in fp32 bf16; do
            # shellcheck disable=SC2086
            memcheck small50 "small.ini 3 steps $p" 200 "small_$p" $SAN "$isthmus" train "$small" $common $G \
                --set train.steps=3 --set train.precision=$p --set train.out_dir="$work/mc_small_$p"
        done
        # shellcheck disable=SC2086
        memcheck small50 "small.ini 3 steps fp32 recompute=layer" 200 small_layer $SAN "$isthmus" train "$small" \
            $common $G --set train.steps=3 --set train.recompute=layer --set train.out_dir="$work/mc_small_layer" ;;
    bf16_refused) row bf16_refused "memcheck" INFO "nothing to check: refused before any GPU work" ;;
    optim)
        for o in shampoo muon; do # roots at update 3, used at 4
            # shellcheck disable=SC2086
            memcheck optim "small.ini 4 steps $o" 200 "$o" $SAN "$isthmus" train "$small" $common $G \
                --set train.steps=4 --set train.precond_every=3 --set train.optimizer=$o --set train.out_dir="$work/mc_$o"
        done ;;
    resume) # the checkpoint written from the GPU
        # shellcheck disable=SC2086
        memcheck resume "small.ini 3 steps, checkpoint at 2" 200 resume env ISTHMUS_STOP_AT_STEP=2 $SAN "$isthmus" \
            train "$small" $common $G --set train.steps=3 --set train.out_dir="$work/mc_resume" ;;
    two_site)
        # shellcheck disable=SC2086
        memcheck two_site "two sites, 4 steps, 2 outer" 300 two_site mpirun -q --bind-to none -np 2 $SAN "$isthmus" \
            train "$small" $common $TWO $G --set train.threads=$((threads / 2)) --set train.steps=4 \
            --set outer.inner_steps=2 --set train.out_dir="$work/mc_two" ;;
    eval)
        if [ -f "$work/two/model.h5" ]; then
            # shellcheck disable=SC2086
            memcheck eval "eval of the two-site model" 200 eval $SAN "$isthmus" eval --model "$work/two/model.h5" \
                --set data.dir="$data" $G --set train.out_dir="$work/mc_eval"
        else
            row eval "memcheck: eval" SKIP "no model from the two-site run"
        fi ;;
    bench) # the bench's own code (phases, CUDA events) on small.ini: gpu-1b is too large for memcheck's pace
        # shellcheck disable=SC2086
        memcheck bench "bench small.ini bf16, 2 steps" 300 bench $SAN "$isthmus" bench "$small" --threads 1 --steps 2 \
            --set train.backend=cuda --set train.precision=bf16 --set data.dir="$data" ;;
    esac
}
