#!/bin/bash
# link_bench.sh — the rate the link achieves between two sites across the
# emulated wide-area link (tests/wan/wan.sh), against tc's configured rate.
# Two federated sites of one rank (scripts/wan_bench.sh) train small.ini
# in diloco with float32 payloads (54.8 MB each way per exchange), H = 10,
# 30 steps: three blocking exchanges. For each, the rate each way is a
# rank's inter-site bytes of that step / 2 over the shorter of the two
# sites' link waits of that step (the site that came last to the exchange
# waited for the transfer alone; the wait also holds one round trip for
# the verdicts: a small underestimate).
#   scripts/link_bench.sh OUT RATE,ONE_WAY_MS [train args...]
#     e.g. scripts/link_bench.sh /tmp/lb 1gbit,75 --set outer.transport=tcp --set outer.streams=4
# Root only (network namespaces). Prints one line per exchange and the
# median; the configured rate is RATE.
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 2 ] || { echo "usage: scripts/link_bench.sh OUT RATE,ONE_WAY_MS [train args...]" >&2; exit 2; }
out=$1 link=$2
shift 2
scripts/wan_bench.sh "$out" share/configs/small.ini "$link" --set outer.mode=diloco --set outer.inner_steps=10 \
    --set outer.codec=none --set train.steps=30 --set train.log_every=1 --set train.eval_every=0 \
    --set data.eval_bytes=4096 "$@" > "$out.wan_bench" 2>&1
rc=$?
grep '^link:' "$out.wan_bench"
[ $rc -eq 0 ] || { echo "link_bench.sh: the run failed: $(tail -3 "$out.wan_bench")" >&2; exit 1; }
cat "$out/run/metrics.jsonl" "$out/run/site-b/metrics.jsonl" | grep '^{"step"' | awk -v link="$link" '
    { b = $0; sub(/.*"inter_site_bytes":/, "", b); sub(/,.*/, "", b)
      w = $0; sub(/.*"link_wait_s":/, "", w); sub(/,.*/, "", w)
      s = $0; sub(/^\{"step":/, "", s); sub(/,.*/, "", s)
      b += 0; w += 0
      if (b > 1e6) { if (!(s in wait) || w < wait[s]) wait[s] = w; bytes[s] = b } }
    END { for (s in wait) steps[++n] = s + 0
          if (!n) { print "no exchange found"; exit 1 }
          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (steps[j] < steps[i]) { t = steps[i]; steps[i] = steps[j]; steps[j] = t }
          for (i = 1; i <= n; i++) { s = steps[i]; r[i] = bytes[s] / 2 * 8 / wait[s] / 1e6
              printf "exchange after step %d: %.1f MB each way in %.2f s: %.0f Mbit/s\n", s, bytes[s] / 2 / 1e6, wait[s], r[i] }
          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
          printf "median %.0f Mbit/s each way (configured %s)\n", r[int((n + 1) / 2)], link }'
