#!/bin/sh
# mpi_units.sh — the CMocka tests that need several ranks, run through mpirun.
. "$TOP_SRCDIR/tests/lib.sh"
BIN=$(dirname "$ISTHMUS")/tests/test_expert_parallel
for np in 2 4; do
    if mpi "$np" "$BIN" > "$WORK/ep$np.log" 2>&1; then
        pass "expert parallelism over $np ranks equals one rank: $(grep -c '^ok' "$WORK/ep$np.log") CMocka checks"
    else
        fail "test_expert_parallel with $np ranks: $(grep -E 'not ok|ERROR|error' "$WORK/ep$np.log" | head -5)"
    fi
done
BF=$(dirname "$ISTHMUS")/tests/test_butterfly
for np in 2 4 8; do
    if mpi "$np" "$BF" > "$WORK/bf$np.log" 2>&1; then
        pass "butterfly with $np learners: pairing, exact mean after k rounds, partner-only waits, spread probe ($(grep -c '^ok' "$WORK/bf$np.log") CMocka checks)"
    else
        fail "test_butterfly with $np ranks: $(grep -E 'not ok|ERROR|error' "$WORK/bf$np.log" | head -5)"
    fi
done
SP=$(dirname "$ISTHMUS")/tests/test_sparse_sum
if mpi 3 "$SP" > "$WORK/sp.log" 2>&1; then
    pass "sparse (topk) sums over three sites, all and senders, one site rejected: bit-identical to direct sums"
else
    fail "test_sparse_sum: $(grep -E 'not ok|ERROR|error|differ' "$WORK/sp.log" | head -5)"
fi
SR=$(dirname "$ISTHMUS")/tests/test_split_reduce
for np in 3 4; do
    if mpi "$np" "$SR" > "$WORK/sr$np.log" 2>&1; then
        pass "experts split over two sites, $np ranks: dense chunks the run's average, experts the site's own, only dense frames on the link (none and int8)"
    else
        fail "test_split_reduce with $np ranks: $(grep -E 'not ok|ERROR|error|rank [0-9]+:' "$WORK/sr$np.log" | head -5)"
    fi
done
EC=$(dirname "$ISTHMUS")/tests/test_expert_copies
if mpi 4 "$EC" > "$WORK/ec.log" 2>&1; then
    pass "split experts' copies, 4 ranks: placed once each, three refreshes bit for bit as a replay of the rule (none and fp4), one frame per tensor and pair of ranks, a lost site's experts assembled from the writer's copies"
else
    fail "test_expert_copies: $(grep -E 'not ok|ERROR|error|rank [0-9]+:' "$WORK/ec.log" | head -5)"
fi
WI=$(dirname "$ISTHMUS")/tests/test_wire
if mpi 3 "$WI" > "$WORK/wire.log" 2>&1; then
    pass "the inter-site TCP transport: whole messages in order over 3 streams, backpressure past its buffer, a hand-made peer (bad MAC refused, malformed chunk fails it), a dead peer never blocks, a broken one gives back its room, cannot make a stalled stream spin nor slip a chunk in twice, chunks go to the stream with room ($(grep -c '^ok' "$WORK/wire.log") CMocka checks)"
else
    fail "test_wire: $(grep -E 'not ok|ERROR|error|Failure' "$WORK/wire.log" | head -5)"
fi
finish || exit 1
