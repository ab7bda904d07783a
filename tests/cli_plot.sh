#!/bin/bash
# cli_plot.sh — `isthmus plot`: two real runs (a one-site sync run and a
# two-site diloco run with fp4) charted into one PNG; the file is a PNG of
# the asked size with a picture on it (many colours, not one background),
# the run's metrics are untouched, and bad input is one line and exit 2.
. "$TOP_SRCDIR/tests/lib.sh"
T="$CONFIGS/tiny.ini"
COMMON="--set train.steps=24 --set train.eval_every=8 --set data.eval_bytes=4096 --set train.log_every=1"
# shellcheck disable=SC2086
mpi 1 "$ISTHMUS" train "$T" $COMMON --set train.out_dir="$WORK/sync1" > "$WORK/sync1.log" 2>&1 ||
    fail "sync run failed: $(tail -2 "$WORK/sync1.log")"
# shellcheck disable=SC2086
mpi 2 "$ISTHMUS" train "$T" $COMMON --set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco \
    --set outer.codec=fp4 --set outer.inner_steps=4 --set train.out_dir="$WORK/diloco" > "$WORK/diloco.log" 2>&1 ||
    fail "diloco run failed: $(tail -2 "$WORK/diloco.log")"
before=$(md5sum "$WORK/sync1/metrics.jsonl" "$WORK/diloco/metrics.jsonl")

# PNG signature, then IHDR's width and height (big-endian) at bytes 16..23
png_size() { od -An -tu1 -j16 -N8 "$1" | awk '{ printf "%dx%d\n", (($1*256+$2)*256+$3)*256+$4, (($5*256+$6)*256+$7)*256+$8 }'; }
png_sig() { od -An -tx1 -N8 "$1" | tr -d ' \n'; }
colours() { pngtopnm "$1" 2> /dev/null | ppmhist -noheader 2> /dev/null | wc -l; }

if "$ISTHMUS" plot "$WORK/sync1" "$WORK/diloco/" -o "$WORK/runs.png" --size 1200x800 > "$WORK/plot.log" 2>&1; then
    pass "plot: two runs -> runs.png ($(cat "$WORK/plot.log"))"
else
    fail "plot failed: $(cat "$WORK/plot.log")"
fi
[ "$(png_sig "$WORK/runs.png")" = 89504e470d0a1a0a ] && pass "runs.png is a PNG" || fail "runs.png is not a PNG"
[ "$(png_size "$WORK/runs.png")" = 1200x800 ] && pass "runs.png is 1200x800 as asked" ||
    fail "runs.png is $(png_size "$WORK/runs.png"), not 1200x800"
n=$(colours "$WORK/runs.png")
if command -v pngtopnm > /dev/null; then
    # a blank picture has one colour; axes, text in anti-aliased grey and
    # two runs' coloured lines have dozens
    [ "$n" -ge 20 ] && pass "runs.png is not blank ($n colours)" || fail "runs.png has $n colour(s): blank?"
else
    fail "pngtopnm (netpbm) is missing: cannot look inside the PNG"
fi
# the charted numbers: the eval points and step lines both runs have
grep -q '"run":"start".*"mode":"diloco","codec":"fp4"' "$WORK/diloco/metrics.jsonl" &&
    [ "$(grep -c '"eval":"prose"' "$WORK/diloco/metrics.jsonl")" -eq 4 ] &&
    pass "the diloco run's metrics name its mode and codec and hold 4 prose evaluations (steps 0, 8, 16, 24)" ||
    fail "the diloco run's metrics lack the run line or evaluations"
last=$(grep '^{"step":24,' "$WORK/diloco/metrics.jsonl" | sed 's/.*"inter_site_bytes_total":\([0-9]*\).*/\1/')
sum=$(grep '^{"step"' "$WORK/diloco/metrics.jsonl" | sed 's/.*"inter_site_bytes":\([0-9]*\).*/\1/' | awk '{ s += $1 } END { print s }')
[ -n "$last" ] && [ "$last" = "$sum" ] && [ "$last" -gt 0 ] &&
    pass "inter_site_bytes_total at the last step ($last) is the sum of every step's bytes" ||
    fail "inter_site_bytes_total '$last' against the steps' sum '$sum'"
[ "$before" = "$(md5sum "$WORK/sync1/metrics.jsonl" "$WORK/diloco/metrics.jsonl")" ] &&
    pass "plot left the runs' metrics untouched" || fail "plot changed a run's metrics.jsonl"
[ ! -e "$WORK/runs.png.tmp" ] && pass "no temporary file left beside runs.png" || fail "runs.png.tmp left behind"

expect_exit 2 "plot: .*/nowhere/metrics.jsonl: No such file" -- "$ISTHMUS" plot "$WORK/nowhere" -o "$WORK/x.png"
expect_exit 2 "plot: no -o FILE.png" -- "$ISTHMUS" plot "$WORK/sync1"
expect_exit 2 "plot: --size 'big'" -- "$ISTHMUS" plot "$WORK/sync1" -o "$WORK/x.png" --size big
: > "$WORK/empty/metrics.jsonl" 2> /dev/null || { mkdir -p "$WORK/empty" && : > "$WORK/empty/metrics.jsonl"; }
expect_exit 2 "plot: .*empty/metrics.jsonl has no step or eval lines" -- "$ISTHMUS" plot "$WORK/empty" -o "$WORK/x.png"
[ ! -e "$WORK/x.png" ] && pass "no PNG from a failed plot" || fail "a failed plot left x.png"
expect_exit 2 "plot: -o .*/missing/x.png: the directory .*/missing does not exist" -- \
    "$ISTHMUS" plot "$WORK/sync1" -o "$WORK/missing/x.png"
# a run evaluated once (at its end), with no inter-site traffic: one point per set, an empty traffic panel
timeout 120 "$ISTHMUS" train "$T" --set train.steps=4 --set train.eval_every=0 --set data.eval_bytes=4096 \
    --set train.out_dir="$WORK/once" > "$WORK/once.log" 2>&1 || fail "the run evaluated once failed"
if "$ISTHMUS" plot "$WORK/once" -o "$WORK/once.png" > "$WORK/once.plot" 2>&1 && [ -s "$WORK/once.png" ]; then
    pass "a run evaluated once and without inter-site traffic plots"
else
    fail "plot of a run evaluated once: $(cat "$WORK/once.plot")"
fi
finish || exit 1
