"""What TinyJit's safety costs per call: replay overhead, fresh output buffers vs copies, random inputs.

    python bench/jit_overhead.py [--device CPU] [--n 4096] [--calls 2000]

Rows (median microseconds per call over `calls` calls, after warm-up):
- eager: the function without the jit (graph, schedule, cached kernels)
- replay, fresh output: the jit returns a buffer its kernel wrote, re-allocated on every replay
- replay, copied output: the function returns its argument, so the jit copies it (one kernel more)
- replay, random input: the function draws Tensor.rand inside; each replay draws and uploads it again
- replay, 4 grads: a backward over 4 parameters; the gradients are replay inputs and outputs
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tgrad import Tensor  # noqa: E402
from tgrad.device import get_runtime  # noqa: E402
from tgrad.jit import TinyJit  # noqa: E402


def per_call_us(fn, args, calls: int, device: str) -> float:
    dev = get_runtime(device)
    for _ in range(5):
        fn(*args)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args)
        dev.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    x = Tensor(np.random.default_rng(0).standard_normal(a.n).astype(np.float32), device=a.device).realize()
    ws = [Tensor(np.ones(a.n, np.float32), device=a.device, requires_grad=True) for _ in range(4)]

    def fresh(t):
        return (t * 2 + 1).realize()

    def returns_arg(t):
        (t * 2 + 1).realize()  # same work, but the value handed back is the argument itself
        return t

    def random(t):
        return (t + Tensor.rand(a.n, device=a.device)).realize()

    def grads(t):
        for w in ws:
            w.grad = None
        loss = sum(((t * w).square()).sum() for w in ws)
        loss.backward()
        return loss.realize(*[w.grad for w in ws])

    rows = [
        ("eager (no jit)", fresh),
        ("replay, fresh output", TinyJit(fresh)),
        ("replay, copied output", TinyJit(returns_arg)),
        ("replay, random input", TinyJit(random)),
        ("eager 4 grads (no jit)", grads),
        ("replay, 4 grads", TinyJit(grads)),
    ]
    print(f"TinyJit overhead on {a.device}, n={a.n}, median of {a.calls} calls")
    print("| call | us per call |\n| --- | --- |")
    for name, fn in rows:
        print(f"| {name} | {per_call_us(fn, (x,), a.calls, a.device):.1f} |")


if __name__ == "__main__":
    main()
