#!/bin/bash
# cli_watch.sh — one site's metrics.jsonl shows the whole run (docs/metrics.md,
# `site_step`), real processes:
#  - diloco over three sites in one mpirun: the host (world rank 0, the only
#    log of a joint launch) records a site_step record of sites b and c at
#    every outer step, of the step before it, the mean over the outer step;
#    every step line and step record carries the ETA, 0 at the last step;
#  - butterfly, four learners over three sites: site c's one learner never
#    mixes with learner 0, yet its summaries reach the host (passed on from
#    pair to pair), the last one of the final step;
#  - the federated launch (two mpiruns): each site's summary as the other
#    records it is exactly (float32) the mean of that site's own step
#    records over the steps it names, its step time theirs within reason;
#  - the summaries are observation only: the butterfly run's model is the
#    same, bit for bit, with the step records every step or every fourth;
#  - isthmus plot draws the other sites' losses and says how many.
. "$TOP_SRCDIR/tests/lib.sh"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
T="$CONFIGS/tiny.ini"
COMMON="--set train.eval_every=0 --set data.eval_bytes=4096 --set train.log_every=1"

# 1. diloco, three sites in one mpirun
# shellcheck disable=SC2086
mpi 3 "$ISTHMUS" train "$T" $COMMON --set site.a.ranks=1 --set site.b.ranks=1 --set site.c.ranks=1 \
    --set outer.mode=diloco --set outer.inner_steps=4 --set train.steps=16 --set train.out_dir="$WORK/diloco" \
    > "$WORK/diloco.log" 2>&1 || fail "diloco run failed: $(tail -2 "$WORK/diloco.log")"

cat > "$WORK/check.py" << 'EOF'
"""Checks over metrics.jsonl files; prints 'ok ...' / 'not ok ...' lines."""
import json, sys

def records(path, kind):
    out = []
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        if next(iter(r)) == kind:
            out.append(r)
    return out

def result(ok, what):
    print(("ok " if ok else "not ok ") + what)

def joint(path, steps, H, site, want):
    """site's summaries at the steps `want`, each over the H steps up to it (fewer at the start), with an ETA
    at their step time; every step record's ETA: 0 at the last step, else the steps left at the recent
    steps' time (within a factor of two of the step records' own times: they time the step a little later)"""
    name = path.split("/")[-2]
    ss = [r for r in records(path, "site_step") if r["site_step"] == site]
    got = [r["step"] for r in ss]
    ok = got == want and all(r["steps_averaged"] == min(H, r["step"]) and r["heard_after_step"] >= r["step"] and
                             r["loss"] > 0 and r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 and
                             abs(r["eta_s"] - (steps - r["step"]) * r["ms_per_step"] / 1e3) <= 1e-3 + 1e-3 * r["eta_s"]
                             for r in ss)
    result(ok, f"{name}: site {site}'s summaries at steps {got} (want {want}), means over "
           f"{sorted(set(r['steps_averaged'] for r in ss))} steps, ETAs at their step time")
    st = records(path, "step")
    bad = []
    for i, r in enumerate(st):
        recent = st[max(0, i - H + 1):i + 1]
        guess = (steps - r["step"]) * sum(x["ms_per_step"] for x in recent) / len(recent) / 1e3
        if (r["step"] == steps) != (r["eta_s"] == 0) or not 0.5 * guess <= r["eta_s"] <= 2 * guess:
            bad.append((r["step"], r["eta_s"], round(guess, 3)))
    result(len(st) == steps and not bad, f"{name}: every step record's eta_s is the steps left at the recent step "
           f"time ({st[0]['eta_s']} s at step 1, 0 at the last){': ' + str(bad[:3]) if bad else ''}")

def same(a_dir, b_dir, steps, H):
    """site X's summary in the other's file = mean of X's own step records over the steps it covers"""
    for here, there, name in ((a_dir, b_dir, "b"), (b_dir, a_dir, "a")):
        own = {r["step"]: r for r in records(there + "/metrics.jsonl", "step")}
        ss = [r for r in records(here + "/metrics.jsonl", "site_step") if r["site_step"] == name]
        bad, ms = [], []
        for r in ss:
            window = range(r["step"] - r["steps_averaged"] + 1, r["step"] + 1)
            mean = sum(own[t]["loss"] for t in window) / len(window)
            if abs(r["loss"] - mean) > 1e-6 * mean:
                bad.append((r["step"], r["loss"], mean))
            ms.append(r["ms_per_step"] / (sum(own[t]["ms_per_step"] for t in window) / len(window)))
        ok = len(ss) == steps // H and not bad and all(0.5 < m < 2 for m in ms)
        result(ok, f"federated: site {name}'s {len(ss)} summaries as the other site recorded them are the means of its "
               f"own step losses (float32){': ' + str(bad[:2]) if bad else ''}; step time ratio "
               f"{min(ms, default=0):.2f}..{max(ms, default=0):.2f}")

def butterfly(path, steps, learners):
    partners = {r["partner"] for r in records(path, "mix")}
    result(3 not in partners and partners, f"butterfly: learner 0 mixes only with learners {sorted(partners)} (never c's)")

what = sys.argv[1]
if what == "joint":
    joint(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], [int(x) for x in sys.argv[6].split(",")])
elif what == "same":
    same(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
elif what == "butterfly":
    butterfly(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
EOF
check() { # check ARGS...: the checker's verdicts as checks; at least MIN of them (the first argument)
    local min=$1
    shift
    "$PY" "$WORK/check.py" "$@" > "$WORK/check.out" 2>&1
    verdicts "$WORK/check.out" "$min+" "check $1"
}
# the host hears each site at the outer steps 4, 8, 12, 16: of the steps before
check 2 joint "$WORK/diloco/metrics.jsonl" 16 4 b 3,7,11,15
check 1 joint "$WORK/diloco/metrics.jsonl" 16 4 c 3,7,11,15
grep -q '^step  *16/16 .* | eta 0s$' "$WORK/diloco.log" && grep -q '^site c step 15/16 | loss [0-9.]* (mean of 4 steps) |' "$WORK/diloco.log" &&
    pass "the step line ends in its ETA, and the host prints each summary it records" ||
    fail "step or site lines: $(grep -E '^(step|site)' "$WORK/diloco.log" | tail -3)"

# 2. butterfly: learners 0, 1 on site a, 2 on b, 3 on c (learner 0 mixes with 1 and 2 only)
BF="--set site.a.ranks=2 --set site.a.learner_ranks=1 --set site.b.ranks=1 --set site.c.ranks=1
--set outer.mode=butterfly --set outer.inner_steps=2 --set train.steps=16"
# shellcheck disable=SC2086
mpi 4 "$ISTHMUS" train "$T" $COMMON $BF --set train.out_dir="$WORK/bf" > "$WORK/bf.log" 2>&1 ||
    fail "butterfly run failed: $(tail -2 "$WORK/bf.log")"
# rounds start every 2 steps and end a step later (overlap 1): learner 0 hears b (learner 2) itself every
# other round, c (learner 3) through learners 1 and 2 a round later, and both at the final exact rounds
check 2 joint "$WORK/bf/metrics.jsonl" 16 2 b 4,8,12,16
check 1 joint "$WORK/bf/metrics.jsonl" 16 2 c 2,4,6,8,10,12,16
check 1 butterfly "$WORK/bf/metrics.jsonl" 16 4
# observation only: another log_every, the same model
# shellcheck disable=SC2086
mpi 4 "$ISTHMUS" train "$T" $COMMON $BF --set train.log_every=4 --set train.out_dir="$WORK/bf4" > "$WORK/bf4.log" 2>&1 ||
    fail "butterfly run (log_every 4) failed: $(tail -2 "$WORK/bf4.log")"
h5diff "$WORK/bf/model.h5" "$WORK/bf4/model.h5" /model /model > /dev/null 2>&1 &&
    pass "butterfly: the same model, bit for bit, with step records every step or every fourth" ||
    fail "butterfly: the models differ with log_every"

# 3. the federated launch: two mpiruns, each site's log of its own, each holding the other's summaries
FED="$TOP_SRCDIR/scripts/federated.sh"
export ISTHMUS MPIRUN_ARGS="-q --oversubscribe"
SERVER="$WORK/server"
trap '"$FED" stop "$SERVER"; rm -rf "$WORK"' EXIT
if "$FED" server "$SERVER"; then
    RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.inner_steps=4
--set train.steps=12 --set outer.join_timeout=60 --set outer.run_id=watch"
    site() { # site NAME: one site's mpirun of one rank
        # shellcheck disable=SC2086
        timeout 240 "$FED" site "$SERVER/ompi-server.uri" "$1" 1 "$T" $COMMON $RUN --set train.out_dir="$WORK/fed"
    }
    federated_pair "$WORK/fed_a.log" "$WORK/fed_b.log" site
    if [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ]; then
        check 2 same "$WORK/fed" "$WORK/fed/site-b" 12 4
    else
        fail "federated run: exits $ra/$rb: $(grep -h error "$WORK"/fed_?.log | head -2)"
    fi
else
    fail "ompi-server did not start"
fi

# 4. plot: every site's loss
if "$ISTHMUS" plot "$WORK/diloco" "$WORK/bf" -o "$WORK/runs.png" > "$WORK/plot.log" 2>&1 &&
    grep -q "the training loss of 4 other site(s) from their site_step records" "$WORK/plot.log" && [ -s "$WORK/runs.png" ]; then
    pass "plot draws the other sites' losses ($(cat "$WORK/plot.log"))"
else
    fail "plot: $(cat "$WORK/plot.log")"
fi
finish || exit 1
