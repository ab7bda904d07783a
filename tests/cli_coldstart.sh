#!/bin/bash
# cli_coldstart.sh — both sites of a federated run started again together
# (--resume auto) after one trained on alone (docs/architecture.md, failure
# rule 11), real processes of tiny.ini through ompi-server:
#  - site a killed early, b trains on alone and is stopped later: started
#    again, every site continues from b's newest step (a fetches b's file
#    through the link), nothing of b's is set aside, both end on the same
#    model;
#  - a live rejoin, then the host killed before the sites completed a
#    checkpoint together: the joiner, training alone to the end with
#    keep = 1, still holds the step both share; started again, the run is
#    complete: each site says so in one line and exits 0, no step trained;
#  - two sites that each trained alone after their last common step (the
#    files of two real solo runs from one common state): both roll back to
#    the newest step they share, said in one line, their later files set
#    aside — with keep = 20 and more than 16 newer files at a site, so the
#    common step lies past the 16 newest, and with files of the same step
#    numbers at both sites that are not the same training.
. "$TOP_SRCDIR/tests/lib.sh"
FED="$TOP_SRCDIR/scripts/federated.sh"
export ISTHMUS MPIRUN_ARGS="-q --oversubscribe"
T="$CONFIGS/tiny.ini"
RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.codec=fp4
--set outer.inner_steps=4 --set data.eval_bytes=4096 --set outer.join_timeout=60 --set outer.timeout=3
--set train.log_every=5"
SERVER="$WORK/server"
trap '"$FED" stop "$SERVER"; rm -rf "$WORK"' EXIT
"$FED" server "$SERVER" || { fail "ompi-server did not start"; finish; exit 1; }
URI="$SERVER/ompi-server.uri"

site() { # site NAME OUT [args...]: one site's mpirun (one rank), with a deadline against a hang
    local name=$1 out=$2
    shift 2
    # shellcheck disable=SC2086
    timeout 300 "$FED" site "$URI" "$name" 1 "$T" $RUN --set train.out_dir="$out" "$@"
}
steps_of() { # steps_of DIR: the steps of DIR's complete checkpoint files, ascending
    ls "$1" 2> /dev/null | sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n
}
newest() { steps_of "$1" | tail -1; }
same_model() { # both sites' final checkpoints hold the same global model
    local d=$1/checkpoints fa fb
    fa=$(ls "$d"/a/ckpt-*.h5 2> /dev/null | tail -1)
    fb=$(ls "$d"/b/ckpt-*.h5 2> /dev/null | tail -1)
    [ -n "$fa" ] && [ "$(basename "$fa")" = "$(basename "$fb")" ] && h5diff "$fa" "$fb" /model /model > /dev/null 2>&1
}
kill_site() { pkill -"$1" -f "isthmus train .* --site $2 .*outer.run_id=$3 "; } # kill_site SIGNAL SITE RUN_ID
until_file() { # until_file DIR STEP: DIR holds a checkpoint of STEP or later (60 s at most)
    for _ in $(seq 1 600); do
        [ "$(newest "$1")" -ge "$2" ] 2> /dev/null && return 0
        sleep 0.1
    done
    return 1
}
why() { grep -h 'error\|warning\|^resume\|^resumed\|^site . \(lost\|left\|rejoined\)\|^rejoined' "$@" | head -6 | tr '\n' ' '; }

# 1. a killed early, b trains on alone and is stopped: the survivor's state
# is the run's
A1="--set outer.run_id=ahead --set train.steps=400 --set checkpoint.every=20"
# shellcheck disable=SC2086
pair_start "$WORK/ahead_a.log" "$WORK/ahead_b.log" site "$WORK/ahead" $A1
wait_line "$WORK/ahead_a.log" '^step  *50/' 60
kill_site KILL a ahead
wait "$pa"
wait_line "$WORK/ahead_b.log" '^site a lost at step' 30
until_file "$WORK/ahead/checkpoints/b" 200
kill_site USR1 b ahead
wait "$pb"
RB=$?
na=$(newest "$WORK/ahead/checkpoints/a")
nb=$(newest "$WORK/ahead/checkpoints/b")
# shellcheck disable=SC2086
federated_pair "$WORK/ahead_a2.log" "$WORK/ahead_b2.log" site "$WORK/ahead" $A1 --resume auto
first=$(sed -n 's|^step  *\([0-9]*\)/400 .*|\1|p' "$WORK/ahead_a2.log" | head -1) # the first step trained
line="resume: site b holds the run's newest step, $nb, and trained on from the others' newest (a $na)"
if [ "$RB" -eq 0 ] && [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ] && [ "${nb:-0}" -gt "$((${na:-0} + 100))" ] &&
    grep -qF "$line" "$WORK/ahead_a2.log" && grep -qF "$line" "$WORK/ahead_b2.log" &&
    grep -q "^resumed from .*/a/rejoin-0*$nb.h5: step $nb," "$WORK/ahead_a2.log" &&
    grep -q "^resumed from .*/b/ckpt-0*$nb.h5: step $nb," "$WORK/ahead_b2.log" &&
    ! ls "$WORK/ahead/checkpoints/b" | grep -q passed && [ "${first:-0}" -gt "${nb:-0}" ] &&
    [ -f "$WORK/ahead/model.h5" ] && same_model "$WORK/ahead"; then
    pass "a killed at step ~50 (newest file $na), b trained alone to $nb and stopped: started again, both continue from $nb (a fetched b's file), nothing set aside, the same final model"
else
    fail "survivor ahead: b exit $RB, then $ra/$rb; a's newest '$na', b's '$nb': $(why "$WORK"/ahead_?2.log)"
fi

# 2. a live rejoin, then the host lost before a checkpoint of both: the
# joiner keeps the step both share (keep = 1); it trains alone to the end,
# and the run started again is complete
R2="--set outer.run_id=pinned --set train.steps=3000 --set checkpoint.every=1500 --set checkpoint.keep=1"
# shellcheck disable=SC2086
pair_start "$WORK/pinned_a.log" "$WORK/pinned_b.log" site "$WORK/pinned" $R2
until_file "$WORK/pinned/checkpoints/a" 1500
wait_line "$WORK/pinned_a.log" '^step  *1510/' 60
kill_site KILL b pinned
wait "$pb"
wait_line "$WORK/pinned_a.log" '^site b lost at step' 30
# shellcheck disable=SC2086
site b "$WORK/pinned" $R2 --resume auto > "$WORK/pinned_b2.log" 2>&1 &
pb=$!
wait_line "$WORK/pinned_a.log" '^site b rejoined at step' 120
kill_site KILL a pinned
wait "$pa"
wait "$pb"
RB=$?
rejoin=$(sed -n 's/^site b rejoined at step \([0-9]*\) .*/\1/p' "$WORK/pinned_a.log" | head -1)
held=$(steps_of "$WORK/pinned/checkpoints/b" | tr '\n' ' ')
if [ "$RB" -eq 0 ] && [ -n "$rejoin" ] && [ "$rejoin" -lt 3000 ] && grep -q '^site a lost at step' "$WORK/pinned_b2.log" &&
    [ "$held" = "1500 3000 " ] && [ -f "$WORK/pinned/site-b/model.h5" ]; then
    pass "b rejoined at step $rejoin, a killed before a checkpoint of both: b trained alone to 3000 with keep = 1 and still holds step 1500, which both share"
else
    fail "pin after a rejoin: b exit $RB, rejoined at '$rejoin', b holds '$held': $(why "$WORK"/pinned_a.log "$WORK"/pinned_b2.log)"
fi
# shellcheck disable=SC2086
federated_pair "$WORK/pinned_a3.log" "$WORK/pinned_b3.log" site "$WORK/pinned" $R2 --resume auto
line="resume: the run is complete: site b trained it to step 3000 (train.steps) and wrote $WORK/pinned/site-b/model.h5; nothing to train"
if [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ] && grep -qxF "$line" "$WORK/pinned_a3.log" && grep -qxF "$line" "$WORK/pinned_b3.log" &&
    ! grep -qh '^step \|^resumed from\|^checkpoint:' "$WORK/pinned_a3.log" "$WORK/pinned_b3.log" &&
    [ ! -f "$WORK/pinned/model.h5" ]; then
    pass "the run complete at b: started again, each site says so in one line and exits 0, nothing trained or written"
else
    fail "complete run: exits $ra/$rb: $(why "$WORK"/pinned_?3.log)"
fi

# 3. diverged: each site trained alone after the last common step. Phase 1:
# b killed, a trains alone (its files kept aside); phase 2: from the common
# step again, a killed, b trains alone; then a's phase-1 files are put back.
# Checkpoints every 5 steps, keep = 20.
D3="--set outer.run_id=split --set train.steps=400 --set checkpoint.every=5 --set checkpoint.keep=20"
S="$WORK/split/checkpoints"
# shellcheck disable=SC2086
pair_start "$WORK/split_a.log" "$WORK/split_b.log" site "$WORK/split" $D3
wait_line "$WORK/split_a.log" '^step  *50/' 60
kill_site KILL b split
wait "$pb"
wait_line "$WORK/split_a.log" '^site b lost at step' 30
until_file "$S/a" 200
kill_site USR1 a split
wait "$pa"
RA1=$?
nb1=$(newest "$S/b")
mkdir -p "$WORK/solo_a"
for s in $(steps_of "$S/a"); do [ "$s" -gt "$nb1" ] && mv "$S/a/ckpt-$(printf %08d "$s").h5" "$WORK/solo_a/"; done
na=$(newest "$WORK/solo_a")
# shellcheck disable=SC2086
pair_start "$WORK/split_a2.log" "$WORK/split_b2.log" site "$WORK/split" $D3 --resume auto
wait_line "$WORK/split_a2.log" "^step  *$((nb1 + 20))/" 60
kill_site KILL a split
wait "$pa"
wait_line "$WORK/split_b2.log" '^site a lost at step' 30
until_file "$S/b" 190
kill_site USR1 b split
wait "$pb"
RB2=$?
# the newest step both hold of the same training: a's phase-2 files and b's
common=$(comm -12 <(steps_of "$S/a" | sort) <(steps_of "$S/b" | sort) | sort -n | tail -1)
mv "$WORK"/solo_a/* "$S/a/"
nb=$(newest "$S/b")
same_number=$(comm -12 <(steps_of "$S/a" | sort) <(steps_of "$S/b" | sort) | sort -n | tail -1)
newer_b=$(steps_of "$S/b" | awk -v c="$common" '$1 > c' | wc -l)
# shellcheck disable=SC2086
federated_pair "$WORK/split_a3.log" "$WORK/split_b3.log" site "$WORK/split" $D3 --resume auto
line="warning: resume: sites a and b each trained alone after step $common (a to $na, b to $nb): both resume from $common, the newest step they share; a's and b's later files set aside as .passed"
if [ "$RA1" -eq 0 ] && [ "$RB2" -eq 0 ] && [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ] && [ -n "$common" ] &&
    [ "$newer_b" -gt 16 ] && [ "$same_number" -gt "$common" ] &&
    grep -qF "$line" "$WORK/split_a3.log" && grep -qF "$line" "$WORK/split_b3.log" &&
    grep -q "^resumed from .*/a/ckpt-0*$common.h5: step $common," "$WORK/split_a3.log" &&
    [ -f "$S/a/ckpt-$(printf %08d "$na").h5.passed" ] && [ -f "$S/b/ckpt-$(printf %08d "$nb").h5.passed" ] &&
    same_model "$WORK/split"; then
    pass "a trained alone to $na, b to $nb after step $common: both roll back to $common (past b's 16 newest files: $newer_b newer; both hold files up to step $same_number, of different training), said in one line, later files set aside; the same final model"
else
    fail "diverged: exits $RA1/$RB2, then $ra/$rb; common '$common', a '$na', b '$nb', b's newer files $newer_b, same numbers up to '$same_number': $(why "$WORK"/split_?3.log)"
fi

finish || exit 1
