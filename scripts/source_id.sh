#!/bin/sh
# source_id.sh — the name of the sources a build is made from, the part of
# `isthmus --version` after the "+" that the federated join compares (two
# builds of different code must not join):
#   sh scripts/source_id.sh SRCDIR            the id of the tree at SRCDIR
#   sh scripts/source_id.sh --record SRCDIR DIR   write DIR/SOURCE_ID (make dist)
# In SRCDIR's own git checkout: git's short commit, "-dirty." and a hash of
# the local changes when there are some (trees with different changes on one
# commit differ). Elsewhere (a release tarball, a copy): a hash of the
# program's sources (src/, cuda/, m4/, configure.ac, Makefile.am: their names
# and bytes, in sorted order), so two trees that differ in one byte differ.
# A tarball's SOURCE_ID (written by `make dist`) holds the commit it was made
# from and that hash: while the sources still hash to it the id is the
# commit, the same as the checkout's build of that commit; changed, it is the
# commit, "-modified." and the new hash. (A tarball made from a tarball
# records the id of the tree it was made from.)
# Owns: the id. Must not: write anything but SOURCE_ID (--record).
set -eu

hash_sources() { # hash_sources DIR: 12 hex digits
    (cd "$1" && {
        for f in configure.ac Makefile.am; do [ -f "$f" ] && echo "$f"; done
        for d in src cuda m4; do
            [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' \
                -o -name '*.m4' \) ! -name build_commit.h
        done
    } | LC_ALL=C sort | while read -r f; do
        printf '%s %s\n' "$f" "$(wc -c < "$f" | tr -d ' ')"
        cat "$f"
    done | { sha256sum 2> /dev/null || shasum -a 256 2> /dev/null || cksum; } | awk '{ print substr($1, 1, 12) }')
}

git_id() { # git_id DIR: the commit (and its local changes), or nothing outside DIR's own checkout
    top=$(cd "$1" && git rev-parse --show-toplevel 2> /dev/null) || return 0
    [ "$top" = "$(cd "$1" && pwd -P)" ] || return 0
    c=$(cd "$1" && git rev-parse --short=12 HEAD 2> /dev/null) || return 0
    if ! (cd "$1" && git diff --quiet HEAD -- 2> /dev/null); then
        c="$c-dirty.$(cd "$1" && git diff HEAD -- | git hash-object --stdin | cut -c1-8)"
    fi
    echo "$c"
}

source_id() { # source_id DIR: the id of the tree at DIR
    c=$(git_id "$1")
    if [ -n "$c" ]; then
        echo "$c"
        return 0
    fi
    h=$(hash_sources "$1")
    if [ -f "$1/SOURCE_ID" ] && read -r commit recorded < "$1/SOURCE_ID" && [ -n "$recorded" ]; then
        if [ "$h" = "$recorded" ]; then echo "$commit"; else echo "$commit-modified.$(echo "$h" | cut -c1-8)"; fi
        return 0
    fi
    echo "src.$h"
}

if [ "${1:-}" = --record ]; then # the tarball of a tarball keeps its id
    [ $# -eq 3 ] || { echo "usage: source_id.sh --record SRCDIR DISTDIR" >&2; exit 2; }
    id=$(source_id "$2")
    echo "$id $(hash_sources "$3")" > "$3/SOURCE_ID"
    exit 0
fi
[ $# -eq 1 ] || { echo "usage: source_id.sh SRCDIR | --record SRCDIR DISTDIR" >&2; exit 2; }
source_id "$1"
