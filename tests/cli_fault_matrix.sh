#!/bin/bash
# cli_fault_matrix.sh — scripts/fault_matrix.sh at reduced size: a site
# hurt at seeded random moments of a federated run with payloads of ~1 MB
# (tiny.ini, codec none: the setting in which Open MPI's transport hung),
# killed (rank, whole job), stopped past the deadline or cut off (the
# emulated WAN's forwarder drops every packet), in diloco and streaming.
# Across the emulated WAN where network namespaces can be made (the cut
# needs them), else over loopback without the cut. Each trial must log the loss within outer.timeout + 5 s (and
# the steps before the exchange that finds it), train on, take the site
# back when it restarts, and leave nothing running (the script's rules).
# The full matrix (every mode, fault, payload and layout, 200+ trials) is
# a script run: docs/benchmarks.md.
. "$TOP_SRCDIR/tests/lib.sh"
out="$WORK/matrix"
faults="kill-job stop kill-rank cut" seed=31 drawn="streaming cut, diloco kill-job"
probe=isthmus-fm-probe-$$
if [ "$(id -u)" != 0 ] || ! ip netns add "$probe" 2> /dev/null; then
    echo "# network namespaces unavailable: the trials run over loopback, without the cut"
    faults="kill-job stop kill-rank" seed=12 drawn="streaming stop, diloco kill-job"
else
    ip netns del "$probe"
fi
if MODES="diloco streaming" FAULTS="$faults" PAYLOADS=medium RANKS=1 WINDOW=15 \
    ISTHMUS="$ISTHMUS" "$TOP_SRCDIR/scripts/fault_matrix.sh" "$out" 2 $seed > "$WORK/fm.log" 2>&1; then
    pass "fault matrix, 2 seeded trials (~1 MB payloads; $drawn): $(tail -1 "$WORK/fm.log")"
else
    fail "fault matrix: $(grep -v pass "$out/matrix.tsv" | tail -3 | tr '\n' ' ') $(tail -1 "$WORK/fm.log")"
fi
finish || exit 1
