#!/bin/bash
# cli_build.sh — building as users on clusters build (docs/building.md): a
# user without root configures the tree against install prefixes and
# installs into a prefix of their own:
#  - as an unprivileged user (nobody), a copy of the tree configures with
#    --with-mpi=DIR (an MPI prefix: bin/mpicc, bin/mpirun) and
#    --with-hdf5=DIR (a parallel HDF5 prefix: include/, lib/) while
#    pkg-config sees no HDF5 at all, so HDF5 can only come from the option;
#    builds isthmus and `make install`s it under --prefix (the presets, the
#    Slurm jobs and scripts/federated.sh with it);
#  - the installed isthmus names those options in --version and trains
#    tiny.ini for a few steps, writing its model through that HDF5;
#  - the installed jobs (site.sbatch, federated.sh) run from a directory
#    that is no tree, with the installed isthmus found without PATH;
#  - outside git the build is named by its sources' hash (never "unknown");
#    `make dist` records the commit and that hash in SOURCE_ID: an unchanged
#    tarball is named as the tree it came from (the commit, when made in the
#    checkout), one byte changed makes another name;
#  - a prefix without mpicc or hdf5.h stops configure with one line naming
#    the option and the missing file;
#  - without CMocka configure warns, isthmus builds and make check stops
#    with one line.
# Skipped (visibly) outside a git checkout (the tree is copied with git
# ls-files), without root (to become nobody) or setpriv.
. "$TOP_SRCDIR/tests/lib.sh"
if [ "$(id -u)" != 0 ] || ! command -v setpriv > /dev/null; then
    echo "1..0 # SKIP needs root (to build as nobody) and setpriv"
    exit 0
fi
if ! git -C "$TOP_SRCDIR" rev-parse --git-dir > /dev/null 2>&1; then
    echo "1..0 # SKIP not a git checkout: the tree to build is taken from git ls-files"
    exit 0
fi
HDF5_PREFIX=
for d in /usr/lib/x86_64-linux-gnu/hdf5/openmpi /usr/lib/aarch64-linux-gnu/hdf5/openmpi; do
    [ -f "$d/include/hdf5.h" ] && HDF5_PREFIX=$d
done
[ -n "$HDF5_PREFIX" ] || {
    echo "1..0 # SKIP Debian's parallel HDF5 prefix (libhdf5-openmpi-dev) not found"
    exit 0
}
B="$WORK/build"
mkdir -p "$B/src" "$B/mpi/bin" "$B/pc" "$B/home"
# the tree as committed (and modified) here, without its build products
(cd "$TOP_SRCDIR" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2> /dev/null) |
    tar -xf - -C "$B/src"
# and the tree's generated build system when it has one (autoreconf's ~30 s)
for f in configure Makefile.in aclocal.m4 autoconf.h.in build-aux; do
    [ -e "$TOP_SRCDIR/$f" ] && cp -a "$TOP_SRCDIR/$f" "$B/src/"
done
# an MPI "module": its prefix holds bin/mpicc and bin/mpirun (the system's, by link)
ln -s "$(command -v mpicc)" "$B/mpi/bin/mpicc"
ln -s "$(command -v mpirun)" "$B/mpi/bin/mpirun"
# pkg-config sees libsodium and cmocka only: no HDF5 (nor anything else of the system)
pcdir=$(pkg-config --variable pcfiledir libsodium)
cp "$pcdir/libsodium.pc" "$pcdir/cmocka.pc" "$B/pc/"
chown -R 65534:65534 "$B"
chmod 755 "$WORK"
as_user() { # as_user COMMAND...: as nobody, in the copy, with a home of its own
    (cd "$B/src" && setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$B/home" PKG_CONFIG_LIBDIR="$B/pc" \
        PKG_CONFIG_PATH= OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 "$@")
}
if { [ -x "$B/src/configure" ] || as_user autoreconf -fi > "$WORK/autoreconf.log" 2>&1; } &&
    as_user ./configure --quiet --with-mpi="$B/mpi" --with-hdf5="$HDF5_PREFIX" --prefix="$B/inst" \
        > "$WORK/configure.log" 2>&1; then
    pass "as nobody: configure --with-mpi=$B/mpi --with-hdf5=$HDF5_PREFIX --prefix=$B/inst (pkg-config without HDF5)"
else
    fail "configure as nobody: $(tail -3 "$WORK/configure.log" "$WORK/autoreconf.log" 2> /dev/null | tr '\n' '|')"
fi
grep -q "^HDF5_LIBS = -L$HDF5_PREFIX" "$B/src/Makefile" 2> /dev/null && grep -q "^CC = $B/mpi/bin/mpicc" "$B/src/Makefile" &&
    pass "the Makefile compiles with the prefix's mpicc and links the prefix's HDF5 (with an rpath)" ||
    fail "the Makefile's CC / HDF5_LIBS: $(grep -h '^CC =\|^HDF5_LIBS =' "$B/src/Makefile" 2> /dev/null | tr '\n' '|')"
if as_user make -j"$(nproc)" --no-print-directory isthmus share/data/train.txt share/data/eval_prose.txt share/data/eval_tech.txt > "$WORK/make.log" 2>&1 &&
    as_user make --no-print-directory install > "$WORK/install.log" 2>&1 &&
    [ -x "$B/inst/bin/isthmus" ] && [ "$(stat -c %u "$B/inst/bin/isthmus")" = 65534 ]; then
    pass "as nobody: make isthmus, make install into the prefix ($B/inst/bin/isthmus, owned by nobody)"
else
    fail "build or install as nobody: $(tail -3 "$WORK/make.log" "$WORK/install.log" 2> /dev/null | tr '\n' '|')"
fi
inst="$B/inst/bin/isthmus"
ver=$(as_user "$inst" --version 2>&1)
echo "$ver" | grep -q -- "--with-mpi=$B/mpi" && echo "$ver" | grep -q -- "--with-hdf5=$HDF5_PREFIX" &&
    pass "the installed isthmus --version names its configure options: $(echo "$ver" | sed -n 2p | cut -c1-100)" ||
    fail "installed --version: $ver"
# outside a git checkout (this copy, a release tarball) the build is named
# by its sources, never "unknown": the federated join compares the name, so
# two builds of different code must differ. `make dist` records the commit
# and the sources' hash in the tarball (SOURCE_ID): a tarball's tree is named
# as the tree it was made from while unchanged, and differs once one byte of
# its sources does; a commit recorded is the name of the unchanged tarball
SID="$TOP_SRCDIR/scripts/source_id.sh"
copy_id=$(sh "$SID" "$B/src")
echo "$ver" | head -1 | grep -Eq "^isthmus 0\.1\.0\+src\.[0-9a-f]{12}$" && [ "$(echo "$ver" | head -1)" = "isthmus 0.1.0+$copy_id" ] &&
    pass "outside git the build is named by its sources' hash: $(echo "$ver" | head -1)" ||
    fail "installed --version outside git: '$(echo "$ver" | head -1)', the sources' id '$copy_id'"
rel="$B/src/isthmus-0.1.0"
if as_user make --no-print-directory distdir > "$WORK/distdir.log" 2>&1 && [ -s "$rel/SOURCE_ID" ]; then
    rel_id=$(sh "$SID" "$rel")
    lost=$(cd "$TOP_SRCDIR" && git ls-files | grep -v '^\.ci/\|^\.gitignore$' | while read -r f; do
        [ -e "$rel/$f" ] || echo "$f"; done)
    [ -z "$lost" ] && pass "make dist's tree holds every file of the checkout (but .ci/, .gitignore)" ||
        fail "make dist leaves out: $(echo $lost | cut -c1-300)"
    cp -a "$rel" "$WORK/rel2"
    printf ' ' >> "$WORK/rel2/src/main.c"
    rel2_id=$(sh "$SID" "$WORK/rel2")
    [ "$rel_id" = "$copy_id" ] && [ "$rel2_id" = "$copy_id-modified.$(echo "$rel2_id" | sed 's/.*-modified\.//')" ] &&
        [ "$rel2_id" != "$rel_id" ] && pass "make dist's tree ($(cat "$rel/SOURCE_ID")): named $rel_id as its source; one byte more in src/main.c: $rel2_id" ||
        fail "make dist's tree named '$rel_id' (its source '$copy_id'), with one byte changed '$rel2_id'"
    rm -f "$WORK/rel2/SOURCE_ID"
    a=$(sh "$SID" "$WORK/rel2")
    printf ' ' >> "$WORK/rel2/src/main.c"
    b=$(sh "$SID" "$WORK/rel2")
    echo "$a $b" | grep -Eq "^src\.[0-9a-f]{12} src\.[0-9a-f]{12}$" && [ "$a" != "$b" ] &&
        pass "without SOURCE_ID two trees one byte apart are two builds: $a, $b" || fail "one byte apart, no SOURCE_ID: '$a' '$b'"
    git_id=$(sh "$SID" "$TOP_SRCDIR")
    sh "$SID" --record "$TOP_SRCDIR" "$WORK/rel2" && c=$(sh "$SID" "$WORK/rel2")
    [ "$c" = "$git_id" ] && echo "$git_id" | grep -Eq "^[0-9a-f]{12}(-dirty\.[0-9a-f]{8})?$" &&
        pass "a tarball made in the checkout is named by its commit, as the checkout's build: $c" ||
        fail "recorded from the checkout: '$c', the checkout's id '$git_id'"
else
    fail "make distdir as nobody: $(tail -3 "$WORK/distdir.log" | tr '\n' '|')"
fi
if as_user mpirun -q -np 1 "$inst" train "$B/inst/share/isthmus/tiny.ini" --set train.steps=3 --set data.eval_bytes=4096 \
    --set data.dir="$B/src/share/data" --set train.out_dir="$B/out" > "$WORK/train.log" 2>&1 &&
    h5ls "$B/out/model.h5" > /dev/null 2>&1; then
    pass "the installed isthmus trains tiny.ini (its installed config) as nobody and writes its model through that HDF5"
else
    fail "installed train: $(grep -h error "$WORK/train.log" | head -2)"
fi
# the installed jobs run without the source tree: from a directory that is
# no tree, with neither ISTHMUS nor isthmus on PATH, the installed
# site.sbatch (outside Slurm: mpirun, one rank) finds its lib.sh and the
# installed isthmus; the installed federated.sh finds that isthmus too and
# runs a federated pair (its own ompi-server)
share="$B/inst/share/isthmus"
mkdir -p "$B/away" && chown 65534:65534 "$B/away"
away() { # away COMMAND...: as nobody, in $B/away, without the test's ISTHMUS or the tree on PATH
    (cd "$B/away" && setpriv --reuid=65534 --regid=65534 --clear-groups env -u ISTHMUS -u ISTHMUS_JOBS \
        -u SLURM_SUBMIT_DIR HOME="$B/home" PATH=/usr/local/bin:/usr/bin:/bin OMPI_MCA_rmaps_base_oversubscribe=1 \
        OMPI_MCA_mpi_yield_when_idle=1 "$@")
}
small="--set train.steps=2 --set data.eval_bytes=4096 --set train.eval_every=0 --set data.dir=$B/src/share/data"
inst_build="\"build\":\"$(as_user "$inst" --version 2> /dev/null | head -1 | sed 's/^isthmus //')\""
if [ -x "$share/jobs/site.sbatch" ] && [ -f "$share/jobs/lib.sh" ] && [ -x "$share/scripts/federated.sh" ] &&
    away env ISTHMUS_LAUNCHER=mpirun ISTHMUS_ARGS="$small --set train.out_dir=$B/away/job" timeout 120 \
        "$share/jobs/site.sbatch" "$share/tiny.ini" > "$WORK/job.log" 2>&1 &&
    grep -q "$inst_build" "$B/away/job/metrics.jsonl"; then
    pass "the installed jobs/site.sbatch runs from $B/away with the installed isthmus ($inst_build), no tree"
else
    fail "installed site.sbatch: $(ls "$share/jobs" "$share/scripts" 2>&1 | tr '\n' ' '); $(tail -3 "$WORK/job.log" | tr '\n' '|')"
fi
# shellcheck disable=SC2086
if away env MPIRUN_ARGS="-q" timeout 200 "$share/scripts/federated.sh" run "$B/away/fed" "$share/tiny.ini" a:1 b:1 -- \
    $small --set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.inner_steps=2 \
    --set outer.join_timeout=60 --set outer.run_id="install-$$" --set train.out_dir="$B/away/fed/out" \
    > "$WORK/fed.log" 2>&1 && grep -q "$inst_build" "$B/away/fed/out/metrics.jsonl" &&
    [ -f "$B/away/fed/out/model.h5" ]; then
    pass "the installed scripts/federated.sh runs two sites with the installed isthmus, no tree"
else
    fail "installed federated.sh run: $(cat "$WORK/fed.log" "$B"/away/fed/?.log 2> /dev/null | grep -v '^step' | tail -4 | tr '\n' '|')"
fi
# without CMocka (the tests' only need): configure warns, isthmus builds,
# and make check stops with one line before compiling a test
rm -f "$B/pc/cmocka.pc"
rc=0
as_user ./configure --quiet --with-mpi="$B/mpi" --with-hdf5="$HDF5_PREFIX" --prefix="$B/inst" > "$WORK/nocm.log" 2>&1 &&
    rm -f "$B/src/isthmus" && as_user make -j"$(nproc)" --no-print-directory isthmus >> "$WORK/nocm.log" 2>&1 || rc=1
as_user make --no-print-directory check > "$WORK/nocm-check.log" 2>&1 && rc=1
if [ $rc -eq 0 ] && grep -q "CMocka not found: isthmus builds" "$WORK/nocm.log" &&
    [ -x "$B/src/isthmus" ] && grep -q "^make check: CMocka was not found when configure ran" "$WORK/nocm-check.log" &&
    ! grep -q "CC .*tests/\|cmocka\.h" "$WORK/nocm-check.log"; then
    pass "without CMocka: configure warns, isthmus builds, make check stops with '$(grep -m1 '^make check:' "$WORK/nocm-check.log" | cut -c1-60)...'"
else
    fail "without CMocka (rc $rc): $(tail -n 4 "$WORK/nocm.log" "$WORK/nocm-check.log" | tr '\n' '|')"
fi
# a prefix without what the option needs: one line, configure fails
bad() { # bad OPTION PATTERN
    local rc=0
    as_user ./configure --quiet "$1" > "$WORK/bad.log" 2>&1 || rc=$?
    if [ $rc -ne 0 ] && grep -q -- "$2" "$WORK/bad.log"; then pass "configure $1: exit $rc, '$(grep -m1 -- "$2" "$WORK/bad.log" | sed 's/.*error: //')'"
    else fail "configure $1: exit $rc: $(tail -2 "$WORK/bad.log")"; fi
}
bad --with-mpi="$B/nowhere" "error: --with-mpi=$B/nowhere: no $B/nowhere/bin/mpicc"
bad --with-hdf5="$B/mpi" "error: --with-hdf5=$B/mpi: no $B/mpi/include/hdf5.h"
finish || exit 1
