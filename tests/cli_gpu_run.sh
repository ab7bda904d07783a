#!/bin/bash
# cli_gpu_run.sh — tests/gpu/run.sh, the one command for a GPU machine
# (docs/benchmarks.md, "GPU"), where there is no GPU:
#  - its arguments: --list (the checks, the kernels first, the bench last);
#    a bad --budget, ISTHMUS_GPU_BUDGET, --rerun ID or unknown argument
#    stops it with one line, exit 2;
#  - a budget too small for any section: every section a SKIP row (the
#    budget's where it would run, "no GPU" or "not built" where it would
#    not), exit 0, and in $OUT exactly the table, the info file and the logs'
#    archive (the device tool brings back at most 8 files);
#  - --rerun ID: that check's rows tagged [blocking], then its memcheck rows
#    (SKIP: no GPU), in the same three files;
#  - a TERM while a command runs (small50's CPU run): run.sh stops it, packs
#    what ran (that command's log in the archive) and exits 143 at once.
# The CPU halves are not run to the end here (minutes on 2 cores). Skipped
# where a GPU is visible: there run.sh itself is the test.
. "$TOP_SRCDIR/tests/lib.sh"
if nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
    echo "1..0 # SKIP a GPU is visible: run tests/gpu/run.sh itself"
    exit 0
fi
RUN=$TOP_SRCDIR/tests/gpu/run.sh
export TMPDIR=$WORK/tmp # run.sh's work directories, to find its commands by
mkdir -p "$TMPDIR"

ids=$(bash "$RUN" --list)
if [ "$(echo "$ids" | wc -l)" = 12 ] && [ "$(echo "$ids" | head -1)" = test_kernels_gpu ] &&
    [ "$(echo "$ids" | sed -n 6p)" = small50 ] && [ "$(echo "$ids" | tail -1)" = bench ]; then
    pass "--list: 12 checks, the GPU tests first, then small50, the bench last"
else
    fail "--list: $(echo "$ids" | tr '\n' ' ')"
fi
expect_exit 2 "^run.sh: --rerun 'bogus': not a check of the table \(one of: test_kernels_gpu .* bench\)$" -- \
    bash "$RUN" --rerun bogus
expect_exit 2 "^run.sh: --rerun needs a value" -- bash "$RUN" --rerun
expect_exit 2 "^run.sh: --budget '0': a whole number of seconds" -- bash "$RUN" --budget 0
expect_exit 2 "^run.sh: --budget '5m': a whole number of seconds" -- bash "$RUN" --budget=5m
expect_exit 2 "^run.sh: ISTHMUS_GPU_BUDGET 'soon': a whole number of seconds" -- env ISTHMUS_GPU_BUDGET=soon bash "$RUN"
expect_exit 2 "^run.sh: unknown argument '--frob'" -- bash "$RUN" --frob

# out_files DIR WHAT: exactly the three files the device tool is to bring back
out_files() {
    local got
    got=$(ls -A "$1" | tr '\n' ' ')
    if [ "$got" = "gpu-info.txt gpu-logs.tar.gz gpu-table.txt " ]; then
        pass "$2: \$OUT holds the table, the info file and the logs' archive (3 files of the 8 that come back)"
    else
        fail "$2: \$OUT holds '$got'"
    fi
}
# archive_has DIR MEMBER WHAT
archive_has() {
    if python3 -c 'import sys, tarfile; sys.exit(sys.argv[2] not in tarfile.open(sys.argv[1]).getnames())' \
        "$1/gpu-logs.tar.gz" "$2"; then
        pass "$3: gpu-logs.tar.gz holds $2"
    else
        fail "$3: gpu-logs.tar.gz lacks $2: $(python3 -c 'import sys, tarfile; print(tarfile.open(sys.argv[1]).getnames())' "$1/gpu-logs.tar.gz" 2>&1)"
    fi
}

# --- a budget that fits no section ---------------------------------------------------
out=$WORK/out
rc=0
OUT=$out timeout 120 bash "$RUN" --budget 4 > "$WORK/run.txt" 2>&1 || rc=$?
table=$out/gpu-table.txt
[ $rc = 0 ] && pass "--budget 4 without a GPU: exit 0" || fail "--budget 4: exit $rc: $(tail -3 "$WORK/run.txt")"
out_files "$out" "--budget 4"
missing=
for id in $ids; do grep -q "^$id  *| " "$table" || missing="$missing $id"; done
[ -z "$missing" ] && pass "a row for each of the 12 checks" || fail "no row for:$missing"
if ! grep -q '| FAIL ' "$table" && ! grep -q '| PASS ' "$table" && [ "$(grep -c '| SKIP ' "$table")" -ge 12 ]; then
    pass "every row SKIP ($(grep -c '| SKIP ' "$table") rows)"
else
    fail "rows other than SKIP: $(grep -v '| SKIP ' "$table" | sed 1d | head -3)"
fi
for id in small50 optim two_site; do
    if grep -q "^$id .*| SKIP   | budget: [0-9]* s left of 4 s, needs ~[0-9]* s (alone: --rerun $id)" "$table"; then
        pass "$id: SKIP naming the budget"
    else
        fail "$id: no SKIP naming the budget: $(grep "^$id " "$table")"
    fi
done
grep -q '^bench .*| SKIP   | no GPU' "$table" && pass "bench: SKIP, no GPU" || fail "bench: $(grep '^bench ' "$table")"
grep -q '^id  *| check  *| result | figure' "$table" && [ "$(tail -n "$(wc -l < "$table")" "$WORK/run.txt")" = "$(cat "$table")" ] &&
    pass "the table (with its header) ends run.sh's output" || fail "the table is not run.sh's last lines"
grep -q 'budget 4 s' "$out/gpu-info.txt" && grep -q 'no GPU' "$out/gpu-info.txt" &&
    pass "gpu-info.txt: the budget, no GPU" || fail "gpu-info.txt: $(cat "$out/gpu-info.txt")"
archive_has "$out" logs/run.log "--budget 4"

# --- the rerun mode ------------------------------------------------------------------
out=$WORK/out_rerun
rc=0
OUT=$out timeout 120 bash "$RUN" --rerun small50 --budget 4 > "$WORK/rerun.txt" 2>&1 || rc=$?
table=$out/gpu-table.txt
[ $rc = 0 ] && pass "--rerun small50: exit 0" || fail "--rerun small50: exit $rc: $(tail -3 "$WORK/rerun.txt")"
out_files "$out" "--rerun small50"
if grep -q '^small50 .*\[blocking\]  *| SKIP   | budget: ' "$table" && [ "$(sed 1d "$table" | grep -vc '^small50 ')" = 0 ]; then
    pass "--rerun small50: its row alone, tagged [blocking], SKIP naming the budget"
else
    fail "--rerun small50: $(sed 1d "$table" | head -3)"
fi
n=$(grep -c '^small50 .*| memcheck: .*| SKIP   | no GPU' "$table")
[ "$n" = 3 ] && pass "--rerun small50: 3 memcheck rows, SKIP: no GPU" || fail "--rerun small50: $n memcheck rows: $(cat "$table")"
grep -q 'rerun small50' "$out/gpu-info.txt" && pass "gpu-info.txt names the rerun" || fail "gpu-info.txt: $(head -1 "$out/gpu-info.txt")"

# --- stopped from outside ----------------------------------------------------------
out=$WORK/out_term
OUT=$out bash "$RUN" --budget 300 > "$WORK/term.txt" 2>&1 &
pid=$!
for _ in $(seq 240); do
    ls "$TMPDIR"/isthmus-gpu-run.*/logs/cpu50.log > /dev/null 2>&1 && break
    sleep 0.25
done
sleep 1
t0=$(date +%s)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
dt=$(($(date +%s) - t0))
[ $rc = 143 ] && [ "$dt" -le 15 ] && pass "TERM during small50's CPU run: exit 143 after $dt s" ||
    fail "TERM: exit $rc after $dt s: $(tail -3 "$WORK/term.txt")"
out_files "$out" "TERM"
archive_has "$out" logs/cpu50.log "TERM"
sleep 1
if pgrep -f "$TMPDIR/isthmus-gpu-run" > /dev/null; then
    fail "TERM: run.sh's command still runs: $(pgrep -af "$TMPDIR/isthmus-gpu-run" | head -2)"
else
    pass "TERM: run.sh's command stopped with it"
fi
# (Open MPI may leave its session directory there: not run.sh's)
if ls -d "$TMPDIR"/isthmus-gpu-run.* > /dev/null 2>&1; then
    fail "TERM: left $(ls -d "$TMPDIR"/isthmus-gpu-run.*)"
else
    pass "TERM: run.sh's work directory removed"
fi
finish || exit 1
