#!/bin/sh
# structure.sh — the shape of the source tree (docs/architecture.md,
# "Modules"): a module is one name in src/ or cuda/ (its .h and its .c,
# .cc or .cu); no module includes a module that includes it back, however
# far round (include circle); no module calls into a module that calls back
# into it (call circle: the symbols each object file defines and uses, read
# with nm from the objects make built); no source file over 800 lines; every
# header says what it owns and what it must not do.
. "$TOP_SRCDIR/tests/lib.sh"
export LC_ALL=C # sort and join must agree on the order
BUILD=$(cd "$(dirname "$ISTHMUS")" && pwd) # where make put the objects (the source tree, or a build directory)
cd "$TOP_SRCDIR" || exit 1
command -v python3 >/dev/null || { echo "1..0 # SKIP python3 is not installed"; exit 0; }

# the build's generated header is not a module
headers=$(ls src/*.h src/cpu/*.h cuda/*.h | grep -v '^src/build_commit.h$')
missing=""
for h in $headers; do
    grep -q "Owns:" "$h" && grep -q "Must not:" "$h" || missing="$missing $h"
done
[ -z "$missing" ] && pass "every header ($(echo "$headers" | wc -w)) says what it owns and must not do" ||
    fail "headers without 'Owns:' / 'Must not:' lines:$missing"

long=$(wc -l src/*.c src/*.cc src/cpu/*.c cuda/*.cu src/*.h src/cpu/*.h cuda/*.h 2>/dev/null | awk '$2 != "total" && $1 > 800 {print $2 " (" $1 ")"}' | tr '\n' ' ')
[ -z "$long" ] && pass "no source file over 800 lines" || fail "files over 800 lines: $long"

# circles: strongly connected components of more than one module
circles() { # circles KIND: reads "from to" edges on stdin, prints each circle
    python3 -c '
import sys
edges = {}
for line in sys.stdin:
    a, b = line.split()
    if a != b: edges.setdefault(a, set()).add(b); edges.setdefault(b, set())
index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in sorted(edges[v]):
        if w not in index: visit(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(" <-> ".join(sorted(comp)))
sys.setrecursionlimit(10000)
for v in sorted(edges):
    if v not in index: visit(v)
print("; ".join(out))'
}
module_of() { sed -e 's,^\./,,' -e 's,\.\(c\|cc\|cu\|h\|o\)$,,' -e 's,^src/,,' -e 's,/libisthmus[a-z_]*_a-,/,' ; }

# include edges: module -> the module of each quoted include that exists in the tree
inc=$(for f in src/*.c src/*.cc src/*.h src/cpu/*.c src/cpu/*.h cuda/*.cu cuda/*.h; do
    [ -f "$f" ] || continue
    dir=$(dirname "$f")
    sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f" | while read -r h; do
        t="" # resolved as the compiler does: beside the file, then -Isrc, -Icuda
        for d in "$dir" src cuda; do [ -f "$d/$h" ] && { t=$(realpath --relative-to=. "$d/$h"); break; }; done
        [ -n "$t" ] || continue
        [ "$t" = src/build_commit.h ] && continue
        echo "$(echo "$f" | module_of) $(echo "$t" | module_of)"
    done
done | circles)
[ -z "$inc" ] && pass "no include circle between modules" || fail "include circles: $inc"

# call edges: from the CPU library's objects (the CUDA objects when built too)
# the objects of today's sources only (a deleted module's stale object is not counted)
objs=$(for f in src/*.c src/*.cc src/cpu/*.c cuda/*.cu; do
    o="$BUILD/${f%.*}.o"
    [ -f "$o" ] && echo "$o"
done)
if [ -z "$objs" ]; then
    fail "no object files: build first (make check does)"
else
    defs=$(for o in $objs; do nm --defined-only -g "$o" 2>/dev/null | awk -v m="$(echo "${o#"$BUILD"/}" | module_of)" 'NF == 3 && $2 ~ /[TDBRC]/ {print $3, m}'; done | sort -u)
    calls=$(for o in $objs; do nm -u "$o" 2>/dev/null | awk -v m="$(echo "${o#"$BUILD"/}" | module_of)" '{print $2, m}'; done | sort -u)
    cyc=$(join "$(printf '%s\n' "$calls" > "$WORK/calls"; echo "$WORK/calls")" \
        "$(printf '%s\n' "$defs" > "$WORK/defs"; echo "$WORK/defs")" | awk '{print $2, $3}' | circles)
    [ -z "$cyc" ] && pass "no call circle between modules ($(echo "$objs" | wc -w) objects)" || fail "call circles: $cyc"
fi
finish || exit 1
