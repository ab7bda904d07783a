#!/bin/sh
# setup.sh — install the Debian packages isthmus needs to build and test.
# Idempotent: does nothing when everything is installed. Run as root.
set -eu
PACKAGES="build-essential openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools libcmocka-dev
libopenblas-dev libopenblas-openmp-dev libsodium-dev autoconf automake libtool pkg-config xz-utils procps
liblapacke-dev gnuplot-nox netpbm iproute2 nftables libsentencepiece-dev python3-sentencepiece"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
echo "setup: all packages present"
# PyTorch for tests/cli_tokens.sh's check of python/isthmus_model.py only
# (Debian's python3-torch, ~230 packages): optional, those checks are skipped without
if [ "${ISTHMUS_SETUP_TORCH:-0}" = 1 ] && ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "ok installed"; then
    echo "setup: installing python3-torch (for the PyTorch loader's test)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3-torch > /dev/null; }; then
        echo "setup: python3-torch could not be installed; the PyTorch checks of tests/cli_tokens.sh will be skipped"
    fi
fi
# Slurm and munge for tests/cli_slurm.sh only (daemons started by the
# test itself, never as services): optional, the test is skipped without
if [ "${ISTHMUS_SETUP_SLURM:-0}" = 1 ]; then
    slurm_missing=""
    for p in slurm-wlm munge; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || slurm_missing="$slurm_missing $p"
    done
    if [ -n "$slurm_missing" ]; then
        echo "setup: installing$slurm_missing (for the Slurm tests)"
        # shellcheck disable=SC2086
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            $slurm_missing > /dev/null; }; then
            echo "setup: Slurm could not be installed; tests/cli_slurm.sh will be skipped"
        fi
    fi
fi
