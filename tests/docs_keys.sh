#!/bin/sh
# docs_keys.sh — docs/configuration.md documents every configuration key the
# program accepts (the key table in src/config_keys.c is the source of truth), and
# `isthmus config --keys` prints each one's type, default and meaning, the
# default the one the documentation gives.
. "$TOP_SRCDIR/tests/lib.sh"
DOC="$TOP_SRCDIR/docs/configuration.md"
n=0
"$ISTHMUS" config --keys > "$WORK/keys" || fail "isthmus config --keys"
# the first two fields of a line are "[section] key"
while read -r section key _; do
    n=$((n + 1))
    sec=$(echo "$section" | tr -d '[]')
    if grep -q "^| \`$sec\.$key\` |" "$DOC"; then :; else fail "$DOC lacks a row for $sec.$key"; fi
done < "$WORK/keys"
[ "$n" -gt 20 ] && pass "$n keys documented" || fail "only $n keys listed"

# Every line: "[section] key", a type, "default X" and a one-line meaning of
# at most 90 characters, columns separated by two spaces or more.
bad=$(awk -F '  +' 'NF != 4 || $1 !~ /^\[[a-z.*]+\] [a-z_0-9]+$/ ||
                    $2 !~ /^(int|long) ([0-9]+\.\.[0-9]+|>= [0-9]+)$|^real [[(][-0-9.e+]+, [0-9.e+]+]$|^(u64|string)$|^enum [a-z0-9]+(\|[a-z0-9]+)+$/ ||
                    $3 !~ /^default [^ ]/ || $4 == "" || length($4) > 90' "$WORK/keys")
[ -z "$bad" ] && pass "every key has a type, a default and a meaning" || fail "malformed config --keys lines: $bad"

# The default printed is the documented one (backquotes dropped); [data] dir
# is the build's own directory, documented in words.
awk '/^\| `[a-z.*_0-9]+` \|/ { gsub(/\\\|/, "\001"); split($0, f, / \| /); k = f[1]; d = f[3]
                              sub(/^\| /, "", k); gsub(/`/, "", k); gsub(/`/, "", d); print k "\t" d }' "$DOC" > "$WORK/doc_defaults"
awk -F '  +' '{ k = $1; sub(/^\[/, "", k); sub(/\] /, ".", k); d = $3; sub(/^default /, "", d); print k "\t" d }' \
    "$WORK/keys" > "$WORK/key_defaults"
m=0
while IFS='	' read -r key dflt; do
    doc=$(awk -F '\t' -v k="$key" '$1 == k { print $2 }' "$WORK/doc_defaults")
    if [ "$key" = data.dir ]; then
        case "$dflt" in */share/data) ;; *) fail "[data] dir: default '$dflt' is not a share/data directory" ;; esac
    elif [ "$doc" != "$dflt" ]; then
        fail "$key: config --keys says default '$dflt', $DOC says '$doc'"
    else
        m=$((m + 1))
    fi
done < "$WORK/key_defaults"
[ "$m" -eq $((n - 1)) ] && pass "$m defaults as documented" || fail "only $m of $((n - 1)) defaults as documented"
for want in "train.lr	0.001" "outer.codec	none" "outer.progress	poll" "outer.lr	by mode: diloco 0.7, streaming 0.4, else 1; codec topk 1"; do
    grep -qxF "$want" "$WORK/key_defaults" && pass "default of ${want%%	*}: ${want#*	}" ||
        fail "config --keys lacks default ${want#*	} for ${want%%	*}"
done
finish || exit 1
