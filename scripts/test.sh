#!/bin/sh
# test.sh — set up, build and run the whole test suite (make check).
set -eu
cd "$(dirname "$0")/.."
ISTHMUS_SETUP_SLURM=1 sh scripts/setup.sh
sh scripts/build.sh
status=0
make check -j"$(nproc)" --no-print-directory || status=$?
if [ "$status" -ne 0 ]; then
    for f in tests/*.log; do
        grep -q "^FAIL\|^ERROR" "$f" 2>/dev/null && { echo "=== $f"; tail -40 "$f"; }
    done
fi
exit "$status"
