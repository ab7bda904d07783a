#!/bin/sh
# cli_config.sh — bad input through the executable: exit status 2 and one
# line naming the file, key or value at fault. Never a crash, never a hang.
. "$TOP_SRCDIR/tests/lib.sh"

T="$CONFIGS/tiny.ini"
cfg() { printf '%b' "$1" > "$WORK/bad.ini"; echo "$WORK/bad.ini"; }

expect_exit 2 "unknown key 'bogus' in \[model\]" -- "$ISTHMUS" train "$(cfg '[model]\nbogus = 1\n')"
expect_exit 2 "unknown section \[nosuch\]" -- "$ISTHMUS" train "$(cfg '[nosuch]\nx = 1\n')"
expect_exit 2 "bad.ini:2: \[model\] layers = 'two' is not an integer" -- "$ISTHMUS" train "$(cfg '[model]\nlayers = two\n')"
expect_exit 2 "\[train\] lr = 'fast' is not a number" -- "$ISTHMUS" train "$T" --set train.lr=fast
expect_exit 2 "\[model\] layers = 0 is out of range" -- "$ISTHMUS" train "$T" --set model.layers=0
expect_exit 2 "\[model\] capacity_factor = 0 is out of range \(0" -- "$ISTHMUS" train "$T" --set model.capacity_factor=0
expect_exit 2 "\[model\] capacity_factor = -1 is out of range" -- "$ISTHMUS" train "$T" --set model.capacity_factor=-1
expect_exit 2 "\[model\] heads = 5 does not divide dim = 64" -- "$ISTHMUS" train "$T" --set model.heads=5
expect_exit 2 "\[model\] top_k = 5 exceeds experts = 4" -- "$ISTHMUS" train "$T" --set model.top_k=5
expect_exit 2 "\[train\] min_lr = 0.1 exceeds lr" -- "$ISTHMUS" train "$T" --set train.min_lr=0.1
expect_exit 2 "\[train\] optimizer = 'rmsprop' is not one of adamw\|sgd\|shampoo" -- "$ISTHMUS" train "$T" --set train.optimizer=rmsprop
# [train] backend: auto runs everywhere (every other test uses it); a backend this build lacks is a one-line error
expect_exit 2 "\[train\] backend = 'gpu' is not one of auto\|cpu\|cuda" -- "$ISTHMUS" train "$T" --set train.backend=gpu
if grep -q "define HAVE_CUDA 0" "$(dirname "$ISTHMUS")/autoconf.h" 2>/dev/null; then
    expect_exit 2 "\[train\] backend = cuda, but this isthmus was built without CUDA" -- "$ISTHMUS" train "$T" \
        --set train.backend=cuda --set train.steps=1 --set train.out_dir="$WORK/cuda"
fi
expect_exit 2 "\[model\] layers is set twice" -- "$ISTHMUS" train "$(cfg '[model]\nlayers = 2\nlayers = 3\n')"
expect_exit 2 "expected 'key = value'" -- "$ISTHMUS" train "$(cfg '[model]\nlayers 2\n')"
expect_exit 2 "layout: \[outer\] mode = butterfly needs a power-of-two number of learners .* give 1" -- "$ISTHMUS" train "$T" --set outer.mode=butterfly
expect_exit 2 "\[outer\] overlap = 5 must be less than inner_steps = 5" -- "$ISTHMUS" train "$T" --set outer.mode=streaming --set outer.inner_steps=5 --set outer.overlap=5
expect_exit 2 "\[outer\] fragments = 3 exceeds \[model\] layers = 2" -- "$ISTHMUS" train "$T" --set outer.mode=streaming --set outer.fragments=3
expect_exit 2 "\[outer\] codec = 'fp8' is not one of none\|bf16\|int8\|fp4" -- "$ISTHMUS" train "$T" --set outer.codec=fp8
expect_exit 2 "\[checkpoint\] keep = 0 is out of range" -- "$ISTHMUS" train "$T" --set checkpoint.keep=0
expect_exit 2 "--set 'layers=3': expected section.key=value" -- "$ISTHMUS" train "$T" --set layers=3
expect_exit 2 "config /nonexistent.ini: cannot open" -- "$ISTHMUS" train /nonexistent.ini
expect_exit 2 "data file /nonexistent-dir/train.txt: cannot open" -- "$ISTHMUS" train "$T" --set data.dir=/nonexistent-dir
mkdir -p "$WORK/xzonly" && cp "$TOP_SRCDIR/share/data/eval_tech.txt.xz" "$WORK/xzonly/train.txt.xz"
expect_exit 2 "train.txt: missing \(only .*train.txt.xz exists" -- "$ISTHMUS" train "$T" --set data.dir="$WORK/xzonly"
mkdir -p "$WORK/short" && printf 'abc' > "$WORK/short/train.txt" && cp "$DATA_DIR"/eval_*.txt "$WORK/short/"
expect_exit 2 "short/train.txt: 3 bytes, less than one window" -- "$ISTHMUS" train "$T" --set data.dir="$WORK/short"
expect_exit 2 "unknown command 'trian'" -- "$ISTHMUS" trian "$T"
expect_exit 2 "unknown option '--sett'" -- "$ISTHMUS" train "$T" --sett model.layers=2
expect_exit 2 "train: missing CONFIG.ini" -- "$ISTHMUS" train
expect_exit 2 "model /nonexistent.h5: invalid: cannot open" -- "$ISTHMUS" eval --model /nonexistent.h5
printf 'not hdf5 at all' > "$WORK/junk.h5"
expect_exit 2 "model .*junk.h5: invalid: not a readable HDF5 file" -- "$ISTHMUS" eval --model "$WORK/junk.h5"

# --version: the package version and the commit built (a git checkout: a commit of
# this repository's history, -dirty.HASH with local changes; "unknown" outside git)
"$ISTHMUS" --version > "$WORK/version" 2>&1
built=$(sed -n 's/^isthmus [0-9]*\.[0-9]*\.[0-9]*+\([0-9a-f]\{12\}\)\(-dirty\.[0-9a-f]\{8\}\)\{0,1\}$/\1/p' "$WORK/version")
if ! grep -q "^configure:" "$WORK/version"; then
    fail "--version: $(cat "$WORK/version")"
elif [ -n "$built" ] && git -C "$TOP_SRCDIR" merge-base --is-ancestor "$built" HEAD 2>/dev/null; then
    pass "--version names the build, a commit of this history: $(head -1 "$WORK/version")"
elif [ -z "$built" ] && grep -q "^isthmus [0-9.]*+unknown$" "$WORK/version" && ! git -C "$TOP_SRCDIR" rev-parse HEAD > /dev/null 2>&1; then
    pass "--version outside a git checkout: $(head -1 "$WORK/version")"
else
    fail "--version: $(head -1 "$WORK/version"), not a commit of $TOP_SRCDIR's history"
fi

# config --devices under the launcher: one line per rank, in rank order, each
# naming its host, local rank and device (the CPU here), as train prints them
mpi 3 "$ISTHMUS" config "$T" --devices > "$WORK/devices" 2> "$WORK/devices.err"
rc=$?
lines=$(grep -c '^device: ' "$WORK/devices")
if [ $rc -eq 0 ] && [ "$lines" = 3 ] &&
    [ "$(sed -n 's/^device: rank \([0-9]\): host [^ ]* (local rank \([0-9]\) of 3), cpu$/\1\2/p' "$WORK/devices" | tr -d '\n')" = 001122 ]; then
    pass "config --devices on 3 ranks: one line each, in rank order: $(head -1 "$WORK/devices")"
else
    fail "config --devices: exit $rc, $lines line(s): $(head -c 300 "$WORK/devices" "$WORK/devices.err")"
fi
mpi 2 "$ISTHMUS" train "$T" --set train.steps=1 --set data.eval_bytes=4096 --set train.out_dir="$WORK/devtrain" \
    > "$WORK/devtrain.log" 2>&1
if grep -q "^device: rank 1: host [^ ]* (local rank 1 of 2), cpu$" "$WORK/devtrain.log"; then
    pass "train prints each rank's device at its start"
else
    fail "train: no device line for rank 1: $(grep -m2 '^device' "$WORK/devtrain.log" | tr '\n' '|')"
fi
expect_exit 2 "backend = cuda, but this isthmus was built without CUDA" -- \
    "$ISTHMUS" config "$T" --devices --set train.backend=cuda
expect_exit 2 "--devices and --memory: one at a time" -- "$ISTHMUS" config "$T" --devices --memory

# [outer] experts = split: the assignment printed as comments (the text still
# loads), every layout that cannot split refused naming the key
S="$CONFIGS/two-site.ini"
if "$ISTHMUS" config "$S" --set outer.experts=split --set site.east.experts=0-5 --set site.west.experts=6-7 \
    > "$WORK/split.ini" 2> "$WORK/split.err" &&
    grep -q "^#   east  *experts 0-5  *(6 of 8; 50.0% of the tokens per step); copies at west$" "$WORK/split.ini" &&
    grep -q "^#   west  *experts 6-7  *(2 of 8;" "$WORK/split.ini" &&
    grep -q "^# per outer period (codec fp4), a site sends .* more$" "$WORK/split.ini" &&
    "$ISTHMUS" config "$WORK/split.ini" > /dev/null; then
    pass "config prints the split assignment as comments, and the text loads back"
else
    fail "config with split experts: $(head -c 300 "$WORK/split.err"; grep '^#' "$WORK/split.ini" | head -3)"
fi
expect_exit 2 "\[outer\] experts = split needs mode = diloco or streaming \(mode is sync" -- \
    "$ISTHMUS" config "$S" --set outer.experts=split --set outer.mode=sync --set outer.fragments=1
expect_exit 2 "set site.west.experts: \[site.west\] experts = 3-7: expert 3 is also site east's" -- \
    "$ISTHMUS" config "$S" --set outer.experts=split --set site.east.experts=0-3 --set site.west.experts=3-7
expect_exit 2 "set outer.experts: \[site.west\] experts is not given while another site's is" -- \
    "$ISTHMUS" config "$S" --set outer.experts=split --set site.east.experts=0-3
expect_exit 2 "\[site.east\] experts = 0-2: 3 experts over learner_ranks = 2 ranks" -- \
    "$ISTHMUS" config "$S" --set outer.experts=split --set site.east.experts=0-2 --set site.west.experts=3-7
expect_exit 2 "\[site.east\] experts = 0-3 needs \[outer\] experts = split" -- \
    "$ISTHMUS" config "$S" --set site.east.experts=0-3
expect_exit 2 "cannot be split into whole multiples of each site's learner_ranks \(east 64, west 64\)" -- \
    "$ISTHMUS" config "$CONFIGS/moe-32b.ini" --set outer.experts=split
expect_exit 2 "set outer.expert_replicas: \[outer\] expert_replicas = 0: at least 1" -- \
    "$ISTHMUS" config "$S" --set outer.experts=split --set outer.expert_replicas=0

for cmd in train eval bench config inspect generate export; do
    if "$ISTHMUS" "$cmd" --help | grep -q "^usage: isthmus $cmd"; then pass "$cmd --help"; else fail "$cmd --help"; fi
done
finish || exit 1
