#!/bin/sh
# docs_keys.sh — docs/configuration.md documents every configuration key the
# program accepts (the key table in src/config.c is the source of truth).
. "$TOP_SRCDIR/tests/lib.sh"
DOC="$TOP_SRCDIR/docs/configuration.md"
n=0
"$ISTHMUS" config --keys > "$WORK/keys" || fail "isthmus config --keys"
while read -r section key; do
    n=$((n + 1))
    sec=$(echo "$section" | tr -d '[]')
    if grep -q "^| \`$sec\.$key\` |" "$DOC"; then :; else fail "$DOC lacks a row for $sec.$key"; fi
done < "$WORK/keys"
[ "$n" -gt 20 ] && pass "$n keys documented" || fail "only $n keys listed"
finish || exit 1
