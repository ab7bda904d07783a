#!/bin/sh
# cli_outer.sh — DiLoCo and Streaming DiLoCo across two sites through mpirun:
#  - diloco with H=1, outer lr 1, momentum 0 and plain-SGD inner steps
#    reproduces sync (same weights within float32 tolerance);
#  - streaming over sites of different layouts keeps every learner's anchor
#    bit-identical, carries far fewer bytes than sync, and logs each outer step;
#  - a corrupted payload (test hook) is rejected by every site, training goes on;
#  - a site that sends late (test hook) does not stop the others before tau,
#    and a delay beyond tau completes without deadlock.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
TWO="--set site.a.ranks=1 --set site.b.ranks=1 --set site.a.micro_batch=6 --set site.b.micro_batch=2"
train() { # train NP NAME [args...]
    local np=$1 name=$2
    shift 2
    mpi "$np" "$ISTHMUS" train "$T" --set train.out_dir="$WORK/$name" --set train.log_every=1 \
        --set data.eval_bytes=4096 "$@" > "$WORK/$name.log" 2>&1 || fail "$name: training failed: $(tail -3 "$WORK/$name.log")"
}

# 1. diloco(H=1, lr 1, momentum 0, SGD) == sync, sites with different batch sizes
SGD="--set train.optimizer=sgd --set train.clip=0 --set train.lr=0.05 --set train.min_lr=0.05 --set train.steps=6"
train 2 sync_sgd $TWO $SGD
train 2 diloco_h1 $TWO $SGD --set outer.mode=diloco --set outer.inner_steps=1 --set outer.lr=1 --set outer.momentum=0
if h5diff -d 2e-6 "$WORK/sync_sgd/model.h5" "$WORK/diloco_h1/model.h5" /model /model > "$WORK/diff" 2>&1; then
    pass "diloco H=1 (outer lr 1, momentum 0, SGD) = sync within 2e-6"
else
    fail "diloco H=1 differs from sync: $(grep 'differences found' "$WORK/diff" | head -3)"
fi
n=$(grep -c '^{"outer"' "$WORK/diloco_h1/metrics.jsonl")
[ "$n" = 6 ] && pass "diloco H=1: one outer step per inner step ($n)" || fail "diloco H=1: $n outer lines"

# 2. streaming, fp4, sites of different layouts (2 ranks as 1 learner + 4 ranks as 2 learners of 2)
HET="--set site.a.ranks=2 --set site.b.ranks=4 --set site.b.learner_ranks=2 --set site.b.micro_batch=4"
STREAM="--set outer.mode=streaming --set outer.inner_steps=8 --set outer.overlap=2 --set outer.codec=fp4 --set train.steps=24 --set train.check_replicas=8"
train 6 stream $HET $STREAM
grep -q "replicas identical at step 24: 3 learner(s)" "$WORK/stream.log" && [ "$(grep -c 'replicas identical' "$WORK/stream.log")" -ge 4 ] &&
    pass "streaming: 3 learners on 2 sites share the same anchor at every check" || fail "streaming replicas: $(grep replicas "$WORK/stream.log")"
M="$WORK/stream/metrics.jsonl"
grep -q '"outer":1,"fragment":1,"started_step":4,"step":6,' "$M" && pass "fragment 1 starts after step 4 (offset H/P) and applies tau=2 steps later" || fail "schedule: $(grep '"outer":1,' "$M")"
grep -q '"outer":2,"fragment":0,"started_step":8,"step":10,' "$M" && pass "fragment 0 starts after step 8" || fail "schedule: $(grep '"outer":2,' "$M")"
red=$(sed -n 's/.*"summary":"traffic".*"reduction":\([0-9.]*\).*/\1/p' "$M")
awk -v r="$red" 'BEGIN {exit !(r > 20)}' && pass "streaming fp4 H=8: $red x fewer inter-site bytes than sync" || fail "traffic reduction '$red'"
err=$(grep '^{"outer"' "$M" | head -1 | sed 's/.*"codec_rel_error":\([^,]*\),.*/\1/')
awk -v e="$err" 'BEGIN {exit !(e > 0.01 && e < 0.3)}' && pass "fp4 relative error logged ($err)" || fail "codec_rel_error '$err'"
for set in prose tech; do
    b=$(eval_bpb "$M" "$set")
    awk -v b="$b" 'BEGIN {exit !(b > 0 && b < 7.5)}' && pass "streaming model learns ($set bpb $b)" || fail "$set bpb '$b'"
done

# hierarchical: site b's two learners average first, the link carries one
# float32 payload per site per outer step (16 bytes per parameter counted:
# 2 sites x (sent + received) x 4 bytes), never one per learner
train 6 hier $HET --set outer.mode=diloco --set outer.inner_steps=4 --set train.steps=8
M="$WORK/hier/metrics.jsonl"
s=$(grep '"summary":"traffic"' "$M")
bytes=$(echo "$s" | sed 's/.*"inter_site_bytes":\([0-9]*\).*/\1/')
syncb=$(echo "$s" | sed 's/.*"sync_equivalent_bytes":\([0-9]*\).*/\1/')
outer=$(grep -c '^{"outer"' "$M")
awk -v b="$bytes" -v s="$syncb" -v o="$outer" 'BEGIN { p = s / 8 / 16; per = b / o;
    exit !(per >= 16 * p && per <= 16 * p + 65536) }' &&
    pass "diloco over 3 learners: one payload per site per outer step ($bytes bytes in $outer outer steps)" ||
    fail "hierarchical traffic: $bytes bytes, $outer outer steps, sync $syncb"
echo "$s" | grep -q '"max_peer_learners":2[,}]' && pass "a diloco outer step waits on every other learner (2 of 3)" ||
    fail "peers waited on: $s"

# 2b. how the link moves payloads changes no number: progress step or
# thread, pieces of 4 KiB, against the default (poll, pace on, 256 KiB);
# and with a window of 4 steps a paced exchange posts its pieces in shares
# (1/3, 2/3, all), against the same window unpaced
train 6 stream_step $HET $STREAM --set outer.progress=step --set outer.pace=off --set outer.piece_bytes=4096
train 6 stream_thread $HET $STREAM --set outer.progress=thread --set outer.pace=on --set outer.piece_bytes=4096
for v in step thread; do
    if h5diff "$WORK/stream/model.h5" "$WORK/stream_$v/model.h5" /model /model > /dev/null 2>&1 &&
        [ "$(losses "$WORK/stream")" = "$(losses "$WORK/stream_$v")" ]; then
        pass "streaming with progress = $v, 4 KiB pieces: losses and weights bit-identical"
    else
        fail "streaming with progress = $v differs"
    fi
done
train 6 stream_w4 $HET $STREAM --set outer.overlap=4 --set outer.pace=off --set outer.piece_bytes=4096
train 6 stream_w4_paced $HET $STREAM --set outer.overlap=4 --set outer.pace=on --set outer.piece_bytes=4096
if h5diff "$WORK/stream_w4/model.h5" "$WORK/stream_w4_paced/model.h5" /model /model > /dev/null 2>&1 &&
    [ "$(losses "$WORK/stream_w4")" = "$(losses "$WORK/stream_w4_paced")" ]; then
    pass "streaming with a window of 4, pieces posted in shares: bit-identical to unpaced"
else
    fail "paced streaming (window 4) differs from unpaced"
fi

# 3. a corrupted payload from site b in exchange 2: rejected by all, training continues
ISTHMUS_LINK_CORRUPT=b:2 train 2 corrupt $TWO $STREAM --set outer.codec=int8
M="$WORK/corrupt/metrics.jsonl"
grep '"outer":2,' "$M" | grep -q '"accepted_sites":1,"sites":2,.*"rejected":"b: failed authentication"' &&
    pass "corrupted payload rejected (failed authentication), left out of that outer step" || fail "corruption: $(grep '"outer":2,' "$M")"
grep -q '"summary":"traffic".*"auth_failures":1[,}]' "$M" && pass "the failed frame is counted in the traffic summary" ||
    fail "auth_failures: $(grep '"summary":"traffic"' "$M")"
[ "$(grep -c '"accepted_sites":2' "$M")" -ge 3 ] && pass "the other outer steps accept both sites" || fail "$(grep -c '"accepted_sites":2' "$M") full outer steps"
grep -q "replicas identical at step 24" "$WORK/corrupt.log" && [ -f "$WORK/corrupt/model.h5" ] &&
    pass "both sites agree after a rejection and finish" || fail "after corruption: $(tail -3 "$WORK/corrupt.log")"

# 3b. sparse payloads (SparseLoCo's topk, averaged over senders) between the
# sites of different layouts: every learner on the same anchor, far fewer
# bytes than fp4, and a corrupted sparse payload rejected like any other
TOPK="--set outer.codec=topk --set outer.topk_chunk=256 --set outer.topk_k=4 --set outer.ef_decay=0.95"
train 6 topk $HET $STREAM $TOPK
grep -q "replicas identical at step 24: 3 learner(s)" "$WORK/topk.log" &&
    pass "topk: 3 learners on 2 sites share the same anchor" || fail "topk replicas: $(grep replicas "$WORK/topk.log")"
red=$(sed -n 's/.*"summary":"traffic".*"reduction":\([0-9.]*\).*/\1/p' "$WORK/topk/metrics.jsonl")
awk -v r="$red" 'BEGIN {exit !(r > 400)}' && pass "streaming topk H=8: $red x fewer inter-site bytes than sync" ||
    fail "topk traffic reduction '$red'"
ISTHMUS_LINK_CORRUPT=b:2 train 2 topk_corrupt $TWO $STREAM $TOPK
grep '"outer":2,' "$WORK/topk_corrupt/metrics.jsonl" | grep -q '"accepted_sites":1,"sites":2,.*"rejected":"b: failed authentication"' &&
    grep -q "replicas identical at step 24" "$WORK/topk_corrupt.log" &&
    pass "topk: a corrupted sparse payload is rejected and both sites finish" ||
    fail "topk corruption: $(grep '"outer":2,' "$WORK/topk_corrupt/metrics.jsonl")"

# 4. overlap: site a posts its sends 2 inner steps late (tau 3): training runs meanwhile
ISTHMUS_LINK_DELAY=a:2 train 2 delay $TWO $STREAM --set outer.overlap=3 --set outer.codec=none
M="$WORK/delay/metrics.jsonl"
grep '"outer":1,' "$M" | grep -q '"started_step":4,"step":7,.*"accepted_sites":2,"sites":2,"sent_after_polls":2,' &&
    pass "exchange started after step 4, sent after 2 more steps, applied after step 7" || fail "delay: $(grep '"outer":1,' "$M")"
grep -q "replicas identical at step 24" "$WORK/delay.log" && pass "delayed sends: anchors still identical" || fail "delay replicas"
# a delay longer than tau: completion posts the held sends, no deadlock.
# The site that holds back (b) is the slower one here: it posts what it held
# at its own completion, two of its steps after the start, and site a (3x
# faster, the one that logs) makes its last poll of the window one of its
# steps after the start, so nothing can have arrived by then. (With b the
# faster site, b's completion could come before a's poll and the payload
# arrive in time: right, but nothing late to announce; a race that went
# either way per exchange.) progress = step: a polls only between steps.
TWO_BSLOW="--set site.a.ranks=1 --set site.b.ranks=1 --set site.a.micro_batch=2 --set site.b.micro_batch=6"
ISTHMUS_LINK_DELAY=b:5 train 2 delay_long $TWO_BSLOW $STREAM --set outer.overlap=2 --set outer.progress=step
grep -q "replicas identical at step 24" "$WORK/delay_long.log" && pass "delay beyond tau completes" || fail "long delay: $(tail -3 "$WORK/delay_long.log")"
# site b holds its payloads back 5 steps, the window is 2: site a says so before the step that waits
grep -q '^link: exchange [0-9]* (fragment [0-9]) will not arrive within its window of 2 step(s): nothing after' "$WORK/delay_long.log" &&
    grep -q '"link_late":[0-9]*,"fragment":[0-9],"steps":1,"window":2,"arrived_fraction":0.0000' "$WORK/delay_long/metrics.jsonl" &&
    pass "a payload held back past the window is announced one step before it is due (log and link_late line)" ||
    fail "no lateness warning: $(grep 'link:' "$WORK/delay_long.log" | head -2)"

# 5. deadline: a site whose payloads never arrive is reported, not waited on forever
rc=0
ISTHMUS_LINK_MUTE=b:1 timeout 120 mpirun -q --oversubscribe -np 2 "$ISTHMUS" train "$T" \
    --set train.out_dir="$WORK/dead" $TWO --set outer.mode=diloco --set outer.inner_steps=2 \
    --set train.steps=4 --set outer.timeout=2 > "$WORK/dead.log" 2>&1 || rc=$?
# site a waits for b's payload, b (its payload muted) for a's verdict: both
# deadlines fall due together, and whichever rank reports first ends the job
if [ "$rc" = 1 ] && grep -Eq "link: (payload exchange: nothing from world rank 1|verdict exchange: nothing from world rank 0) within \[outer\] timeout = 2 s" "$WORK/dead.log"; then
    pass "a silent site hits the 2 s deadline: exit 1 naming the peer"
else
    fail "deadline: exit $rc: $(grep error "$WORK/dead.log" | head -3)"
fi
finish || exit 1
