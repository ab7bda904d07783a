#!/bin/sh
# build.sh — configure (once) and build isthmus in the source tree.
set -eu
cd "$(dirname "$0")/.."
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure --quiet
make -j"$(nproc)" --no-print-directory
