#!/bin/sh
# quickstart.sh — set up, build, and run the main job briefly on one machine:
# the small model on two emulated sites of different layouts and batch sizes
# (share/configs/two-site.ini: Streaming DiLoCo, fp4 payloads), 4 MPI ranks.
# Prints bits per byte on both eval sets before and after training and the
# inter-site traffic saved against sync, then re-evaluates the saved model.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
sh scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
mpirun -q -np 4 ./isthmus train share/configs/two-site.ini --set train.steps=300 \
    --set train.eval_every=300 --set data.eval_bytes=262144 --set train.out_dir=runs/quickstart "$@"
./isthmus eval --model runs/quickstart/model.h5 --set train.out_dir=runs/quickstart
