# lib.sh — helpers shared by the shell tests (sourced, not run).
# Environment from Makefile.am: ISTHMUS (the executable), TOP_SRCDIR, DATA_DIR.
set -u
: "${ISTHMUS:?run through make check}"
# metric, eval_bpb, last_bpb, wait_line, pair_start, pair_wait, federated_pair
. "$TOP_SRCDIR/scripts/lib.sh"
CONFIGS="$TOP_SRCDIR/share/configs"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/isthmus-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILS=0
NCHECK=0

# TAP output: one "ok N - ..." / "not ok N - ..." per check, plan at the end
fail() { NCHECK=$((NCHECK + 1)); FAILS=$((FAILS + 1)); echo "not ok $NCHECK - $*"; }
pass() { NCHECK=$((NCHECK + 1)); echo "ok $NCHECK - $*"; }
note() { echo "# $*"; }
# verdicts FILE N[+] WHAT [PREFIX]: a checker's output (lines "ok TEXT",
# "not ok TEXT", "# note") as checks; it must have given N verdicts (N+: at
# least N), or it broke (fail naming WHAT and its last lines)
verdicts() {
    local file=$1 want=$2 what=$3 prefix=${4:-} l n
    while IFS= read -r l; do
        case "$l" in
        "ok "*) pass "$prefix${l#ok }" ;;
        "not ok "*) fail "$prefix${l#not ok }" ;;
        "#"*) echo "$l" ;;
        esac
    done < "$file"
    n=$(grep -c '^\(not \)\{0,1\}ok ' "$file")
    if [ "${want%+}" != "$want" ]; then [ "$n" -ge "${want%+}" ]; else [ "$n" = "$want" ]; fi ||
        fail "$what broke ($n verdicts, $want expected): $(tail -5 "$file")"
}

# expect_exit CODE PATTERN -- command...: exit status CODE and stderr
# matching the extended regex PATTERN, in one line.
expect_exit() {
    local code=$1 pattern=$2
    shift 3
    local err="$WORK/stderr" rc=0
    timeout 120 "$@" >"$WORK/stdout" 2>"$err" || rc=$?
    if [ "$rc" -ne "$code" ]; then
        fail "'$*' exited $rc, expected $code; stderr: $(head -c 500 "$err")"
    elif ! grep -Eq -- "$pattern" "$err"; then
        fail "'$*' stderr lacks /$pattern/: $(head -c 500 "$err")"
    elif [ "$code" -ne 0 ] && [ "$(grep -c . "$err")" -ne 1 ]; then
        fail "'$*' printed $(grep -c . "$err") error lines, expected one: $(head -c 500 "$err")"
    else
        pass "$* -> exit $rc"
    fi
}

# Print the TAP plan; returns non-zero when any check failed, so each test
# ends with `finish || exit 1` and its exit status fails too.
finish() {
    echo "1..$NCHECK"
    [ "$FAILS" -eq 0 ]
}

# mpirun for tests: quiet (errors come from isthmus alone), oversubscribed
# (more ranks than cores), with a deadline.
mpi() { # mpi NP command...
    local np=$1
    shift
    # -k: a rank that failed an assertion leaves the others in a barrier, and
    # mpirun may not end on TERM alone
    timeout -k 20 300 mpirun -q --oversubscribe -np "$np" "$@"
}

# value of a numeric JSON field on the metrics line of step N
step_field() { metric "$3" "$1" "^{\"step\":$2,"; } # step_field FILE STEP FIELD

# |a-b| <= tol * |b|
close_to() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= t * m) }'; }

# losses of a run directory, one "step loss" line per step
losses() { grep '^{"step"' "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/' | sort -n | uniq; }
exact() { # exact NAME_A NAME_B: same loss at every step and identical weights
    if [ -n "$(losses "$WORK/$1")" ] && [ "$(losses "$WORK/$1")" = "$(losses "$WORK/$2")" ]; then
        pass "$2: losses bit-identical to the uninterrupted run ($(losses "$WORK/$1" | wc -l) steps)"
    else
        fail "$2: losses differ: $(diff <(losses "$WORK/$1") <(losses "$WORK/$2") | head -4)"
    fi
    if h5diff "$WORK/$1/model.h5" "$WORK/$2/model.h5" /model /model > /dev/null 2>&1; then
        pass "$2: final weights bit-identical"
    else
        fail "$2: final weights differ"
    fi
}

# run NP NAME [args...]: train $T (the caller's config) into $WORK/NAME,
# logging every step, appending its output to $WORK/NAME.log
run() {
    local np=$1 name=$2
    shift 2
    mpi "$np" "$ISTHMUS" train "$T" --set train.out_dir="$WORK/$name" --set train.log_every=1 \
        --set data.eval_bytes=4096 "$@" >> "$WORK/$name.log" 2>&1
}
# run_failed NAME: a failed check naming the run NAME, with its log's last lines
run_failed() { fail "$1: training failed: $(tail -3 "$WORK/$1.log")"; }

# Exit the test as skipped (visibly) unless network namespaces can be made
# here (root, and not a sandbox without them): tests/wan's harness needs them.
need_netns() {
    local probe=isthmus-netns-probe-$$
    if [ "$(id -u)" != 0 ] || ! ip netns add "$probe" 2> /dev/null; then
        echo "1..0 # SKIP network namespaces unavailable (root and ip netns are needed)"
        exit 0
    fi
    ip netns del "$probe"
}
