# shellcheck shell=bash
# lib.sh — what the scripts here and the shell tests share (sourced, not
# run; tests/lib.sh sources it): reading a field of metrics.jsonl, waiting
# for a log line, starting the two sites of a federated pair.
# Owns: these readers and launchers, nothing a caller must set first.
# Must not: run anything when sourced, or set options (set -e, traps) of
# the script that sources it.

# metric FIELD FILE [PATTERN]: the value of the numeric FIELD on each line of
# the metrics file FILE that matches the grep pattern PATTERN (default: the
# lines holding FIELD), one a line, in the file's order
metric() {
    grep -- "${3:-\"$1\":}" "$2" | sed "s/.*\"$1\":\([^,}]*\)[,}].*/\1/"
}

# eval_bpb FILE SET [STEP]: the bpb of every evaluation of SET in the metrics
# file FILE (of the one at STEP, when given), one a line
eval_bpb() {
    if [ $# -ge 3 ]; then
        metric bpb "$1" "\"eval\":\"$2\",\"step\":$3,"
    else
        metric bpb "$1" "\"eval\":\"$2\""
    fi
}

# last_bpb FILE SET: the bpb of the last evaluation of SET in FILE; empty when none
last_bpb() { eval_bpb "$1" "$2" | tail -1; }

# wait_line FILE PATTERN SECONDS [COUNT]: until FILE holds COUNT (default 1)
# lines matching the grep pattern PATTERN; status 1 when SECONDS pass first.
# Polls every 0.1 s (a log that is not there yet counts none).
wait_line() {
    local end n
    end=$(awk -v s="$3" -v t="$(date +%s.%N)" 'BEGIN { printf "%.0f", t + s }')
    while [ "$(date +%s)" -le "$end" ]; do
        n=$(grep -c -- "$2" "$1" 2> /dev/null)
        [ "${n:-0}" -ge "${4:-1}" ] && return 0
        sleep 0.1
    done
    return 1
}

# pair_start LOG_A LOG_B COMMAND [args...]: `COMMAND a args...` (stdout and
# stderr to LOG_A) and `COMMAND b args...` (to LOG_B), both in the
# background, site a first; their pids in pa and pb. COMMAND starts one site
# of a federated run, named by its first argument.
pair_start() {
    local log_a=$1 log_b=$2 cmd=$3
    shift 3
    "$cmd" a "$@" > "$log_a" 2>&1 &
    pa=$!
    "$cmd" b "$@" > "$log_b" 2>&1 &
    pb=$!
}

# pair_wait: until both sites of pair_start have ended; their exit statuses in ra and rb
pair_wait() {
    wait "$pa"
    ra=$?
    wait "$pb"
    rb=$?
}

# federated_pair LOG_A LOG_B COMMAND [args...]: pair_start, then pair_wait
federated_pair() {
    pair_start "$@"
    pair_wait
}
