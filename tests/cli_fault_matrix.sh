#!/bin/bash
# cli_fault_matrix.sh — scripts/fault_matrix.sh at reduced size: a site
# hurt at seeded random moments of a federated run with payloads of ~1 MB
# (tiny.ini, codec none: the setting in which Open MPI's transport hung),
# killed (rank, whole job) or stopped past the deadline, in diloco and
# streaming. Each trial must log the loss within outer.timeout + 5 s (and
# the steps before the exchange that finds it), train on, take the site
# back when it restarts, and leave nothing running (the script's rules).
# The full matrix (every mode, fault, payload and layout, 200+ trials) is
# a script run: docs/benchmarks.md.
. "$TOP_SRCDIR/tests/lib.sh"
out="$WORK/matrix"
if MODES="diloco streaming" FAULTS="kill-job stop kill-rank" PAYLOADS=medium RANKS=1 WINDOW=15 \
    ISTHMUS="$ISTHMUS" "$TOP_SRCDIR/scripts/fault_matrix.sh" "$out" 2 12 > "$WORK/fm.log" 2>&1; then
    pass "fault matrix, 2 seeded trials (~1 MB payloads; streaming stop, diloco kill-job): $(tail -1 "$WORK/fm.log")"
else
    fail "fault matrix: $(grep -v pass "$out/matrix.tsv" | tail -3 | tr '\n' ' ') $(tail -1 "$WORK/fm.log")"
fi
finish || exit 1
