"""The model rows (`cnn_step`, `gpt_step`): seeded numpy weights, a numpy forward pass (the reference loss
before the first step), and the same model in tgrad / tinygrad (one class, their nn APIs agree) and in
PyTorch. Every contender starts from the same numpy weights and trains on the same batch.

- CNN: tinygrad's beautiful_mnist net: Conv2d 1->32 5x5, relu, Conv2d 32->32 5x5, relu, BatchNorm2d(32),
  max_pool2d(2); Conv2d 32->64 3x3, relu, Conv2d 64->64 3x3, relu, BatchNorm2d(64), max_pool2d(2);
  flatten; Linear 576->10. Cross-entropy, Adam lr 1e-3.
- GPT: token + position embeddings, pre-LayerNorm blocks (causal scaled_dot_product_attention, GELU (tanh
  approximation: tinygrad's only GELU) MLP of width 4x), final LayerNorm, an untied head without bias.
  Cross-entropy over every position, Adam lr 1e-3.
"""

from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------------------------------------------
# weights and data (numpy)

CNN_CONVS = (("c1", 1, 32, 5), ("c2", 32, 32, 5), ("c3", 32, 64, 3), ("c4", 64, 64, 3))


def cnn_data(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    d = {"x": rng.random((batch, 1, 28, 28), dtype=np.float32),
         "y": rng.integers(0, 10, batch).astype(np.int64)}
    for name, cin, cout, k in CNN_CONVS:  # PyTorch's default init: uniform(+-1/sqrt(fan_in))
        bound = 1 / math.sqrt(cin * k * k)
        d[name + "w"] = rng.uniform(-bound, bound, (cout, cin, k, k)).astype(np.float32)
        d[name + "b"] = rng.uniform(-bound, bound, cout).astype(np.float32)
    for name, c in (("bn1", 32), ("bn2", 64)):
        d[name + "w"], d[name + "b"] = np.ones(c, np.float32), np.zeros(c, np.float32)
    bound = 1 / math.sqrt(576)
    d["lw"] = rng.uniform(-bound, bound, (10, 576)).astype(np.float32)
    d["lb"] = rng.uniform(-bound, bound, 10).astype(np.float32)
    return d


def gpt_data(batch: int, ctx: int, vocab: int, width: int, layers: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(9)

    def normal(*shape):  # GPT-2's init: N(0, 0.02)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    c = width
    d = {"x": rng.integers(0, vocab, (batch, ctx)).astype(np.int64),
         "y": rng.integers(0, vocab, (batch, ctx)).astype(np.int64),
         "wte": normal(vocab, c), "wpe": normal(ctx, c), "lnfw": np.ones(c, np.float32),
         "lnfb": np.zeros(c, np.float32), "head": normal(vocab, c)}
    for i in range(layers):
        p = f"h{i}."
        d.update({p + "ln1w": np.ones(c, np.float32), p + "ln1b": np.zeros(c, np.float32),
                  p + "attnw": normal(3 * c, c), p + "attnb": np.zeros(3 * c, np.float32),
                  p + "projw": normal(c, c), p + "projb": np.zeros(c, np.float32),
                  p + "ln2w": np.ones(c, np.float32), p + "ln2b": np.zeros(c, np.float32),
                  p + "fcw": normal(4 * c, c), p + "fcb": np.zeros(4 * c, np.float32),
                  p + "fc2w": normal(c, 4 * c), p + "fc2b": np.zeros(c, np.float32)})
    return d


# ---------------------------------------------------------------------------------------------------
# numpy forward passes (float64): the loss before the first step


def _cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = w.shape[-1]
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))  # (B, C, Ho, Wo, k, k)
    out = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3]))  # (B, Ho, Wo, O)
    return out.transpose(0, 3, 1, 2) + b[None, :, None, None]


def _batchnorm(x, w, b, eps=1e-5):
    mean, var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[None, :, None, None] + b[None, :, None, None]


def _pool(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max((3, 5))


def cnn_loss_numpy(d: dict[str, np.ndarray]) -> np.ndarray:
    p = {k: v.astype(np.float64) for k, v in d.items() if k != "y"}
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    h = relu(_conv(p["x"], p["c1w"], p["c1b"]))
    h = _pool(_batchnorm(relu(_conv(h, p["c2w"], p["c2b"])), p["bn1w"], p["bn1b"]))
    h = relu(_conv(h, p["c3w"], p["c3b"]))
    h = _pool(_batchnorm(relu(_conv(h, p["c4w"], p["c4b"])), p["bn2w"], p["bn2b"]))
    logits = h.reshape(len(h), -1) @ p["lw"].T + p["lb"]
    return np.float32(_cross_entropy(logits, d["y"]))


def _layernorm(x, w, b, eps=1e-5):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gpt_loss_numpy(d: dict[str, np.ndarray], heads: int) -> np.ndarray:
    p = {k: v.astype(np.float64) for k, v in d.items() if k not in ("x", "y")}
    x, y = d["x"], d["y"]
    batch, ctx = x.shape
    c = p["wte"].shape[1]
    h = p["wte"][x] + p["wpe"][:ctx]
    causal = np.tril(np.ones((ctx, ctx), bool))
    layers = sum(1 for k in p if k.endswith(".ln1w"))
    for i in range(layers):
        q = {k[len(f"h{i}."):]: v for k, v in p.items() if k.startswith(f"h{i}.")}
        a = _layernorm(h, q["ln1w"], q["ln1b"]) @ q["attnw"].T + q["attnb"]
        qh, kh, vh = (t.reshape(batch, ctx, heads, c // heads).transpose(0, 2, 1, 3)
                      for t in np.split(a, 3, -1))
        s = np.where(causal, qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(c // heads), -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        att = (s / s.sum(-1, keepdims=True)) @ vh
        h = h + att.transpose(0, 2, 1, 3).reshape(batch, ctx, c) @ q["projw"].T + q["projb"]
        m = _gelu_tanh(_layernorm(h, q["ln2w"], q["ln2b"]) @ q["fcw"].T + q["fcb"])
        h = h + m @ q["fc2w"].T + q["fc2b"]
    logits = _layernorm(h, p["lnfw"], p["lnfb"]) @ p["head"].T
    return np.float32(_cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))


# ---------------------------------------------------------------------------------------------------
# tgrad and tinygrad: the same classes, given the library's nn module and a function that turns a
# numpy array into a trainable tensor


class TinyCNN:
    def __init__(self, nn, param, d):
        self.convs = []
        for name, cin, cout, k in CNN_CONVS:
            conv = nn.Conv2d(cin, cout, k)
            conv.weight, conv.bias = param(d[name + "w"]), param(d[name + "b"])
            self.convs.append(conv)
        self.bns = []
        for name, c in (("bn1", 32), ("bn2", 64)):
            bn = nn.BatchNorm2d(c)
            bn.weight, bn.bias = param(d[name + "w"]), param(d[name + "b"])
            self.bns.append(bn)
        self.head = nn.Linear(576, 10)
        self.head.weight, self.head.bias = param(d["lw"]), param(d["lb"])

    def __call__(self, x):
        c1, c2, c3, c4 = self.convs
        x = self.bns[0](c2(c1(x).relu()).relu()).max_pool2d((2, 2))
        x = self.bns[1](c4(c3(x).relu()).relu()).max_pool2d((2, 2))
        return self.head(x.flatten(1))


class TinyGPT:
    def __init__(self, nn, param, d, heads: int, gelu):
        self.heads, self.gelu = heads, gelu
        vocab, c = d["wte"].shape
        self.wte = nn.Embedding(vocab, c)
        self.wte.weight = param(d["wte"])
        self.wpe = param(d["wpe"])
        self.blocks = []
        i = 0
        while f"h{i}.ln1w" in d:
            p = f"h{i}."
            ln1, ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
            attn, proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            fc, fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
            for layer, name in ((ln1, "ln1"), (ln2, "ln2"), (attn, "attn"), (proj, "proj"), (fc, "fc"),
                                (fc2, "fc2")):
                layer.weight, layer.bias = param(d[p + name + "w"]), param(d[p + name + "b"])
            self.blocks.append((ln1, attn, proj, ln2, fc, fc2))
            i += 1
        self.lnf = nn.LayerNorm(c)
        self.lnf.weight, self.lnf.bias = param(d["lnfw"]), param(d["lnfb"])
        self.head = nn.Linear(c, vocab, bias=False)
        self.head.weight = param(d["head"])

    def __call__(self, idx):
        batch, t = idx.shape
        h = self.wte(idx) + self.wpe[:t]
        c = h.shape[-1]
        for ln1, attn, proj, ln2, fc, fc2 in self.blocks:
            q, k, v = (z.reshape(batch, t, self.heads, c // self.heads).transpose(1, 2)
                       for z in attn(ln1(h)).split(c, 2))
            a = q.scaled_dot_product_attention(k, v, is_causal=True)
            h = h + proj(a.transpose(1, 2).reshape(batch, t, c))
            h = h + fc2(self.gelu(fc(ln2(h))))
        return self.head(self.lnf(h))


# ---------------------------------------------------------------------------------------------------
# PyTorch


def torch_cnn(torch, d):
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(), nn.BatchNorm2d(64), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(576, 10))
    names = ["c1w", "c1b", "c2w", "c2b", "bn1w", "bn1b", "c3w", "c3b", "c4w", "c4b", "bn2w", "bn2b",
             "lw", "lb"]
    with torch.no_grad():
        for p, name in zip(model.parameters(), names, strict=True):
            p.copy_(torch.from_numpy(d[name]))
    return model


def torch_gpt(torch, d, heads: int):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.ln1, self.attn, self.proj = nn.LayerNorm(c), nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.ln2, self.fc, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, h):
            batch, t, c = h.shape
            q, k, v = (z.view(batch, t, heads, c // heads).transpose(1, 2)
                       for z in self.attn(self.ln1(h)).split(c, 2))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(a.transpose(1, 2).reshape(batch, t, c))
            return h + self.fc2(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, vocab, ctx, c, layers):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, c), nn.Parameter(torch.zeros(ctx, c))
            self.blocks = nn.ModuleList(Block(c) for _ in range(layers))
            self.lnf, self.head = nn.LayerNorm(c), nn.Linear(c, vocab, bias=False)

        def forward(self, idx):
            h = self.wte(idx) + self.wpe[: idx.shape[1]]
            for b in self.blocks:
                h = b(h)
            return self.head(self.lnf(h))

    vocab, c = d["wte"].shape
    layers = sum(1 for k in d if k.endswith(".ln1w"))
    model = GPT(vocab, d["wpe"].shape[0], c, layers)
    with torch.no_grad():
        model.wte.weight.copy_(torch.from_numpy(d["wte"]))
        model.wpe.copy_(torch.from_numpy(d["wpe"]))
        model.lnf.weight.copy_(torch.from_numpy(d["lnfw"]))
        model.lnf.bias.copy_(torch.from_numpy(d["lnfb"]))
        model.head.weight.copy_(torch.from_numpy(d["head"]))
        for i, b in enumerate(model.blocks):
            for name in ("ln1", "attn", "proj", "ln2", "fc", "fc2"):
                getattr(b, name).weight.copy_(torch.from_numpy(d[f"h{i}.{name}w"]))
                getattr(b, name).bias.copy_(torch.from_numpy(d[f"h{i}.{name}b"]))
    return model
