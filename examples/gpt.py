"""A small character-level GPT trained on the Python standard library's source (text every machine with
Python has), with Adam and a TinyJit training step; prints a sample of generated text at the end.

    python examples/gpt.py                        # 2 blocks, width 64, context 64: ~30 s on 2 CPU cores
    python examples/gpt.py --steps 1000 --device CL
    DEVICE=CL python examples/gpt.py              # the same: the model is made on the default device

The loss starts at ln(vocab) ~ 4.6 (a uniform guess over ~100 characters) and falls to ~1.9 within the
default 300 steps (19 s of training, 26 s in all from a warm kernel cache, 2 cores); the sample then has
Python's indentation, `>>>`, `#` comments, parentheses and word-like runs of letters. Sampling runs
the trained model as tgrad.models.gpt2.GPT2, through its KV cache (`generate`).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import string
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tgrad import Tensor  # noqa: E402
from tgrad.jit import TinyJit  # noqa: E402
from tgrad.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from tgrad.nn import Embedding, LayerNorm, Linear  # noqa: E402
from tgrad.nn.optim import Adam  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402

KEEP = set(string.printable) - set("\r\x0b\x0c")


def load_text(max_bytes: int = 300_000) -> str:
    """The first max_bytes characters of the standard library's top-level *.py files (sorted by name);
    characters outside printable ASCII become '?' so the vocabulary stays ~100."""
    parts, size = [], 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "".join(c if c in KEEP else "?" for c in "".join(parts)[:max_bytes])


class Block:
    def __init__(self, width: int, heads: int):
        self.heads = heads
        self.ln1, self.attn, self.proj = LayerNorm(width), Linear(width, 3 * width), Linear(width, width)
        self.ln2, self.fc, self.fc2 = LayerNorm(width), Linear(width, 4 * width), Linear(4 * width, width)

    def __call__(self, h: Tensor) -> Tensor:
        batch, t, c = h.shape
        q, k, v = (z.reshape(batch, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.attn(self.ln1(h)).split(c, 2))
        a = q.scaled_dot_product_attention(k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(batch, t, c))
        return h + self.fc2(self.fc(self.ln2(h)).gelu())


class GPT:
    def __init__(self, vocab: int, ctx: int, width: int = 64, heads: int = 4, layers: int = 2):
        self.ctx = ctx
        self.wte = Embedding(vocab, width)
        self.wpe = Tensor.uniform(ctx, width, low=-0.02, high=0.02, requires_grad=True)  # positions
        self.blocks = [Block(width, heads) for _ in range(layers)]
        self.lnf, self.head = LayerNorm(width), Linear(width, vocab, bias=False)

    def __call__(self, idx: Tensor) -> Tensor:
        h = self.wte(idx) + self.wpe[: idx.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.lnf(h))


def progress(steps: int, quiet: bool):
    if not quiet:
        try:
            from tqdm import trange

            return trange(steps)
        except ImportError:
            pass
    return range(steps)


def as_gpt2(model: GPT) -> GPT2:
    """The trained model as tgrad.models.gpt2.GPT2 (the same computation: pre-LayerNorm blocks, scaled
    causal attention, exact-erf GELU, learned positions, an untied head), for sampling through its KV
    cache. GPT-2 keeps each dense layer's weight as (in, out), a Linear's transposed."""
    width, heads = model.wte.embed_size, model.blocks[0].heads
    config = GPT2Config(vocab_size=model.wte.vocab_size, n_positions=model.ctx, n_embd=width,
                        n_layer=len(model.blocks), n_head=heads, n_inner=model.blocks[0].fc.weight.shape[0],
                        activation="none", layer_norm_epsilon=model.lnf.eps, scale_attn_weights=True,
                        scale_attn_by_inverse_layer_idx=False, tie_word_embeddings=False)
    w = {"wte.weight": model.wte.weight, "wpe.weight": model.wpe, "ln_f.weight": model.lnf.weight,
         "ln_f.bias": model.lnf.bias, "lm_head.weight": model.head.weight}
    for i, b in enumerate(model.blocks):
        for name, ln in (("ln_1", b.ln1), ("ln_2", b.ln2)):
            w[f"h.{i}.{name}.weight"], w[f"h.{i}.{name}.bias"] = ln.weight, ln.bias
        for name, lin in (("attn.c_attn", b.attn), ("attn.c_proj", b.proj), ("mlp.c_fc", b.fc),
                          ("mlp.c_proj", b.fc2)):
            w[f"h.{i}.{name}.weight"], w[f"h.{i}.{name}.bias"] = lin.weight.T, lin.bias
    weights = {k: v.detach().contiguous() for k, v in w.items()}
    Tensor.realize(*weights.values())
    return GPT2(config, weights)


def generate(model: GPT, stoi: dict, itos: list, prompt: str, n: int, temperature: float,
             rng: np.random.Generator) -> str:
    """Sample n characters after prompt (greedy for temperature 0) through GPT-2's KV cache: the prompt
    runs once, then each character is one replayed TinyJit decode step. The model knows ctx positions:
    when the text since the last start fills them, its last ctx // 2 characters start again at position 0
    (as every training window does), run once, and sampling goes on from there; every such chunk has the
    same length (ctx), so one decode capture serves them all."""
    ctx, keep = model.ctx, max(1, model.ctx // 2)
    lm = as_gpt2(model)
    ids = [stoi.get(c, stoi["?"]) for c in prompt]
    out = list(ids)
    context = ids if len(ids) <= ctx else ids[-keep:]
    context = context or [stoi["\n"]]  # (an empty prompt starts after a line break)
    with Tensor.no_grad:
        while len(out) < len(ids) + n:
            # the positions left hold all but the last of the new characters (that one is not fed back)
            room = ctx - len(context) + 1
            made = lm.generate(np.array([context]), room, temperature, seed=int(rng.integers(2**63)))
            out.extend(int(i) for i in made[0, len(context):])
            context = out[-keep:]
    return "".join(itos[i] for i in out[:len(ids) + n])


def train(steps: int = 300, batch_size: int = 16, ctx: int = 64, width: int = 64, heads: int = 4,
          layers: int = 2, lr: float = 3e-3, text_bytes: int = 300_000, sample_chars: int = 300,
          temperature: float = 0.8, seed: int = 0, quiet: bool = False) -> dict:
    t_start = time.perf_counter()
    Tensor.manual_seed(seed)
    text = load_text(text_bytes)
    itos = sorted(set(text) | {"\n", "?"})
    stoi = {c: i for i, c in enumerate(itos)}
    data = np.array([stoi[c] for c in text], np.int32)
    model = GPT(len(itos), ctx, width, heads, layers)
    opt = Adam(get_parameters(model), lr=lr)
    if not quiet:
        print(f"{len(text):,} characters of {os.path.dirname(os.__file__)}/*.py, vocabulary {len(itos)}; "
              f"{sum(t.numel() for t in get_parameters(model)):,} parameters; uniform guess: loss "
              f"{math.log(len(itos)):.2f}")

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step(loss)  # realize the loss with the update
        return loss

    rng = np.random.default_rng(seed)
    losses: list[float] = []
    bar = progress(steps, quiet)
    t_train = time.perf_counter()
    Tensor.training = True
    try:
        for i in bar:
            start = rng.integers(0, len(data) - ctx - 1, batch_size)
            rows = data[start[:, None] + np.arange(ctx + 1)]
            loss = train_step(Tensor(rows[:, :-1]), Tensor(rows[:, 1:]))
            losses.append(loss.item())
            if hasattr(bar, "set_description"):
                bar.set_description(f"loss {losses[-1]:6.3f}")
            elif not quiet and (i % 50 == 0 or i == steps - 1):
                rate = (i + 1) / (time.perf_counter() - t_train)
                print(f"step {i:4d}  loss {losses[-1]:6.3f}  {rate:6.1f} steps/s", flush=True)
    finally:
        Tensor.training = False
    train_s = time.perf_counter() - t_train
    sample = generate(model, stoi, itos, "def ", sample_chars, temperature, rng)
    result = {"losses": losses, "first_loss": losses[0], "final_loss": float(np.mean(losses[-10:])),
              "train_s": train_s, "total_s": time.perf_counter() - t_start, "sample": sample,
              "vocab": len(itos)}
    if not quiet:
        print(f"loss {losses[0]:.3f} -> {result['final_loss']:.3f} (mean of the last 10 steps) in {steps} "
              f"steps, training {train_s:.1f} s ({steps / train_s:.1f} steps/s)")
        print(f"--- {sample_chars} sampled characters (temperature {temperature}) ---")
        print(sample)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default=None, help="tgrad device (CPU, CL, ...): sets DEVICE")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--ctx", type=int, default=64, help="context length (characters)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--text-bytes", type=int, default=300_000, help="characters of stdlib source to read")
    p.add_argument("--sample", type=int, default=300, help="characters to generate at the end")
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.device:
        os.environ["DEVICE"] = a.device
    train(a.steps, a.batch_size, a.ctx, a.width, a.heads, a.layers, a.lr, a.text_bytes, a.sample,
          a.temperature, a.seed)


if __name__ == "__main__":
    main()
