#!/bin/sh
# quickstart.sh — set up, build, train the small model briefly on the bundled
# corpus and evaluate it (bits per byte on both eval sets, before and after).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
sh scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
./isthmus train share/configs/small.ini --set train.steps=300 --set train.eval_every=300 \
    --set data.eval_bytes=262144 --set train.out_dir=runs/quickstart "$@"
./isthmus eval --model runs/quickstart/model.h5 --set train.out_dir=runs/quickstart
