"""torch_check.py — an independent forward of an isthmus model file in PyTorch.

Reads /model/* of MODEL.h5 (h5py; the model file's stable tensor names),
scores the first EVAL_BYTES bytes of EVAL_FILE the way `isthmus eval` does
(windows of T+1 bytes overlapping by one, rotary positions restarting in
every window, no expert capacity) in float64, and prints the bits per byte.
Written from the model's equations, not from isthmus' code: it checks
the GPU backend (and the file layout) against a second implementation.

usage: python3 torch_check.py MODEL.h5 EVAL_FILE EVAL_BYTES T TOP_K
"""
import math
import sys

import h5py
import torch


def rmsnorm(x, g):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g


def rotary(x, positions):
    # x (W, H, T, Dh): element i pairs with i + Dh/2, frequency 10000^(-2i/Dh)
    dh = x.shape[-1]
    i = torch.arange(dh // 2, dtype=x.dtype, device=x.device)
    angle = positions[:, None] * torch.pow(torch.tensor(10000.0, dtype=x.dtype, device=x.device), -2.0 * i / dh)
    c, s = torch.cos(angle), torch.sin(angle)
    a, b = x[..., : dh // 2], x[..., dh // 2 :]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def forward(w, tokens, top_k):
    # tokens (W, T) -> logits (W, T, 256)
    L, D = w["wq"].shape[0], w["embed"].shape[1]
    E = w["router"].shape[2]
    heads = forward.heads
    dh = D // heads
    W, T = tokens.shape
    pos = torch.arange(T, dtype=torch.float64, device=tokens.device)
    mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    x = w["embed"][tokens]
    for l in range(L):
        a = rmsnorm(x, w["attn_norm"][l])
        q = (a @ w["wq"][l]).view(W, T, heads, dh).transpose(1, 2)
        k = (a @ w["wk"][l]).view(W, T, heads, dh).transpose(1, 2)
        v = (a @ w["wv"][l]).view(W, T, heads, dh).transpose(1, 2)
        q, k = rotary(q, pos), rotary(k, pos)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
        s = s.masked_fill(~mask, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(W, T, D)
        h = x + o @ w["wo"][l]
        m = rmsnorm(h, w["moe_norm"][l]).reshape(W * T, D)
        p = torch.softmax(m @ w["router"][l], dim=-1)
        # top-k by p, ties to the lower index: sort by (-p, index), stable
        order = torch.sort(-p, dim=-1, stable=True).indices[:, :top_k]
        out = torch.zeros_like(m)
        for e in range(E):
            rows, slot = (order == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = m[rows]
            ye = (torch.nn.functional.silu(xe @ w["w_gate"][l, e]) * (xe @ w["w_up"][l, e])) @ w["w_down"][l, e]
            out.index_add_(0, rows, p[rows, e][:, None] * ye)
        x = h + out.view(W, T, D)
    x = rmsnorm(x, w["final_norm"])
    return x @ w["embed"].T


def main():
    path, eval_file, eval_bytes, T, top_k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with h5py.File(path, "r") as f:
        w = {k: torch.tensor(f["model"][k][...], dtype=torch.float64, device=dev) for k in f["model"]}
        cfg = f.attrs.get("config")
    cfg = cfg.decode() if isinstance(cfg, bytes) else str(cfg)
    heads = [int(line.split("=")[1]) for line in cfg.splitlines() if line.replace(" ", "").startswith("heads=")]
    forward.heads = heads[0]
    data = open(eval_file, "rb").read()
    if eval_bytes:
        data = data[:eval_bytes]
    predicted = len(data) - 1
    ce, counted = 0.0, 0
    windows = (predicted + T - 1) // T
    with torch.no_grad():
        for w0 in range(0, windows, 16):
            batch = [data[w * T : w * T + T + 1] for w in range(w0, min(w0 + 16, windows))]
            longest = max(len(b) for b in batch) - 1
            tok = torch.zeros(len(batch), longest, dtype=torch.long, device=dev)
            tgt = torch.full((len(batch), longest), -1, dtype=torch.long, device=dev)
            for i, b in enumerate(batch):
                tok[i, : len(b) - 1] = torch.tensor(list(b[:-1]), device=dev)
                tgt[i, : len(b) - 1] = torch.tensor(list(b[1:]), device=dev)
            logits = forward(w, tok, top_k)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1), ignore_index=-1,
                                                     reduction="sum")
            ce += loss.item()
            counted += int((tgt >= 0).sum())
    assert counted == predicted, (counted, predicted)
    print("torch_check: bpb %.9f over %d bytes (float64, %s)" % (ce / (predicted * math.log(2)), predicted, dev))


if __name__ == "__main__":
    main()
