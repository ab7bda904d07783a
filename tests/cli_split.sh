#!/bin/sh
# cli_split.sh — [outer] experts = split through the executable, two sites
# in one mpirun (tiny.ini: E = 4, each site two experts): only the dense
# part crosses (its payload worked out here from the model's sizes), the
# learners of a site agree on everything and the sites on the dense part,
# the drop policy counts the copies it drops, a resume is bit-exact, and a
# site's file is never read as the whole model. The whole model: model.h5
# holds every site's experts, assembled through the link (its bytes
# counted apart, worked out here), equal bit for bit to the dense part and
# to each expert's slice of its owner site's final checkpoint; `isthmus
# eval`, `export` and `generate` read it as a replicated model holding the
# same weights; the run evaluates the site's model and the whole one; the
# joint router phase moves the router alone, as `isthmus tune-router` does.
# (The federated launch of the same: cli_split_federated.sh.)
. "$TOP_SRCDIR/tests/lib.sh"
TAMPER=$(dirname "$ISTHMUS")/tests/h5tamper

T="$CONFIGS/tiny.ini"
# (no joint router phase unless a check sets one: model.h5 is then the sites' weights, bit for bit)
SPLIT="--set site.a.ranks=1 --set site.b.ranks=2 --set site.b.learner_ranks=1 --set outer.mode=diloco
 --set outer.inner_steps=4 --set outer.experts=split --set data.eval_bytes=4096 --set train.log_every=4
 --set outer.router_steps=0"
train() { # train NAME STEPS [--set ...]
    local name=$1 steps=$2
    shift 2
    # shellcheck disable=SC2086
    mpi 3 "$ISTHMUS" train "$T" $SPLIT --set train.out_dir="$WORK/$name" --set train.steps="$steps" "$@" \
        > "$WORK/$name.log" 2>&1
}

# tiny.ini: V=256 D=64 L=2 E=4 F=128; the dense part is the embedding, per
# layer the attention (4 D^2), the router (D E) and two norms (2 D), and the
# final norm: 49,984 values, float32 (codec none), and a 96-byte frame
dense=$(awk 'BEGIN { V = 256; D = 64; L = 2; E = 4; print (V*D + L*(4*D*D + D*E + 2*D) + D) * 4 + 96 }')
if train local 12 --set train.check_replicas=4; then
    payloads=$(sed -n 's/^outer .* payload \([0-9]*\) B .*/\1/p' "$WORK/local.log" | sort -u)
    [ "$payloads" = "$dense" ] && pass "split: each outer step's payload is the dense part, $dense B" ||
        fail "split payloads '$payloads' B, the dense part is $dense B"
    grep -q "^  site a .*(experts 0-1, 2 experts per rank)" "$WORK/local.log" &&
        grep -q "^  site b .*(experts 2-3, 2 experts per rank)" "$WORK/local.log" &&
        pass "the layout names each site's experts" || fail "layout: $(grep '^  site' "$WORK/local.log")"
    [ "$(grep -c "^replicas identical at step .*: 3 learner(s); the site's fingerprint .*, the dense part's" \
        "$WORK/local.log")" -ge 3 ] && pass "b's two learners hold the same model, a and b the same dense part" ||
        fail "replica check: $(grep -i 'replica' "$WORK/local.log" | head -2)"
    expect_exit 2 "the run split its experts across sites" -- \
        "$ISTHMUS" eval --model "$(ls "$WORK"/local/checkpoints/a/ckpt-*.h5 | tail -1)"
else
    fail "split training failed: $(tail -3 "$WORK/local.log")"
fi

# whole_equals RUN LO-HI LO-HI: RUN's model.h5 holds, bit for bit, the dense
# part of both sites' final checkpoints (the same at both) and each site's
# experts (site a's range, site b's) from that site's checkpoint. The
# expert tensors are the 4-dimensional ones (layers, experts, rows, columns)
slice() { # slice FILE DATASET START COUNT OUT: raw little-endian float32
    h5dump -d "$2" -s "$3" -c "$4" -b LE -o "$5" "$1" > /dev/null 2>&1
}
whole_equals() {
    local run=$1 model=$WORK/$1/model.h5 d name dims n s lo hi ck bad="" checked=0
    shift
    [ -f "$model" ] || { echo "no $model"; return 1; }
    for d in $(h5ls "$model/model" | awk '{ print $1 }'); do
        dims=$(h5ls "$model/model/$d" | sed 's/.*{\(.*\)}.*/\1/' | tr -d ' ')
        checked=$((checked + 1))
        n=$(echo "$dims" | awk -F, '{ print NF }')
        if [ "$n" = 4 ]; then
            s=0
            for range in "$@"; do
                lo=${range%-*} hi=${range#*-}
                [ $s = 0 ] && name=a || name=b
                ck=$(ls "$WORK/$run/checkpoints/$name"/ckpt-*.h5 | tail -1)
                count=$(echo "$dims" | awk -F, -v k=$((hi - lo + 1)) '{ print $1 "," k "," $3 "," $4 }')
                slice "$model" "/model/$d" "0,$lo,0,0" "$count" "$WORK/m.bin" &&
                    slice "$ck" "/model/$d" "0,$lo,0,0" "$count" "$WORK/c.bin" && cmp -s "$WORK/m.bin" "$WORK/c.bin" ||
                    bad="$bad $d[experts $range from $name]"
                s=1
            done
        else
            for name in a b; do
                ck=$(ls "$WORK/$run/checkpoints/$name"/ckpt-*.h5 | tail -1)
                h5dump -d "/model/$d" -b LE -o "$WORK/m.bin" "$model" > /dev/null 2>&1 &&
                    h5dump -d "/model/$d" -b LE -o "$WORK/c.bin" "$ck" > /dev/null 2>&1 &&
                    cmp -s "$WORK/m.bin" "$WORK/c.bin" || bad="$bad $d[$name]"
            done
        fi
    done
    [ -z "$bad" ] || { echo "differs:$bad"; return 1; }
    [ $checked -ge 12 ] || { echo "only $checked datasets in $model"; return 1; } # tiny.ini has 12
}

# tiny.ini's experts are w_gate, w_up (D x F each) and w_down (F x D) per
# layer: site b's two are L * 2 * 3 * D * F float32 values; each frame
# (one per expert tensor and pair of ranks) has the link's 96-byte header;
# counted sent + received
expert_bytes() { # expert_bytes FRAMES: what the assembly moves
    awk -v f="$1" 'BEGIN { L = 2; D = 64; F = 128; printf "%.0f", 2 * (L * 2 * 3 * D * F * 4 + f * 96) }'
}
if [ -f "$WORK/local/model.h5" ]; then
    grep -q "^wrote $WORK/local/model.h5 (step 12): the whole model, every site's experts" "$WORK/local.log" &&
        h5dump -A -H "$WORK/local/model.h5" | grep -q 'ATTRIBUTE "experts_whole"' &&
        pass "a split run writes model.h5, marked experts_whole" || fail "model.h5: $(grep model.h5 "$WORK/local.log")"
    why=$(whole_equals local 0-1 2-3) && pass "model.h5 = the dense part of both sites' checkpoints and each site's experts of its own, bit for bit" ||
        fail "the whole model: $why"
    # a site's checkpoint holds no values of the other's experts: the comparison tells them apart
    whole_equals local 2-3 0-1 > /dev/null && fail "the comparison does not tell the sites' experts apart"
    want=$(expert_bytes 3)
    got=$(sed -n 's/^assembly bytes: \([0-9]*\) through the link for the whole model .*/\1/p' "$WORK/local.log")
    [ "$got" = "$want" ] && grep -q "\"summary\":\"traffic\",.*\"assembly_bytes\":$want[,}]" "$WORK/local/metrics.jsonl" &&
        pass "assembly bytes $got: site b's experts, float32, and three frames' headers, both ways (log and summary)" ||
        fail "assembly bytes '$got', want $want"
    # the run's evaluations: the site's model (its experts, local routing), then the whole one
    [ "$(grep -c '^eval .* | the site.s model$' "$WORK/local.log")" = 2 ] &&
        [ "$(grep -c '^eval .* | the whole model$' "$WORK/local.log")" = 2 ] &&
        [ "$(grep -c '"model":"site"' "$WORK/local/metrics.jsonl")" = 2 ] &&
        [ "$(grep -c '"model":"whole"' "$WORK/local/metrics.jsonl")" = 2 ] &&
        pass "the final evaluation is labelled: the site's model and the whole model" ||
        fail "eval labels: $(grep '^eval' "$WORK/local.log")"
    # eval of the file = eval of a replicated model file holding the same weights = the run's own
    cp "$WORK/local/model.h5" "$WORK/replicated.h5"
    "$TAMPER" "$WORK/replicated.h5" subst config "experts = split" "experts = replicated" &&
        "$TAMPER" "$WORK/replicated.h5" attr experts_whole 0 || fail "h5tamper could not make the replicated copy"
    "$ISTHMUS" eval --model "$WORK/local/model.h5" --set train.out_dir="$WORK/eval_whole" > "$WORK/eval_whole.log" 2>&1 &&
        "$ISTHMUS" eval --model "$WORK/replicated.h5" --set train.out_dir="$WORK/eval_rep" > "$WORK/eval_rep.log" 2>&1 ||
        fail "eval of model.h5 failed: $(tail -2 "$WORK/eval_whole.log" "$WORK/eval_rep.log")"
    ok=1
    for set in prose tech; do
        w=$(last_bpb "$WORK/eval_whole/metrics.jsonl" $set) r=$(last_bpb "$WORK/eval_rep/metrics.jsonl" $set)
        in_run=$(metric bpb "$WORK/local/metrics.jsonl" "\"eval\":\"$set\",.*\"model\":\"whole\"")
        [ -n "$w" ] && [ "$w" = "$r" ] && [ "$w" = "$in_run" ] || ok=0
        note "$set: isthmus eval of model.h5 $w, of the replicated copy $r, the run's whole model $in_run"
    done
    [ $ok = 1 ] && pass "isthmus eval of model.h5 = of a replicated model file of the same weights = the run's whole-model eval" ||
        fail "whole-model bpb differ"
    "$ISTHMUS" export --model "$WORK/local/model.h5" -o "$WORK/exp_whole" > /dev/null 2>&1 &&
        "$ISTHMUS" export --model "$WORK/replicated.h5" -o "$WORK/exp_rep" > /dev/null 2>&1 &&
        cmp -s "$WORK/exp_whole/model.safetensors" "$WORK/exp_rep/model.safetensors" &&
        pass "isthmus export of model.h5 = of the replicated copy (safetensors, byte for byte)" ||
        fail "export of model.h5 failed or differs"
    "$ISTHMUS" generate --model "$WORK/local/model.h5" --tokens 8 > /dev/null 2>&1 &&
        pass "isthmus generate reads model.h5" || fail "generate of model.h5 failed"
    # a site's checkpoint is still no whole model
    ck=$(ls "$WORK"/local/checkpoints/b/ckpt-*.h5 | tail -1)
    expect_exit 2 "a site's file holds that site's experts only; the run's model.h5 holds the whole model" -- \
        "$ISTHMUS" eval --model "$ck"
else
    fail "no model.h5 from the split run: $(grep -i 'model.h5' "$WORK/local.log")"
fi

# the writer a learner of two ranks, site b one rank: b's two experts to
# the writer's two ranks, one each (six frames)
if mpi 3 "$ISTHMUS" train "$T" $SPLIT --set site.a.ranks=2 --set site.a.learner_ranks=2 --set site.b.ranks=1 \
    --set train.out_dir="$WORK/wide" --set train.steps=8 > "$WORK/wide.log" 2>&1; then
    want=$(expert_bytes 6)
    got=$(sed -n 's/^assembly bytes: \([0-9]*\) .*/\1/p' "$WORK/wide.log")
    why=$(whole_equals wide 0-1 2-3) && [ "$got" = "$want" ] &&
        [ "$(grep -c '^eval .* | the whole model$' "$WORK/wide.log")" = 2 ] &&
        pass "a writer of two ranks: model.h5 bit for bit, assembly bytes $got (six frames), the whole model evaluated" ||
        fail "writer of two ranks: $why; assembly bytes '$got', want $want"
else
    fail "split run with a two-rank writer failed: $(tail -3 "$WORK/wide.log")"
fi

# drop: the full router; copies routed to the other site's experts are
# dropped and counted (about half of them with two sites of two experts)
if train drop 8 --set outer.expert_routing=drop; then
    frac=$(metric remote_frac "$WORK/drop/metrics.jsonl" | tail -1)
    awk -v f="$frac" 'BEGIN { exit !(f > 0.2 && f < 0.8) }' && pass "drop: $frac of the copies went to the other site's experts" ||
        fail "drop: remote_frac '$frac'"
else
    fail "drop training failed: $(tail -3 "$WORK/drop.log")"
fi

# a resume: 8 steps straight against 4, then 4 more from the checkpoint;
# every site's last checkpoint the same, bit for bit
train straight 8 --set checkpoint.every=4 &&
    train halves 4 --set checkpoint.every=4 &&
    train halves 8 --set checkpoint.every=4 --resume auto || fail "resume runs failed: $(tail -2 "$WORK/halves.log")"
same=1
for s in a b; do
    h5diff "$WORK/straight/checkpoints/$s/ckpt-00000008.h5" "$WORK/halves/checkpoints/$s/ckpt-00000008.h5" /model /model \
        > /dev/null 2>&1 || same=0
done
[ $same = 1 ] && grep -q "resum" "$WORK/halves.log" && pass "split: a resume at step 4 ends on the same bits at both sites" ||
    fail "split resume differs from the straight run"

# a site behind (b's newest checkpoint step 4, a's 8): a site's experts are
# in its own files only, so every site resumes from step 4 (a's 8 set
# aside), never b from a's file, which holds none of b's experts (they
# would load as zeros, and zero experts never train again): both sites'
# checkpoints of step 8 are then the straight run's, bit for bit
train behind 8 --set checkpoint.every=4 && rm "$WORK/behind/model.h5" "$WORK/behind/checkpoints/b/ckpt-00000008.h5" &&
    train behind 8 --set checkpoint.every=4 --resume auto || fail "the resume with b behind failed: $(tail -2 "$WORK/behind.log")"
same=1
for s in a b; do
    h5diff "$WORK/straight/checkpoints/$s/ckpt-00000008.h5" "$WORK/behind/checkpoints/$s/ckpt-00000008.h5" /model /model \
        > /dev/null 2>&1 || same=0
done
[ $same = 1 ] && grep -q "every site resumes from 4, the newest step they all hold" "$WORK/behind.log" &&
    pass "split, b behind: both sites resume from step 4, b's experts its own; step 8 the straight run's bits" ||
    fail "split, b behind: $(grep -i 'resum' "$WORK/behind.log" | head -2)"
# a change of the assignment, or replicated experts, on resume: refused in one line (exit 2)
rc=0
train behind 12 --set checkpoint.every=4 --set site.a.experts=2-3 --set site.b.experts=0-1 --resume auto || rc=$?
[ $rc = 2 ] && grep -q "site a trained experts 0-1, the config gives it 2-3: .*the assignment cannot change on resume" \
    "$WORK/behind.log" && pass "a resume that moves a site's experts is refused (exit 2)" ||
    fail "assignment changed on resume: exit $rc: $(grep -i error "$WORK/behind.log" | head -2)"
rc=0
train behind 12 --set checkpoint.every=4 --set outer.experts=replicated --resume auto || rc=$?
[ $rc = 2 ] && grep -q "\[outer\] experts = split in the checkpoint, replicated in the config" "$WORK/behind.log" &&
    pass "a split run's checkpoint resumed with replicated experts is refused (exit 2)" ||
    fail "split resumed as replicated: exit $rc: $(grep -i error "$WORK/behind.log" | head -2)"
rc=0
train behind 12 --set checkpoint.every=4 --set outer.expert_replicas=1 --resume auto || rc=$?
[ $rc = 2 ] && grep -q "expert_replicas = 2 in the checkpoint, 1 in the config" "$WORK/behind.log" &&
    pass "a resume that changes expert_replicas (the copies a file holds) is refused (exit 2)" ||
    fail "expert_replicas changed on resume: exit $rc: $(grep -i error "$WORK/behind.log" | head -2)"
# copies in checkpoints: a resume from step 4 (refreshes after every outer
# period, fp4) ends with the straight run's copies, mirrors and model at
# step 12, bit for bit at both sites
COPIES="--set outer.expert_refresh=1 --set outer.codec=fp4 --set checkpoint.every=4 --set checkpoint.keep=10"
# shellcheck disable=SC2086
if train copies 12 $COPIES && train copies_back 12 $COPIES &&
    rm "$WORK"/copies_back/checkpoints/*/ckpt-0000001[02].h5 "$WORK"/copies_back/checkpoints/*/ckpt-00000008.h5 &&
    train copies_back 12 $COPIES --resume auto; then
    same=1
    for s in a b; do
        for g in /copies /mirror /model; do
            h5diff "$WORK/copies/checkpoints/$s/ckpt-00000012.h5" "$WORK/copies_back/checkpoints/$s/ckpt-00000012.h5" \
                "$g" "$g" > /dev/null 2>&1 || same=0
        done
    done
    [ $same = 1 ] && grep -q '^copies    | refresh 2 after step 8 ' "$WORK/copies_back.log" &&
        grep -q '^refresh bytes: [0-9]* .*(1 refresh(es) every 4 steps after step 4' "$WORK/copies_back.log" &&
        pass "copies in checkpoints: a resume at step 4 ends with the straight run's copies and mirrors, bit for bit" ||
        fail "copies after a resume differ from the straight run's: $(grep -e '^copies' -e '^refresh' "$WORK/copies_back.log" | head -3)"
else
    fail "copies runs failed: $(tail -2 "$WORK/copies_back.log")"
fi
# the joint router phase (outer.router_steps): model.h5 differs from the
# same run's without it in the router alone, and `isthmus tune-router` of
# that untuned file on one rank (site a's learner: the same windows, the
# steps after 12, the same lr) gives the run's file bit for bit
if train plain 12 && train tuned 12 --set outer.router_steps=10; then
    same=1
    for x in embed attn_norm wq wk wv wo moe_norm final_norm w_gate w_up w_down; do
        h5diff "$WORK/plain/model.h5" "$WORK/tuned/model.h5" "/model/$x" "/model/$x" > /dev/null 2>&1 || same=0
    done
    ! h5diff "$WORK/plain/model.h5" "$WORK/tuned/model.h5" /model/router /model/router > /dev/null 2>&1 &&
        [ $same = 1 ] && grep -q "^router phase: the whole model's router alone, 10 steps at lr 0.006 on site a" \
        "$WORK/tuned.log" && [ "$(grep -c '^eval .* | the whole model$' "$WORK/tuned.log")" = 2 ] &&
        pass "router phase: only the router of model.h5 moved; the whole model evaluated after it" ||
        fail "router phase: other weights same: $same; $(grep -e '^router' -e error "$WORK/tuned.log" | head -2)"
    mpi 1 "$ISTHMUS" tune-router --model "$WORK/plain/model.h5" -o "$WORK/retuned.h5" --steps 10 \
        > "$WORK/retune.log" 2>&1 && h5diff "$WORK/tuned/model.h5" "$WORK/retuned.h5" /model /model > /dev/null 2>&1 &&
        grep -q "^tune-router: .* 10 steps at lr 0.006 (8 windows of 64 a step)" "$WORK/retune.log" &&
        pass "isthmus tune-router of the untuned model.h5 = the run's router phase, bit for bit" ||
        fail "tune-router: $(tail -2 "$WORK/retune.log")"
else
    fail "router phase run failed: $(tail -2 "$WORK/tuned.log")"
fi
expect_exit 2 "tune-router: -o .* is the model itself" -- "$ISTHMUS" tune-router --model "$WORK/plain/model.h5" \
    -o "$WORK/plain/model.h5" --steps 10
finish || exit 1
