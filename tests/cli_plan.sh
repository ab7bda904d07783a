#!/bin/bash
# cli_plan.sh — `isthmus plan` against arithmetic done here by hand (awk),
# from the config's shape alone: parameters, FLOPs per token, each site's
# step time (at the peak of the config's precision), the fp4 payload of a streaming fragment and of the whole
# model, transfer times and the utilisation of diloco and streaming; the
# smallest H it names reaches the target and the one below does not; bad
# sites and links are one line and exit 2.
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
# bytes over the link's payload rate (1448 TCP bytes per 1500 on the wire) + two round trips
x_whole=$(awk -v b="$whole" 'BEGIN { printf "%.6g", b * 8 / (25e9 * 1448 / 1500) + 2 * 0.15 }')
x_frag=$(awk -v b="$frag0" 'BEGIN { printf "%.6g", b * 8 / (25e9 * 1448 / 1500) + 2 * 0.15 }')
row() { grep "^  $1 " "$WORK/plan.txt" | head -1; }
check "diloco payload (MB)" "$(row diloco | awk '{ print $3 }')" "$(awk -v b="$whole" 'BEGIN { print b / 1e6 }')" 0.002
check "diloco transfer (s)" "$(row diloco | awk '{ print $5 }')" "$x_whole" 0.002
check "streaming payload, largest fragment (MB)" "$(row streaming | awk '{ print $5 }')" \
    "$(awk -v b="$frag0" 'BEGIN { print b / 1e6 }')" 0.002
check "streaming transfer (s)" "$(row streaming | awk '{ print $7 }')" "$x_frag" 0.002
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
# a layout training would refuse is refused the same way (the config's own check, as for train --set site.NAME.ranks=N)
expect_exit 2 "\\[site.east\\] learner_ranks = 64 does not divide ranks = 48" -- "$ISTHMUS" plan "$C" --site east:gb300:48 --site west:b300:64 --link 25Gbps,150ms
expect_exit 2 "\\[site.a\\] learner_ranks = 3 does not divide \\[model\\] experts = 4" -- \
    "$ISTHMUS" plan "$CONFIGS/tiny.ini" --site a:h100:3 --link 1Gbps,10ms
expect_exit 2 "plan: --mfu '1.5'" -- "$ISTHMUS" plan "$C" --site east:gb300:64 --site west:b300:64 --link 25Gbps,150ms --mfu 1.5
finish || exit 1
