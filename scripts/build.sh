#!/bin/sh
# build.sh — configure (once) and build isthmus in the source tree.
#   sh scripts/build.sh [CONFIGURE-OPTION]...   e.g. --with-cuda, --with-nccl=DIR
# Options given run configure again with them; without any, a configured
# tree keeps its configuration.
set -eu
cd "$(dirname "$0")/.."
[ -x configure ] || autoreconf -fi
if [ $# -gt 0 ] || [ ! -f Makefile ]; then ./configure --quiet "$@"; fi
make -j"$(nproc)" --no-print-directory
