#!/bin/bash
# run.sh — every check that needs a GPU, in one call of under 5 minutes on a
# machine with one (the project's device: an H200, a driver, Python with
# PyTorch, h5py and NVIDIA's library wheels, nothing else of ours).
#
#   1. the GPU tests (kernels, optimisers, codec, the backend through its verbs)
#   2. 50 steps of small.ini on the CPU and on the GPU: fp32 losses within
#      1e-4 relative of the CPU's, bf16 within 1%; 12 steps with Shampoo
#      (roots every 3 updates) and with Muon, fp32, within 1e-3; 50 fp32
#      steps with train.recompute = layer: the same bits as without; bf16
#      at a head dimension the tensor cores do not take refused (exit 2)
#   3. a checkpoint written on the GPU resumed on the CPU: the CPU
#      continues where the GPU would have (losses within 1e-4); the same
#      with Shampoo's statistics and roots in the checkpoint (within 1e-3)
#   4. two sites of one rank each on the one GPU (diloco, fp4, NCCL
#      communicators of one rank, gpu_share): trains, bytes cross the link
#   5. that model evaluated on the CPU and on the GPU (within 1e-5), and by
#      PyTorch in float64 from the HDF5 file (tests/gpu/torch_check.py)
#   6. bench of gpu-1b.ini in bf16: tokens/s and MFU against the H200's
#      989 TFLOP/s dense bf16 peak; the step by phase (CUDA events), whose
#      sum must be the step's wall time within 5%, and the GPU's idle time
#      on the MoE layers' host reads (target: under 0.5% of the step)
# The last lines are a table: check | result | figure. Exit 0 only when every
# check that ran passed. Without a GPU every row says SKIP and why; the
# executables still run their CPU halves, so the plumbing is checked here.
#
# The executables: the bundle tests/gpu/bundle.sh made (gpubundle/, carried
# to the device), else an in-tree build configured --with-cuda.
# Output: $OUT (the device tool's folder) or /tmp/isthmus-gpu-out.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/isthmus-gpu-out}
work=$(mktemp -d /tmp/isthmus-gpu-run.XXXXXX)
mkdir -p "$out"
table=$out/gpu-table.txt
: > "$table"
failed=0
row() { # row CHECK RESULT FIGURE
    printf '%-44s | %-6s | %s\n' "$1" "$2" "$3" | tee -a "$table"
    [ "$2" = FAIL ] && failed=$((failed + 1))
    return 0
}
say() { echo "run.sh: $*"; }
t_start=$(date +%s)
# Python (PyTorch) runs with the machine's libraries, not the bundle's
py() { LD_LIBRARY_PATH=$orig_ld_path python3 "$@"; }
orig_ld_path=${LD_LIBRARY_PATH:-}

# --- the executables and what they load -----------------------------------
if [ -f "$top/gpubundle/isthmus-gpu.tar.xz" ]; then
    # Python's tarfile and lzma, not tar -J: the bare machine may lack xz
    if ! python3 -c 'import sys, tarfile
kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}  # our own bundle: modes and links as packed
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **kw)' \
        "$top/gpubundle/isthmus-gpu.tar.xz" "$work"; then
        say "cannot unpack $top/gpubundle/isthmus-gpu.tar.xz (python3 with lzma is needed)"
        exit 1
    fi
    b=$work/isthmus-gpu
    bin=$b/bin
    tests=$b/bin
    configs=$b/share/configs
    export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OPAL_PREFIX=$b/ompi/usr
    export PMIX_INSTALL_PREFIX=$b/ompi/usr/lib/x86_64-linux-gnu/pmix2
    export PATH=$OPAL_PREFIX/bin:$PATH
    say "executables from the bundle ($b)"
elif [ -x "$top/isthmus" ] && grep -q 'define HAVE_CUDA 1' "$top/autoconf.h" 2>/dev/null; then
    bin=$top
    tests=$top/tests/gpu
    configs=$top/share/configs
    say "executables from the tree (configured --with-cuda)"
else
    say "no bundle (tests/gpu/bundle.sh) and no --with-cuda build in $top"
    exit 1
fi
isthmus=$bin/isthmus
if [ ! -x "$isthmus" ]; then
    say "no executable at $isthmus: the bundle or the build is incomplete"
    exit 1
fi
# CUDA's large libraries from the machine: NVIDIA's wheels, else the toolkit
cuda_dirs=$(py - 2>/dev/null <<'EOF'
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
seen = set()
for root in nvidia.__path__:
    for d, _, files in os.walk(root):
        if any(f.startswith(("libcublas.so", "libcublasLt.so", "libnccl.so", "libcudart.so", "libcusolver.so",
                             "libcusparse.so", "libnvJitLink.so")) for f in files):
            seen.add(d)
print(":".join(sorted(seen)))
EOF
)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && cuda_dirs=${cuda_dirs:+$cuda_dirs:}$d
done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_dirs
missing=$(ldd "$isthmus" | awk '/not found/ {print $1}' | tr '\n' ' ')
if [ -n "$missing" ]; then
    say "isthmus cannot load: $missing (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    exit 1
fi

# Open MPI on one machine: shared memory and TCP only, no fabric probing;
# single-copy off (gVisor has no process_vm_readv)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx,pt2pt OMPI_MCA_mtl=^ofi,psm,psm2
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
mpi() { mpirun -q --bind-to none -np "$@"; }

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -gt 0 ]; then
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    say "$gpus GPU(s): $gpu_name"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia-smi.txt" 2>&1
else
    gpu_name=none
    say "no GPU visible: GPU rows are SKIP, the CPU halves still run"
fi
threads=$(nproc)
[ "$threads" -gt 16 ] && threads=16

# the corpus (tracked compressed; xz may be missing there, Python is not)
data=$work/data
mkdir -p "$data"
for f in "$top"/share/data/*.txt.xz; do
    py -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
        "$f" "$data/$(basename "$f" .xz)"
done
common="--set data.dir=$data --set train.log_every=1 --set train.eval_every=0"

# --- 1. the GPU tests --------------------------------------------------------
for t in test_kernels_gpu test_layers_gpu test_optim_gpu test_codec_gpu test_backend_gpu; do
    log=$out/$t.log
    if [ "$t" = test_backend_gpu ]; then
        (cd "$work" && timeout 180 mpirun -q -np 1 "$tests/$t" > "$log" 2>&1)
    else
        (cd "$work" && timeout 120 "$tests/$t" > "$log" 2>&1)
    fi
    rc=$?
    ok=$(grep -c '^ok ' "$log")
    bad=$(grep -c '^not ok ' "$log")
    if grep -q '^1..0 # SKIP' "$log" && [ "$gpus" -gt 0 ]; then
        row "$t" FAIL "skipped although nvidia-smi sees $gpus GPU(s): $(sed -n 's/^1..0 # SKIP //p' "$log")"
    elif grep -q '^1..0 # SKIP' "$log"; then
        row "$t" SKIP "$(sed -n 's/^1..0 # SKIP //p' "$log")"
    elif [ $rc -eq 0 ] && [ "$bad" -eq 0 ] && [ "$ok" -gt 0 ]; then
        row "$t" PASS "$ok checks"
    else
        row "$t" FAIL "$ok ok, $bad not ok, exit $rc"
    fi
done
# how the experts' products ran (test_kernels_gpu's log): grouped, or one call each where cuBLAS refused
if grep -q '^# gemm_batch' "$out/test_kernels_gpu.log" 2>/dev/null; then
    row "expert products (cublasGemmGroupedBatchedEx)" INFO \
        "$(sed -n 's/^# gemm_batch (\(.*\)): \(.*\)/\1 \2/p' "$out/test_kernels_gpu.log" | paste -sd ';' -)"
fi

# --- 2. small.ini 50 steps, CPU against GPU ----------------------------------
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
compare_losses() { # compare_losses DIR_REF DIR TOL -> "max_rel" on stdout, status 0 if within
    py - "$1" "$2" "$3" <<'EOF'
import json, sys
def steps(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
ref, got, tol = steps(sys.argv[1]), steps(sys.argv[2]), float(sys.argv[3])
common = sorted(set(ref) & set(got))
worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in common), default=float("inf"))
print("%.2e over %d steps" % (worst, len(common)))
sys.exit(0 if common and worst <= tol else 1)
EOF
}
small=$configs/small.ini
S50="--set train.steps=50 --set data.eval_bytes=65536 --set train.threads=$threads"
timeout 240 "$isthmus" train "$small" $common $S50 --set train.backend=cpu --set train.out_dir="$work/cpu50" \
    > "$out/cpu50.log" 2>&1 || say "CPU small.ini run failed: $(tail -2 "$out/cpu50.log")"
if [ "$gpus" -gt 0 ]; then
    for p in fp32 bf16; do
        tol=1e-4
        [ $p = bf16 ] && tol=1e-2
        if timeout 120 "$isthmus" train "$small" $common $S50 --set train.backend=cuda --set train.precision=$p \
            --set train.out_dir="$work/gpu50_$p" > "$out/gpu50_$p.log" 2>&1; then
            fig=$(compare_losses "$work/cpu50" "$work/gpu50_$p" $tol)
            st=$?
            ms=$(grep -o '"ms_per_step":[0-9.]*' "$work/gpu50_$p/metrics.jsonl" | tail -20 |
                awk -F: '{s += $2; n++} END {if (n) printf "%.1f", s / n}')
            cms=$(grep -o '"ms_per_step":[0-9.]*' "$work/cpu50/metrics.jsonl" | tail -20 |
                awk -F: '{s += $2; n++} END {if (n) printf "%.1f", s / n}')
            row "small.ini 50 steps $p vs CPU (tol $tol)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
                "max rel loss diff $fig; $ms ms/step GPU, $cms CPU ($threads threads)"
        else
            row "small.ini 50 steps $p vs CPU" FAIL "$(tail -1 "$out/gpu50_$p.log")"
        fi
    done
    # bf16 attention runs on tensor cores only: tiny.ini's head dimension
    # (32) is refused before the first step, in one line, exit 2
    rc=0
    timeout 60 "$isthmus" train "$configs/tiny.ini" $common --set train.backend=cuda --set train.precision=bf16 \
        --set train.steps=1 --set train.out_dir="$work/tiny_bf16" > "$out/tiny_bf16.log" 2>&1 || rc=$?
    if [ $rc -eq 2 ] && grep -q "precision = bf16 runs attention on tensor cores" "$out/tiny_bf16.log"; then
        row "bf16 at head dim 32 refused" PASS "exit 2: $(grep -m1 'precision = bf16' "$out/tiny_bf16.log" | cut -c1-60)"
    else
        row "bf16 at head dim 32 refused" FAIL "exit $rc: $(tail -1 "$out/tiny_bf16.log")"
    fi
else
    row "small.ini 50 steps fp32/bf16 vs CPU" SKIP "no GPU; CPU run $([ -f "$work/cpu50/model.h5" ] && echo ok || echo FAILED)"
fi
# train.recompute = layer: each layer's forward again before its backward,
# the same kernels on the same inputs (no float atomics; the plan's
# histogram adds integers): the same bits as the run above
if [ "$gpus" -gt 0 ] && [ -f "$work/gpu50_fp32/model.h5" ]; then
    if timeout 120 "$isthmus" train "$small" $common $S50 --set train.backend=cuda --set train.precision=fp32 \
        --set train.recompute=layer --set train.out_dir="$work/gpu50_layer" > "$out/gpu50_layer.log" 2>&1; then
        fig=$(compare_losses "$work/gpu50_fp32" "$work/gpu50_layer" 0)
        st=$?
        row "small.ini 50 steps fp32 recompute=layer vs none (bit-identical)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
            "max rel loss diff $fig"
    else
        row "small.ini 50 steps fp32 recompute=layer" FAIL "$(tail -1 "$out/gpu50_layer.log")"
    fi
else
    row "small.ini 50 steps fp32 recompute=layer vs none" SKIP "no GPU run without it"
fi

# The matrix optimisers: 12 steps with roots every 3 updates (computed at 3,
# 6, 9 and 12, used from 3 on), fp32. Tolerance 1e-3: their directions on the
# GPU are within 1e-3 of an update's RMS of the CPU's (test_optim_gpu: the
# two eigensolvers, and Muon's Newton-Schulz steps, round differently), and
# in warmup an update moves the loss far less than that.
PRE="--set train.steps=12 --set data.eval_bytes=4096 --set train.threads=$threads --set train.precond_every=3"
for o in shampoo muon; do
    # shellcheck disable=SC2086
    timeout 240 "$isthmus" train "$small" $common $PRE --set train.optimizer=$o --set train.backend=cpu \
        --set train.out_dir="$work/cpu_$o" > "$out/cpu_$o.log" 2>&1 || say "CPU $o run failed: $(tail -2 "$out/cpu_$o.log")"
    if [ "$gpus" -gt 0 ]; then
        # shellcheck disable=SC2086
        if timeout 120 "$isthmus" train "$small" $common $PRE --set train.optimizer=$o --set train.backend=cuda \
            --set train.precision=fp32 --set train.out_dir="$work/gpu_$o" > "$out/gpu_$o.log" 2>&1; then
            fig=$(compare_losses "$work/cpu_$o" "$work/gpu_$o" 1e-3)
            st=$?
            row "small.ini 12 steps $o fp32 vs CPU (tol 1e-3)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
                "max rel loss diff $fig"
        else
            row "small.ini 12 steps $o fp32 vs CPU" FAIL "$(tail -1 "$out/gpu_$o.log")"
        fi
    else
        row "small.ini 12 steps $o vs CPU" SKIP "no GPU; CPU run $([ -f "$work/cpu_$o/model.h5" ] && echo ok || echo FAILED)"
    fi
done

# --- 3. resume across backends ----------------------------------------------
# resume_on_cpu LABEL STOP REF TOL DIR ARGS...: the GPU trains with ARGS and
# stops after step STOP as if signalled (checkpoint, exit 0); the CPU resumes
# it in DIR: it must start at step STOP + 1 and its losses match the GPU-only
# run REF within TOL
resume_on_cpu() {
    local label=$1 stop=$2 ref=$3 tol=$4 dir=$5 fig st first
    shift 5
    ISTHMUS_STOP_AT_STEP=$stop timeout 60 "$isthmus" train "$small" $common "$@" --set train.backend=cuda \
        --set train.out_dir="$dir" > "$dir.gpu.log" 2>&1 &&
        timeout 120 "$isthmus" train "$small" $common "$@" --set train.backend=cpu --set train.out_dir="$dir" \
            --resume auto > "$dir.cpu.log" 2>&1
    if [ $? -eq 0 ] && grep -q "^resumed from .*: step $stop," "$dir.cpu.log"; then
        fig=$(compare_losses "$ref" "$dir" "$tol")
        st=$?
        first=$(grep '^{"step"' "$dir/metrics.jsonl" | sed -n "$((stop + 1))p" | sed 's/^{"step":\([0-9]*\),.*/\1/')
        [ "$first" = $((stop + 1)) ] || st=1
        row "$label ($tol)" "$([ $st -eq 0 ] && echo PASS || echo FAIL)" \
            "resumed at step $stop; the steps after it vs the GPU-only run: $fig"
    else
        row "$label" FAIL "see $dir.gpu.log, $dir.cpu.log"
    fi
    cp "$dir.gpu.log" "$dir.cpu.log" "$out/" 2> /dev/null
}
if [ "$gpus" -gt 0 ]; then
    R="--set train.steps=30 --set data.eval_bytes=4096 --set train.threads=$threads"
    # shellcheck disable=SC2086
    if timeout 60 "$isthmus" train "$small" $common $R --set train.backend=cuda --set train.out_dir="$work/gpu30" \
        > "$out/gpu30.log" 2>&1; then
        # shellcheck disable=SC2086
        resume_on_cpu "GPU checkpoint resumed on the CPU" 15 "$work/gpu30" 1e-4 "$work/resume" $R
    else
        row "GPU checkpoint resumed on the CPU" FAIL "the GPU-only run: $(tail -1 "$out/gpu30.log")"
    fi
else
    row "GPU checkpoint resumed on the CPU" SKIP "no GPU"
fi
# with Shampoo: stopped after update 7, the checkpoint holds the statistics
# and the roots of update 6, which the CPU uses at 8 before its own at 9;
# against the GPU's 12-step Shampoo run above (the same settings)
if [ "$gpus" -gt 0 ] && [ -f "$work/gpu_shampoo/model.h5" ]; then
    # shellcheck disable=SC2086
    resume_on_cpu "GPU Shampoo checkpoint resumed on the CPU" 7 "$work/gpu_shampoo" 1e-3 "$work/resume_sh" \
        $PRE --set train.optimizer=shampoo --set train.precision=fp32
elif [ "$gpus" -gt 0 ]; then
    row "GPU Shampoo checkpoint resumed on the CPU" FAIL "no GPU Shampoo run to compare with"
else
    row "GPU Shampoo checkpoint resumed on the CPU" SKIP "no GPU"
fi

# --- 4. two sites of one rank on the one GPU ----------------------------------
TWO="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.codec=fp4 --set outer.inner_steps=10
--set train.steps=40 --set data.eval_bytes=65536 --set train.threads=$((threads / 2)) --set train.gpu_share=1"
if [ "$gpus" -gt 0 ]; then be=cuda; else be=cpu; fi
# shellcheck disable=SC2086
if timeout 180 mpirun -q --bind-to none -np 2 "$isthmus" train "$small" $common $TWO --set train.backend=$be \
    --set train.out_dir="$work/two" > "$out/two_site.log" 2>&1; then
    bytes=$(grep -o '"inter_site_bytes":[0-9]*' "$work/two/metrics.jsonl" | tail -1 | cut -d: -f2)
    outers=$(grep -c '^{"outer"' "$work/two/metrics.jsonl")
    if [ "$gpus" -gt 0 ]; then
        row "two sites x 1 rank on one GPU (diloco fp4)" "$([ "${bytes:-0}" -gt 0 ] && [ "$outers" -ge 4 ] && echo PASS || echo FAIL)" \
            "$outers outer steps, $bytes inter-site bytes"
    else
        row "two sites x 1 rank on one GPU (diloco fp4)" SKIP "no GPU; the same run on the CPU: $outers outer steps, $bytes bytes"
    fi
else
    row "two sites x 1 rank on one GPU (diloco fp4)" FAIL "$(grep -m1 error "$out/two_site.log")"
fi

# --- 5. that model on the CPU, the GPU and in PyTorch -------------------------
bpb() { grep "\"eval\":\"$2\"" "$1/metrics.jsonl" | tail -1 | sed 's/.*"bpb":\([^,]*\),.*/\1/'; }
if [ -f "$work/two/model.h5" ]; then
    timeout 120 "$isthmus" eval --model "$work/two/model.h5" --set data.dir="$data" --set data.eval_bytes=65536 \
        --set train.backend=cpu --set train.threads="$threads" --set train.out_dir="$work/eval_cpu" \
        > "$out/eval_cpu.log" 2>&1
    cpu_bpb=$(bpb "$work/eval_cpu" prose)
    if [ "$gpus" -gt 0 ]; then
        timeout 120 "$isthmus" eval --model "$work/two/model.h5" --set data.dir="$data" --set data.eval_bytes=65536 \
            --set train.backend=cuda --set train.out_dir="$work/eval_gpu" > "$out/eval_gpu.log" 2>&1
        gpu_bpb=$(bpb "$work/eval_gpu" prose)
        ok=$(py -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(abs(a - b) <= 1e-5 * b)" \
            "${gpu_bpb:-nan}" "${cpu_bpb:-nan}" 2>/dev/null)
        row "eval of the GPU model: GPU vs CPU (1e-5)" "$([ "$ok" = True ] && echo PASS || echo FAIL)" \
            "prose bpb GPU $gpu_bpb, CPU $cpu_bpb"
    else
        row "eval of the GPU model: GPU vs CPU" SKIP "no GPU; CPU prose bpb $cpu_bpb"
    fi
    if py -c 'import torch, h5py' 2>/dev/null; then
        top_k=$(sed -n 's/^top_k *= *//p' "$small")
        context=$(sed -n 's/^context *= *//p' "$small")
        tb=$(timeout 120 env LD_LIBRARY_PATH="$orig_ld_path" python3 "$top/tests/gpu/torch_check.py" "$work/two/model.h5" "$data/eval_prose.txt" 65536 \
            "$context" "$top_k" 2> "$out/torch_check.err" | sed -n 's/^torch_check: bpb \([0-9.]*\).*/\1/p')
        ok=$(py -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(abs(a - b) <= 1e-5 * a)" \
            "${tb:-nan}" "${cpu_bpb:-nan}" 2>/dev/null)
        ref=${gpu_bpb:-$cpu_bpb}
        row "PyTorch float64 forward of model.h5 (1e-5)" "$([ "$ok" = True ] && echo PASS || echo FAIL)" \
            "prose bpb torch $tb, isthmus $ref"
    else
        row "PyTorch float64 forward of model.h5" SKIP "no torch/h5py in python3"
    fi
else
    row "eval of the GPU model on the CPU" FAIL "no model from step 4"
fi

# --- 6. bench gpu-1b (bf16) ---------------------------------------------------
if [ "$gpus" -gt 0 ]; then
    if timeout 150 "$isthmus" bench "$configs/gpu-1b.ini" --threads 1 --steps 5 --peak-tflops 989 \
        --set train.backend=cuda --set train.precision=bf16 --set data.dir="$data" > "$out/bench_gpu1b.log" 2>&1; then
        # threads ms/step cpu-ms/step tokens/s GFLOP/s ... MFU
        line=$(awk '$1 == 1 {printf "%s ms/step, %s tokens/s, %.1f TFLOP/s, MFU %s", $2, $4, $5 / 1000, $NF}' \
            "$out/bench_gpu1b.log" | tail -1)
        row "bench gpu-1b.ini bf16 (MFU vs 989 TFLOP/s)" INFO "$line"
        # the step by phase (CUDA events): the three largest, and the phases'
        # sum against the wall time (within 5%: nothing of the step unmarked)
        top=$(awk '/^#   / && $2 != "sum" { n = NF; name = ""; for (i = 2; i <= n - 2; i++) name = name (name ? " " : "") $i;
            print $(n - 1), name }' "$out/bench_gpu1b.log" | sort -rn | head -3 | awk '{ ms = $1; $1 = ""; printf "%s%s %s ms", sep, $0, ms; sep = ";" }')
        share=$(awk '/^#   sum / { sub("%", "", $4); print $4 }' "$out/bench_gpu1b.log" | tail -1)
        row "bench gpu-1b.ini step by phase (sum within 5%)" \
            "$(awk -v s="${share:-0}" 'BEGIN { print (s >= 95 && s <= 105) ? "PASS" : "FAIL" }')" \
            "sum ${share:-?}% of the step;$top"
        # the MoE layers' one host read: what the GPU idles beyond the work
        # queued behind it (target: never idle; PASS under 0.5% of the step)
        wait=$(awk '/^#   host wait / { sub("%", "", $NF); print $(NF - 1), $NF }' "$out/bench_gpu1b.log" | tail -1)
        row "bench gpu-1b.ini GPU idle on MoE host reads" \
            "$(echo "${wait:-x 100}" | awk '{ print $2 < 0.5 ? "PASS" : "INFO" }')" "$(echo "${wait:-? ?}" | awk '{ printf "%s ms/step, %s%% of the step", $1, $2 }')"
        # for scale: PyTorch's SDPA, causal, bf16, forward + backward on the
        # same shapes (gpu-1b: 8 x 2048 tokens, 16 heads of 64, 16 layers)
        att=$(awk '/^#   attention / { print $3 }' "$out/bench_gpu1b.log" | tail -1)
        if sdpa=$(timeout 60 env LD_LIBRARY_PATH="$orig_ld_path" python3 "$top/tests/gpu/torch_sdpa.py" 8 16 2048 64 16 1 \
            "${att:-0}" 2> "$out/torch_sdpa.log"); then
            ratio=$(echo "$sdpa" | sed -n 's/.*ratio \([0-9.]*\).*/\1/p')
            row "attention vs PyTorch SDPA (target >= 0.70)" \
                "$(awk -v r="${ratio:-0}" 'BEGIN { print r >= 0.7 ? "PASS" : "INFO" }')" "$sdpa"
        else
            row "attention vs PyTorch SDPA" SKIP "no torch: $(tail -1 "$out/torch_sdpa.log")"
        fi
    else
        row "bench gpu-1b.ini bf16" FAIL "$(tail -2 "$out/bench_gpu1b.log" | tr '\n' ' ')"
    fi
else
    row "bench gpu-1b.ini bf16" SKIP "no GPU"
fi

echo
echo "run.sh: $(($(date +%s) - t_start)) s on $(hostname) ($gpu_name), $(date -u +%Y-%m-%d)"
echo "check                                        | result | figure"
cat "$table"
rm -rf "$work"
[ $failed -eq 0 ]
