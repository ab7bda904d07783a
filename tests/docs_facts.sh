#!/bin/bash
# docs_facts.sh — facts the docs state agree with the code: every exit code
# of src/status.h is in docs/errors.md's exit table and in `isthmus train
# --help`; the user docs stand alone (no DESIGN.md); jobs/README.md does not
# call `isthmus plan` unwritten. Needs no build: without an executable
# $ISTHMUS the help text is read from src/cmd_train.c's usage_train string.
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
finish || exit 1
