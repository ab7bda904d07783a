# shellcheck shell=bash
# lib.sh — what the isthmus job scripts share (sourced, not run): finding
# the executable, choosing the launcher, waiting for ompi-server, and
# running the launch with the signals Slurm sends passed on.
#
# Slurm runs a copy of the batch script from its spool directory, so the
# scripts find this file and the tree through SLURM_SUBMIT_DIR (submit from
# the isthmus tree) or ISTHMUS_JOBS / ISTHMUS (set them to submit from
# elsewhere); installed (`make install`), through the paths written in.

# ISTHMUS (the executable) and ISTHMUS_TREE (its source tree, or where
# `make install` put the jobs: PREFIX/share/isthmus, for scripts/). The
# executable: ISTHMUS, else the tree's, else the one installed with these
# scripts (its directory written in at install), else isthmus on PATH.
isthmus_locate() {
    ISTHMUS_TREE=$(cd "${ISTHMUS_JOBS:-${SLURM_SUBMIT_DIR:-.}/jobs}/.." && pwd)
    if [ -z "${ISTHMUS:-}" ]; then
        if [ -x "$ISTHMUS_TREE/isthmus" ]; then ISTHMUS=$ISTHMUS_TREE/isthmus
        elif [ -x "@ISTHMUS_BINDIR@/isthmus" ]; then ISTHMUS=@ISTHMUS_BINDIR@/isthmus
        else ISTHMUS=$(command -v isthmus || true)
        fi
    fi
    [ -n "$ISTHMUS" ] && [ -x "$ISTHMUS" ] || {
        echo "isthmus job: no isthmus executable (set ISTHMUS, or submit from a built tree)" >&2
        return 2
    }
    export ISTHMUS ISTHMUS_TREE
}

# From the environment: `sets` (the --set arguments: ISTHMUS_OUT,
# ISTHMUS_CKPT, ISTHMUS_ARGS) and `args` (those and --resume auto, unless
# ISTHMUS_RESUME=none), the arguments every start of `isthmus train` gets.
isthmus_train_args() {
    sets=()
    [ -n "${ISTHMUS_OUT:-}" ] && sets+=(--set "train.out_dir=$ISTHMUS_OUT")
    [ -n "${ISTHMUS_CKPT:-}" ] && sets+=(--set "checkpoint.dir=$ISTHMUS_CKPT")
    # shellcheck disable=SC2206
    [ -n "${ISTHMUS_ARGS:-}" ] && sets+=(${ISTHMUS_ARGS})
    args=(--resume auto "${sets[@]}")
    # shellcheck disable=SC2034 # sets and args are for the caller
    [ "${ISTHMUS_RESUME:-auto}" = none ] && args=("${sets[@]}")
    return 0
}

# The resolved value of section.key in CONFIG with the given --set args.
isthmus_config_value() {
    local config=$1 key=$2
    shift 2
    "$ISTHMUS" config "$config" "$@" 2> /dev/null |
        awk -v sec="[${key%%.*}]" -v k="${key#*.}" '
            /^\[/ { in_sec = ($0 == sec) } in_sec && $1 == k && $2 == "=" { sub(/^[^=]*= */, ""); print; exit }'
}

# Wait up to SECONDS for ompi-server (SERVER: its URI file, the URI itself,
# or HOST:PORT; scripts/federated.sh) to answer: 0 when it does. When it
# does not, or the time-limit signal (USR1) comes first, the job requeues
# itself (ISTHMUS_REQUEUE=1, the default, under Slurm) and the caller exits
# 0: the job is back in the queue, as a site's job waiting for the other
# site is (the server's job may not have started yet); 2 without a requeue
# (no Slurm, ISTHMUS_REQUEUE=0, or cancelled: TERM).
isthmus_wait_server() {
    local server=$1 wait=$2 start=$SECONDS signalled=
    trap 'signalled=USR1' USR1
    trap 'signalled=TERM' TERM INT
    while ! "$ISTHMUS_TREE/scripts/federated.sh" check "$server" 2> /dev/null; do
        [ -z "$signalled" ] && [ $((SECONDS - start)) -lt "$wait" ] || break
        sleep 1
    done
    trap - USR1 TERM INT
    "$ISTHMUS_TREE/scripts/federated.sh" check "$server" 2> /dev/null && [ -z "$signalled" ] && return 0
    local why="not answering after $((SECONDS - start)) s"
    [ -n "$signalled" ] && why="not answering when SIG$signalled came ($((SECONDS - start)) s)"
    if [ "$signalled" != TERM ] && [ "${ISTHMUS_REQUEUE:-1}" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "isthmus job: ompi-server $server $why (ISTHMUS_SERVER_WAIT); requeueing job $SLURM_JOB_ID to try again"
        scontrol requeue "$SLURM_JOB_ID"
        isthmus_leave_the_second
        return 1
    fi
    echo "isthmus job: ompi-server $server $why (submit jobs/ompi-server.sbatch first, or set ISTHMUS_SERVER)" >&2
    return 2
}

# LAUNCH: the command that starts NTASKS ranks in this allocation.
isthmus_launcher() {
    local ntasks=$1 how=${ISTHMUS_LAUNCHER:-auto}
    if [ "$how" = auto ]; then
        how=mpirun
        srun --mpi=list 2>&1 | grep -q pmix && how=srun
    fi
    # ISTHMUS_MPIRUN_ARGS splits into words on purpose
    # shellcheck disable=SC2206
    case $how in
    srun) LAUNCH=(srun --mpi=pmix --kill-on-bad-exit=1) ;;
    mpirun) LAUNCH=(mpirun ${ISTHMUS_MPIRUN_ARGS:-} -np "$ntasks") ;;
    *) echo "isthmus job: ISTHMUS_LAUNCHER=$how: srun, mpirun or auto" >&2; return 2 ;;
    esac
    echo "isthmus job: launching with ${LAUNCH[*]}"
}

# PAUSED: the pause marker isthmus writes when this job's site stops on a
# pause (its own time limit, or a pause of every site that another site's
# time limit started): <out_dir>/paused, or <out_dir>/paused-SITE for a
# federated site (docs/architecture.md, failure rule 8).
isthmus_pause_marker() {
    local config=$1 site=${2:-} out
    shift 2
    out=$(isthmus_config_value "$config" train.out_dir "$@")
    PAUSED=$out/paused${site:+-$site}
}

# Run the command in the background, pass USR1/TERM/INT on to it (the
# time-limit warning and cancellation: isthmus checkpoints and exits 0),
# and return its exit status. When isthmus stopped on a pause (the marker
# PAUSED written: its own USR1, or another site's time limit that paused
# every site) the job requeues itself (ISTHMUS_REQUEUE=1, the
# default) so that the run continues; after an end (scancel) it does not.
# A pause goes on as USR1, an end as USR2 (isthmus's TERM): srun answers a
# TERM by sending SIGKILL to its tasks (the checkpoint of the stop would be
# lost), while it passes USR1 and USR2 on as they are; so do mpirun and
# federated.sh.
isthmus_run() {
    local child rc signalled=
    trap 'signalled=USR1; [ -n "${child:-}" ] && kill -USR1 "$child" 2> /dev/null' USR1
    trap 'signalled=TERM; [ -n "${child:-}" ] && kill -USR2 "$child" 2> /dev/null' TERM INT
    [ -n "${PAUSED:-}" ] && rm -f "$PAUSED" # isthmus removes it too: one of an earlier start is stale
    "$@" &
    child=$!
    wait "$child"
    rc=$?
    while kill -0 "$child" 2> /dev/null; do # a trap interrupted the wait
        wait "$child"
        rc=$?
    done
    trap '' USR1 TERM INT # the run is over; the job ends below (a requeue's TERM may come)
    echo "isthmus job: exit $rc${signalled:+ after SIG$signalled}, $(date -u +%FT%TZ)"
    local paused=
    # the marker alone: isthmus wrote it after the pause's checkpoint, and
    # an mpirun whose ompi-server was started again ends with exit 1 after it
    [ -n "${PAUSED:-}" ] && [ -f "$PAUSED" ] && paused=1
    if [ -n "$paused" ] && [ "${ISTHMUS_REQUEUE:-1}" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "isthmus job: paused ($PAUSED: $(cat "$PAUSED" 2> /dev/null)); requeueing job $SLURM_JOB_ID to continue"
        scontrol requeue "$SLURM_JOB_ID"
    fi
    [ -n "$signalled$paused" ] && isthmus_leave_the_second
    return $rc
}

# slurmd (22.05) revokes a killed or requeued job's credential with a time
# in whole seconds and refuses a launch whose credential is not newer
# ("Job N already killed, do not launch batch job": the requeued job
# FAILS). A job that stops quickly on a requeue can be started again within
# the same second, so a stopped job ends only once that second is over.
isthmus_leave_the_second() {
    local now
    now=$(date +%s)
    while [ "$(date +%s)" -le "$now" ]; do sleep 0.1; done
}
