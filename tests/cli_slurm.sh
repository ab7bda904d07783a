#!/bin/bash
# cli_slurm.sh — the job scripts of jobs/ submitted to a real Slurm
# controller on this machine (tests/slurm/cluster.sh: munged, slurmctld and
# two slurmd as the nodes siteA and siteB), each on tiny.ini:
#  - site.sbatch trains and writes its model (srun --mpi=pmix chosen by itself);
#  - two-site.sbatch, one heterogeneous job (a component per site), trains
#    across both in diloco with fp4 and its log shows the inter-site bytes;
#  - a job whose time limit comes checkpoints on Slurm's USR1 and exits 0;
#  - `scontrol requeue` of a running job: it resumes from its checkpoint in
#    its next start and ends on the same model as an undisturbed run;
#  - the federated pair (ompi-server.sbatch, site.sbatch a and b): scancel
#    of site b's job lets b leave while a trains on; b submitted again
#    rejoins the live run and both end on the same model;
#  - a federated site alone in its queue waits, is requeued by its time-limit
#    signal and, requeued, meets the other site (each site in a directory of
#    its own, the server given as HOST:PORT: nothing shared but the network);
#  - a pause of every site (both sites' stop at one step, as when the first
#    site's time limit pauses the whole run): neither job is signalled, each
#    writes its pause marker and both jobs requeue themselves; requeued, they
#    train to the end, the same final model at both;
#  - three federated sites (a and c on siteA, b on siteB): the first site's
#    time-limit signal pauses it alone — a leaves, its job requeues, b hosts
#    and b and c train on; requeued, a rejoins live; every site ends on the
#    same model;
#  - three sites paused at one step (the hook at every site): all three
#    jobs requeue themselves, resume and end on the same model;
#  - a federated site whose name server does not answer waits
#    ISTHMUS_SERVER_WAIT and requeues its job (exit 2 with ISTHMUS_REQUEUE=0);
#  - the harness stops every daemon it started, by PID.
# Skipped (visibly) when the Slurm packages are not installed.
. "$TOP_SRCDIR/tests/lib.sh"
if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null || ! command -v munged > /dev/null; then
    echo "1..0 # SKIP Slurm is not installed (apt-get install slurm-wlm munge)"
    exit 0
fi
CLUSTER="$TOP_SRCDIR/tests/slurm/cluster.sh"
CL="$WORK/cluster"
trap '"$CLUSTER" stop "$CL"; rm -rf "$WORK"' EXIT
if ! "$CLUSTER" start "$CL" > "$WORK/cluster.log" 2>&1; then
    fail "the Slurm cluster did not start: $(tail -2 "$WORK/cluster.log")"
    finish
    exit 1
fi
export SLURM_CONF="$CL/slurm.conf"
pass "munged, slurmctld and two slurmd (siteA, siteB) are up, both nodes idle"
# both nodes are this host: Open MPI keeps to its local transports
export OMPI_MCA_btl=self,vader,tcp ISTHMUS_JOBS="$TOP_SRCDIR/jobs"
T="$CONFIGS/tiny.ini"
SHORT="--set data.eval_bytes=4096 --set train.log_every=50"

job_field() { scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
wait_state() { # wait_state JOB STATE SECONDS: until the state, the deadline, or another end state
    local n=0 st
    while st=$(job_field "$1" JobState) && [ "$st" != "$2" ]; do
        n=$((n + 1))
        [ $n -gt $(($3 * 5)) ] && return 1
        case $st in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) return 1 ;; esac
        sleep 0.2
    done
}
# start_requeued JOB...: once each job has requeued itself (its first
# start over, pending again), start it now rather than in two minutes
start_requeued() {
    local j
    for j in "$@"; do
        for _ in $(seq 1 900); do
            [ "$(job_field "$j" Restarts)" = 1 ] && [ "$(job_field "$j" JobState)" = PENDING ] && break
            case $(job_field "$j" JobState) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
            sleep 0.2
        done
        scontrol update JobId="$j" StartTime=now 2> /dev/null
    done
}
wait_log() { # wait_log FILE PATTERN SECONDS JOB: until the line, the deadline, or the job's end
    local n=0 st
    while ! grep -q "$2" "$1" 2> /dev/null; do
        n=$((n + 1))
        [ $n -gt $(($3 * 5)) ] && return 1
        st=$(job_field "$4" JobState)
        case $st in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) grep -q "$2" "$1" 2> /dev/null; return ;; esac
        sleep 0.2
    done
}

# 1. one site, srun --mpi=pmix (the script's own choice here)
ISTHMUS_OUT="$WORK/one" ISTHMUS_ARGS="$SHORT --set train.steps=30" timeout 180 \
    sbatch --wait -N1 --ntasks-per-node=2 -w siteA -o "$WORK/one.log" "$TOP_SRCDIR/jobs/site.sbatch" "$T" > /dev/null
rc=$?
if [ $rc -eq 0 ] && [ -f "$WORK/one/model.h5" ] && grep -q "launching with srun --mpi=pmix" "$WORK/one.log" &&
    grep -q "^wrote .*one/model.h5 (step 30)" "$WORK/one.log"; then
    pass "site.sbatch: 2 ranks through srun --mpi=pmix train and write the model"
else
    fail "site.sbatch: sbatch exit $rc: $(grep -h 'error' "$WORK/one.log" | head -2)"
fi

# 2. the joint launch as one heterogeneous job; both nodes are this host,
# so one mpirun starts every rank here (see jobs/README.md); the node names
# are not host names, so mpirun is kept from Slurm's node list too
LOCAL_MPIRUN="-q --mca plm isolated --mca ras ^slurm --oversubscribe"
ISTHMUS_LAUNCHER=mpirun ISTHMUS_MPIRUN_ARGS="$LOCAL_MPIRUN" \
    ISTHMUS_OUT="$WORK/het" ISTHMUS_ARGS="$SHORT --set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco
 --set outer.codec=fp4 --set outer.inner_steps=4 --set train.steps=40" timeout 180 \
    sbatch --wait -o "$WORK/het.log" -w siteA : -w siteB "$TOP_SRCDIR/jobs/two-site.sbatch" "$T" > /dev/null
rc=$?
bytes=$(sed -n 's/^inter-site traffic: \([0-9]*\) bytes.*/\1/p' "$WORK/het.log")
if [ $rc -eq 0 ] && grep -q "component 0: 1 rank(s) on siteA, component 1: 1 rank(s) on siteB" "$WORK/het.log" &&
    [ "${bytes:-0}" -gt 0 ] && [ -f "$WORK/het/model.h5" ]; then
    pass "two-site.sbatch: a heterogeneous job (siteA + siteB) trains diloco/fp4 across both, $bytes inter-site bytes"
else
    fail "two-site.sbatch: sbatch exit $rc: $(grep -h 'error\|components' "$WORK/het.log" | head -2)"
fi

# 3. the time limit: USR1 before it, a checkpoint, exit 0 (no requeue here)
ISTHMUS_REQUEUE=0 ISTHMUS_OUT="$WORK/limit" ISTHMUS_ARGS="$SHORT --set train.steps=10000000" timeout 240 \
    sbatch --wait -N1 -w siteA --time=1 --signal=B:USR1@45 -o "$WORK/limit.log" "$TOP_SRCDIR/jobs/site.sbatch" "$T" \
    > "$WORK/limit.id"
rc=$?
jid=$(sed -n 's/^Submitted batch job //p' "$WORK/limit.id")
newest=$(ls "$WORK"/limit/checkpoints/*/ckpt-*.h5 2> /dev/null | tail -1)
if [ $rc -eq 0 ] && grep -q "^stopping after step [0-9]* on request (signal)" "$WORK/limit.log" &&
    grep -q "exit 0 after SIGUSR1" "$WORK/limit.log" && [ "$(job_field "$jid" JobState)" = COMPLETED ] &&
    [ -n "$newest" ] && "$ISTHMUS" inspect "$newest" 2> /dev/null | grep -q '^verdict: valid'; then
    pass "time limit: USR1 after $(job_field "$jid" RunTime) of a 1-min limit, checkpoint $(basename "$newest") valid, exit 0 (COMPLETED)"
else
    fail "time limit: sbatch exit $rc, state $(job_field "$jid" JobState): $(grep -h 'error\|stopping' "$WORK/limit.log" | head -2)"
fi

# 4. scontrol requeue: the job resumes from its checkpoint and ends on the
# model of an undisturbed run (outside Slurm, the same settings)
RQ="$SHORT --set train.steps=1500 --set checkpoint.every=100"
# shellcheck disable=SC2086
mpi 1 "$ISTHMUS" train "$T" $RQ --set train.out_dir="$WORK/ref" > "$WORK/ref.log" 2>&1 || fail "reference run failed"
jid=$(ISTHMUS_OUT="$WORK/rq" ISTHMUS_ARGS="$RQ" sbatch --parsable -N1 -w siteA -o "$WORK/rq.log" \
    "$TOP_SRCDIR/jobs/site.sbatch" "$T")
wait_log "$WORK/rq.log" '^step  *300/' 120 "$jid" && scontrol requeue "$jid"
# Slurm holds a requeued job back (its begin time ~2 min ahead): start it
# now, once its first start has ended (a loaded machine takes a while)
for _ in $(seq 1 300); do [ "$(job_field "$jid" JobState)" = PENDING ] && break; sleep 0.2; done
scontrol update JobId="$jid" StartTime=now 2> /dev/null
wait_state "$jid" COMPLETED 240
if [ "$(job_field "$jid" JobState)" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] &&
    grep -q "(restart 1)" "$WORK/rq.log" && grep -q "^resumed from .*ckpt-" "$WORK/rq.log" &&
    h5diff "$WORK/ref/model.h5" "$WORK/rq/model.h5" /model /model > /dev/null 2>&1; then
    pass "scontrol requeue: $(grep -m1 '^resumed from' "$WORK/rq.log" | sed 's|.*/||; s|:.*||') resumed; the final model is the undisturbed run's, bit for bit"
else
    fail "requeue: state $(job_field "$jid" JobState), restarts $(job_field "$jid" Restarts), exit $(job_field "$jid" ExitCode), reason $(job_field "$jid" Reason); the job's lines that are neither config nor steps: $(grep -v '^step \|^\[\|^[a-z_0-9]* = \|^  \|^$' "$WORK/rq.log" | tail -12 | tr '\n' '|'); slurmd: $(grep -h 'error' "$CL"/log/slurmd-siteA.log | tail -4 | tr '\n' '|')"
fi

# 5. the federated pair: ompi-server's job, one job per site; scancel of
# site b's job, then b submitted again
FED="$SHORT --set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.codec=fp4
 --set outer.inner_steps=4 --set train.steps=1500 --set outer.timeout=5 --set outer.run_id=slurm-fed"
URI="$WORK/fed/ompi-server.uri"
SPORT=23900 # the server's port (ISTHMUS_PORTS' first): section 6's sites give it as HOST:PORT
sjid=$(ISTHMUS_PORTS=$SPORT-$((SPORT + 23)) sbatch --parsable -w siteA -o "$WORK/server.log" \
    "$TOP_SRCDIR/jobs/ompi-server.sbatch" "$URI")
submit_site() { # submit_site NAME NODE LOG
    ISTHMUS_SITE=$1 ISTHMUS_SERVER="$URI" ISTHMUS_OUT="$WORK/fed" ISTHMUS_ARGS="$FED" ISTHMUS_MPIRUN_ARGS="$LOCAL_MPIRUN" \
        sbatch --parsable -w "$2" -o "$3" "$TOP_SRCDIR/jobs/site.sbatch" "$T"
}
ajid=$(submit_site a siteA "$WORK/fed_a.log")
bjid=$(submit_site b siteB "$WORK/fed_b.log")
wait_log "$WORK/fed_a.log" '^step  *200/' 180 "$ajid" && scancel "$bjid"
wait_log "$WORK/fed_a.log" '^site b left at step\|^site b lost at step' 60 "$ajid"
b2jid=$(submit_site b siteB "$WORK/fed_b2.log")
wait_state "$ajid" COMPLETED 300
wait_state "$b2jid" COMPLETED 120
fa=$(ls "$WORK"/fed/checkpoints/a/ckpt-*.h5 2> /dev/null | tail -1)
fb=$(ls "$WORK"/fed/checkpoints/b/ckpt-*.h5 2> /dev/null | tail -1)
if [ "$(job_field "$ajid" JobState)" = COMPLETED ] && [ "$(job_field "$b2jid" JobState)" = COMPLETED ] &&
    grep -q '^site b \(left\|lost\) at step' "$WORK/fed_a.log" && grep -q '^site b rejoined at step' "$WORK/fed_a.log" &&
    grep -q '^rejoined the live run at step' "$WORK/fed_b2.log" && [ -n "$fa" ] &&
    [ "$(basename "$fa")" = "$(basename "$fb")" ] && h5diff "$fa" "$fb" /model /model > /dev/null 2>&1; then
    pass "federated jobs: scancel of b ($(grep -m1 '^site b \(left\|lost\) at step' "$WORK/fed_a.log" | cut -d: -f1)), a trains on, b resubmitted rejoins; the same final model"
else
    fail "federated jobs: a $(job_field "$ajid" JobState), b2 $(job_field "$b2jid" JobState): $(grep -h 'error\|left\|lost\|rejoin' "$WORK"/fed_*.log | head -3)"
fi

# 6. sites in different queues: site a's job starts alone and waits (site.sbatch
# sets outer.join_timeout = 0) naming whom; its time-limit signal (USR1 to the
# batch shell, as --signal=B:USR1 sends it) ends the wait with exit 0 and the
# job requeues itself; requeued, it meets site b and the run forms. No file
# in common: each site has a directory of its own (out_dir, a copy of the
# key made once) and is given the server as HOST:PORT
mkdir -p "$WORK/queue_a" "$WORK/queue_b" && "$ISTHMUS" keygen "$WORK/queue_a/run.key" > /dev/null &&
    cp -p "$WORK/queue_a/run.key" "$WORK/queue_b/run.key"
submit_q() { # submit_q NAME NODE LOG
    ISTHMUS_SITE=$1 ISTHMUS_SERVER="127.0.0.1:$SPORT" ISTHMUS_OUT="$WORK/queue_$1" ISTHMUS_ARGS="$FED
 --set outer.run_id=slurm-queue --set train.steps=40 --set outer.key_file=$WORK/queue_$1/run.key" \
        ISTHMUS_MPIRUN_ARGS="$LOCAL_MPIRUN" sbatch --parsable -w "$2" -o "$3" "$TOP_SRCDIR/jobs/site.sbatch" "$T"
}
qa=$(submit_q a siteA "$WORK/queue_a.log")
wait_log "$WORK/queue_a.log" 'waiting for site(s) b (no limit: until stopped)' 120 "$qa" && scancel -s USR1 -b "$qa"
for _ in $(seq 1 300); do [ "$(job_field "$qa" JobState)" = PENDING ] && break; sleep 0.2; done
qb=$(submit_q b siteB "$WORK/queue_b.log")
scontrol update JobId="$qa" StartTime=now 2> /dev/null
wait_state "$qa" COMPLETED 240
wait_state "$qb" COMPLETED 120
if [ "$(job_field "$qa" JobState)" = COMPLETED ] && [ "$(job_field "$qa" Restarts)" = 1 ] &&
    [ "$(job_field "$qb" JobState)" = COMPLETED ] &&
    grep -q "stopped by a signal while waiting for site(s) b" "$WORK/queue_a.log" &&
    grep -q "isthmus job: exit 0 after SIGUSR1" "$WORK/queue_a.log" && grep -q "requeueing job $qa" "$WORK/queue_a.log" &&
    grep -q "(restart 1)" "$WORK/queue_a.log" && grep -q "site b joined (proof verified)" "$WORK/queue_a.log" &&
    [ -f "$WORK/queue_a/model.h5" ] && [ -f "$WORK/queue_b/checkpoints/b/ckpt-00000040.h5" ]; then
    pass "a site alone in its queue waits without a limit, its time-limit signal requeues it (exit 0), and requeued it meets site b (the server given as HOST:PORT, no file in common): the run trains to the end"
else
    fail "queue: a $(job_field "$qa" JobState) (restarts $(job_field "$qa" Restarts)), b $(job_field "$qb" JobState): $(grep -h 'federation\|isthmus job\|error' "$WORK"/queue_?.log | head -8 | tr '\n' '|')"
fi

# 7. a pause of every site: the test hook stops both sites at step 45 (the
# site votes are agreed after step 46 and ride on the same verdicts: no
# exchange posts its verdicts at step 46), a stop every site asked for, as a
# pause; no job sees a signal, each site writes its marker, and both jobs
# requeue themselves (site.sbatch reads the marker). Requeued (started now
# rather than in two minutes), they resume and train to the end.
submit_p() { # submit_p NAME NODE LOG
    ISTHMUS_STOP_AT_STEP=45 ISTHMUS_SITE=$1 ISTHMUS_SERVER="$URI" ISTHMUS_OUT="$WORK/pause" ISTHMUS_ARGS="$FED
 --set outer.run_id=slurm-pause --set train.steps=120" ISTHMUS_MPIRUN_ARGS="$LOCAL_MPIRUN" \
        sbatch --parsable -w "$2" -o "$3" "$TOP_SRCDIR/jobs/site.sbatch" "$T"
}
pja=$(submit_p a siteA "$WORK/pause_a.log")
pjb=$(submit_p b siteB "$WORK/pause_b.log")
start_requeued $pja $pjb
wait_state "$pja" COMPLETED 240
wait_state "$pjb" COMPLETED 120
fa=$(ls "$WORK"/pause/checkpoints/a/ckpt-*.h5 2> /dev/null | tail -1)
fb=$(ls "$WORK"/pause/checkpoints/b/ckpt-*.h5 2> /dev/null | tail -1)
at=$(sed -n 's/^stopping after step \([0-9]*\) on request (signal): a pause of every site.*/\1/p' "$WORK/pause_b.log" | head -1)
if [ "$(job_field "$pja" JobState)" = COMPLETED ] && [ "$(job_field "$pjb" JobState)" = COMPLETED ] &&
    [ "$(job_field "$pja" Restarts)" = 1 ] && [ "$(job_field "$pjb" Restarts)" = 1 ] && [ -n "$at" ] &&
    grep -q "^isthmus job: paused ($WORK/pause/paused-a: step $at: a pause of every site); requeueing job $pja" "$WORK/pause_a.log" &&
    grep -q "^isthmus job: paused ($WORK/pause/paused-b: step $at: a pause of every site); requeueing job $pjb" "$WORK/pause_b.log" &&
    ! grep -q "isthmus job: exit 0 after SIG" "$WORK/pause_b.log" && grep -q "^resumed from .*: step $at," "$WORK/pause_b.log" &&
    [ "$(basename "$fa")" = ckpt-00000120.h5 ] && [ "$(basename "$fb")" = ckpt-00000120.h5 ] &&
    h5diff "$fa" "$fb" /model /model > /dev/null 2>&1 && ! ls "$WORK"/pause/paused-* > /dev/null 2>&1; then
    pass "a pause of every site at step $at: both jobs (neither signalled) requeue on their pause markers, resume and train to the end, the same final model"
else
    fail "pause of every site: a $(job_field "$pja" JobState) (restarts $(job_field "$pja" Restarts)), b $(job_field "$pjb" JobState) (restarts $(job_field "$pjb" Restarts)), paused at '$at': $(grep -h 'isthmus job\|^stopping\|^paused\|^resumed\|error' "$WORK"/pause_?.log | head -8 | tr '\n' '|')"
fi

# 7b. three sites: USR1 to site a's batch shell (its time limit, as
# --signal=B:USR1 sends it): a pauses alone (it leaves, its marker
# written), its job requeues itself; b hosts, b and c train on; requeued
# (started now), a rejoins at b; all three end on the same model
FED3="$FED --set site.c.ranks=1 --set train.steps=900"
submit_3() { # submit_3 NAME NODE LOG RUN_ID [env...]: a site of the three-site run
    local name=$1 node=$2 log=$3 id=$4
    shift 4
    env "$@" ISTHMUS_SITE="$name" ISTHMUS_SERVER="$URI" ISTHMUS_OUT="$WORK/$id" ISTHMUS_ARGS="$FED3 --set outer.run_id=$id" \
        ISTHMUS_MPIRUN_ARGS="$LOCAL_MPIRUN" sbatch --parsable -w "$node" -o "$log" "$TOP_SRCDIR/jobs/site.sbatch" "$T"
}
same3() { # same3 DIR: every site's newest checkpoint is of STEP and holds the same model
    local f g s
    f=$(ls "$1"/checkpoints/a/ckpt-*.h5 2> /dev/null | tail -1)
    [ "$(basename "$f")" = "$2" ] || return 1
    for s in b c; do
        g=$(ls "$1"/checkpoints/$s/ckpt-*.h5 2> /dev/null | tail -1)
        [ "$(basename "$g")" = "$2" ] && h5diff "$f" "$g" /model /model > /dev/null 2>&1 || return 1
    done
}
j3a=$(submit_3 a siteA "$WORK/t3_a.log" slurm-three)
j3b=$(submit_3 b siteB "$WORK/t3_b.log" slurm-three)
j3c=$(submit_3 c siteA "$WORK/t3_c.log" slurm-three)
wait_log "$WORK/t3_a.log" '^step  *200/' 180 "$j3a" && scancel -s USR1 -b "$j3a"
start_requeued "$j3a"
wait_state "$j3a" COMPLETED 300
wait_state "$j3b" COMPLETED 120
wait_state "$j3c" COMPLETED 120
if [ "$(job_field "$j3a" JobState)" = COMPLETED ] && [ "$(job_field "$j3a" Restarts)" = 1 ] &&
    [ "$(job_field "$j3b" JobState)" = COMPLETED ] && [ "$(job_field "$j3c" JobState)" = COMPLETED ] &&
    grep -q "^isthmus job: paused ($WORK/slurm-three/paused-a: step [0-9]*: .*); requeueing job $j3a" "$WORK/t3_a.log" &&
    grep -q '^site a left at step' "$WORK/t3_b.log" && grep -q '^site a left at step' "$WORK/t3_c.log" &&
    grep -q '^federation: site b hosts run' "$WORK/t3_b.log" && grep -q '^site a rejoined at step' "$WORK/t3_c.log" &&
    grep -q '^rejoined the live run at step' "$WORK/t3_a.log" && same3 "$WORK/slurm-three" ckpt-00000900.h5; then
    pass "three sites: the first site's time limit pauses it alone (its job requeues), b hosts and b and c train on; requeued, a rejoins ($(grep -m1 '^site a rejoined' "$WORK/t3_c.log" | cut -d: -f1)); the same final model at all three"
else
    fail "three sites, a's time limit: a $(job_field "$j3a" JobState) (restarts $(job_field "$j3a" Restarts)), b $(job_field "$j3b" JobState), c $(job_field "$j3c" JobState): $(grep -h 'isthmus job\|^site a\|^rejoined\|error' "$WORK"/t3_?.log | head -8 | tr '\n' '|')"
fi

# 7c. three sites paused at one step (the hook at all three: a stop every
# site asked for, a pause): all three jobs requeue on their markers,
# resume and train to the end
pids3=""
for s in a b c; do
    node=siteA
    [ $s = b ] && node=siteB
    pids3="$pids3 $(submit_3 $s $node "$WORK/p3_$s.log" slurm-pause3 ISTHMUS_STOP_AT_STEP=45)"
done
start_requeued $pids3
ok3=1
for j in $pids3; do
    wait_state "$j" COMPLETED 300
    [ "$(job_field "$j" JobState)" = COMPLETED ] && [ "$(job_field "$j" Restarts)" = 1 ] || ok3=0
done
for s in a b c; do
    grep -q "^isthmus job: paused ($WORK/slurm-pause3/paused-$s: step [0-9]*: a pause of every site); requeueing job" \
        "$WORK/p3_$s.log" || ok3=0
done
if [ $ok3 = 1 ] && same3 "$WORK/slurm-pause3" ckpt-00000900.h5 && ! ls "$WORK"/slurm-pause3/paused-* > /dev/null 2>&1; then
    pass "three sites paused at one step: all three jobs (none signalled) requeue on their markers, resume and train to the end, the same final model"
else
    fail "three sites paused: $(for j in $pids3; do printf '%s ' "$(job_field "$j" JobState)/$(job_field "$j" Restarts)"; done): $(grep -h 'isthmus job\|^stopping\|^paused\|^resumed\|error' "$WORK"/p3_?.log | head -8 | tr '\n' '|')"
fi

# 7d. no name server answering: a site's job waits ISTHMUS_SERVER_WAIT and
# then requeues itself (back in the queue, like a site waiting for the
# other), not exit 2; with ISTHMUS_REQUEUE=0 it ends with exit 2
submit_ns() { # submit_ns LOG [env...]: site a of a run whose server does not answer (port 9)
    local log=$1
    shift
    env "$@" ISTHMUS_SITE=a ISTHMUS_SERVER=127.0.0.1:9 ISTHMUS_SERVER_WAIT=2 ISTHMUS_OUT="$WORK/noserver" \
        ISTHMUS_ARGS="$FED" ISTHMUS_MPIRUN_ARGS="$LOCAL_MPIRUN" sbatch --parsable -w siteB -o "$log" \
        "$TOP_SRCDIR/jobs/site.sbatch" "$T"
}
nsj=$(submit_ns "$WORK/noserver.log")
for _ in $(seq 1 300); do
    [ "$(job_field "$nsj" Restarts)" = 1 ] && [ "$(job_field "$nsj" JobState)" = PENDING ] && break
    sleep 0.2
done
if [ "$(job_field "$nsj" Restarts)" = 1 ] && [ "$(job_field "$nsj" JobState)" = PENDING ] &&
    grep -q "^isthmus job: ompi-server 127.0.0.1:9 not answering after [0-9]* s (ISTHMUS_SERVER_WAIT); requeueing job $nsj to try again" \
        "$WORK/noserver.log"; then
    pass "no name server: the site's job waits ISTHMUS_SERVER_WAIT, then requeues itself (pending again, restart 1)"
else
    fail "no name server: job $nsj $(job_field "$nsj" JobState), restarts $(job_field "$nsj" Restarts), exit $(job_field "$nsj" ExitCode): $(grep -h 'isthmus job\|site.sbatch' "$WORK/noserver.log" | tail -3 | tr '\n' '|')"
fi
scancel "$nsj"
nsj=$(submit_ns "$WORK/noserver0.log" ISTHMUS_REQUEUE=0)
wait_state "$nsj" COMPLETED 60
if [ "$(job_field "$nsj" JobState)" = FAILED ] && [ "$(job_field "$nsj" ExitCode)" = 2:0 ] &&
    [ "$(job_field "$nsj" Restarts)" = 0 ] && grep -q "ompi-server 127.0.0.1:9 not answering" "$WORK/noserver0.log"; then
    pass "no name server, ISTHMUS_REQUEUE=0: the job ends with exit 2, not requeued"
else
    fail "no name server, no requeue: job $nsj $(job_field "$nsj" JobState), exit $(job_field "$nsj" ExitCode), restarts $(job_field "$nsj" Restarts)"
fi
scancel "$sjid"

# 8. the harness stops what it started, by PID (also on the way out of a failed test: the trap)
pids=$("$CLUSTER" alive "$CL")
"$CLUSTER" stop "$CL"
left=""
for p in $pids; do kill -0 "$p" 2> /dev/null && left="$left $p"; done
if [ "$(echo "$pids" | wc -w)" -eq 4 ] && [ -z "$left" ] && ! "$CLUSTER" alive "$CL" > /dev/null; then
    pass "cluster.sh stop: munged, slurmctld and both slurmd ($(echo $pids | tr ' ' ',')) are gone"
else
    fail "cluster.sh stop: daemons alive before: '$pids', after:$left"
fi

finish || exit 1
