#!/bin/bash
# shellcheck disable=SC2046 # the process lists (pgrep) are meant to split into arguments
# fault_matrix.sh — does the link survive a site's death at any moment?
# Trials of a federated run of two sites (or three: SITES=3), one mpirun
# per site through ompi-server (scripts/federated.sh), in which one site
# (b; with three sites a, b or c, drawn) is hurt at a seeded random moment
# of training, so that every phase of an exchange is hit:
#   kill-rank  SIGKILL of b's ranks (its mpirun sees them die)
#   kill-job   SIGKILL of b's mpirun, its launcher and its ranks at once
#              (a node or a job gone)
#   stop       SIGSTOP of b's ranks, SIGCONT after a's deadline has passed
#   cut        b's link cut (every packet either way dropped by the emulated
#              WAN's forwarder, tests/wan/wan.sh), mended after a has logged
#              the loss and trained on
# in diloco, streaming, butterfly and sync (and split: diloco with the experts
# split across the sites, their copies refreshed after every outer period;
# the fault comes after the first refresh, so that the host holds a copy of
# the victim's experts to give it back; two sites only), sites of 1 and of 2 ranks, with
# small payloads (tiny.ini, fp4) and payloads of MBs per rank (small.ini,
# codec none).
# A trial passes when site a (b when a is the victim) logs the loss within outer.timeout + 5 s (three
# sites: a loss of any site, within 2 x outer.timeout + 5 s: a verdict's wait) of the
# exchange that first needs b after the fault (the bound allows H + overlap
# inner steps, at 1.5x its last step time, before it), trains 5 more steps, and the victim — started again after a kill, woken
# after a stop or a mended cut (it finds it was dropped, exits 3 and
# federated.sh starts it again) — rejoins the live run (three sites: every site out after the fault,
# the victim or the smaller side of a cut, is back); every site is then stopped (TERM) and no
# process may be left 60 s later. Three sites in butterfly: site a has two
# learners (two ranks or four: a power of two in all).
#   scripts/fault_matrix.sh OUT TRIALS [SEED]      (a built ./isthmus)
# One row per trial in OUT/matrix.tsv (mode, ranks, payload, fault,
# fault time after the first step, detection, verdict); the logs of a failed
# trial stay in OUT/trial-N (with the stacks of the processes a TERM left,
# where gdb is installed); the last line counts passes and failures.
# Environment: TIMEOUT (outer.timeout, default 5), WINDOW (the fault falls
# uniformly in the first WINDOW seconds after the first logged step (split: the first refresh),
# default 30); KEEP_LOGS=1 keeps a passed trial's logs too; ONLY="3 9" runs
# only those trials of the seed's draws (a failure again); MODES, FAULTS, PAYLOADS, RANKS (space-separated lists to draw
# from; default every mode, fault, payload and 1 2). Payloads: small
# (tiny.ini, fp4: 131 KB per exchange), medium (tiny.ini, codec none: 986 KB,
# the setting in which Open MPI's transport hung: 8 of 8 in the issue's
# report, 3 of 4 here with outer.transport = mpi), large (small.ini, codec
# none: 7.3 MB).
# When the faults include cut (the default), every trial runs across the
# emulated WAN (root, network namespaces: ompi-server and site a in one, b
# in the other, with three sites the victim in b's and the others in a's;
# 1 Gbit/s, 1 ms each way); otherwise over loopback.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${1:?usage: scripts/fault_matrix.sh OUT TRIALS [SEED]}
TRIALS=${2:?usage: scripts/fault_matrix.sh OUT TRIALS [SEED]}
SEED=${3:-1}
TIMEOUT=${TIMEOUT:-5}
WINDOW=${WINDOW:-30}
SITES=${SITES:-2}
case $SITES in 2 | 3) ;; *) echo "fault_matrix.sh: SITES=$SITES: 2 or 3" >&2; exit 2 ;; esac
case " ${MODES:-} " in *" split "*) [ "$SITES" = 2 ] || { echo "fault_matrix.sh: MODES split: two sites only (E = 4 or 8 split into whole experts per rank)" >&2; exit 2; } ;; esac
DEFAULT_MODES="diloco streaming butterfly sync"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_mpi_yield_when_idle=1 MPIRUN_ARGS="-q --bind-to none" ISTHMUS_REJOINS=2
ISTHMUS=${ISTHMUS:-$PWD/isthmus}
export ISTHMUS
FED=scripts/federated.sh
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
FAULTS=${FAULTS:-kill-rank kill-job stop cut}
WAN=$PWD/tests/wan/wan.sh
in_a=() in_b=()
case " $FAULTS " in
*" cut "*)
    [ -x tests/wan/tundelay ] || make -s tests/wan/tundelay > /dev/null ||
        { echo "fault_matrix.sh: cannot build tests/wan/tundelay" >&2; exit 2; }
    "$WAN" up "$OUT/wan" 1gbit 1 > /dev/null || { echo "fault_matrix.sh: the cut fault needs the emulated WAN (root, network namespaces)" >&2; exit 2; }
    in_a=("$WAN" exec "$OUT/wan" a) in_b=("$WAN" exec "$OUT/wan" b)
    MPIRUN_ARGS="$MPIRUN_ARGS --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24" ;;
esac
"${in_a[@]}" "$FED" server "$OUT/server" || { [ ${#in_a[@]} -eq 0 ] || "$WAN" down "$OUT/wan"; exit 2; }
trap '"${in_a[@]}" "$FED" stop "$OUT/server"; [ ${#in_a[@]} -eq 0 ] || "$WAN" down "$OUT/wan"' EXIT
URI=$OUT/server/ompi-server.uri

# every trial's draw, from one random stream of the seed: mode fault payload
# ranks at. The generator is written out (Park and Miller's, exact in any
# awk's doubles) so that a seed draws the same trials with mawk and gawk,
# whose rand() differ.
awk -v s="$SEED" -v n="$TRIALS" -v w="$WINDOW" -v M="${MODES:-$DEFAULT_MODES}" -v S="$SITES" \
    -v F="$FAULTS" -v P="${PAYLOADS:-small medium large}" -v R="${RANKS:-1 2}" '
function rnd() { x = (16807 * x) % 2147483647; return (x - 1) / 2147483646 }
BEGIN {
    x = (s * 7919 + 12345) % 2147483646 + 1
    for (i = 0; i < 10; i++) rnd() # nearby seeds apart
    nm = split(M, modes, " "); nf = split(F, faults, " "); np = split(P, payloads, " "); nr = split(R, ranks, " ")
    for (t = 1; t <= n; t++) {
        mo = modes[1 + int(rnd() * nm)]; fa = faults[1 + int(rnd() * nf)]; pa = payloads[1 + int(rnd() * np)]
        ra = ranks[1 + int(rnd() * nr)]
        at = rnd() * w
        vi = S == 3 ? substr("abc", 1 + int(rnd() * 3), 1) : "b" # two sites: the draws of earlier seeds unchanged
        printf "%s %s %s %d %.2f %s\n", mo, fa, pa, ra, at, vi
    }
}' > "$OUT/draws"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
. scripts/lib.sh # wait_line FILE PATTERN SECONDS
BIN_NAME=$(basename "$ISTHMUS") # the ranks' command name (a copied binary may have another)
ranks_of() { pgrep -f "$BIN_NAME train .* --site $1 .*outer.run_id=$2( |$)"; }
launcher_of() { pgrep -f "federated.sh site .* $1 .*outer.run_id=$2( |$)"; }
mpirun_of() { pgrep -f "^mpirun .* --site $1 .*outer.run_id=$2( |$)"; }

# site_back S (three sites): S is in the run — never out, or its newest
# process (the restart's log after a kill) rejoined after its last drop
site_back() {
    local f=$dir/$1.log restarted=0
    [ -f "$dir/${1}2.log" ] && f=$dir/${1}2.log restarted=1
    awk -v r=$restarted '/was dropped from the run/ { out = 1 } /^rejoined the live run/ { out = 0; back = 1 }
        END { exit !(!out && (back || !r)) }' "$f"
}
printf 'trial\tmode\tranks\tpayload\tfault\tvictim\tat_s\tdetected_s\tverdict\n' > "$OUT/matrix.tsv"
passed=0 failed=0
for t in $(seq 1 "$TRIALS"); do
    case " ${ONLY:-$t} " in *" $t "*) ;; *) continue ;; esac
    read -r mode fault payload np at v < <(sed -n "${t}p" "$OUT/draws")
    [ "$v" = a ] && o=b || o=a # the site that must see the loss and the rejoin
    all=$([ "$SITES" = 3 ] && echo "a b c" || echo "a b")
    id=fm$SEED-$t
    dir=$OUT/trial-$t
    rm -rf "$dir"
    mkdir -p "$dir"
    case $payload in
    small) cfg=share/configs/tiny.ini codec=fp4 ;;
    medium) cfg=share/configs/tiny.ini codec=none ;;
    *) cfg=share/configs/small.ini codec=none ;;
    esac
    np_of() { if [ "$1" = a ]; then echo "$np_a"; else echo "$np"; fi; } # a site's ranks
    np_a=$np # three sites in butterfly: a power of two learners, two at site a
    [ "$SITES" = 3 ] && [ "$mode" = butterfly ] && np_a=$((2 * np))
    outer_mode=$mode split_args=""
    [ "$mode" = split ] && outer_mode=diloco split_args="--set outer.experts=split --set outer.expert_refresh=1"
    set_args="--set site.a.ranks=$np_a --set site.b.ranks=$np --set outer.mode=$outer_mode --set outer.codec=$codec $split_args
     $([ "$SITES" = 3 ] && echo "--set site.c.ranks=$np")
     $([ "$SITES" = 3 ] && [ "$mode" = butterfly ] && echo "--set site.a.learner_ranks=$np")
     --set outer.inner_steps=10 --set outer.timeout=$TIMEOUT --set outer.join_timeout=120 --set train.steps=100000
     --set train.log_every=1 --set train.eval_every=0 --set data.eval_bytes=4096 --set train.threads=1
     --set train.out_dir=$dir --set outer.run_id=$id"
    [ "$mode" = streaming ] && set_args="$set_args --set outer.fragments=2 --set outer.overlap=2"
    declare -A pid=()
    for s in $all; do # the victim behind the link that a cut cuts
        # shellcheck disable=SC2086
        if [ "$s" = "$v" ]; then
            "${in_b[@]}" "$FED" site "$URI" "$s" "$(np_of "$s")" "$cfg" $set_args > "$dir/$s.log" 2>&1 &
        else
            "${in_a[@]}" "$FED" site "$URI" "$s" "$(np_of "$s")" "$cfg" $set_args > "$dir/$s.log" 2>&1 &
        fi
        pid[$s]=$!
    done
    disown "${pid[$v]}" # its death by SIGKILL is the point: no job notice
    verdict=pass detected=-
    first_line='^step  *1/'
    [ "$mode" = split ] && first_line='^copies    | refresh 1 ' # the victim's experts have a copy at the host
    if ! wait_line "$dir/$o.log" "$first_line" 300; then
        verdict="fail: no first step"
    else
        sleep "$at"
        t_fault=$(now)
        case $fault in
        kill-rank) kill -KILL $(ranks_of "$v" "$id") 2> /dev/null ;;
        kill-job) kill -KILL $(launcher_of "$v" "$id") $(mpirun_of "$v" "$id") $(ranks_of "$v" "$id") 2> /dev/null ;;
        stop) kill -STOP $(ranks_of "$v" "$id") 2> /dev/null ;;
        cut) "$WAN" cut "$OUT/wan" || verdict="fail: the link could not be cut" ;;
        esac
        # o learns of the loss when it next needs v: at its next exchange, up
        # to H + overlap inner steps after the fault, then within the deadline
        ms=$(grep '^step ' "$dir/$o.log" | tail -1 | sed -n 's/.*| *\([0-9.]*\) ms |.*/\1/p')
        # (three sites: a verdict's wait is two deadlines, and the site o
        # loses may be another than v: the smaller side of a cut goes)
        lost_re="^site $v lost at step" waits=1
        [ "$SITES" = 3 ] && lost_re="^site [a-z]* lost at step" waits=2
        bound=$(awk -v t="$TIMEOUT" -v w=$waits -v ms="${ms:-1000}" 'BEGIN { printf "%.0f", w * t + 5 + (10 + 2) * ms / 1000 * 1.5 + 0.5 }')
        if wait_line "$dir/$o.log" "$lost_re" "$bound"; then
            detected=$(since "$t_fault")
        else
            verdict="fail: loss not logged within $bound s (outer.timeout + 5 s + H + overlap steps of ${ms:-?} ms)"
        fi
        if [ "$verdict" = pass ]; then
            lost=$(grep -m1 "$lost_re" "$dir/$o.log" | sed "s/^site [a-z]* lost at step \([0-9]*\).*/\1/")
            if ! wait_line "$dir/$o.log" "^step  *$((lost + 5))/" 120; then verdict="fail: site $o did not train on"; fi
        fi
        if [ "$verdict" = pass ]; then
            case $fault in
            stop) # woken after the deadline: b learns it was dropped (exit 3) and its launcher starts it again
                kill -CONT $(ranks_of "$v" "$id") 2> /dev/null ;;
            cut) # the same once the link is back: a's notice reaches b
                "$WAN" mend "$OUT/wan" ;;
            *) # the victim's launcher has ended (or was killed): start the site again
                wait "${pid[$v]}" 2> /dev/null
                # its log exists before the check below reads it: a check
                # that ran first took the victim for a site never out
                : > "$dir/${v}2.log"
                # shellcheck disable=SC2086
                "${in_b[@]}" "$FED" site "$URI" "$v" "$(np_of "$v")" "$cfg" $set_args --resume auto >> "$dir/${v}2.log" 2>&1 &
                pid[$v]=$! ;;
            esac
            if [ "$SITES" = 2 ]; then
                wait_line "$dir/$o.log" "^site $v rejoined at step" 240 || verdict="fail: $v did not rejoin"
            else # every site out after the fault (v, or the smaller side of a cut) is back
                for _ in $(seq 1 240); do
                    out=$(for s in $all; do site_back "$s" || printf ' %s' "$s"; done)
                    [ -z "$out" ] && break
                    sleep 1
                done
                [ -z "$out" ] || verdict="fail:$out not back in the run"
            fi
        fi
    fi
    # the end: every site asked to stop; nothing may be left a minute later
    [ "$fault" = cut ] && "$WAN" mend "$OUT/wan"
    every() { local s; for s in $all; do "$1" "$s" "$id"; done; } # every FN: FN's processes of every site
    # (a process started after the TERM, a site's restart launched a moment
    # before, gets one too: it never had the signal to obey)
    termed=" "
    term_new() {
        local p
        for p in $(every ranks_of); do
            case $termed in *" $p "*) ;; *) kill -TERM "$p" 2> /dev/null; termed="$termed$p " ;; esac
        done
    }
    term_new
    kill -CONT $(ranks_of "$v" "$id") 2> /dev/null
    for _ in $(seq 1 60); do
        [ -z "$(every ranks_of)" ] && break
        sleep 1
        term_new
    done
    if [ -n "$(every ranks_of)" ]; then
        [ "$verdict" = pass ] && verdict="fail: processes left 60 s after TERM"
        # where each one is stuck, before it goes (gdb, where installed)
        if command -v gdb > /dev/null; then
            for s in $all; do for p in $(ranks_of "$s" "$id"); do
                echo "=== site $s pid $p"
                timeout 30 gdb -p "$p" -batch -ex "thread apply all bt 16" 2> /dev/null | grep -E '^#|^Thread'
            done; done > "$dir/stacks.txt" 2>&1
        fi
        kill -KILL $(every ranks_of) $(every mpirun_of) 2> /dev/null
    fi
    kill -KILL $(every launcher_of) 2> /dev/null
    wait "${pid[@]}" 2> /dev/null
    printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$mode" "$(for s in $all; do printf '%s' "${sep-}$(np_of "$s")"; sep=+; done; unset sep)" \
        "$payload" "$fault" "$v" "$at" "$detected" "$verdict" | tee -a "$OUT/matrix.tsv"
    if [ "$verdict" = pass ]; then
        passed=$((passed + 1))
        [ -n "${KEEP_LOGS:-}" ] || rm -rf "$dir"
    else
        failed=$((failed + 1))
    fi
done
echo "fault matrix: $passed passed, $failed failed ($((passed + failed)) trials of $SITES sites, seed $SEED, outer.timeout $TIMEOUT s)"
[ "$failed" -eq 0 ]
