#!/bin/bash
# cli_metrics.sh — metrics.jsonl against its documentation (docs/metrics.md):
# short real runs (sync, a two-site diloco run stopped and resumed, a
# two-learner butterfly run, a streaming run whose exchange comes late,
# isthmus eval) and one check over their files:
# every line is a JSON object whose type (its first key) has a table in the
# doc and whose keys are exactly that table's fields (optional ones aside),
# in its order, "time" (Unix seconds, 3 decimals) last and never going back;
# each opening of the file begins with a start record of the documented
# fields (build as --version says, the job id from the environment, a
# 16-hex fingerprint), a train start followed by the run line; a resumed run
# appends a second start record naming the step it resumed from; strings
# are escaped (an out_dir with a quote, a backslash and a tab).
. "$TOP_SRCDIR/tests/lib.sh"
PY=/usr/bin/python3
DOC="$TOP_SRCDIR/docs/metrics.md"
T="$CONFIGS/tiny.ini"
COMMON="--set train.log_every=1 --set train.eval_every=4 --set data.eval_bytes=4096"
TWO="--set site.a.ranks=1 --set site.b.ranks=1"
NOJOB="env -u SLURM_JOB_ID -u PBS_JOBID -u LSB_JOBID"
# the job id the multi-rank runs see (mpirun keeps the environment's)
JOB=${SLURM_JOB_ID:-${PBS_JOBID:-${LSB_JOBID:-}}}

# sync, one process, into a directory whose name needs escaping; LSB's job id only
SYNC="$WORK/sync \"q\" \\b	t"
# shellcheck disable=SC2086
$NOJOB LSB_JOBID=lsf-42 timeout 120 "$ISTHMUS" train "$T" $COMMON --set train.steps=12 --set checkpoint.every=6 \
    --set train.out_dir="$SYNC" > "$WORK/sync.log" 2>&1 || fail "sync run failed: $(tail -2 "$WORK/sync.log")"
# isthmus eval of its model into a directory of its own: Slurm's job id wins over PBS's
SLURM_JOB_ID=slurm-7 PBS_JOBID=pbs-8 timeout 120 "$ISTHMUS" eval --model "$SYNC/model.h5" \
    --set train.out_dir="$WORK/eval" --set data.eval_bytes=4096 > "$WORK/eval.log" 2>&1 ||
    fail "eval failed: $(tail -2 "$WORK/eval.log")"
# diloco over two sites: a stop asked for after step 6 (it comes at the next outer
# step, 8: a checkpoint), then resumed to step 12
DILOCO="$TWO --set outer.mode=diloco --set outer.inner_steps=4 --set train.steps=12 --set train.out_dir=$WORK/diloco"
# shellcheck disable=SC2086
ISTHMUS_STOP_AT_STEP=6 mpi 2 "$ISTHMUS" train "$T" $COMMON $DILOCO > "$WORK/diloco.log" 2>&1 ||
    fail "diloco run failed: $(tail -2 "$WORK/diloco.log")"
# shellcheck disable=SC2086
mpi 2 "$ISTHMUS" train "$T" $COMMON $DILOCO --resume auto >> "$WORK/diloco.log" 2>&1 ||
    fail "resumed diloco run failed: $(tail -2 "$WORK/diloco.log")"
# butterfly: two learners on two sites mix (and the spread probe samples both)
# shellcheck disable=SC2086
mpi 2 "$ISTHMUS" train "$T" $COMMON $TWO --set outer.mode=butterfly --set outer.inner_steps=2 --set train.steps=8 \
    --set train.out_dir="$WORK/butterfly" > "$WORK/butterfly.log" 2>&1 ||
    fail "butterfly run failed: $(tail -2 "$WORK/butterfly.log")"
# streaming, site b (the slower) holding its payloads back 5 steps past a window of 2:
# site a logs a link_late record (the setup of tests/cli_outer.sh's delay_long)
# shellcheck disable=SC2086
ISTHMUS_LINK_DELAY=b:5 mpi 2 "$ISTHMUS" train "$T" $COMMON $TWO --set site.a.micro_batch=2 --set site.b.micro_batch=6 \
    --set outer.mode=streaming --set outer.inner_steps=8 --set outer.overlap=2 --set outer.codec=fp4 \
    --set outer.progress=step --set train.steps=10 --set train.eval_every=0 --set train.out_dir="$WORK/late" \
    > "$WORK/late.log" 2>&1 || fail "streaming run failed: $(tail -2 "$WORK/late.log")"
BUILD=$("$ISTHMUS" --version | sed -n '1s/^isthmus //p')
# the step the resumed run picked up at (diloco stops at its next outer step: 8)
FROM=$(sed -n 's/^resumed from .*: step \([0-9]*\),.*/\1/p' "$WORK/diloco.log" | tail -1)
[ "${FROM:-0}" -gt 0 ] && pass "the diloco run stopped and resumed from step $FROM" || fail "diloco did not resume: $(tail -3 "$WORK/diloco.log")"

cat > "$WORK/check.py" << 'EOF'
"""Check metrics.jsonl files against docs/metrics.md's tables.

argv: DOC BUILD, then per file: PATH|COMMAND|JOB_ID|RESUMES|TYPES
(JOB_ID "" = null; RESUMES: the resumed_from_step of each start record,
comma-separated, "-" = null; TYPES: record types that must occur)."""
import json, re, sys

doc, build = sys.argv[1], sys.argv[2]
checks = 0

def result(ok, what):
    global checks
    checks += 1
    print(("ok " if ok else "not ok ") + what)

# --- the documentation: "### `KEY`" or "### `KEY`: `"VALUE"`", then a table
# whose first column is "`field`" or "`field` *(optional)*"
tables, cur, problems = {}, None, []
for line in open(doc, encoding="utf-8"):
    m = re.match(r'^### `(\w+)`(?:: `"(\w+)"`)?\s*$', line)
    if m:
        cur = (m.group(1), m.group(2))
        if cur in tables:
            problems.append(f"{cur} documented twice")
        tables[cur] = []
        continue
    if line.startswith("#"):
        cur = None
    elif cur and line.startswith("| `"):
        m = re.match(r'^\| `(\w+)`( \*\(optional\)\*)? \|', line)
        if not m:
            problems.append(f"{cur}: cannot read the row {line.strip()!r}")
            continue
        tables[cur].append((m.group(1), bool(m.group(2))))
for t, fields in tables.items():
    names = [f for f, _ in fields]
    if not names or names[0] != t[0] or names[-1] != "time" or len(set(names)) != len(names):
        problems.append(f"{t}: the first field must be the type's key, the last time, each once: {names}")
need = {"start", "run", "step", "site_step", "eval", "outer", "mix", "spread", "checkpoint", "link_late", "site_lost",
        "site_rejoined", "summary"}
missing_types = need - {k for k, _ in tables}
if missing_types:
    problems.append(f"no table for {sorted(missing_types)}")
result(not problems and len(tables) >= 14,
       f"docs/metrics.md: {len(tables)} record tables, first field the type, time last"
       + ("" if not problems else ": " + "; ".join(problems)))

def kind(rec):
    k, v = next(iter(rec.items()))
    return (k, v) if isinstance(v, str) and (k, v) in tables else (k, None)

def pairs(items):
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys {keys}")
    return dict(items)

start_doc = {f for f, _ in tables.get(("start", None), [])}
seen_all = set()
for arg in sys.argv[3:]:
    path, command, job, resumes, types = arg.split("|")
    name = path.split("/")[-2] if "/" in path else path
    errors, seen, starts = [], set(), []
    last_time, prev = 0.0, None
    try:
        lines = open(path, encoding="utf-8").read().split("\n")
    except (OSError, ValueError) as e:
        result(False, f"{name}: cannot read {path}: {e}")
        continue
    if lines[-1] != "":
        errors.append("the file does not end in a newline")
    lines = lines[:-1]
    for i, line in enumerate(lines, 1):
        where = f"line {i}"
        try:
            rec = json.loads(line, object_pairs_hook=pairs)  # strict: raw control characters fail
        except ValueError as e:
            errors.append(f"{where}: not JSON ({e}): {line[:120]}")
            prev = None
            continue
        if not isinstance(rec, dict) or not rec:
            errors.append(f"{where}: not a JSON object")
            continue
        t = kind(rec)
        seen.add(t)
        keys = list(rec)
        if t not in tables:
            errors.append(f"{where}: record type {t[0]!r} has no table in docs/metrics.md")
            prev = t
            continue
        fields = tables[t]
        documented = [f for f, _ in fields]
        required = {f for f, opt in fields if not opt}
        extra, absent = [k for k in keys if k not in documented], sorted(required - set(keys))
        if extra or absent:
            errors.append(f"{where}: {t[0]} record: undocumented {extra}, documented but missing {absent}")
        elif keys != [f for f in documented if f in rec]:
            errors.append(f"{where}: {t[0]} record: fields out of the documented order: {keys}")
        if keys[-1] != "time" or not re.search(r',"time":[0-9]+\.[0-9]{3}\}$', line):
            errors.append(f"{where}: time is not the last field with 3 decimals")
        else:
            if not 1.5e9 < rec["time"] < 1e10 or rec["time"] < last_time:
                errors.append(f"{where}: time {rec['time']} implausible or going back (after {last_time})")
            last_time = rec["time"]
        if i == 1 and t[0] != "start":
            errors.append("the first line is not a start record")
        if t[0] == "start":
            starts.append(rec)
            rec = {f: rec.get(f) for f in start_doc} | rec  # a missing field is reported above
            if rec["command"] != command:
                errors.append(f"{where}: command {rec['command']!r}, expected {command!r}")
            if rec["build"] != build:
                errors.append(f"{where}: build {rec['build']!r}, --version says {build!r}")
            if rec["job_id"] != (job or None):
                errors.append(f"{where}: job_id {rec['job_id']!r}, expected {job or None!r}")
            if not re.fullmatch(r"[0-9a-f]{16}", str(rec["fingerprint"])):
                errors.append(f"{where}: fingerprint {rec['fingerprint']!r} is not 16 hex digits")
            if not isinstance(rec["start"], float) or not rec["start"] <= (rec["time"] or 0) + 0.001:
                errors.append(f"{where}: start {rec['start']!r} not a time at or before the record's")
            if not isinstance(rec["configure"], str) or not isinstance(rec["ranks"], int) or rec["ranks"] < 1:
                errors.append(f"{where}: configure / ranks malformed")
            if (command == "eval") != (rec["site"] is None):
                errors.append(f"{where}: site {rec['site']!r} for {command}")
        if command == "train" and prev == ("start", None) and t != ("run", "start"):
            errors.append(f"{where}: a train start record is not followed by the run line")
        prev = t
    want = [None if r == "-" else int(r) if r.isdigit() else r for r in resumes.split(",")]
    got = [s.get("resumed_from_step", "absent") for s in starts]
    if got != want:
        errors.append(f"start records' resumed_from_step {got}, expected {want}")
    for ty in types.split(","):
        k, _, v = ty.partition("/")
        if (k, v or None) not in seen:
            errors.append(f"no {ty} record")
    seen_all |= seen
    result(not errors, f"{name}: {len(lines)} lines, {len(starts)} start record(s), types "
           + " ".join(sorted(k + ("/" + v if v else "") for k, v in seen))
           + ("" if not errors else " -- " + "; ".join(errors[:6])))
unseen = sorted(k + ("/" + v if v else "") for k, v in set(tables) - seen_all)
print(f"# documented but not written by these runs (not checked here): {' '.join(unseen)}")
EOF

SPEC=(
    "$SYNC/metrics.jsonl|train|lsf-42|-|start,run/start,step,eval,checkpoint,summary/compute"
    "$WORK/eval/metrics.jsonl|eval|slurm-7|-|start,eval"
    "$WORK/diloco/metrics.jsonl|train|$JOB|-,${FROM:-?}|start,run/start,step,site_step,eval,outer,checkpoint,summary/traffic,summary/compute"
    "$WORK/late/metrics.jsonl|train|$JOB|-|start,run/start,step,site_step,eval,outer,link_late,summary/traffic"
    "$WORK/butterfly/metrics.jsonl|train|$JOB|-|start,run/start,step,site_step,eval,mix,spread,summary/traffic,summary/compute"
)
"$PY" "$WORK/check.py" "$DOC" "$BUILD" "${SPEC[@]}" > "$WORK/check.out" 2>&1
# the checker itself ran through (one verdict for the doc, one per file)
verdicts "$WORK/check.out" 6 "the metrics check"

# the escaped path reads back as the directory's own name
got=$("$PY" -c 'import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(l)
    if "checkpoint" in r: print(r["checkpoint"]); break' "$SYNC/metrics.jsonl" 2>&1)
[ "$got" = "$SYNC/checkpoints/default/ckpt-00000006.h5" ] &&
    pass "a path with a quote, a backslash and a tab is escaped and reads back exactly" ||
    fail "checkpoint path read back as '$got'"
# the existing line-oriented readers still find their fields (time is appended last)
[ "$(step_field "$SYNC/metrics.jsonl" 12 inter_site_bytes_total)" = 0 ] &&
    [ -n "$(losses "$SYNC")" ] && grep -q '^{"run":"start","site":"default","mode":"sync",' "$SYNC/metrics.jsonl" &&
    pass "step_field, losses and the run line's prefix still match" || fail "line-oriented readers broke"
finish || exit 1
