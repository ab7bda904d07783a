#!/bin/bash
# cli_three_sites.sh — three federated sites (one mpirun each, joined
# through ompi-server) on this machine, real processes:
#  - the run forms and trains to the same model, bit for bit, as the same
#    three sites in one mpirun (the joint launch);
#  - a join that breaks inside Open MPI at the host (the hook): every site
#    exits 3 and, started again by the site script, the three form the run
#    (the host waits out the merges' bound) and train to the joint model;
#  - site c killed mid-run: a and b train on; c started again with
#    --resume auto is taken back live by all three (the host's ask rides
#    the exchange's verdicts), and every site ends on the same model;
#  - sites b and c killed together: a trains alone; b started again is
#    answered "busy" until c knocks too, then a takes both back at once;
#  - sites a and c killed together: b hosts alone; a started again waits on
#    b's "busy" beat past its own join_timeout, never hosting, until c knocks;
#  - site a, the host, killed: b hosts from then on, b and c train on; a
#    started again rejoins at b; every site ends on the same model;
#  - USR1 to site a (its job's time limit): a checkpoints and leaves, b and
#    c train on; a started again rejoins;
#  - butterfly: c killed, a and b train on; c started again is taken back
#    live (the live sites meet at the end of every round); the same final
#    model on every site;
#  - a cold restart: c killed, a and b train on and are stopped later; all
#    three started again continue from a's and b's newest step (c fetches
#    it), not from c's, and end on the same model.
. "$TOP_SRCDIR/tests/lib.sh"
FED="$TOP_SRCDIR/scripts/federated.sh"
export ISTHMUS MPIRUN_ARGS="-q --oversubscribe"
T="$CONFIGS/tiny.ini"
RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set site.c.ranks=1 --set outer.mode=diloco
--set outer.inner_steps=4 --set data.eval_bytes=4096 --set outer.join_timeout=60 --set outer.timeout=3"
SERVER="$WORK/server"
stop_server() { "$FED" stop "$SERVER"; }
trap 'stop_server; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
"$FED" server "$SERVER" || { fail "ompi-server did not start"; finish; exit 1; }
URI="$SERVER/ompi-server.uri"

site() { # site NAME OUT [args...]: one site's mpirun of one rank, with a deadline against a hang
    local name=$1 out=$2
    shift 2
    # shellcheck disable=SC2086
    timeout 300 "$FED" site "$URI" "$name" "$([ "$name" = a ] && echo "${NP_A:-1}" || echo 1)" "$T" $RUN \
        --set train.out_dir="$out" "$@"
}
three() { # three NAME [args...]: sites a, b, c into $WORK/NAME (pids in pa pb pc)
    local name=$1
    shift
    site a "$WORK/$name" --set outer.run_id="$name" "$@" > "$WORK/${name}_a.log" 2>&1 &
    pa=$!
    site b "$WORK/$name" --set outer.run_id="$name" "$@" > "$WORK/${name}_b.log" 2>&1 &
    pb=$!
    site c "$WORK/$name" --set outer.run_id="$name" "$@" > "$WORK/${name}_c.log" 2>&1 &
    pc=$!
}
wait_three() { wait $pa; ra=$?; wait $pb; rb=$?; wait $pc; rc=$?; }
same_model() { # every site's final checkpoint holds the same global model
    local d=$1/checkpoints f g
    f=$(ls "$d"/a/ckpt-*.h5 2>/dev/null | tail -1)
    [ -n "$f" ] || return 1
    for s in b c; do
        g=$(ls "$d"/$s/ckpt-*.h5 2>/dev/null | tail -1)
        [ "$(basename "$f")" = "$(basename "$g")" ] && h5diff "$f" "$g" /model /model > /dev/null 2>&1 || return 1
    done
}

# 1. three sites == one mpirun of three sites, bit for bit
# shellcheck disable=SC2086
mpi 3 "$ISTHMUS" train "$T" $RUN --set train.steps=16 --set train.out_dir="$WORK/joint" > "$WORK/joint.log" 2>&1 ||
    fail "joint launch failed: $(tail -2 "$WORK/joint.log")"
three fed --set train.steps=16
wait_three
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && grep -q "^federation: 3 sites, 3 ranks in one world" "$WORK/fed_a.log" &&
    h5diff "$WORK/joint/model.h5" "$WORK/fed/model.h5" /model /model > /dev/null 2>&1; then
    pass "three federated sites form one world and train to the joint launch's model, bit for bit"
else
    fail "three sites: exits $ra/$rb/$rc: $(grep -h 'error' "$WORK"/fed_?.log | head -3 | tr '\n' '|')"
fi

# a join broken at the host's first merge
export ISTHMUS_BREAK_JOIN=a:1
three broken --set train.steps=16
unset ISTHMUS_BREAK_JOIN
wait_three
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && grep -q 'broken on purpose' "$WORK/broken_a.log" &&
    [ "$(grep -c 'was dropped from the run or its join broke' "$WORK/broken_b.log")" = 1 ] &&
    grep -q "^federation: 3 sites, 3 ranks in one world" "$WORK/broken_a.log" &&
    h5diff "$WORK/joint/model.h5" "$WORK/broken/model.h5" /model /model > /dev/null 2>&1; then
    pass "a join broken inside Open MPI at the host: every site exits 3, started again the three form the run, the joint launch's model"
else
    fail "broken join of three: exits $ra/$rb/$rc: $(grep -h 'error\|federated.sh' "$WORK"/broken_?.log | head -4 | tr '\n' '|')"
fi

# 2. a site lost and taken back: VICTIM killed (or signalled) after step 40,
# started again once the others have lost it
lose() { # lose NAME VICTIM SIGNAL [train args...]
    local name=$1 v=$2 sig=$3 pids pv o
    shift 3
    three "$name" --set train.log_every=5 "$@"
    [ "$v" = a ] && o=b || o=a
    wait_line "$WORK/${name}_$o.log" '^step  *40/' 60
    pids=$(pgrep -f "isthmus train .* --site $v .*outer.run_id=$name ")
    # shellcheck disable=SC2086
    kill -"$sig" $pids
    case $v in a) pv=$pa ;; b) pv=$pb ;; c) pv=$pc ;; esac
    wait "$pv"
    wait_line "$WORK/${name}_$o.log" "^site $v \(lost\|left\) at step" 30
    site "$v" "$WORK/$name" --set outer.run_id="$name" --set train.log_every=5 "$@" --resume auto \
        > "$WORK/${name}_${v}2.log" 2>&1 &
    case $v in a) pa=$! ;; b) pb=$! ;; c) pc=$! ;; esac
    wait_three
}
lose killc c KILL --set train.steps=800
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && grep -q '^site c lost at step' "$WORK/killc_a.log" &&
    grep -q '^site c lost at step' "$WORK/killc_b.log" && grep -q '^site c rejoined at step' "$WORK/killc_a.log" &&
    grep -q '^site c rejoined at step' "$WORK/killc_b.log" && grep -q '^rejoined the live run at step' "$WORK/killc_c2.log" &&
    grep -q '^step  *800/800 .*| missed c 1' "$WORK/killc_a.log" && same_model "$WORK/killc"; then
    pass "three sites, c killed: a and b train on; c started again is taken back live ($(grep -m1 '^site c rejoined' "$WORK/killc_a.log" | cut -d: -f1)); the same final model on every site"
else
    fail "three sites, c killed: exits $ra/$rb/$rc: $(grep -h 'error\|rejoin\|lost' "$WORK"/killc_?.log "$WORK"/killc_c2.log | head -4 | tr '\n' '|')"
fi
# two sites out at once (a live site's wait for a dead one can make a third
# site find it lost too): a, left alone, answers b's knock "busy" until c
# knocks too, then takes both back together
three killbc --set train.log_every=5 --set train.steps=1500
wait_line "$WORK/killbc_a.log" '^step  *40/' 60
# shellcheck disable=SC2046
kill -KILL $(pgrep -f "isthmus train .* --site [bc] .*outer.run_id=killbc ")
wait $pb
wait $pc
wait_line "$WORK/killbc_a.log" '^site b lost at step' 30
wait_line "$WORK/killbc_a.log" '^site c lost at step' 30
site b "$WORK/killbc" --set outer.run_id=killbc --set train.log_every=5 --set train.steps=1500 --resume auto \
    > "$WORK/killbc_b2.log" 2>&1 &
pb=$!
wait_line "$WORK/killbc_b2.log" '^federation: site b waits for the host' 60
sleep 3 # b's knock answered "busy" meanwhile
early=$(grep -c '^site b rejoined' "$WORK/killbc_a.log") # 0: b waits for c
site c "$WORK/killbc" --set outer.run_id=killbc --set train.log_every=5 --set train.steps=1500 --resume auto \
    > "$WORK/killbc_c2.log" 2>&1 &
pc=$!
wait_three
back_b=$(grep -m1 '^site b rejoined at step' "$WORK/killbc_a.log" | awk '{print $6}')
back_c=$(grep -m1 '^site c rejoined at step' "$WORK/killbc_a.log" | awk '{print $6}')
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && [ "$early" = 0 ] && [ -n "$back_b" ] && [ "$back_b" = "$back_c" ] &&
    grep -q '^rejoined the live run at step' "$WORK/killbc_b2.log" &&
    grep -q '^rejoined the live run at step' "$WORK/killbc_c2.log" && same_model "$WORK/killbc"; then
    pass "three sites, b and c killed: a trains alone, answers b's knock busy until c knocks, then takes both back at step $back_b; the same final model"
else
    fail "three sites, b and c killed: exits $ra/$rb/$rc, b back early $early, back at '$back_b'/'$back_c': $(grep -h 'error\|rejoin\|lost' "$WORK"/killbc_?.log "$WORK"/killbc_?2.log | head -5 | tr '\n' '|')"
fi
# the first site out with another: b, left alone, hosts; a started again
# (its probe: is the run live?) is answered "busy" while b waits for c, and
# waits as long as b's beat moves — past its own join_timeout of 4 s — never
# hosting beside b; then c knocks and b takes both back together
three killac --set train.log_every=5 --set train.steps=4000
wait_line "$WORK/killac_b.log" '^step  *40/' 60
# shellcheck disable=SC2046
kill -KILL $(pgrep -f "isthmus train .* --site [ac] .*outer.run_id=killac ")
wait $pa
wait $pc
wait_line "$WORK/killac_b.log" '^site a lost at step' 30
wait_line "$WORK/killac_b.log" '^site c lost at step' 30
site a "$WORK/killac" --set outer.run_id=killac --set train.log_every=5 --set train.steps=4000 \
    --set outer.join_timeout=4 --resume auto > "$WORK/killac_a2.log" 2>&1 &
pa=$!
sleep 12 # past a's join_timeout, answered "busy" all along
waiting=$(kill -0 $pa 2> /dev/null && echo yes || echo no)
site c "$WORK/killac" --set outer.run_id=killac --set train.log_every=5 --set train.steps=4000 --resume auto \
    > "$WORK/killac_c2.log" 2>&1 &
pc=$!
wait_three
back_a=$(grep -m1 '^site a rejoined at step' "$WORK/killac_b.log" | awk '{print $6}')
back_c=$(grep -m1 '^site c rejoined at step' "$WORK/killac_b.log" | awk '{print $6}')
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && [ "$waiting" = yes ] && [ -n "$back_a" ] &&
    [ "$back_a" = "$back_c" ] && ! grep -q 'hosts run' "$WORK/killac_a2.log" && same_model "$WORK/killac"; then
    pass "three sites, a and c killed: b hosts alone; a started again waits on b's busy beat past its join_timeout, never hosts; both back at step $back_a; the same final model"
else
    fail "three sites, a and c killed: exits $ra/$rb/$rc, a waiting after 12 s: $waiting, back at '$back_a'/'$back_c': $(grep -h 'error\|rejoin\|lost\|hosts' "$WORK"/killac_?.log "$WORK"/killac_?2.log | head -5 | tr '\n' '|')"
fi
lose killa a KILL --set train.steps=800
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && grep -q '^site a lost at step' "$WORK/killa_b.log" &&
    grep -q '^federation: site b hosts run' "$WORK/killa_b.log" && grep -q '^site a rejoined at step' "$WORK/killa_c.log" &&
    grep -q "^federation: site a rejoins run killa at site b's step" "$WORK/killa_a2.log" && same_model "$WORK/killa"; then
    pass "three sites, the host a killed: b hosts, b and c train on; a started again rejoins at b; the same final model"
else
    fail "three sites, a killed: exits $ra/$rb/$rc: $(grep -h 'error\|rejoin\|lost\|hosts' "$WORK"/killa_?.log "$WORK"/killa_a2.log | head -4 | tr '\n' '|')"
fi
lose stopa a USR1 --set train.steps=800
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && grep -q '^site a left at step' "$WORK/stopa_b.log" &&
    grep -q '^site a left at step' "$WORK/stopa_c.log" && grep -q '^site a rejoined at step' "$WORK/stopa_b.log" &&
    same_model "$WORK/stopa"; then
    pass "three sites, USR1 to the first site: a leaves, b and c train on (b hosts); a started again rejoins; the same final model"
else
    fail "three sites, a stopped: exits $ra/$rb/$rc: $(grep -h 'error\|rejoin\|left\|stopping' "$WORK"/stopa_?.log "$WORK"/stopa_a2.log | head -4 | tr '\n' '|')"
fi
# (butterfly needs a power-of-two number of learners: a has two)
NP_A=2 lose bfkillc c KILL --set train.steps=800 --set outer.mode=butterfly --set site.a.ranks=2 \
    --set site.a.learner_ranks=1
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && grep -q '^site c lost at step' "$WORK/bfkillc_a.log" &&
    grep -q '^site c rejoined at step' "$WORK/bfkillc_b.log" && grep -q '^rejoined the live run at step' "$WORK/bfkillc_c2.log" &&
    same_model "$WORK/bfkillc"; then
    pass "three sites, butterfly, c killed: a and b train on; c started again is taken back live at the sites' meeting ($(grep -m1 '^site c rejoined' "$WORK/bfkillc_a.log" | cut -d: -f1)); the same final model"
else
    fail "three sites, butterfly, c killed: exits $ra/$rb/$rc: $(grep -h 'error\|rejoin\|lost' "$WORK"/bfkillc_?.log "$WORK"/bfkillc_c2.log | head -4 | tr '\n' '|')"
fi

# 3. a cold restart after one site trained less
three cold --set train.steps=400 --set train.log_every=5 --set checkpoint.every=20
wait_line "$WORK/cold_a.log" '^step  *40/' 60
kill -KILL $(pgrep -f "isthmus train .* --site c .*outer.run_id=cold ")
wait_line "$WORK/cold_a.log" '^site c lost at step' 30
wait_line "$WORK/cold_a.log" '^step  *120/' 60
kill -USR1 $(pgrep -f "isthmus train .* --site [ab] .*outer.run_id=cold ")
wait_three
stopped=$(sed -n 's/^stopping after step \([0-9]*\) .*/\1/p' "$WORK/cold_a.log" | tail -1)
three cold --set train.steps=400 --set train.log_every=5 --set checkpoint.every=20 --resume auto
wait_three
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $rc -eq 0 ] && [ -n "$stopped" ] &&
    grep -q "^resume: site [ab] holds the run's newest step, $stopped," "$WORK/cold_c.log" &&
    grep -q '^step  *400/400' "$WORK/cold_c.log" && same_model "$WORK/cold"; then
    pass "three sites, cold restart: c lost, a and b stopped at step $stopped; started again, c fetches their state and all continue from $stopped; the same final model"
else
    fail "three sites, cold restart: exits $ra/$rb/$rc, stopped at '${stopped}': $(grep -h 'error\|resume' "$WORK"/cold_?.log | head -4 | tr '\n' '|')"
fi
finish
