#!/bin/bash
# link_bench.sh — the rate the link achieves between two sites across the
# emulated wide-area link (tests/wan/wan.sh), against tc's configured rate.
# Two federated sites of one rank (scripts/wan_bench.sh) train small.ini
# in diloco with float32 payloads (54.8 MB each way per exchange), H = 10,
# 60 steps: six blocking exchanges. Site a's end of the link is sampled
# every 0.1 s (the device's byte counters, whatever the transport); the
# achieved rate each way is over the busy samples (those that carried at
# least a tenth of the configured rate): their median (the steady rate of
# a transfer) and their mean (slow starts and tails included).
#   scripts/link_bench.sh OUT RATE,ONE_WAY_MS [train args...]
#     e.g. scripts/link_bench.sh /tmp/lb 1gbit,75 --set outer.transport=tcp --set outer.streams=4
# Root only (network namespaces). Prints the link check, the run's exit and
# one line per direction; OUT.samples holds the samples (time, tx, rx bytes).
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 2 ] || { echo "usage: scripts/link_bench.sh OUT RATE,ONE_WAY_MS [train args...]" >&2; exit 2; }
out=$1 link=$2
shift 2
rm -rf "$out/wan" "$out/a.log"
scripts/wan_bench.sh "$out" share/configs/small.ini "$link" --set outer.mode=diloco --set outer.inner_steps=10 \
    --set outer.codec=none --set train.steps=60 --set train.log_every=1 --set train.eval_every=0 \
    --set data.eval_bytes=4096 "$@" > "$out.wan_bench" 2>&1 &
bench=$!
# the sites start once the harness is up and checked (its probe's stream must not count)
for _ in $(seq 1 600); do [ -f "$out/a.log" ] && break; sleep 0.1; done
[ -f "$out/wan/wan.env" ] && [ -f "$out/a.log" ] || { wait $bench; echo "link_bench.sh: the sites did not start: $(tail -3 "$out.wan_bench")" >&2; exit 1; }
# shellcheck disable=SC1091
. "$out/wan/wan.env"
ip netns exec "$WAN_NS_A" sh -c "s=/sys/class/net/$WAN_DEV_A/statistics
    while :; do echo \$(date +%s.%N) \$(cat \$s/tx_bytes) \$(cat \$s/rx_bytes); sleep 0.1; done" > "$out.samples" 2>/dev/null &
sampler=$!
disown $sampler # its end below is not news
wait $bench
rc=$?
kill $sampler 2>/dev/null
grep '^link:' "$out.wan_bench"
[ $rc -eq 0 ] || { echo "link_bench.sh: the run failed: $(tail -3 "$out.wan_bench")" >&2; exit 1; }
for dir in tx rx; do
    awk -v col=$([ $dir = tx ] && echo 2 || echo 3) -v bps="$WAN_RATE_BPS" -v dir=$dir -v link="$link" '
        NR > 1 && $1 > t { d = ($col - b) * 8 / ($1 - t); if (d >= 0.1 * bps) r[++n] = d }
        { t = $1; b = $col }
        END { if (!n) { print dir ": no busy sample"; exit 1 }
              s = 0; for (i = 1; i <= n; i++) s += r[i]
              for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { x = r[i]; r[i] = r[j]; r[j] = x }
              printf "%s %s: %d busy samples of 0.1 s, median %.0f Mbit/s, mean %.0f Mbit/s (configured %.0f Mbit/s: %.0f%% / %.0f%%)\n",
                  dir == "tx" ? "a -> b" : "b -> a", link, n, r[int((n + 1) / 2)] / 1e6, s / n / 1e6, bps / 1e6,
                  100 * r[int((n + 1) / 2)] / bps, 100 * s / n / bps }' "$out.samples"
done
