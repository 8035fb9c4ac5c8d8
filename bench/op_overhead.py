"""Per-op Python overhead of eager tgrad: building the lazy graph of one op (nothing runs), and one whole
realize of a tiny op. The eager MLP step is ~60 of these plus its launches (bench/HISTORY.md).

    python bench/op_overhead.py [--device CPU] [--calls 2000] [--repeat 5]

Each row: the minimum over `repeat` rounds of the mean microseconds per call over `calls` calls, after 100
untimed calls. `a`, `b` are 128x128 and `c` 128x10 realized float32 tensors, `y` 128 class labels. Build
rows time the Python work only (the result is dropped, so the graph is built anew each call).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tgrad import Tensor, nn  # noqa: E402


def per_call_us(fn, calls: int, repeat: int) -> float:
    for _ in range(min(calls, 100)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def rows(device: str) -> list[tuple[str, object]]:
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((128, 128)).astype(np.float32), device=device).realize() for _ in "ab")
    c = Tensor(rng.standard_normal((128, 10)).astype(np.float32), device=device).realize()
    y = Tensor((np.arange(128) % 10).astype(np.int64), device=device).realize()
    s = Tensor(np.ones((4, 4), np.float32), device=device).realize()
    layer = nn.Linear(128, 128)
    layer.weight, layer.bias = layer.weight.to(device).realize(), layer.bias.to(device).realize()
    return [
        ("a + b", lambda: a + b),
        ("a * 2", lambda: a * 2),
        ("a.relu()", lambda: a.relu()),
        ("a.sum(1)", lambda: a.sum(1)),
        ("a.exp()", lambda: a.exp()),
        ("a @ b", lambda: a @ b),
        ("Linear(128, 128)(a)", lambda: layer(a)),
        ("c.log_softmax(1)", lambda: c.log_softmax(1)),
        ("c.softmax(1)", lambda: c.softmax(1)),
        ("c.cross_entropy(y)", lambda: c.cross_entropy(y)),
        ("(s * 2).realize(), 4x4", lambda: (s * 2).realize()),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"| op ({args.device}) | us per call |\n| --- | --- |")
    for name, fn in rows(args.device):
        print(f"| `{name}` | {per_call_us(fn, args.calls, args.repeat):.1f} |")


if __name__ == "__main__":
    main()
