"""isthmus_model.py — an isthmus model in PyTorch, from `isthmus export`'s directory.

    from isthmus_model import IsthmusModel
    model = IsthmusModel.from_dir("exported")          # config.json + model.safetensors (or the shards' index)
    logits = model(tokens)                              # (B, T) int64 -> (B, T, vocab)
    ids = model.generate(prompt_ids, 50)                # greedy continuation

The forward is isthmus's evaluation forward (docs/architecture.md): pre-norm
blocks of RMSNorm (eps 1e-5), rotary attention (pairs i and i + head_dim/2,
base 10000, causal), and a mixture of experts (softmax router over all
experts, the top_k most probable taken, lower index first on ties, each
output weighted by its router probability, no renormalisation, no capacity
limit; SwiGLU experts); a final RMSNorm and the output head tied to the
embedding. Weights are stored (in, out): y = x @ w. Both layouts of
`isthmus export` load: one model.safetensors of whole tensors, or shards
named by model.safetensors.index.json's weight_map with the tensors split by
layer ("layers.L.NAME", stacked back here); float32 or bfloat16 values
(computed in float32). Needs only torch (and sentencepiece for text,
through the tokenizer.model beside the weights).
"""
import json
import math
import os
import struct

import torch

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16}


def load_safetensors(path):
    """The tensors of a safetensors file (little-endian float32 or bfloat16) as a dict."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: {name}: dtype {info['dtype']} not supported")
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]) if info["shape"] else t
    return out


class IsthmusModel(torch.nn.Module):
    NAMES = ("embed", "attn_norm", "wq", "wk", "wv", "wo", "moe_norm", "router", "final_norm",
             "w_gate", "w_up", "w_down")

    def __init__(self, config, tensors):
        super().__init__()
        self.config = config
        for k in ("vocab", "dim", "layers", "heads", "experts", "top_k", "ffn", "context"):
            setattr(self, k, int(config[k]))
        self.rope_base = float(config.get("rope_base", 10000.0))
        self.eps = float(config.get("norm_eps", 1e-5))
        for name in self.NAMES:
            if name not in tensors:
                raise ValueError(f"missing tensor {name}")
            self.register_parameter(name, torch.nn.Parameter(tensors[name].clone(), requires_grad=False))

    @classmethod
    def from_dir(cls, path):
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        return cls(config, load_dir(path, int(config["layers"])))

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _rope(self, x):  # x (B, T, H, Dh)
        T, Dh = x.shape[1], x.shape[3]
        half = Dh // 2
        # the tables in double, rounded to float (as src/cpu/layers.c's rope_tables)
        freq = torch.tensor([self.rope_base ** (-2.0 * i / Dh) for i in range(half)], dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
        c = torch.cos(ang).float()[None, :, None, :]
        s = torch.sin(ang).float()[None, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)

    def _moe(self, x, layer):  # x (N, D)
        probs = torch.softmax(x @ self.router[layer], dim=-1)
        # top_k by repeated argmax, lower index first on ties (torch.topk does not promise that)
        p = probs.clone()
        choice = []
        for _ in range(self.top_k):
            c = torch.argmax(p, dim=-1)  # first maximal index
            choice.append(c)
            p.scatter_(1, c[:, None], -1.0)
        out = torch.zeros_like(x)
        for k in range(self.top_k):
            c = choice[k]
            for e in torch.unique(c).tolist():
                rows = (c == e).nonzero(as_tuple=True)[0]
                xe = x[rows]
                a = xe @ self.w_gate[layer, e]
                u = xe @ self.w_up[layer, e]
                y = (torch.nn.functional.silu(a) * u) @ self.w_down[layer, e]
                out[rows] += probs[rows, e][:, None] * y
        return out

    def forward(self, tokens):
        """logits (B, T, vocab) of tokens (B, T); positions start at 0 in each row."""
        B, T = tokens.shape
        H, D = self.heads, self.dim
        Dh = D // H
        x = self.embed[tokens]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.layers):
            xn = self._rms(x, self.attn_norm[l])
            q = self._rope((xn @ self.wq[l]).view(B, T, H, Dh)).transpose(1, 2)
            k = self._rope((xn @ self.wk[l]).view(B, T, H, Dh)).transpose(1, 2)
            v = (xn @ self.wv[l]).view(B, T, H, Dh).transpose(1, 2)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
            att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            ao = (att @ v).transpose(1, 2).reshape(B, T, D)
            h = x + ao @ self.wo[l]
            x = h + self._moe(self._rms(h, self.moe_norm[l]).reshape(B * T, D), l).view(B, T, D)
        return self._rms(x, self.final_norm) @ self.embed.t()

    @torch.no_grad()
    def eval_loss(self, tokens):
        """isthmus eval's protocol on a 1-D token sequence: windows of context+1
        tokens overlapping by one (the last may be shorter), every token after the
        first predicted once. Returns (nats summed, tokens predicted)."""
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        T, total, n = self.context, 0.0, 0
        starts = list(range(0, len(tokens) - 1, T))
        full = [s for s in starts if s + T + 1 <= len(tokens)]
        for b in range(0, len(full), 64):  # whole windows in batches, the short last one alone
            w = torch.stack([tokens[s:s + T + 1] for s in full[b:b + 64]])
            logits = self(w[:, :-1])
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab).double(),
                                                             w[:, 1:].reshape(-1), reduction="sum"))
            n += w.shape[0] * T
        for s in starts[len(full):]:
            w = tokens[s:s + T + 1]
            logits = self(w[None, :-1])[0]
            total += float(torch.nn.functional.cross_entropy(logits.double(), w[1:], reduction="sum"))
            n += len(w) - 1
        return total, n

    @torch.no_grad()
    def generate(self, prompt, count):
        """Greedy continuation of `prompt` (token ids): `count` ids, the context
        restarting on its last half when full (as isthmus generate)."""
        keep = self.context // 2
        window = list(prompt)
        if len(window) > self.context:
            window = window[len(window) - max(keep, 1):]
        out = []
        for _ in range(count):
            logits = self(torch.tensor([window], dtype=torch.int64))[0, -1]
            t = int(torch.argmax(logits))
            out.append(t)
            if len(window) == self.context:
                window = window[len(window) - keep:]
            window.append(t)
        return out


def load_dir(path, layers):
    """An export's tensors in their canonical shapes, float32: model.safetensors,
    or the files model.safetensors.index.json names, each tensor from the file
    its weight_map gives and per-layer tensors ("layers.L.NAME") stacked."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        parts = {}
        for name in sorted(set(weight_map.values())):
            tensors = load_safetensors(os.path.join(path, name))
            for k, t in tensors.items():
                if weight_map.get(k) != name:
                    raise ValueError(f"{path}: {name} holds {k}, which the index places elsewhere")
                parts[k] = t
        missing = set(weight_map) - set(parts)
        if missing:
            raise ValueError(f"{path}: the index names tensors no file holds: {sorted(missing)[:4]}")
    else:
        parts = load_safetensors(os.path.join(path, "model.safetensors"))
    out = {}
    for name in IsthmusModel.NAMES:
        if name in parts:
            out[name] = parts[name].float()
        elif f"layers.0.{name}" in parts:
            out[name] = torch.stack([parts[f"layers.{l}.{name}"] for l in range(layers)]).float()
    return out


def read_shard(path):
    """The tokens of an llm.c shard (uint16 magic 20240520, uint32 20240801)."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        width = {20240520: 2, 20240801: 4}.get(header[0])
        if width is None:
            raise ValueError(f"{path}: magic {header[0]} is not an llm.c shard's")
        data = f.read(header[2] * width)
    return list(struct.unpack(f"<{header[2]}{'H' if width == 2 else 'I'}", data))
