"""The workloads: what is computed, on which inputs, and how much work one run is.

A Workload is plain data. Its inputs are numpy arrays made once (seeded) and handed to every contender,
so all contenders compute the same thing; `expected` is numpy's answer, used to check each contender's
first (warm-up) result. `flops` and `nbytes` are the minimal work and memory traffic of one run, used for
GFLOP/s and GB/s (None where the number would not mean much).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

MB = 1 << 20


@dataclass
class Workload:
    name: str
    kind: str  # elementwise softmax reduce matmul conv mlp mlp_jit cnn gpt gpt2_* peak_memory compile
    arg: object
    make: Callable[[], dict[str, np.ndarray]] = field(repr=False)
    flops: float | None = None
    nbytes: float | None = None
    expected: Callable[[dict[str, np.ndarray]], np.ndarray] | None = field(default=None, repr=False)
    rtol: float = 1e-3
    # elements of the largest intermediate a node-by-node interpreter (tgrad's NUMPY device) materializes
    interp_elems: int = 0
    description: str = ""
    # training steps: run() returns the step's loss (`expected`: the first step's, at the initial weights;
    # float32 losses agree to ~1e-6, so rtol 1e-4); the loss of the second step (after one update) is
    # compared across contenders (suite.cross_check) against PyTorch's in this row or in `reference`
    training: bool = False
    reference: str | None = None
    # what one run works on, as it ran: names stay those of the full sizes (`matmul_1024` under --quick is a
    # 512x512 matmul), so tables and plots print this next to the name
    size: str = ""


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.random(shape, dtype=np.float32) - 0.5).astype(np.float32)


def _scaled(n: int, scale: float, lo: int = 8) -> int:
    return max(lo, int(n * scale))


def _count(n: int) -> str:
    """4194304 -> '4M', 8192 -> '8K' (binary prefixes, as the sizes are powers of two)."""
    for shift, unit in ((20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n:,}"


def elementwise(scale: float = 1.0) -> Workload:
    n = _scaled(1 << 22, scale, 64)

    def make():
        rng = np.random.default_rng(1)
        return {"a": _rand(rng, n), "b": _rand(rng, n), "c": _rand(rng, n)}

    return Workload(
        "elementwise", "elementwise", n, make, flops=4 * n, nbytes=3 * 4 * n,
        expected=lambda d: np.maximum(d["a"] * d["b"] + d["c"], 0).sum(dtype=np.float64).astype(np.float32),
        rtol=1e-3, interp_elems=n, description=f"(a*b+c).relu().sum(), {n:,} float32", size=_count(n),
    )


def softmax(scale: float = 1.0) -> Workload:
    rows, cols = _scaled(4096, math.sqrt(scale), 4), _scaled(1024, math.sqrt(scale), 8)

    def make():
        return {"x": _rand(np.random.default_rng(2), rows, cols) * 8}

    def expected(d):
        x = d["x"]
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    return Workload(
        "softmax", "softmax", (rows, cols), make, flops=5 * rows * cols, nbytes=2 * 4 * rows * cols,
        expected=expected, interp_elems=rows * cols, description=f"softmax over rows of {rows}x{cols}",
        size=f"{rows}x{cols}",
    )


def reduce(axis: int, scale: float = 1.0) -> Workload:
    side = _scaled(256, scale ** (1 / 3), 4)
    shape = (side, side, side)

    def make():
        return {"x": _rand(np.random.default_rng(3), *shape)}

    n = side**3
    return Workload(
        f"reduce_axis{axis}", "reduce", axis, make, flops=n, nbytes=4 * (n + n // side),
        expected=lambda d: d["x"].sum(axis), interp_elems=n,
        description=f"sum over axis {axis} of {side}x{side}x{side}", size=f"{side}x{side}x{side}",
    )


def matmul(size: int, scale: float = 1.0) -> Workload:
    n = _scaled(size, scale ** (1 / 3), 4)

    def make():
        rng = np.random.default_rng(4)
        return {"a": _rand(rng, n, n), "b": _rand(rng, n, n)}

    return Workload(
        f"matmul_{size}", "matmul", n, make, flops=2 * n**3, nbytes=3 * 4 * n * n,
        expected=lambda d: d["a"] @ d["b"], rtol=2e-3, interp_elems=n**3,
        description=f"{n}x{n} @ {n}x{n} float32", size=f"{n}x{n}",
    )


CONV_BATCH = 64


def conv(scale: float = 1.0) -> Workload:
    """The example conv net's first block: conv 1->32 5x5, relu, conv 32->32 5x5, relu, sum; backward."""
    batch = _scaled(CONV_BATCH, scale, 2)

    def make():
        rng = np.random.default_rng(5)
        return {"x": _rand(rng, batch, 1, 28, 28), "w1": _rand(rng, 32, 1, 5, 5) * 0.4,
                "w2": _rand(rng, 32, 32, 5, 5) * 0.1}

    fwd = 2 * batch * 32 * 24 * 24 * 1 * 25 + 2 * batch * 32 * 20 * 20 * 32 * 25
    return Workload(
        "conv2d_fwd_bwd", "conv", batch, make, flops=3 * fwd, nbytes=None,
        interp_elems=batch * 32 * 20 * 20 * 32 * 25,
        description=f"2 conv2d layers (1->32->32, 5x5) on {batch}x1x28x28, forward+backward",
        size=f"batch {batch}",
    )


MLP_BATCH = 128


def mlp(jit: bool, scale: float = 1.0) -> Workload:
    batch = _scaled(MLP_BATCH, scale, 4)

    def make():
        rng = np.random.default_rng(6)
        bound1, bound2 = 1 / math.sqrt(784), 1 / math.sqrt(128)
        return {
            "x": rng.random((batch, 784), dtype=np.float32),
            "y": rng.integers(0, 10, batch).astype(np.int64),
            "w1": rng.uniform(-bound1, bound1, (128, 784)).astype(np.float32),
            "b1": rng.uniform(-bound1, bound1, 128).astype(np.float32),
            "w2": rng.uniform(-bound2, bound2, (10, 128)).astype(np.float32),
            "b2": rng.uniform(-bound2, bound2, 10).astype(np.float32),
        }

    def expected(d):  # the loss of the first step, at the initial weights (float64)
        from bench.models import _cross_entropy

        h = np.maximum(d["x"].astype(np.float64) @ d["w1"].T + d["b1"], 0)
        return np.float32(_cross_entropy(h @ d["w2"].T.astype(np.float64) + d["b2"], d["y"]))

    flops = 6 * batch * (784 * 128 + 128 * 10)
    name = "mlp_step_jit" if jit else "eager_mlp_step"
    return Workload(
        name, "mlp_jit" if jit else "mlp", batch, make, flops=flops, nbytes=None,
        expected=expected, rtol=1e-4, interp_elems=batch * 784 * 128, training=True,
        reference="eager_mlp_step" if jit else None, size=f"batch {batch}",
        description=f"MLP 784-128-10 training step, batch {batch}, Adam" + (", TinyJit" if jit else ""),
    )


CNN_BATCH = 128


def cnn(scale: float = 1.0, batch: int = CNN_BATCH, name: str = "cnn_step") -> Workload:
    """tinygrad's beautiful_mnist CNN: one training step (forward, backward, Adam); TinyJit where there
    is one."""
    from bench.models import cnn_data, cnn_loss_numpy

    batch = _scaled(batch, scale, 2)
    # forward multiply-adds per image: the four convs and the head; a step is ~3x the forward
    macs = 24 * 24 * 32 * 25 + 20 * 20 * 32 * 32 * 25 + 8 * 8 * 64 * 32 * 9 + 6 * 6 * 64 * 64 * 9 + 576 * 10
    return Workload(
        name, "cnn", batch, lambda: cnn_data(batch), flops=6 * macs * batch, nbytes=None,
        expected=cnn_loss_numpy, rtol=1e-4, interp_elems=batch * 20 * 20 * 32 * 25, training=True,
        size=f"batch {batch}",
        description=f"beautiful_mnist CNN training step (4 conv, 2 BatchNorm, 2 max_pool), batch {batch}, "
        "28x28, Adam; TinyJit for tgrad/tinygrad, eager PyTorch",
    )


GPT_BATCH, GPT_CTX, GPT_VOCAB, GPT_WIDTH, GPT_HEADS, GPT_LAYERS = 16, 64, 96, 64, 4, 2
# the rows' shapes: (batch, context, width, heads, layers); the other two are issue 42's shapes nobody
# tuned for (deeper and longer; wider)
GPT_SHAPES = {"gpt_step": (GPT_BATCH, GPT_CTX, GPT_WIDTH, GPT_HEADS, GPT_LAYERS),
              "gpt_4x128_step": (8, 128, 128, 4, 4), "gpt_w256_step": (16, 64, 256, 8, 2)}


def gpt(scale: float = 1.0, name: str = "gpt_step") -> Workload:
    """A character GPT (GPT_SHAPES[name]): one training step (forward, backward, Adam). `arg` is (batch,
    context, heads)."""
    from bench.models import gpt_data, gpt_loss_numpy

    batch0, ctx0, c, heads, n = GPT_SHAPES[name]
    batch = _scaled(batch0, scale, 2)
    ctx = ctx0 if scale >= 1 / 8 else 16
    v = GPT_VOCAB
    params = v * c * 2 + n * 12 * c * c
    flops = 6 * batch * ctx * params + n * 6 * batch * ctx * ctx * c * 2  # weights + attention (q@k, p@v)
    return Workload(
        name, "gpt", (batch, ctx, heads), lambda: gpt_data(batch, ctx, v, c, n), flops=flops, nbytes=None,
        expected=lambda d: gpt_loss_numpy(d, heads), rtol=1e-4,
        interp_elems=batch * heads * ctx * ctx * 4, training=True, size=f"batch {batch}, ctx {ctx}",
        description=f"char GPT training step: {n} blocks, width {c}, {heads} heads, context {ctx}, "
        f"batch {batch}, vocab {v}, Adam; TinyJit for tgrad/tinygrad, eager PyTorch",
    )


def gpt2(phase: str, scale: float = 1.0) -> Workload:
    """GPT-2 inference from a random checkpoint of GPT-2 124M's shape (bench/gpt2.py): generate (batch 1,
    a 32-token prompt, 128 new tokens, greedy, KV cache) or prefill (batch 8 x 128 tokens, the last
    position's logits). Below full size (--quick, --tiny) a 2-layer, width-128 model."""
    from bench import gpt2 as g

    size = g.FULL if scale >= 1 else g.SMALL
    batch, prompt, new = g.shape(phase)
    model = "124M" if size is g.FULL else "{layers}x{width}".format(**size)

    tokens = batch * (prompt + new)
    what = (f"generate {new} tokens after a {prompt}-token prompt (greedy, KV cache; tokens must equal "
            "transformers'), batch 1" if phase == "decode" else
            f"prefill {batch} x {prompt} tokens, the last position's logits")
    return Workload(
        f"gpt2_{phase}", f"gpt2_{phase}", phase, lambda: g.inputs(size, phase),
        flops=2 * g.params(size) * tokens, nbytes=None,
        expected=g.expected_decode if phase == "decode" else g.expected_prefill,
        rtol=0 if phase == "decode" else 1e-4,
        size=f"{model}, batch {batch}, prompt {prompt}" + (f", {new} new" if new else ""),
        description=f"GPT-2 {model} (random weights): {what}; tgrad.models.gpt2 against transformers' "
        "GPT2LMHeadModel (PyTorch eager); peak RSS of a process that loads the model and runs it once",
    )


PEAK_COLS = 16384


def peak_memory(scale: float = 1.0) -> Workload:
    """A 1 GiB float32 tensor through `((a*2+1).exp()*b).sum()`: evaluated op by op (numpy) it holds
    1 GiB intermediates; fused it needs none. The row reports peak memory above the inputs as well as time."""
    rows = _scaled(16384, scale, 8)
    n = rows * PEAK_COLS

    def make():
        rng = np.random.default_rng(7)
        return {"a": _rand(rng, rows, PEAK_COLS), "b": _rand(rng, PEAK_COLS)}

    def expected(d):  # in float64, a block of rows at a time: the checker must not need GiBs itself
        a, b = d["a"], d["b"].astype(np.float64)
        step = max(1, (16 * MB) // (8 * PEAK_COLS))
        total = sum(float((np.exp(a[i:i + step] * 2.0 + 1.0) * b).sum()) for i in range(0, rows, step))
        return np.float32(total)

    return Workload(
        "peak_memory", "peak_memory", (rows, PEAK_COLS), make, flops=4 * n, nbytes=4 * n,
        expected=expected, rtol=1e-3, interp_elems=n, size=f"{rows}x{PEAK_COLS}",
        description=f"((a*2+1).exp()*b).sum(), a {rows}x{PEAK_COLS} float32 ({4 * n / 2**30:.3g} GiB), "
        f"b {PEAK_COLS}: peak memory above the inputs",
    )


def compile_time(phase: str) -> Workload:
    return Workload(
        f"compile_{phase}", "compile", phase, dict, nbytes=None, size=f"batch {MLP_BATCH}",
        description=f"first 3 MLP training steps in a new process, {phase} kernel cache",
    )


def all_workloads(scale: float = 1.0, quick: bool = False) -> list[Workload]:
    sizes = (256, 1024) if quick else (256, 1024, 2048)
    return [
        elementwise(scale),
        softmax(scale),
        *(reduce(axis, scale) for axis in range(3)),
        *(matmul(size, scale) for size in sizes),
        conv(scale),
        mlp(False, scale),
        mlp(True, scale),
        cnn(scale),
        cnn(scale, 32, "cnn_b32_step"),
        gpt(scale),
        gpt(scale, "gpt_4x128_step"),
        gpt(scale, "gpt_w256_step"),
        gpt2("decode", scale),
        gpt2("prefill", scale),
        peak_memory(scale),
        compile_time("cold"),
        compile_time("warm"),
    ]


# old names that still select their rows
ALIASES = {"mlp_step": "eager_mlp_step"}


def select(workloads: list[Workload], only: list[str] | None) -> list[Workload]:
    """Workloads whose name starts with one of `only` (so 'matmul' picks every matmul size); an old name
    in ALIASES selects its row too ('mlp_step' picks eager_mlp_step and mlp_step_jit, as before)."""
    if not only:
        return workloads
    only = list(only) + [ALIASES[o] for o in only if o in ALIASES]
    return [w for w in workloads if any(w.name.startswith(o) or w.kind == o for o in only)]
