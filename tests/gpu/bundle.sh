#!/bin/sh
# bundle.sh — build here what tests/gpu/run.sh needs on a bare GPU machine
# (the device the project's tool lends: a driver, nvcc, Python with PyTorch
# and NVIDIA's library wheels, but no MPI, HDF5, OpenBLAS or CMocka).
#
#   sh tests/gpu/bundle.sh [--arch sm_90|all]     (or BUNDLE_ARCH=sm_90|all)
#
# --arch sm_90 (the default): the H100 and H200 of the device tool alone, in a
# third of the build time and size; --arch all: also sm_100 and sm_103
# (B200, B300), configure's default.
# Writes gpubundle/isthmus-gpu.tar.xz (ignored by git; carry it: under
# 64 MiB), holding
#   BUILD   the commit, the GPUs built for, nvcc's version (run.sh reports it)
#   bin/    isthmus and the GPU tests, built --with-cuda
#   lib/    every shared library they and Open MPI load that is neither
#           glibc, the C++ runtime, nor CUDA's big libraries (cuBLAS,
#           cuBLASLt, cuSOLVER and what it loads: cuSPARSE, nvJitLink;
#           NCCL, the driver: run.sh finds the device's own)
#   ompi/   Open MPI 4.1's runtime (orterun, orted, the MCA components, the
#           help texts) and PMIx's, under their Debian paths, relocated at
#           run time with OPAL_PREFIX and PMIX_INSTALL_PREFIX
#   share/  the configs
# compute-sanitizer is not carried: the device's image has it (run.sh finds
# it in /usr/local/cuda/bin or PATH). Run as root on the development machine
# after scripts/setup.sh; the CUDA toolkit is taken from /usr/local/cuda (or
# $CUDA_DIR).
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
cuda=${CUDA_DIR:-/usr/local/cuda}
build=${BUNDLE_BUILD:-/tmp/isthmus-cuda-build}
jobs=${BUNDLE_JOBS:-$(nproc 2>/dev/null || echo 2)}
tests="test_optim_gpu test_layers_gpu test_kernels_gpu test_backend_gpu test_codec_gpu"
arch=${BUNDLE_ARCH:-sm_90}
while [ $# -gt 0 ]; do
    case $1 in
    --arch) [ $# -ge 2 ] || { echo "bundle.sh: --arch needs sm_90 or all" >&2; exit 2; }; arch=$2; shift 2 ;;
    --arch=*) arch=${1#*=}; shift ;;
    *) echo "bundle.sh: unknown argument '$1' (usage: sh tests/gpu/bundle.sh [--arch sm_90|all])" >&2; exit 2 ;;
    esac
done
case $arch in
sm_90) gencode="-gencode arch=compute_90,code=sm_90" ;;
all) gencode="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_100,code=sm_100 -gencode arch=compute_103,code=sm_103" ;;
*) echo "bundle.sh: --arch '$arch': sm_90 (H100, H200) or all (and sm_100, sm_103)" >&2; exit 2 ;;
esac

# a copy of the tree (tar keeps the times, so a build dir already configured
# is rebuilt incrementally; make reruns automake when Makefile.am changed)
echo "bundle: building --with-cuda for $arch in $build"
mkdir -p "$build"
(cd "$top" && git ls-files -co --exclude-standard | tar cf - -T -) | tar xf - -C "$build"
(
    cd "$build"
    # configured once per set of GPUs: another set reconfigures, and its
    # device code is compiled anew (make does not see a flag change)
    if [ ! -f config.status ] || ! grep -q with-cuda config.status || [ "$(cat .bundle-gencode 2>/dev/null)" != "$gencode" ]; then
        autoreconf -fi > autoreconf.log 2>&1 || { tail -5 autoreconf.log; exit 1; }
        ./configure -q --with-cuda="$cuda" CUDA_GENCODE="$gencode" > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
        rm -f cuda/*.o libisthmus_cuda.a
        echo "$gencode" > .bundle-gencode
    fi
    # the libraries first, alone: two archive writers at once race in ar
    make -j"$jobs" libisthmus.a libisthmus_cuda.a > make.log 2>&1 || { tail -20 make.log; exit 1; }
    targets="isthmus"
    for t in $tests; do targets="$targets tests/gpu/$t"; done
    # shellcheck disable=SC2086
    make -j"$jobs" $targets >> make.log 2>&1 || { tail -20 make.log; exit 1; }
)

stage=$(mktemp -d /tmp/isthmus-bundle.XXXXXX)
root=$stage/isthmus-gpu
mkdir -p "$root/bin" "$root/lib" "$root/share/configs"
cp "$build/isthmus" "$root/bin/"
for t in $tests; do cp "$build/tests/gpu/$t" "$root/bin/"; done
strip --strip-unneeded "$root"/bin/*
cp "$top"/share/configs/*.ini "$root/share/configs/"
{
    echo "bundle of $(git -C "$top" describe --always --dirty 2>/dev/null || echo 'an unknown commit'), $(date -u +%Y-%m-%d), for $arch"
    echo "CUDA_GENCODE: $gencode"
    echo "nvcc: $("$cuda/bin/nvcc" --version | tail -1)"
} > "$root/BUILD"

# Open MPI's runtime under its Debian paths (ompi_info --path all: prefix
# /usr, libdir and pkglibdir under /usr/lib/x86_64-linux-gnu/openmpi).
ompi=$root/ompi/usr
arch=x86_64-linux-gnu
mkdir -p "$ompi/bin" "$ompi/lib/$arch" "$ompi/share"
cp /usr/bin/orterun /usr/bin/orted "$ompi/bin/"
ln -s orterun "$ompi/bin/mpirun"
cp -a "/usr/lib/$arch/openmpi" "$ompi/lib/$arch/"
rm -rf "$ompi/lib/$arch/openmpi/include"
cp -a "/usr/lib/$arch/pmix2" "$ompi/lib/$arch/"
rm -rf "$ompi/lib/$arch/pmix2/include" "$ompi/lib/$arch/pmix2/lib/libpmix.a"
cp -a /usr/share/openmpi "$ompi/share/"
# components that need fabrics a single GPU machine lacks (and whose
# libraries are large): left out, and excluded by run.sh's MCA settings
for c in btl_openib btl_uct btl_ofi mtl_ofi mtl_psm mtl_psm2 pml_ucx osc_ucx spml_ucx atomic_ucx \
    coll_hcoll coll_fca fs_lustre fs_gpfs fbtl_pvfs2 fs_pvfs2 mtl_portals4 btl_portals4 \
    btl_usnic common_ucx common_ofi common_verbs; do
    rm -f "$ompi/lib/$arch/openmpi/lib/openmpi3/mca_$c.so" "$ompi/lib/$arch/openmpi/lib/libmca_$c.so"*
done

# The shared libraries all of it loads, but for what every Linux (glibc,
# the C++ runtime) or the GPU machine (CUDA's large libraries) has.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink|libnccl)'
libs=$(mktemp)
for f in "$root"/bin/* "$ompi"/bin/orterun "$ompi"/bin/orted $(find "$ompi/lib" -name '*.so*' -type f); do
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' >> "$libs"
done
sort -u "$libs" | while read -r name path; do
    echo "$name" | grep -Eq "$skip" && continue
    [ -e "$root/lib/$name" ] || cp -L "$path" "$root/lib/$name"
done
rm -f "$libs"
# libmpi and friends are found through lib/ by the executables (RUNPATH is
# Debian's /usr/lib/...); the components find them the same way.

mkdir -p "$top/gpubundle"
out=$top/gpubundle/isthmus-gpu.tar.xz
tar -C "$stage" -cf - isthmus-gpu | xz -T"$jobs" -6 > "$out.tmp"
mv "$out.tmp" "$out"
rm -rf "$stage"
size=$(du -m "$out" | cut -f1)
echo "bundle: $out (${size} MiB; carry gpubundle, at most 64 MiB with the tree)"
[ "$size" -lt 56 ] || { echo "bundle: too large to carry with the tree" >&2; exit 1; }
