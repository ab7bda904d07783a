"""torch_sdpa.py — PyTorch's scaled_dot_product_attention, causal, forward
and backward, in bf16 on the GPU, at one shape: its throughput, and
isthmus's attention on the same shapes from `isthmus bench`'s step by phase.

    python3 torch_sdpa.py B H T Dh LAYERS MICRO_STEPS ISTHMUS_ATTENTION_MS

B sequences of T tokens, H heads of Dh; isthmus's figure is the bench's
"attention" milliseconds per step over LAYERS layers x MICRO_STEPS
micro-batches (forward and backward, each layer once: no recomputation).
FLOPs as FlashAttention counts them for a causal mask: forward
2 * 2 * B * H * T^2 * Dh / 2, backward 2.5 x the forward. Prints one line:
"sdpa X TFLOP/s (backend), isthmus Y TFLOP/s, ratio Z"."""
import sys
import time

import torch
import torch.nn.functional as F

B, H, T, Dh, L, M = (int(v) for v in sys.argv[1:7])
isthmus_ms = float(sys.argv[7])
flops = 3.5 * (2 * 2 * B * H * T * T * Dh / 2)  # forward + backward, causal

dev = torch.device("cuda")
q, k, v = (torch.randn(B, H, T, Dh, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn(B, H, T, Dh, device=dev, dtype=torch.bfloat16)


def step():
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    o.backward(g)


for _ in range(3):
    step()
torch.cuda.synchronize()
reps = 20
t0 = time.perf_counter()
for _ in range(reps):
    step()
torch.cuda.synchronize()
sdpa = flops * reps / (time.perf_counter() - t0) / 1e12
mine = flops * L * M / (isthmus_ms / 1e3) / 1e12 if isthmus_ms > 0 else 0.0
backend = "flash" if torch.backends.cuda.flash_sdp_enabled() else "other"
print("sdpa %.1f TFLOP/s (%s), isthmus %.1f TFLOP/s, ratio %.3f" % (sdpa, backend, mine, mine / sdpa if sdpa else 0))
