#!/bin/bash
# cli_plan.sh — `isthmus plan` against arithmetic done here by hand (awk),
# from the config's shape alone: parameters, FLOPs per token, each site's
# step time (at the peak of the config's precision), the fp4 payload of a streaming fragment and of the whole
# model, transfer times (one round trip over outer.transport = tcp, two
# over mpi) and the utilisation of diloco and streaming; the
# smallest H it names reaches the target and the one below does not; bad
# sites and links are one line and exit 2. Then the issue-55 deployment
# (64 H100 and 32 B200, 10 Gbit/s, 80 ms): the layout adapted to the
# counts and its --set lines (which load and plan alike), the grad_accum
# that balances the sites, memory equal to `config --memory` for the bf16
# config on any build and against each GPU's capacity (exit 2 when a
# site's does not fit), the socket buffers, the codecs with the bpb each
# cost as docs/results/ records it, and the run's totals (checkpoint
# sizes from the parameter count, write times, wall time, the interval).
. "$TOP_SRCDIR/tests/lib.sh"
C="$CONFIGS/moe-32b.ini"
"$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms > "$WORK/plan.txt" 2>&1 ||
    fail "plan failed: $(tail -2 "$WORK/plan.txt")"
# moe-32b: L=32 D=2560 E=64 k=2 F=2048 T=4096 V=32768; 64 ranks x 1 seq x 8 micro-steps per site
L=32 D=2560 E=64 K=2 F=2048 T=4096 V=32768
field() { sed -n "$1" "$WORK/plan.txt" | head -1; }
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != 0 && d <= t * (b < 0 ? -b : b)) }'; }
check() { # check WHAT GOT WANT TOL
    if [ -n "$2" ] && within "$2" "$3" "$4"; then pass "$1: $2 (by hand $3)"; else fail "$1: plan says '$2', by hand $3"; fi
}

total=$(awk -v L=$L -v D=$D -v E=$E -v F=$F -v V=$V 'BEGIN { printf "%.6g", (V*D + L*(4*D*D + D*E + E*3*D*F + 2*D) + D) / 1e9 }')
check "total parameters (B)" "$(field 's/^model: \([0-9.]*\) B parameters.*/\1/p')" "$total" 0.001
active=$(awk -v L=$L -v D=$D -v E=$E -v K=$K -v F=$F -v V=$V 'BEGIN { printf "%.6g", (V*D + L*(4*D*D + D*E + K*3*D*F + 2*D) + D) / 1e9 }')
check "active parameters per token (B)" "$(field 's/.*parameters, \([0-9.]*\) B active.*/\1/p')" "$active" 0.001
# 6 x matrix parameters a token touches (attention, router, k experts, tied head) + 6 L T D of attention
fpt=$(awk -v L=$L -v D=$D -v E=$E -v K=$K -v F=$F -v V=$V -v T=$T 'BEGIN { printf "%.6g", (6*(L*(4*D*D + D*E + K*3*D*F) + V*D) + 6*L*T*D) / 1e9 }')
check "GFLOP per token" "$(field 's/.*sparsity), \([0-9.]*\) GFLOP per token.*/\1/p')" "$fpt" 0.001
tokens=$((64 * 1 * 8 * T))
for s in east:2500 west:2250; do
    name=${s%:*} peak=${s#*:}
    want=$(awk -v n=$tokens -v f="$fpt" -v p="$peak" 'BEGIN { printf "%.6g", n * f * 1e9 / (64 * p * 1e12 * 0.4) }')
    check "$name step time (s)" "$(field "s/^  $name .* step \([0-9.]*\) s$/\1/p")" "$want" 0.002
done
# an fp32 config is planned at the GPUs' fp32 peaks (no TF32: cuda/gemm.cu), 80 and 75 TFLOP/s
"$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --set train.precision=fp32 \
    > "$WORK/plan32.txt" 2>&1 || fail "fp32 plan failed: $(tail -2 "$WORK/plan32.txt")"
for s in east:80 west:75; do
    name=${s%:*} peak=${s#*:}
    want=$(awk -v n=$tokens -v f="$fpt" -v p="$peak" 'BEGIN { printf "%.6g", n * f * 1e9 / (64 * p * 1e12 * 0.4) }')
    check "$name step time at fp32 (s)" "$(sed -n "s/^  $name .* step \([0-9.]*\) s$/\1/p" "$WORK/plan32.txt")" "$want" 0.002
done
t_west=$(awk -v n=$tokens -v f="$fpt" 'BEGIN { printf "%.9g", n * f * 1e9 / (64 * 2250e12 * 0.4) }')
# fp4: half a byte per value + a 4-byte scale per 128 values
fp4() { awk -v n="$1" 'BEGIN { printf "%.0f", int((n + 1) / 2) + 4 * int((n + 127) / 128) }'; }
whole=$(fp4 "$(awk -v L=$L -v D=$D -v E=$E -v F=$F -v V=$V 'BEGIN { printf "%.0f", V*D + L*(4*D*D + D*E + E*3*D*F + 2*D) + D }')")
# streaming, 8 fragments strided over 32 layers: fragment 0 holds layers 0, 8, 16, 24 and the embedding
frag0=$(fp4 "$(awk -v D=$D -v E=$E -v F=$F -v V=$V 'BEGIN { printf "%.0f", V*D + 4*(4*D*D + D*E + E*3*D*F + 2*D) }')")
# bytes over the link's payload rate (1448 TCP bytes per 1500 on the wire) + one round trip
# (outer.transport = tcp: the data's way and the verdict's way back)
x_whole=$(awk -v b="$whole" 'BEGIN { printf "%.6g", b * 8 / (25e9 * 1448 / 1500) + 0.15 }')
x_frag=$(awk -v b="$frag0" 'BEGIN { printf "%.6g", b * 8 / (25e9 * 1448 / 1500) + 0.15 }')
row() { grep "^  $1 " "$WORK/plan.txt" | head -1; }
check "diloco payload (MB)" "$(row diloco | awk '{ print $3 }')" "$(awk -v b="$whole" 'BEGIN { print b / 1e6 }')" 0.002
check "diloco transfer (s)" "$(row diloco | awk '{ print $5 }')" "$x_whole" 0.002
check "streaming payload, largest fragment (MB)" "$(row streaming | awk '{ print $5 }')" \
    "$(awk -v b="$frag0" 'BEGIN { print b / 1e6 }')" 0.002
check "streaming transfer (s)" "$(row streaming | awk '{ print $7 }')" "$x_frag" 0.002
# Open MPI's transport (outer.transport = mpi) adds the rendezvous: two round trips
check "diloco transfer over outer.transport = mpi (s)" "$("$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 \
    --link 25Gbps,150ms --set outer.transport=mpi | grep '^  diloco ' | awk '{ print $5 }')" \
    "$(awk -v b="$whole" 'BEGIN { printf "%.6g", b * 8 / (25e9 * 1448 / 1500) + 2 * 0.15 }')" 0.002
# diloco: the slowest site's H steps against H steps + one blocking exchange
u_d=$(awk -v t="$t_west" -v x="$x_whole" 'BEGIN { printf "%.4g", 100 * 100 * t / (100 * t + x) }')
check "diloco utilisation of west (%)" "$(row diloco | sed 's/.*| west *\([0-9.]*\)%.*/\1/')" "$u_d" 0.002
# streaming: each fragment's transfer (~1 s) hides behind overlap 5 x 0.48 s: no stall
check "streaming utilisation of west (%)" "$(row streaming | sed 's/.*| west *\([0-9.]*\)%.*/\1/')" 100 0.001
# the smallest H for 95%: diloco H >= 0.95 x / (0.05 t) (the faster site's imbalance aside)
h=$(sed -n 's/.*utilisation (beside the sites. imbalance): diloco \([0-9]*\),.*/\1/p' "$WORK/plan.txt")
hmin=$(awk -v t="$t_west" -v x="$x_whole" 'BEGIN { printf "%d", 0.95 * x / (0.05 * t) }')
if [ -n "$h" ] && [ "$h" -ge "$hmin" ] && [ "$h" -le $((hmin + hmin / 8 + 1)) ]; then
    pass "smallest diloco H for 95%: $h (by hand >= $hmin, in the planner's search steps of 1/8)"
else
    fail "smallest diloco H: plan '$h', by hand >= $hmin"
fi
u_at() { "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --set outer.mode=diloco \
    --set outer.fragments=1 --set outer.inner_steps="$1" 2>&1 | sed -n 's/^  diloco .*| west *\([0-9.]*\)%.*/\1/p'; }
if [ -n "$h" ] && awk -v a="$(u_at "$h")" -v b="$(u_at $((h - h / 8 - 1)))" 'BEGIN { exit !(a >= 95 && b < 95) }'; then
    pass "diloco at H=$h reaches 95% on the slowest site, a step of the search below does not"
else
    fail "diloco at H=$h: $(u_at "$h")%, below: $(u_at $((h - h / 8 - 1)))%"
fi
# sealing: each of a site's 64 first-learner ranks seals 1/64 of the payload and
# opens the other site's share, at PLAN_SEAL_BYTES_PER_S = 0.6 GB/s
seal=$(awk -v b="$whole" 'BEGIN { printf "%.6g", b / 64 * 2 / 0.6e9 }')
check "link seal seconds per rank" "$(sed -n 's/^link seal .*: \([0-9.e-]*\) s per rank.*/\1/p' "$WORK/plan.txt")" "$seal" 0.002
# topk (64 of 4,096 at 2 bits): per chunk, 4 float32 bin values, then per
# run of 4,096 64 x (12 index + 2) bits, a short run ceil(64 len / 4096) x
# (bits of len - 1 + 2), the chunk's stream rounded up to bytes
topk() { awk -v n="$1" 'BEGIN { full = int(n / 4096); t = n - 4096 * full; bits = full * 64 * 14
    if (t > 0) { k = int((64 * t + 4095) / 4096); if (k < 1) k = 1; ib = 0; while (2 ^ ib < t) ib++; bits += k * (ib + 2) }
    printf "%.0f", 16 + int((bits + 7) / 8) }'; }
topk_whole=$(awk -v V=$V -v D=$D -v L=$L -v E=$E -v F=$F -v emb="$(topk $((V * D)))" -v d="$(topk $D)" \
    -v dd="$(topk $((D * D)))" -v de="$(topk $((D * E)))" -v df="$(topk $((D * F)))" \
    'BEGIN { printf "%.0f", emb + d + L * (2 * d + 4 * dd + de + 3 * E * df) }')
"$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --set outer.codec=topk \
    --set outer.mode=diloco --set outer.fragments=1 > "$WORK/topk.txt" 2>&1 || fail "topk plan failed: $(tail -2 "$WORK/topk.txt")"
check "diloco topk payload (MB)" "$(grep '^  diloco ' "$WORK/topk.txt" | awk '{ print $3 }')" \
    "$(awk -v b="$topk_whole" 'BEGIN { print b / 1e6 }')" 1e-6
check "topk bits per value" "$(sed -n 's/.*2 bits, \([0-9.]*\) bits per value.*/\1/p' "$WORK/topk.txt")" \
    "$(awk -v b="$topk_whole" -v t="$total" 'BEGIN { print 8 * b / (t * 1e9) }')" 0.003
grep -q "butterfly  (not with codec topk" "$WORK/topk.txt" && pass "no butterfly row with topk" ||
    fail "butterfly row with topk: $(grep '^  butterfly' "$WORK/topk.txt")"
grep -q "memory of world rank .* predicted" "$WORK/plan.txt" && pass "memory per GPU printed by category" ||
    fail "no memory table in the plan"
# the GPU's activations (any build): the residual stream (L+1 layers), seven
# saved (N,D) tensors per layer (moe-32b trains in bf16: all but the
# residual h — the two normed ones, q, k, v and the attention's output,
# what the products and the attention read — are bf16, so four tensors'
# floats),
# eight (N,D) scratch tensors, the rows sent
# and returned (2 N K D), each layer's returned rows (N K D), and the head's
# probabilities, whose buffer holds their gradient in backward (N V), and
# the pool's scratch: the gradients rounded to bf16 of the experts' rows
# (1.25 N K rows of D, grown as the row buffers) and of the projections
# (N rows of D), half a float each, in
# floats; the rest (norms, routing tables, log-sum-exps) is under 1% here
acts=$(awk '$1 == "activations" && $3 == "B" { print $2 }' "$WORK/plan.txt")
check "GPU activations per rank (GB)" "$(awk -v a="$acts" 'BEGIN { print a / 1e9 }')" \
    "$(awk -v V=$V 'BEGIN { L = 32; N = 4096; D = 2560; K = 2; P = 0.5 * (1.25 * N * K * D + N * D)
        print 4 * ((L + 1) * N * D + 4 * L * N * D + 8 * N * D + 2 * N * K * D + L * N * K * D + N * V + P) / 1e9 }')" 0.01
# train.recompute = layer: the residual stream (L+1 layers) and one layer's
# seven saved tensors (four floats' worth) and returned rows, the pool's
# scratch as above; the step a third longer (the
# forward pass again)
"$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --set train.recompute=layer \
    > "$WORK/planrl.txt" 2>&1 || fail "recompute=layer plan failed: $(tail -2 "$WORK/planrl.txt")"
acts=$(awk '$1 == "activations" && $3 == "B" { print $2 }' "$WORK/planrl.txt")
check "GPU activations per rank with recompute = layer (GB)" "$(awk -v a="$acts" 'BEGIN { print a / 1e9 }')" \
    "$(awk -v V=$V 'BEGIN { L = 32; N = 4096; D = 2560; K = 2; P = 0.5 * (1.25 * N * K * D + N * D)
        print 4 * ((L + 1) * N * D + 4 * N * D + 8 * N * D + 2 * N * K * D + N * K * D + N * V + P) / 1e9 }')" 0.01
want=$(awk -v n=$tokens -v f="$fpt" 'BEGIN { printf "%.6g", n * f * 1e9 * 4 / 3 / (64 * 2500 * 1e12 * 0.4) }')
check "east step time with recompute = layer (s)" "$(sed -n "s/^  east .* step \([0-9.]*\) s$/\1/p" "$WORK/planrl.txt")" "$want" 0.002
total_gib=$(awk '$1 == "total" && $3 == "B" { printf "%.1f", $2 / 2^30 }' "$WORK/plan.txt")
awk -v t="$total_gib" 'BEGIN { exit !(t > 0 && t < 80) }' && pass "moe-32b fits an 80 GB GPU: $total_gib GiB per rank" ||
    fail "moe-32b needs $total_gib GiB per rank"
# bf16 keeps a bf16 copy of the weights the products read: 2 bytes more per
# parameter after the tied embedding (V x D) than the same config in fp32
# (whose weights are 4 bytes per parameter)
w32=$("$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --set train.precision=fp32 |
    awk '$1 == "weights" && $3 == "B" { print $2 }')
w16=$(awk '$1 == "weights" && $3 == "B" { print $2 }' "$WORK/plan.txt")
check "GPU weights in bf16 (B)" "$w16" "$(awk -v w="$w32" -v V=$V 'BEGIN { printf "%.0f", w + 2 * (w / 4 - V * 2560) }')" 1e-6
grep -q "faster idles 10.0% of each period; give it 1.11x the tokens" "$WORK/plan.txt" &&
    pass "the sites' imbalance (gb300 against b300) is named with the batch that balances it" ||
    fail "no imbalance line: $(grep -i idle "$WORK/plan.txt" | tail -1)"

expect_exit 2 "plan: --site 'east:tpu9:64': GPU 'tpu9'" -- "$ISTHMUS" plan "$C" --site east:tpu9:64 --site west:b300:64 --link 25Gbps,150ms
expect_exit 2 "plan: --site 'east:gb300:x'" -- "$ISTHMUS" plan "$C" --site east:gb300:x --site west:b300:64 --link 25Gbps,150ms
expect_exit 2 "plan: --link '25Gbps': expected RATE,RTT" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps
expect_exit 2 "plan: --link '25furlongs,150ms'" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25furlongs,150ms
expect_exit 2 "has 2 site\(s\); give one --site per" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --link 25Gbps,150ms
expect_exit 2 "--site north: .* has no \[site.north\]" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --site north:b300:64 --link 25Gbps,150ms
# a learner_ranks the user set is not adapted: a layout training would
# refuse is refused the same way (the config's own check)
expect_exit 2 "\\[site.east\\] learner_ranks = 64 does not divide ranks = 48" -- "$ISTHMUS" plan "$C" --site east:gb300:48 \
    --site west:b300:64 --link 25Gbps,150ms --set site.east.learner_ranks=64
expect_exit 2 "\\[site.a\\] learner_ranks = 3 does not divide \\[model\\] experts = 4" -- \
    "$ISTHMUS" plan "$CONFIGS/tiny.ini" --site a:h100:3 --link 1Gbps,10ms --set site.a.learner_ranks=3
# unset, it follows the count: the largest learner dividing 3 ranks and 4 experts
"$ISTHMUS" plan "$CONFIGS/tiny.ini" --site a:h100:3 --link 1Gbps,10ms > "$WORK/tiny3.txt" 2>&1 &&
    grep -qx '  --set site.a.ranks=3 --set site.a.learner_ranks=1   (3 learner(s) of 1, 4 expert(s) per rank)' "$WORK/tiny3.txt" &&
    pass "tiny.ini on 3 GPUs: 3 learners of 1, printed as --set lines" || fail "tiny.ini on 3 GPUs: $(grep -i 'set\|error' "$WORK/tiny3.txt")"
expect_exit 2 "plan: --storage 'fast'" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --storage fast
expect_exit 2 "plan: --mfu '1.5'" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --mfu 1.5
# --- the issue-55 deployment: 64 H100 (east) and 32 B200 (west), 10 Gbit/s, 80 ms --------
I="$WORK/issue.txt"
"$ISTHMUS" plan "$C" --site east:h100:64 --site west:b200:32 --link 10Gbps,80ms > "$I" 2>&1 ||
    fail "the issue's plan failed: $(tail -1 "$I")"
# west's 32 GPUs cannot hold the config's learner of 64: one learner of 32
# (the largest dividing 32 ranks and 64 experts), east as configured
grep -qx '  --set site.west.ranks=32 --set site.west.learner_ranks=32   (1 learner(s) of 32, 2 expert(s) per rank)' "$I" &&
    ! grep -q -- '^  --set site.east' "$I" && pass "west adapted to one learner of 32, printed as --set lines; east unchanged" ||
    fail "adapted layout: $(grep -- '--set' "$I")"
# the grad_accum that balances: a step's time is proportional to it; west
# takes the whole number nearest the ideal 8 x t_east / t_west that leaves
# the smaller share idle
t_e=$(awk -v f="$fpt" 'BEGIN { printf "%.9g", 64 * 8 * 4096 * f * 1e9 / (64 * 989e12 * 0.4) }')
t_w=$(awk -v f="$fpt" 'BEGIN { printf "%.9g", 32 * 8 * 4096 * f * 1e9 / (32 * 2250e12 * 0.4) }')
ga=$(awk -v e="$t_e" -v w="$t_w" 'BEGIN { i = 8 * e / w; lo = int(i); hi = lo + 1; print (1 - lo / i <= 1 - i / hi) ? lo : hi }')
grep -qx "  --set site.west.grad_accum=$ga" "$I" && pass "balance: --set site.west.grad_accum=$ga (by hand, ideal $(awk -v e="$t_e" -v w="$t_w" 'BEGIN { print 8 * e / w }'))" ||
    fail "balance line: $(grep -A1 'steps differ' "$I" | tail -1), by hand grad_accum=$ga"
# the lines load and plan alike: the layout then fits as given, the
# balanced batch needs nothing more, and every figure is the same
SETS="--set site.west.ranks=32 --set site.west.learner_ranks=32"
"$ISTHMUS" plan "$C" --site east:h100:64 --site west:b200:32 --link 10Gbps,80ms $SETS --set site.west.grad_accum="$ga" \
    > "$WORK/applied.txt" 2>&1 || fail "plan with the printed --set lines failed: $(tail -1 "$WORK/applied.txt")"
grep -q "^layout: the config's \[site.\*\] sections fit" "$WORK/applied.txt" &&
    grep -q "no whole grad_accum comes nearer" "$WORK/applied.txt" &&
    [ "$(grep 'world rank' "$WORK/applied.txt" | head -2)" = "$(grep 'world rank' "$I" | head -2)" ] &&
    pass "the printed --set lines give the planned layout, and the balanced batch is balanced" ||
    fail "with the --set lines: $(grep -E '^layout|comes nearer|world rank' "$WORK/applied.txt" | head -4)"
# memory: the bf16 config is planned for the GPU by config --memory on this
# build too (without CUDA): the same bytes as the plan's largest rank
mem_plan=$(awk '$1 == "total" && $3 == "B" { print $2 }' "$I")
"$ISTHMUS" config "$C" $SETS --memory --rank max > "$WORK/mem.txt" 2>&1
mem_cfg=$(awk '$1 == "total" && $3 == "B" { print $2 }' "$WORK/mem.txt")
[ -n "$mem_plan" ] && [ "$mem_plan" = "$mem_cfg" ] && grep -q "the CUDA backend's buffers" "$WORK/mem.txt" &&
    pass "config --memory --rank max = plan's largest rank: $mem_cfg B (bf16: the GPU's buffers on a CPU build)" ||
    fail "config --memory '$mem_cfg' B, plan '$mem_plan' B"
"$ISTHMUS" config "$C" $SETS --set train.precision=fp32 --memory | grep -q "the CPU backend's buffers" &&
    pass "an fp32 config with backend auto: config --memory lays out the CPU backend's buffers" ||
    fail "fp32 auto: not the CPU's buffers"
# each site's largest rank against its GPU (H100 80 GiB, B200 180 GiB)
for s in east:80 west:180; do
    name=${s%:*} cap=${s#*:}
    line=$(grep -E "^  $name +[a-z0-9]+ +world rank" "$I")
    gib=$(echo "$line" | sed -n 's/.* \([0-9.]*\) GiB of \([0-9]*\) GiB.*/\1 \2/p')
    [ "${gib#* }" = "$cap" ] && pass "$name: ${gib% *} GiB against its GPU's $cap GiB" || fail "$name memory line: $line"
done
west_gib=$(grep -E "^  west " "$I" | sed -n 's/.* \([0-9.]*\) GiB of.*/\1/p')
check "west's peak is the largest rank's total (GiB)" "$west_gib" "$(awk -v b="$mem_plan" 'BEGIN { print b / 2^30 }')" 0.0005
# a layout that does not fit its GPU: 8 experts per rank on 8 H100s
# (exit 2, one line naming the site, its peak and the capacity; the
# same peak as config --memory), and the same layout on B300s fits
SMALL="--site east:h100:8 --site west:b200:8"
big=$("$ISTHMUS" config "$C" --set site.east.ranks=8 --set site.east.learner_ranks=8 --set site.west.ranks=8 \
    --set site.west.learner_ranks=8 --memory --rank 0 | awk '$1 == "total" && $3 == "B" { printf "%.1f", $2 / 2^30 }')
expect_exit 2 "^isthmus: error: plan: site east: $big GiB per GPU \\(world rank 0\\) does not fit its h100's 80 GiB$" -- \
    "$ISTHMUS" plan "$C" $SMALL --link 10Gbps,80ms
"$ISTHMUS" plan "$C" --site east:b300:8 --site west:b300:8 --link 10Gbps,80ms > /dev/null 2>&1 &&
    pass "the same layout ($big GiB per GPU) fits 288 GiB B300s: exit 0" || fail "8 B300s per site: refused"
# socket buffers: 10 Gbit/s x 80 ms = 100 MB in flight; the busiest pair
# is west's rank 0, the tied embedding and its 2 experts' fp4 chunks of
# fragment 0 (layers 0, 8, 16, 24), of the fragment's whole encoding
enc() { awk -v n="$1" 'BEGIN { printf "%.0f", int((n + 1) / 2) + 4 * int((n + 127) / 128) }'; }
share=$(awk -v emb="$(enc $((V * D)))" -v ex="$(enc $((D * F)))" -v dd="$(enc $((D * D)))" -v d="$(enc $D)" \
    -v de="$(enc $((D * E)))" -v E=$E 'BEGIN { mine = emb + 4 * 2 * 3 * ex; all = emb + 4 * (2 * d + 4 * dd + de + 3 * E * ex)
        printf "%.6g", mine / all }')
per=$(sed -n 's/.*flight: \([0-9.]*\) MB per connection.s buffer over 4 connection.*/\1/p' "$I")
check "socket buffer per connection (MB, 4 streams)" "$per" "$(awk -v s="$share" 'BEGIN { print 100 * s / 4 }')" 0.002
grep -q "Linux's default (4 MiB, 6 MiB) is enough" "$I" && pass "autotuning's default ceiling suffices at 10 Gbit/s x 80 ms" ||
    fail "buffer verdict: $(grep 'socket_buffer = 0' "$I")"
# codecs: bits per value, and each bpb figure recomputed from the rows it cites
for c in none:32 bf16:16 int8:8.25 fp4:4.25; do
    bits=$(grep -E "^  ${c%:*} +[0-9]" "$I" | awk '{ print $2 }')
    [ "$bits" = "${c#*:}" ] && pass "codec ${c%:*}: ${c#*:} bits per value" || fail "codec ${c%:*}: '$bits' bits per value"
done
check "codec fp4 payload (MB): the streaming row's" "$(grep -E '^  fp4 +[0-9]' "$I" | awk '{ print $3 }')" \
    "$(grep '^  streaming ' "$I" | awk '{ print $5 }')" 1e-6
CM="$TOP_SRCDIR/docs/results/choosing-a-mode.md" SP="$TOP_SRCDIR/docs/results/sparse-payloads.md"
bpb() { awk -F'|' -v r="$2" -v c="$3" '{ gsub(/ /, "", $2) } $2 == r { gsub(/ /, "", $c); print $c; exit }' "$1"; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.2f%%", 100 * (a / b - 1) }'; }
for c in bf16 int8 fp4; do
    want="$(pct "$(bpb "$CM" streaming_h50_$c 3)" "$(bpb "$CM" streaming_h50_none 3)") / $(pct "$(bpb "$CM" streaming_h50_$c 5)" "$(bpb "$CM" streaming_h50_none 5)") against none"
    grep -E "^  $c +[0-9]" "$I" | grep -qF -- "$want (choosing-a-mode.md, four learners: streaming_h50_$c)" &&
        pass "codec $c: bpb $want, from choosing-a-mode.md's rows" || fail "codec $c: plan '$(grep -E "^  $c +[0-9]" "$I")', docs $want"
done
topk_want="$(bpb "$SP" topkh16_adamw_lr0.001_1600_s42 5 | tr -d '*') / $(bpb "$SP" topkh16_adamw_lr0.001_1600_s42 7 | tr -d '*') against sync (fp4 DiLoCo there: $(bpb "$SP" diloco_adamw_lr0.001_1600_s42 5) / $(bpb "$SP" diloco_adamw_lr0.001_1600_s42 7 | sed 's/−/-/'))"
grep -E "^  topk +[0-9]" "$I" | grep -qF -- "$topk_want" && pass "codec topk: bpb $topk_want, from sparse-payloads.md's rows" ||
    fail "codec topk: plan '$(grep -E '^  topk +[0-9]' "$I")', docs '$topk_want'"
# totals, at checkpoint.every = 610 (some checkpoints with an exchange in
# flight, some without) and 4 GB/s: each site's file holds 6 float32 copies
# of the parameters (anchor, outer momentum, residual, one learner's
# weights, AdamW m and v), 7 with an exchange's drained result
"$ISTHMUS" plan "$C" --site east:h100:64 --site west:b200:32 --link 10Gbps,80ms --storage 4GB/s \
    --set checkpoint.every=610 > "$WORK/tot.txt" 2>&1 || fail "totals plan failed: $(tail -1 "$WORK/tot.txt")"
params=$(awk -v L=$L -v D=$D -v E=$E -v F=$F -v V=$V 'BEGIN { printf "%.0f", V*D + L*(4*D*D + D*E + E*3*D*F + 2*D) + D }')
for s in east west; do
    got=$(sed -n "s/^  $s .*GB (\([0-9]*\) B).*/\1/p" "$WORK/tot.txt")
    [ "$got" = "$(awk -v p="$params" 'BEGIN { printf "%.0f", 24 * p }')" ] && pass "$s checkpoint: $got B = 6 x 4 B x $params parameters" ||
        fail "$s checkpoint '$got' B, by hand $(awk -v p="$params" 'BEGIN { printf "%.0f", 24 * p }')"
done
check "checkpoint write time at 4 GB/s (s)" "$(sed -n 's/^  east .* B), \([0-9.]*\) s;.*/\1/p' "$WORK/tot.txt")" \
    "$(awk -v p="$params" 'BEGIN { print 24 * p / 4e9 }')" 0.001
# the schedule: fragment p starts after step t when t mod 100 = floor(p x 100 / 8), in flight 5 steps
n_flight=$(awk 'BEGIN { for (k = 610; k < 100000; k += 610) { n++; f = 0
        for (s = k - 4; s <= k; s++) for (p = 0; p < 8; p++) if (s % 100 == int(p * 100 / 8)) f = 1
        nf += f } print n, nf }')
grep -q "+ ${n_flight% *} checkpoint(s) every 610 steps (.*; ${n_flight#* } with an exchange in flight" "$WORK/tot.txt" &&
    pass "checkpoints during the run: ${n_flight% *}, ${n_flight#* } with an exchange in flight (by the schedule)" ||
    fail "checkpoint count: $(grep -o '+ [0-9]* checkpoint.*in flight' "$WORK/tot.txt"), by hand $n_flight"
# wall time: 100,000 of east's steps (streaming hides every fragment), each
# checkpoint the slower write + the completion's round trip (+ the drained
# fragment's transfer when one is in flight), the last one with the model file
x_f=$(awk -v b="$(fp4 "$(awk -v D=$D -v E=$E -v F=$F -v V=$V 'BEGIN { printf "%.0f", V*D + 4*(4*D*D + D*E + E*3*D*F + 2*D) }')")" \
    'BEGIN { printf "%.9g", b * 8 / (10e9 * 1448 / 1500) + 0.08 }')
wall=$(awk -v t="$t_e" -v p="$params" -v n="${n_flight% *}" -v nf="${n_flight#* }" -v x="$x_f" 'BEGIN {
    w = 24 * p / 4e9; wf = 28 * p / 4e9
    print (100000 * t + (n - nf) * (w + 0.08) + nf * (wf + 0.08 + x) + 28 * p / 4e9) / 3600 }')
check "run total (h)" "$(sed -n 's/^run total .* = \([0-9.]*\) h; checkpoints.*/\1/p' "$WORK/tot.txt")" "$wall" 0.001
# the interval at which the dearest checkpoint costs 2% of the time, up to a multiple of H
want=$(awk -v t="$t_e" -v p="$params" -v x="$x_f" 'BEGIN { c = 28 * p / 4e9 + 0.08 + x; n = c * 0.98 / (0.02 * t)
    n = (n == int(n)) ? n : int(n) + 1; print int((n + 99) / 100) * 100 }')
grep -q "^checkpoint.every for checkpoints at <= 2% of the wall time: $want " "$WORK/tot.txt" &&
    pass "checkpoint.every for 2%: $want steps (by hand)" || fail "interval: $(grep '^checkpoint.every' "$WORK/tot.txt"), by hand $want"
check "a live rejoin's checkpoint over the link (min)" "$(sed -n 's/^a live rejoin .* in \([0-9.]*\) min$/\1/p' "$WORK/tot.txt")" \
    "$(awk -v p="$params" 'BEGIN { print 28 * p * 8 / (10e9 * 1448 / 1500) / 60 }')" 0.002
# a real checkpoint of tiny.ini in two sites (east one learner of 2, west
# two of 1), streaming with an exchange in flight at step 4: each file is
# the planned groups of float32 parameters plus HDF5's own metadata (under
# 0.6 MB here, less than one group: the count is what is checked)
TW="--set site.east.ranks=2 --set site.west.ranks=2 --set site.east.learner_ranks=2 --set site.west.learner_ranks=1
--set outer.mode=streaming --set outer.inner_steps=4 --set outer.fragments=2 --set outer.overlap=2 --set outer.codec=fp4
--set train.steps=8 --set checkpoint.every=4"
"$ISTHMUS" plan "$CONFIGS/tiny.ini" --site east:h100:2 --site west:h100:2 --link 1Gbps,10ms $TW > "$WORK/tinyck.txt" 2>&1 ||
    fail "tiny checkpoint plan failed: $(tail -1 "$WORK/tinyck.txt")"
if mpi 4 "$ISTHMUS" train "$CONFIGS/tiny.ini" $TW --set train.out_dir="$WORK/ck" --set train.eval_every=0 \
    --set data.eval_bytes=4096 > "$WORK/ck.log" 2>&1; then
    for s in east west; do
        read -r g b <<< "$(sed -n "s/^  $s *\([0-9]*\) group(s) of .* GB (\([0-9]*\) B).*/\1 \2/p" "$WORK/tinyck.txt")"
        for k in 4:1 8:0; do # step: an exchange in flight (the drained result, one more group) or not
            f=$(stat -c %s "$WORK/ck/checkpoints/$s/ckpt-0000000${k%:*}.h5" 2>/dev/null)
            want=$(awk -v g="$g" -v b="$b" -v x="${k#*:}" 'BEGIN { printf "%.0f", b / g * (g + x) }')
            awk -v f="${f:-0}" -v w="$want" 'BEGIN { exit !(f >= w && f <= w + 6e5) }' &&
                pass "$s's checkpoint of step ${k%:*}: $f B, planned $want B of parameters ($((g + ${k#*:})) groups)" ||
                fail "$s's checkpoint of step ${k%:*}: '$f' B, planned $want B ($((g + ${k#*:})) groups)"
        done
    done
else
    fail "tiny two-site training failed: $(tail -3 "$WORK/ck.log")"
fi
# the checkpoints' count is arithmetic, not a loop over train.steps / every
# (two billion checkpoints here): the plan answers at once
if timeout 30 "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms \
    --set train.steps=2000000000 --set checkpoint.every=1 > "$WORK/many.txt" 2>&1 &&
    grep -q "+ 1999999999 checkpoint(s) every 1 steps" "$WORK/many.txt"; then
    pass "a plan of 2e9 steps with a checkpoint at every step"
else
    fail "plan of 2e9 steps, checkpoint.every = 1: $(grep -o '+ [0-9]* checkpoint(s)' "$WORK/many.txt"; tail -1 "$WORK/many.txt")"
fi
# experts split across the sites: 64 experts over 64-rank learners are not
# whole experts per rank at 32 a site, so the plan halves learner_ranks;
# a site sends the dense part (fp4) and, averaged, its 32 experts' copy
# once every 32 outer periods; replicated sends the whole model
split=$(sed -n '/^experts split across sites/,+3p' "$WORK/plan.txt")
if echo "$split" | grep -q "with --set site.east.learner_ranks=32 --set site.west.learner_ranks=32$" &&
    echo "$split" | grep -q "east experts 0-31 (32); west experts 32-63 (32); each held by 2 site(s)"; then
    pass "split: the layout that gives every rank whole experts, and the assignment"
else
    fail "split: $(echo "$split" | head -2)"
fi
dense=$(fp4 "$(awk -v L=$L -v D=$D -v E=$E -v V=$V 'BEGIN { printf "%.0f", V*D + L*(4*D*D + D*E + 2*D) + D }')")
expert=$(fp4 "$(awk -v L=$L -v D=$D -v F=$F 'BEGIN { printf "%.0f", L*3*D*F }')")
per=$(echo "$split" | sed -n 's/.*a site sends \([0-9.e+]*\) MB (the dense part) + \([0-9.e+]*\) MB (copies.*/\1 \2/p')
check "split: dense part per outer period (MB)" "${per% *}" "$(awk -v b="$dense" 'BEGIN { print b / 1e6 }')" 0.002
check "split: copies per outer period (MB)" "${per#* }" "$(awk -v b="$expert" 'BEGIN { print b * 32 / 32 / 1e6 }')" 0.002
check "split: fewer bytes than replicated, without the copies" \
    "$(echo "$split" | sed -n 's/.*(\([0-9.]*\)x without the copies).*/\1/p')" \
    "$(awk -v w="$whole" -v d="$dense" 'BEGIN { printf "%.4g", w / d }')" 0.003
finish || exit 1
