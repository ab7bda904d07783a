#!/bin/sh
# cli_faults.sh — no hang, and nothing between sites outside the link:
#  - a failure on some ranks ends the whole job within [outer] timeout + 30 s
#    with one line naming the rank and its site: a muted site with 2 learners
#    per site (diloco, streaming, butterfly), a NaN loss on one site, an
#    allocation failure on one rank during training and during set-up;
#  - a two-site diloco run makes no inter-site MPI call between outer steps
#    (a PMPI shim counts them: as many for 8 inner steps as for 16);
#  - a checkpoint write that hangs is ended by the [checkpoint] timeout watchdog;
#  - the default build carries no instructions beyond the baseline ISA.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
FOUR="--set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1"
TIMEOUT=5

# fails NAME PATTERN [env...] -- args: exit non-zero within timeout + 30 s and
# an error line matching PATTERN
fails() {
    local name=$1 pattern=$2
    shift 2
    local envs=""
    while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
    shift
    local t0 rc=0 dt
    t0=$(date +%s)
    env $envs timeout $((TIMEOUT + 30)) mpirun -q --oversubscribe -np 4 "$ISTHMUS" train "$T" \
        --set train.out_dir="$WORK/$name" --set data.eval_bytes=4096 --set outer.timeout=$TIMEOUT $FOUR "$@" \
        > "$WORK/$name.log" 2>&1 || rc=$?
    dt=$(($(date +%s) - t0))
    if [ "$rc" = 124 ]; then
        fail "$name: still running after $((TIMEOUT + 30)) s (hang)"
    elif [ "$rc" = 0 ]; then
        fail "$name: exit 0, expected a failure"
    elif ! grep -Eq -- "$pattern" "$WORK/$name.log"; then
        fail "$name: exit $rc but no line /$pattern/: $(grep error "$WORK/$name.log" | head -3)"
    else
        pass "$name: exit $rc after ${dt} s: $(grep -E -- "$pattern" "$WORK/$name.log" | head -1 | cut -c1-110)"
    fi
}

DILOCO="--set outer.mode=diloco --set outer.inner_steps=2 --set train.steps=8"
fails muted_diloco "error: rank [0-9] \(site a\): link: .*nothing from world rank [23] within \[outer\] timeout = $TIMEOUT s" \
    ISTHMUS_LINK_MUTE=b:1 -- $DILOCO
fails muted_streaming "error: rank [0-9] \(site [ab]\): link: .*within \[outer\] timeout" \
    ISTHMUS_LINK_MUTE=b:1 -- --set outer.mode=streaming --set outer.inner_steps=4 --set outer.overlap=1 --set train.steps=8
fails muted_butterfly "error: rank [0-9] \(site [ab]\): link: butterfly .*within \[outer\] timeout" \
    ISTHMUS_LINK_MUTE=b:1 -- --set outer.mode=butterfly --set outer.inner_steps=2 --set train.steps=12
fails nan_site_b "error: rank 2 \(site b\): step 3: loss is nan" ISTHMUS_NAN_AT=b:3 -- $DILOCO
fails nan_sync "error: rank 0 \(site a\): step 2: loss is nan" ISTHMUS_NAN_AT=a:2 -- --set train.steps=6
fails alloc_step "error: rank 3 \(site b\): .*out of memory" ISTHMUS_FAIL_ALLOC=3:5 -- $DILOCO
fails alloc_setup "error: rank 1: .*out of memory" ISTHMUS_FAIL_ALLOC=1:0 -- $DILOCO

# a deadline that fires at once (two sites of one rank): exit 1, every line
# the deadline's, no crash — in every mode and codec
# not_deadline: the lines of stdin that are neither a deadline line nor
# Open MPI's own noise while it tears an aborted job down — libevent's
# "[warn] Epoll MOD(1) on fd N failed", and the shared-memory transport's
# "[host:pid] Read -1, expected N, errno = 3" (a single-copy read from a peer
# that has already exited: ESRCH)
not_deadline() {
    grep -v "within \[outer\] timeout = 1e-06 s" |
        grep -v "^\[warn\] Epoll" |
        grep -Ev "^\[[^]]+:[0-9]+\] Read -1, expected [0-9]+, errno = 3$" || true
}
for mode in sync diloco streaming butterfly; do
    for codec in none bf16 int8 fp4; do
        rc=0
        timeout 60 mpirun -q --oversubscribe -np 2 "$ISTHMUS" train "$T" --set train.out_dir="$WORK/d_$mode$codec" \
            --set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=$mode --set outer.codec=$codec \
            --set outer.inner_steps=2 --set train.steps=6 --set outer.timeout=1e-6 --set data.eval_bytes=4096 \
            > /dev/null 2> "$WORK/d.err" || rc=$?
        others=$(not_deadline < "$WORK/d.err" | grep -c .)
        # at least one deadline line, and nothing else of isthmus's
        if [ "$rc" = 1 ] && [ "$others" = 0 ] && grep -q "within \[outer\] timeout = 1e-06 s" "$WORK/d.err"; then
            pass "deadline 1e-6 s, $mode/$codec: exit 1, only deadline lines ($(grep -c . "$WORK/d.err"))"
        else
            fail "deadline 1e-6 s, $mode/$codec: exit $rc; lines other than deadline lines: $(not_deadline < "$WORK/d.err" | head -c 300); all: $(head -c 300 "$WORK/d.err")"
        fi
    done
done

# a checkpoint write that hangs (a rank stuck in parallel I/O): the watchdog
# of [checkpoint] timeout ends the job
fails ckpt_stall "error: rank [0-3] \(site b\): checkpoint of step 2 did not finish within 1 s" \
    ISTHMUS_CKPT_STALL=b:60 -- $DILOCO --set checkpoint.every=2 --set checkpoint.timeout=1

# inter-site MPI calls counted by a PMPI shim: the same for 2 outer steps of
# 4 inner steps and 2 outer steps of 8 (so none between outer steps)
SHIM=$(dirname "$ISTHMUS")/tests/libpmpi_sites.so
count_calls() { # count_calls NAME H STEPS
    rm -f "$WORK/$1.pmpi".*
    ISTHMUS_PMPI_SITES=2,2 ISTHMUS_PMPI_OUT="$WORK/$1.pmpi" timeout 300 mpirun -q --oversubscribe -np 4 \
        -x LD_PRELOAD="$SHIM" -x ISTHMUS_PMPI_SITES -x ISTHMUS_PMPI_OUT "$ISTHMUS" train "$T" \
        --set train.out_dir="$WORK/$1" --set data.eval_bytes=4096 $FOUR --set outer.mode=diloco \
        --set outer.inner_steps="$2" --set train.steps="$3" --set outer.codec=int8 > "$WORK/$1.log" 2>&1 || return 1
    cat "$WORK/$1.pmpi".* | awk '{n += $2} END {print n + 0}'
}
short=$(count_calls pmpi_short 4 8) || fail "pmpi run (8 steps) failed: $(tail -3 "$WORK/pmpi_short.log")"
long=$(count_calls pmpi_long 8 16) || fail "pmpi run (16 steps) failed: $(tail -3 "$WORK/pmpi_long.log")"
if [ -n "$short" ] && [ "$short" -gt 0 ] && [ "$short" = "$long" ]; then
    pass "diloco: $short inter-site MPI calls for 2 outer steps of 4 inner steps and of 8: none between outer steps"
else
    fail "inter-site MPI calls: $short (H=4, 8 steps) vs $long (H=8, 16 steps): $(cat "$WORK/pmpi_long.pmpi.0" | tr '\n' ' ')"
fi
grep -q '"outer":2,' "$WORK/pmpi_long/metrics.jsonl" &&
    pass "the 16-step run took its 2 outer steps" || fail "no second outer step in the 16-step run"

# the default build is portable: no AVX/AVX-512 registers in isthmus's own code
if grep -q -- "-march=native" "$(dirname "$ISTHMUS")/Makefile" 2>/dev/null; then
    pass "# SKIP built with --enable-native"
elif ! command -v objdump > /dev/null; then
    pass "# SKIP objdump not installed"
else
    n=$(objdump -d "$ISTHMUS" | grep -c '%[yz]mm')
    [ "$n" = 0 ] && pass "default build: no ymm/zmm instructions (runs on any x86-64)" ||
        fail "default build uses $n AVX/AVX-512 instructions"
fi
finish || exit 1
