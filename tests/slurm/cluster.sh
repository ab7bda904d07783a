#!/bin/bash
# cluster.sh — a real Slurm controller on this machine for the job-script
# tests: munged, slurmctld and two slurmd daemons on localhost, as the two
# Slurm nodes siteA and siteB (one partition, both nodes), so that
# heterogeneous jobs schedule. Nothing is installed system-wide: every
# file (config, keys, spool, state, logs, sockets) lives under DIR, and the
# daemons are started by hand (no init system) and stopped by PID.
#
#   cluster.sh start DIR    write the config, start the daemons, wait for
#                           both nodes to be idle; prints `export
#                           SLURM_CONF=DIR/slurm.conf` for the caller
#   cluster.sh stop DIR     stop every daemon started in DIR (by PID)
#   cluster.sh alive DIR    the PIDs of DIR's daemons still alive (exit 1: none)
#
# What one host needs to be two nodes (Debian 12, Slurm 22.05): a Port per
# NodeName, a spool and log per node (%n), SlurmdParameters=config_overrides
# with a CPU count so that ranks may oversubscribe the cores, PMIx's client
# directory in mpi.conf; munged on its own socket (AuthInfo=socket=...).
set -u
die() { echo "cluster.sh: $*" >&2; exit 2; }   # bad use, or Slurm missing
broken() { echo "cluster.sh: $*" >&2; exit 1; } # a daemon did not come up

cmd_start() {
    local dir=$1 host base
    command -v slurmctld > /dev/null && command -v slurmd > /dev/null && command -v munged > /dev/null ||
        die "slurmctld, slurmd or munged missing (apt-get install slurm-wlm munge)"
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    cmd_stop "$dir" 2> /dev/null
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/pmix" "$dir/run"
    chmod 700 "$dir/munge"
    host=$(hostname -s)
    # ports from the PID: two harnesses on one machine do not collide
    base=$((20000 + ($$ % 2000) * 4))
    # munge: a fresh key, its own socket
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" ||
        broken "munged did not start (see $dir/log/munged.log)"
    cat > "$dir/slurm.conf" <<CONF
ClusterName=isthmus-test
SlurmctldHost=$host
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
SchedulerParameters=defer_batch
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=siteA NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=8 RealMemory=4000 State=UNKNOWN
NodeName=siteB NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes=siteA,siteB Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
    printf 'PMIxCliTmpDirBase=%s/pmix\n' "$dir" > "$dir/mpi.conf"
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -c -f "$SLURM_CONF" || broken "slurmctld did not start (see $dir/log/slurmctld.log)"
    for n in siteA siteB; do
        slurmd -N "$n" -f "$SLURM_CONF" || broken "slurmd $n did not start (see $dir/log/slurmd-$n.log)"
    done
    local idle=0
    for _ in $(seq 1 150); do
        idle=$(sinfo -h -N -o '%N %t' 2> /dev/null | grep -c ' idle$')
        [ "$idle" -eq 2 ] && break
        sleep 0.2
    done
    [ "$idle" -eq 2 ] || broken "the nodes did not come up idle: $(sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ') (see $dir/log)"
    echo "export SLURM_CONF=$SLURM_CONF"
}

cmd_stop() {
    local dir=$1 f pid
    # the jobs first: a job's processes outlive a killed slurmd
    if [ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2> /dev/null; then
        SLURM_CONF=$dir/slurm.conf scancel --full --quiet --user=root 2> /dev/null
        for _ in $(seq 1 50); do
            [ -z "$(SLURM_CONF=$dir/slurm.conf squeue -h -t running,completing 2> /dev/null)" ] && break
            sleep 0.2
        done
    fi
    for f in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        if [ -n "$pid" ] && kill "$pid" 2> /dev/null; then
            for _ in $(seq 1 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2> /dev/null
        fi
        rm -f "$f"
    done
    return 0
}

# The daemons started in DIR that are alive (PIDs), one per line; exit 1
# when none is.
cmd_alive() {
    local dir=$1 f pid any=1
    for f in "$dir"/run/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        if [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null; then echo "$pid"; any=0; fi
    done
    return $any
}

case "${1:-}" in
alive) shift; [ $# -eq 1 ] || die "usage: cluster.sh alive DIR"; cmd_alive "$1" ;;
start) shift; [ $# -eq 1 ] || die "usage: cluster.sh start DIR"; cmd_start "$1" ;;
stop) shift; [ $# -eq 1 ] || die "usage: cluster.sh stop DIR"; cmd_stop "$1" ;;
*) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
