#!/bin/bash
# cli_fault_matrix.sh — scripts/fault_matrix.sh at reduced size: a site
# hurt at seeded random moments of a federated run with payloads of ~1 MB
# (tiny.ini, codec none: the setting in which Open MPI's transport hung),
# killed (rank, whole job), stopped past the deadline or cut off (the
# emulated WAN's forwarder drops every packet), in diloco and streaming.
# Across the emulated WAN where it can be set up (the cut needs it), else
# over loopback without the cut; either way the draw must hold the fault
# it was chosen for (the generator is the script's own: the same trials
# with any awk). Each trial must log the loss within outer.timeout + 5 s (and
# the steps before the exchange that finds it), train on, take the site
# back when it restarts, and leave nothing running (the script's rules).
# The full matrix (every mode, fault, payload and layout, 200+ trials) is
# a script run: docs/benchmarks.md.
. "$TOP_SRCDIR/tests/lib.sh"
out="$WORK/matrix"
# the cut needs the emulated WAN (root, network namespaces, a TUN device):
# tried first; without it the trials run over loopback without the cut
faults="kill-job stop kill-rank cut" seed=13 want="cut"
if [ "$(id -u)" != 0 ] || ! "$TOP_SRCDIR/tests/wan/wan.sh" up "$WORK/probe" 1gbit 1 > "$WORK/probe.log" 2>&1; then
    echo "# the emulated WAN is unavailable ($(tail -1 "$WORK/probe.log" 2>/dev/null)): over loopback, without the cut"
    faults="kill-job stop kill-rank" seed=9 want="stop"
fi
"$TOP_SRCDIR/tests/wan/wan.sh" down "$WORK/probe" > /dev/null 2>&1
if MODES="diloco streaming" FAULTS="$faults" PAYLOADS=medium RANKS=1 WINDOW=15 \
    ISTHMUS="$ISTHMUS" "$TOP_SRCDIR/scripts/fault_matrix.sh" "$out" 2 $seed > "$WORK/fm.log" 2>&1; then
    drawn=$(awk -F'\t' 'NR > 1 { printf "%s%s %s", n++ ? ", " : "", $2, $5 }' "$out/matrix.tsv")
    pass "fault matrix, 2 seeded trials (~1 MB payloads; $drawn): $(tail -1 "$WORK/fm.log")"
else
    fail "fault matrix: $(grep -v pass "$out/matrix.tsv" | tail -3 | tr '\n' ' ') $(tail -1 "$WORK/fm.log")"
fi
# the draw must hold the fault this run is for (the seed was chosen for it)
awk -F'\t' -v f="$want" 'NR > 1 && $5 == f { found = 1 } END { exit !found }' "$out/matrix.tsv" 2>/dev/null &&
    pass "the trials include a $want" || fail "no $want among the trials drawn: $(cut -f2,5 "$out/matrix.tsv" | tr '\n' ' ')"
finish || exit 1
