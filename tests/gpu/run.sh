#!/bin/bash
# run.sh — every check that needs a GPU, in one call of the device tool (one
# H100 or H200, a driver, Python with PyTorch, h5py and NVIDIA's library
# wheels, compute-sanitizer; nothing else of ours: tests/gpu/bundle.sh).
#
#   tests/gpu/run.sh [--budget SECONDS] [--rerun ID] [--list]
#
# --budget S (or ISTHMUS_GPU_BUDGET; default 480): the whole run's seconds,
# its setup included. Each section starts only when what is left covers its
# need (else a SKIP row naming the budget), and each command's timeout is its
# own cap or what is left, the smaller: an early hang costs its own cap only.
# --rerun ID: that check alone, first with CUDA_LAUNCH_BLOCKING=1 (a kernel
# fault is reported at its launch) and NCCL_DEBUG=INFO, then its GPU commands
# under compute-sanitizer's memcheck. --list: the IDs, in the order they run.
#
# The checks (ID: what), cheapest and most telling first:
#   test_kernels_gpu .. test_backend_gpu: the GPU tests (kernels, layers,
#       optimisers, codec, the backend through its verbs) against the CPU
#   small50: 50 steps of small.ini on the CPU and the GPU: fp32 losses within
#       1e-4 relative of the CPU's, bf16 within 1%; train.recompute = layer:
#       the same bits as without
#   bf16_refused: bf16 at a head dimension the tensor cores do not take: exit 2
#   optim: 12 steps with Shampoo (roots every 3 updates) and with Muon, fp32,
#       within 1e-3 of the CPU's
#   resume: a GPU checkpoint resumed on the CPU (within 1e-4), and one with
#       Shampoo's statistics and roots (within 1e-3)
#   two_site: two sites of one rank each on the one GPU (diloco, fp4, NCCL
#       communicators of one rank, gpu_share): trains, bytes cross the link
#   eval: that model evaluated on the CPU and the GPU (within 1e-5), and by
#       PyTorch in float64 from the HDF5 file (tests/gpu/torch_check.py)
#   bench: gpu-1b.ini in bf16: tokens/s and MFU against 989 TFLOP/s (dense
#       bf16, H100 and H200); the step by phase (CUDA events), whose sum must
#       be the step's wall time within 5%; the GPU's idle time on the MoE
#       layers' host reads; attention against PyTorch's SDPA
# docs/benchmarks.md says what each row means and its pass criterion.
#
# Output, in $OUT (the device tool's folder; at most 8 files come back) or
# /tmp/isthmus-gpu-out: gpu-table.txt (the table: id | check | result |
# figure), gpu-info.txt (the device: nvidia-smi with the compute mode, the
# bundle's build, the tools) and gpu-logs.tar.gz (every log and each run's
# metrics.jsonl, packed after each section so a stopped run keeps what ran).
# Exit 0 only when no row is FAIL, 2 for bad arguments. Without a GPU every
# GPU row says SKIP and why, and the CPU halves still run.
#
# The executables: the bundle tests/gpu/bundle.sh made (gpubundle/, carried
# to the device), else an in-tree build configured --with-cuda; without a
# GPU an in-tree build without CUDA will do (the CPU halves only).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
ids="test_kernels_gpu test_layers_gpu test_optim_gpu test_codec_gpu test_backend_gpu"
ids="$ids small50 bf16_refused optim resume two_site eval bench"
usage="usage: tests/gpu/run.sh [--budget SECONDS] [--rerun ID] [--list]"
bad_arg() { echo "run.sh: $*" >&2; exit 2; }
budget=${ISTHMUS_GPU_BUDGET:-480}
budget_from="ISTHMUS_GPU_BUDGET"
rerun=
while [ $# -gt 0 ]; do
    case $1 in
    --budget | --rerun)
        [ $# -ge 2 ] || bad_arg "$1 needs a value ($usage)"
        if [ "$1" = --budget ]; then budget=$2 budget_from=--budget; else rerun=$2; fi
        shift 2 ;;
    --budget=*) budget=${1#*=} budget_from=--budget; shift ;;
    --rerun=*) rerun=${1#*=}; shift ;;
    --list) echo "$ids" | tr ' ' '\n'; exit 0 ;;
    -h | --help) echo "$usage"; exit 0 ;;
    *) bad_arg "unknown argument '$1' ($usage)" ;;
    esac
done
case $budget in '' | *[!0-9]* | 0*) bad_arg "$budget_from '$budget': a whole number of seconds, at least 1" ;; esac
if [ -n "$rerun" ]; then
    case " $ids " in *" $rerun "*) ;; *) bad_arg "--rerun '$rerun': not a check of the table (one of: $ids)" ;; esac
fi

t_start=$(date +%s)
deadline=$((t_start + budget))
reserve=10 # for the last pack and the table
out=${OUT:-/tmp/isthmus-gpu-out}
work=$(mktemp -d "${TMPDIR:-/tmp}/isthmus-gpu-run.XXXXXX")
logs=$work/logs
mkdir -p "$out" "$logs"
table=$out/gpu-table.txt
info=$out/gpu-info.txt
rm -f "$table" "$info" "$out/gpu-logs.tar.gz"
cd "$work" || exit 1
failed=0
tag=
# Python (PyTorch) runs with the machine's libraries, not the bundle's
orig_ld_path=${LD_LIBRARY_PATH:-}
py() { LD_LIBRARY_PATH=$orig_ld_path python3 "$@"; }
# every log and each run's metrics, one archive (Python's tarfile: the bare
# machine may lack tar's compressors), replaced whole
pack() {
    py - "$work" "$out/gpu-logs.tar.gz" 2> /dev/null <<'EOF' || tar -C "$work" -czf "$out/gpu-logs.tar.gz" logs 2> /dev/null
import glob, os, sys, tarfile
work, dest = sys.argv[1:]
with tarfile.open(dest + ".part", "w:gz") as t:
    t.add(os.path.join(work, "logs"), arcname="logs")
    for m in sorted(glob.glob(os.path.join(work, "*", "metrics.jsonl"))):
        t.add(m, arcname="runs/" + os.path.relpath(m, work))
os.replace(dest + ".part", dest)
EOF
}
# stopped from outside: the command running is stopped (TERM, KILL after
# 10 s), and what ran is packed
child=
stopped() {
    local _
    echo "run.sh: stopped ($1)"
    if [ -n "$child" ]; then
        kill -TERM "$child" 2> /dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2> /dev/null && sleep 1; done
        kill -KILL -- "-$child" 2> /dev/null # timeout leads its own process group
    fi
    pack
    exit "$2"
}
trap 'rm -rf "$work"' EXIT
trap 'stopped TERM 143' TERM
trap 'stopped INT 130' INT
# the output in logs/run.log too (the caller's stdout and stderr kept as 3, 4)
exec 3>&1 4>&2 > >(tee -a "$logs/run.log") 2>&1
tee_pid=$!
say() { echo "run.sh: $*"; }
printf '%-16s | %-58s | %-6s | %s\n' id check result figure > "$table"
row() { # row ID CHECK RESULT FIGURE
    printf '%-16s | %-58s | %-6s | %s\n' "$1" "$2${tag:+ $tag}" "$3" "$4" | tee -a "$table"
    [ "$3" = FAIL ] && failed=$((failed + 1))
    return 0
}
# seconds left to the sections (what the last pack keeps aside excluded)
left() { echo $((deadline - $(date +%s) - reserve)); }
# fits NEED ID CHECK: what is left covers NEED seconds, else a SKIP row naming the budget
fits() {
    local l
    l=$(left)
    [ "$l" -ge "$1" ] && return 0
    row "$2" "$3" SKIP "budget: $((l > 0 ? l : 0)) s left of $budget s, needs ~$1 s (alone: --rerun $2)"
    return 1
}
# go CAP LOG COMMAND...: COMMAND, its output in LOG, stopped after CAP s or at
# the budget's end, whichever comes first. Sets rc, and cut=1 when the budget
# (not CAP) stopped it. In the background with wait, so that a TERM to run.sh
# is handled at once, not after the command.
go() {
    local cap=$1 log=$2 t
    shift 2
    t=$(left)
    [ "$t" -gt "$cap" ] && t=$cap
    [ "$t" -lt 1 ] && t=1
    cut=0
    timeout -k 5 "$t" "$@" > "$log" 2>&1 3>&- 4>&- &
    child=$!
    wait "$child"
    rc=$?
    child=
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        [ "$t" -lt "$cap" ] && cut=1
        echo "run.sh: stopped after $t s ($([ $cut = 1 ] && echo "the budget's end" || echo "its cap"))" >> "$log"
    fi
    return $rc
}
# why LOG: a failed command's figure: stopped, or its last line
why() {
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then tail -1 "$1"; else echo "exit $rc: $(grep -v '^\s*$' "$1" | tail -1)"; fi
}
# verdict CUT: SKIP when the budget stopped the command, else FAIL
verdict() { [ "$cut" = 1 ] && echo SKIP || echo FAIL; }

# --- the device, the executables and what they load -----------------------
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
gpu_name=none compute_mode=
if [ "$gpus" -gt 0 ]; then
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    compute_mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | head -1)
    say "$gpus GPU(s): $gpu_name, compute mode $compute_mode"
else
    say "no GPU visible: GPU rows are SKIP, the CPU halves still run"
fi
build_info=
tests=
if [ -f "$top/gpubundle/isthmus-gpu.tar.xz" ]; then
    # Python's tarfile and lzma, not tar -J: the bare machine may lack xz
    if ! py -c 'import sys, tarfile
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
    build_info=$b/BUILD
    export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OPAL_PREFIX=$b/ompi/usr
    export PMIX_INSTALL_PREFIX=$b/ompi/usr/lib/x86_64-linux-gnu/pmix2
    export PATH=$OPAL_PREFIX/bin:$PATH
    say "executables from the bundle ($(head -1 "$build_info" 2> /dev/null))"
else
    # the tree's build (make check names it in ISTHMUS; VPATH builds too)
    tb=$(dirname "${ISTHMUS:-$top/isthmus}")
    bin=$tb
    configs=$top/share/configs
    if [ -x "$tb/isthmus" ] && grep -q 'define HAVE_CUDA 1' "$tb/autoconf.h" 2> /dev/null; then
        tests=$tb/tests/gpu
        say "executables from the tree (configured --with-cuda)"
    elif [ -x "$tb/isthmus" ] && [ "$gpus" -eq 0 ]; then
        say "executables from the tree, built without CUDA: the CPU halves only"
    else
        say "no bundle (tests/gpu/bundle.sh) and no --with-cuda build in $tb"
        exit 1
    fi
fi
isthmus=$bin/isthmus
if [ ! -x "$isthmus" ]; then
    say "no executable at $isthmus: the bundle or the build is incomplete"
    exit 1
fi
# CUDA's large libraries from the machine: NVIDIA's wheels, else the toolkit
cuda_dirs=$(py - 2> /dev/null <<'EOF'
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
# compute-sanitizer for --rerun: the toolkit's, else PATH's
sanitizer=
for s in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
    "$(command -v compute-sanitizer 2> /dev/null)"; do
    [ -n "$s" ] && [ -x "$s" ] && { sanitizer=$s; break; }
done
SAN="$sanitizer --tool memcheck --leak-check no --print-limit 20 --error-exitcode 99"

# Open MPI on one machine: shared memory and TCP only, no fabric probing;
# single-copy off (gVisor has no process_vm_readv)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx,pt2pt OMPI_MCA_mtl=^ofi,psm,psm2
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
# NCCL says why an init or a collective failed (else only "unhandled system error")
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

{ # the device, in one small file
    echo "run.sh on $(hostname), $(date -u '+%Y-%m-%d %H:%M:%S UTC'); budget $budget s; ${rerun:+rerun $rerun}"
    [ -n "$build_info" ] && cat "$build_info"
    if [ "$gpus" -gt 0 ]; then
        nvidia-smi -L
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current,clocks.max.sm \
            --format=csv
    else
        echo "no GPU: nvidia-smi -L lists none"
    fi
    echo "compute-sanitizer: ${sanitizer:-none} $([ -n "$sanitizer" ] && "$sanitizer" --version 2>&1 | tail -1)"
    echo "nvcc: $(nvcc --version 2> /dev/null | tail -1)"
    echo "python3: $(py -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
    echo "kernel: $(uname -r); cores: $(nproc); CUDA libraries: $cuda_dirs"
} > "$info" 2>&1
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
small=$configs/small.ini
S50="--set train.steps=50 --set data.eval_bytes=65536 --set train.threads=$threads"
PRE="--set train.steps=12 --set data.eval_bytes=4096 --set train.threads=$threads --set train.precond_every=3"

# shellcheck source=tests/gpu/run_checks.sh
. "$top/tests/gpu/run_checks.sh"

# --- the run ------------------------------------------------------------------
if [ -z "$rerun" ]; then
    for id in $ids; do
        section "$id"
        pack
    done
else
    # the check alone: a kernel fault reported at its launch, NCCL's whole story
    say "rerun of $rerun: CUDA_LAUNCH_BLOCKING=1 and NCCL_DEBUG=INFO, then compute-sanitizer memcheck"
    tag="[blocking]"
    export CUDA_LAUNCH_BLOCKING=1 NCCL_DEBUG=INFO
    section "$rerun"
    unset CUDA_LAUNCH_BLOCKING
    tag=
    pack
    memcheck_of "$rerun"
fi

echo
echo "run.sh: $(($(date +%s) - t_start)) s of $budget on $(hostname) ($gpu_name), $(date -u +%Y-%m-%d)"
cat "$table"
exec 1>&3 2>&4 3>&- 4>&- # tee sees the end: its last lines are in run.log (and out) before the last pack
wait "$tee_pid"
pack
[ $failed -eq 0 ]
