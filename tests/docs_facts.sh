#!/bin/bash
# docs_facts.sh — facts the docs state agree with the code: every exit code
# of src/status.h is in docs/errors.md's exit table and in `isthmus train
# --help`; the user docs stand alone (no DESIGN.md); jobs/README.md does not
# call `isthmus plan` unwritten; every path of the tree that a doc, script,
# source or test cites exists and every relative markdown link resolves; a
# page that sends the reader elsewhere for a command sends them where it is
# documented; a metrics field has one unit wherever it appears; eval
# --help names every key eval accepts, and the main help
# neither calls the model byte-level nor counts the eval sets. Needs no
# build: without an executable $ISTHMUS the help text is read from
# src/cmd_train.c's usage_train string (and the help facts are skipped).
. "$TOP_SRCDIR/tests/lib.sh"
SRC="$TOP_SRCDIR/src"
ERRORS="$TOP_SRCDIR/docs/errors.md"

# (a) exit codes: "ISTH_NAME = N" in status.h
codes=$(sed -n 's/^ *\(ISTH_[A-Z]*\) *= *\([0-9][0-9]*\).*/\1 \2/p' "$SRC/status.h")
[ "$(echo "$codes" | grep -c .)" -ge 3 ] || fail "src/status.h: found only '$codes'"
# docs/errors.md's exit table: the rows after "| exit | meaning |" up to the first blank line
awk '/^\| exit \| meaning \|/ { t = 1 } t && /^$/ { exit } t' "$ERRORS" > "$WORK/exit_table"
[ -s "$WORK/exit_table" ] || fail "$ERRORS: no '| exit | meaning |' table"
if [ -x "${ISTHMUS:-}" ]; then
    "$ISTHMUS" train --help > "$WORK/help" 2>&1 || fail "isthmus train --help exited non-zero"
    from="isthmus train --help"
else
    # the C string: its lines between "usage_train =" and the closing ";", unquoted
    awk '/usage_train =/ { t = 1; next } t { print } t && /;$/ { exit }' "$SRC/cmd_train.c" |
        sed 's/^ *"//; s/";$//; s/"$//; s/\\n$//; s/\\"/"/g' > "$WORK/help"
    from="src/cmd_train.c usage_train"
fi
# the exit-status sentence, joined into one line
exits=$(tr '\n' ' ' < "$WORK/help" | sed -n 's/.*Exit status://p')
[ -n "$exits" ] || fail "$from: no 'Exit status:' text"
while read -r name n; do
    [ -n "$name" ] || continue
    if grep -q "^| $n | " "$WORK/exit_table"; then
        pass "docs/errors.md's exit table has $n ($name)"
    else
        fail "docs/errors.md's exit table lacks $n ($name)"
    fi
    if echo " $exits" | grep -Eq "(^|[:,]) *$n [a-z]"; then
        pass "$from lists exit $n ($name)"
    else
        fail "$from lists no exit $n ($name):$exits"
    fi
done <<< "$codes"

# (b) the user docs stand alone
refs=$(cd "$TOP_SRCDIR" && grep -rln "DESIGN\.md" README.md docs jobs 2>/dev/null)
if [ -z "$refs" ]; then pass "README.md, docs/, jobs/ reference no DESIGN.md"; else fail "DESIGN.md referenced in: $(echo $refs)"; fi

# (c) isthmus plan exists (src/planner.c) and jobs/README.md does not say otherwise
JOBS="$TOP_SRCDIR/jobs/README.md"
if [ -f "$SRC/planner.c" ] && tr '\n' ' ' < "$JOBS" | grep -Eiq 'plan[^.;()]{0,40}not (yet )?(written|implemented)'; then
    fail "jobs/README.md says isthmus plan is not written"
else
    pass "jobs/README.md does not call isthmus plan unwritten"
fi
# (d) every path of the tree that a doc, script, source or test names (a
# page under docs, a script, a source file: top directory, name and
# extension) exists, and every relative link of a markdown page resolves
cd "$TOP_SRCDIR" || exit 1
inc="--include=*.md --include=*.sh --include=*.py --include=*.c --include=*.h --include=*.cc --include=*.cu
--include=*.m4 --include=*.ini --include=*.sbatch --include=*.am --include=*.ac"
# shellcheck disable=SC2086
cited=$(grep -rIhoE $inc "(^|[^A-Za-z0-9_./\$-])(docs|scripts|jobs|tests|share/configs|python|src|cuda|m4)/[A-Za-z0-9_./-]+\.(md|sh|py|ini|sbatch|c|h|cc|cu|m4)\b" \
    README.md docs jobs scripts src cuda tests python share/configs m4 configure.ac Makefile.am 2> /dev/null |
    sed 's/^[^A-Za-z]*//' | sort -u)
missing=$(for p in $cited; do [ -e "$p" ] || echo "$p ($(grep -rIl $inc -- "$p" README.md docs jobs scripts src cuda tests python share/configs m4 configure.ac Makefile.am 2> /dev/null | head -2 | tr '\n' ' '))"; done)
[ "$(echo "$cited" | grep -c .)" -gt 50 ] || fail "found only $(echo "$cited" | grep -c .) cited paths"
[ -z "$missing" ] && pass "every path of the tree cited in README.md, docs/, jobs/, scripts/, src/, cuda/, tests/ exists ($(echo "$cited" | grep -c .))" ||
    fail "cited but missing: $missing"
broken=
for f in README.md jobs/README.md share/data/PROVENANCE.md docs/*.md docs/results/*.md; do
    for t in $(perl -ne 'while (/\]\(([^)#\s]+)(?:#[^)]*)?\)/g) { print "$1\n" unless $1 =~ m{^[a-z]+:} }' "$f"); do
        [ -e "$(dirname "$f")/$t" ] || broken="$broken $f -> $t;"
    done
done
[ -z "$broken" ] && pass "every relative link of README.md, jobs/README.md and docs/ resolves" || fail "broken links:$broken"

# (e) a page that sends the reader elsewhere for a command (`isthmus CMD`
# ... ([page](page.md)), in one clause) sends them where the command is
# documented: a heading naming it, or a command line running it
sent=$(perl -ne 'while (/`isthmus ([a-z]+)[^`]*`((?:(?!\. )[^;`|)])*?)\]\(([^)#\s]+\.md)/g) { print "$ARGV $1 $3\n" }' \
    README.md jobs/README.md docs/*.md)
while read -r page cmd target; do
    [ -n "$page" ] || continue
    t="$(dirname "$page")/$target"
    if grep -Eq "^#.*(isthmus $cmd|\`$cmd\`)|^( {4}|\t)?(\./|mpirun .*)?isthmus $cmd " "$t" 2> /dev/null; then
        pass "$page: isthmus $cmd is documented in $target, where it sends the reader"
    else
        fail "$page sends the reader to $target for isthmus $cmd, which documents it nowhere (no heading, no command line)"
    fi
done <<< "$sent"
pass "$(echo "$sent" | grep -c .) pointer(s) from a command to its page checked"

# (f) one name, one meaning: a field of docs/metrics.md's record tables has
# one unit in every record type that carries it (bits per token and bits per
# byte are two names)
awk -F' \\| ' '/^\| `[a-z_]+`/ { f = $1; sub(/^\| /, "", f); gsub(/`| \*\(optional\)\*/, "", f); print f "\t" $3 }' \
    docs/metrics.md | sort -u > "$WORK/units"
twice=$(cut -f1 "$WORK/units" | uniq -d)
n_fields=$(cut -f1 "$WORK/units" | sort -u | grep -c .)
[ "$n_fields" -gt 40 ] || fail "docs/metrics.md: found only $n_fields fields"
[ -z "$twice" ] && pass "docs/metrics.md: each of $n_fields field names has one unit in every record" ||
    fail "docs/metrics.md: one name, two units: $(for f in $twice; do grep "^$f	" "$WORK/units" | tr '\t\n' ': '; done)"

# (g) the main help and eval's: what the program accepts. Every key `eval
# --set` accepts (its refusal lists them) is in eval --help; the main help
# does not call the model byte-level while model.vocab goes above 256, nor
# count the eval sets while [eval.NAME] names any number
if [ -x "${ISTHMUS:-}" ]; then
    "$ISTHMUS" eval --help > "$WORK/eval_help" 2>&1 || fail "isthmus eval --help exited non-zero"
    "$ISTHMUS" eval --model "$WORK/none.h5" --set no.such_key=1 > /dev/null 2> "$WORK/eval_refusal"
    keys=$(sed -n 's/.*: only \(.*\) can change for evaluation.*/\1/p' "$WORK/eval_refusal" | tr -d ',')
    [ "$(echo "$keys" | wc -w)" -ge 5 ] || fail "eval --set no.such_key=1: no list of the keys it accepts: $(cat "$WORK/eval_refusal")"
    lacking=$(for k in $keys; do grep -q -- "$k" "$WORK/eval_help" || echo "$k"; done)
    [ -z "$lacking" ] && pass "eval --help names every key eval --set accepts: $keys" ||
        fail "eval --help lacks $(echo $lacking) (accepted by eval --set)"
    "$ISTHMUS" --help > "$WORK/main_help" 2>&1
    vmax=$("$ISTHMUS" config --keys | sed -n 's/^\[model\] vocab  *int [0-9]*\.\.\([0-9]*\) .*/\1/p')
    if [ -n "$vmax" ] && [ "$vmax" -gt 256 ] && grep -qi "byte-level" "$WORK/main_help"; then
        fail "isthmus --help calls the model byte-level; model.vocab goes to $vmax (token models)"
    else
        pass "isthmus --help does not call the model byte-level (model.vocab up to $vmax)"
    fi
    grep -Eqi "^ *eval .*(both|two) eval sets" "$WORK/main_help" &&
        fail "isthmus --help counts the eval sets: $(grep -i '^ *eval ' "$WORK/main_help")" ||
        pass "isthmus --help's eval line does not count the eval sets ([eval.NAME] names any)"
else
    pass "# SKIP the help texts' facts: no executable \$ISTHMUS"
fi
finish || exit 1
