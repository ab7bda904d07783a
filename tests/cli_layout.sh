#!/bin/sh
# cli_layout.sh — many ranks through mpirun: expert parallelism changes
# nothing but speed, `sync` over learners equals one learner with the
# combined batch (token-weighted when sites differ), learners stay
# bit-identical, inter-site bytes are counted, bad layouts exit 2.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
train() { # train NP NAME [--set ...]
    local np=$1 name=$2
    shift 2
    mpi "$np" "$ISTHMUS" train "$T" --set train.out_dir="$WORK/$name" --set train.steps=5 \
        --set train.log_every=1 --set data.eval_bytes=4096 --set train.check_replicas=1 "$@" \
        > "$WORK/$name.log" 2>&1 || fail "$name: training failed: $(tail -3 "$WORK/$name.log")"
}
# same_run A B TOL: every step's loss within TOL (relative) and weights within 1e-5
same_run() {
    local ok=1 s
    for s in 1 2 3 4 5; do
        a=$(step_field "$WORK/$1/metrics.jsonl" $s loss)
        b=$(step_field "$WORK/$2/metrics.jsonl" $s loss)
        close_to "$a" "$b" "$3" || { ok=0; note "step $s: loss $a vs $b"; }
    done
    [ $ok = 1 ] && pass "$1 and $2: losses agree within $3" || fail "$1 and $2: losses differ"
    if h5diff -d 1e-5 "$WORK/$1/model.h5" "$WORK/$2/model.h5" /model /model > "$WORK/diff" 2>&1; then
        pass "$1 and $2: weights agree within 1e-5"
    else
        fail "$1 and $2: weights differ: $(grep 'differences found' "$WORK/diff" | head -3)"
    fi
}

# 1. one learner of 1, 2 and 4 ranks, same global batch of 8 sequences
train 1 g1 --set train.micro_batch=8
train 2 g2 --set train.micro_batch=4
train 4 g4 --set train.micro_batch=2
same_run g1 g2 1e-6
same_run g1 g4 1e-6
a2a=$(step_field "$WORK/g4/metrics.jsonl" 1 a2a_bytes)
[ "${a2a:-0}" -gt 0 ] 2>/dev/null && pass "all-to-all bytes counted ($a2a per step with 4 ranks)" || fail "a2a_bytes = '$a2a'"

# evaluation of one model file with 1, 2 and 4 ranks (experts read as
# canonical hyperslabs by each rank): the same bits per byte
for np in 1 2 4; do
    mpi $np "$ISTHMUS" eval --model "$WORK/g4/model.h5" --set train.out_dir="$WORK/ev$np" \
        > "$WORK/ev$np.log" 2>&1 || fail "eval with $np ranks: $(tail -2 "$WORK/ev$np.log")"
done
for np in 2 4; do
    for set in prose tech; do
        a=$(eval_bpb "$WORK/ev1/metrics.jsonl" "$set")
        b=$(eval_bpb "$WORK/ev$np/metrics.jsonl" "$set")
        close_to "$b" "$a" 1e-5 && pass "eval $set with $np ranks: $b (1 rank: $a)" || fail "eval $set with $np ranks: $b vs $a"
    done
done

# Capacity and the balancing statistics are defined per learner micro-step
# (docs/architecture.md, Decisions), so learners of different sizes route differently; with no
# drops and no balancing loss the objectives coincide exactly.
NODROP="--set model.capacity_factor=8 --set model.aux_loss=0"
train 1 one8 --set train.micro_batch=8 $NODROP
# 2. sync over two learners of one site equals one learner with both batches
train 2 two_learners --set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.a.micro_batch=4 $NODROP
same_run one8 two_learners 1e-6
grep -q "replicas identical at step 5: 2 learner(s)" "$WORK/two_learners.log" && pass "2 learners bit-identical every step" || fail "replica check missing"
ib=$(step_field "$WORK/two_learners/metrics.jsonl" 1 inter_site_bytes)
[ "$ib" = 0 ] && pass "one site: no inter-site bytes" || fail "one site: inter_site_bytes = $ib"

# 3. heterogeneous two-site layout: 4 ranks as one learner + 4 ranks as 2 learners of 2
train 1 one16 --set train.micro_batch=16 $NODROP
train 8 hetero --set site.a.ranks=4 --set site.a.micro_batch=2 \
    --set site.b.ranks=4 --set site.b.learner_ranks=2 --set site.b.micro_batch=2 $NODROP
same_run one16 hetero 1e-6
[ "$(grep -c 'replicas identical at step .: 3 learner(s)' "$WORK/hetero.log")" -ge 5 ] && pass "3 learners over 2 sites bit-identical at every step" || fail "hetero replicas: $(grep replicas "$WORK/hetero.log")"
ib=$(step_field "$WORK/hetero/metrics.jsonl" 1 inter_site_bytes)
[ "${ib:-0}" -gt 0 ] 2>/dev/null && pass "two sites: inter-site bytes counted ($ib per step)" || fail "inter_site_bytes = '$ib'"

# 4. sites with different batch sizes: 6 + 2 sequences (one with 2 micro-steps
# of 1) average by tokens, i.e. equal one learner with 8
train 2 weighted --set site.a.ranks=1 --set site.a.micro_batch=6 \
    --set site.b.ranks=1 --set site.b.micro_batch=1 --set site.b.grad_accum=2 $NODROP
same_run one8 weighted 1e-6

# 5. bad layouts: exit 2, one line naming the site and the numbers
expect_exit 2 "layout: the \[site.\*\] sections describe 4 ranks \(a=2 \+ b=2\), but the job has 3" -- \
    mpirun -q --oversubscribe -np 3 "$ISTHMUS" train "$T" --set site.a.ranks=2 --set site.b.ranks=2
expect_exit 2 "\[site.b\] learner_ranks = 3 does not divide \[model\] experts = 4" -- \
    mpirun -q --oversubscribe -np 3 "$ISTHMUS" train "$T" --set site.b.ranks=3 --set site.b.learner_ranks=3
expect_exit 2 "\[site.a\] learner_ranks = 2 does not divide ranks = 3" -- \
    mpirun -q --oversubscribe -np 3 "$ISTHMUS" train "$T" --set site.a.ranks=3 --set site.a.learner_ranks=2
expect_exit 2 "layout: 3 ranks form one learner, but \[model\] experts = 4 is not divisible by 3" -- \
    mpirun -q --oversubscribe -np 3 "$ISTHMUS" train "$T"
expect_exit 2 "\[site.a\] unknown key 'rank'|unknown key 'rank' in \[site.a\]" -- \
    mpirun -q --oversubscribe -np 2 "$ISTHMUS" train "$T" --set site.a.rank=2
finish || exit 1
