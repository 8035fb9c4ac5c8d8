"""Timings of a few workloads on the Triton device (CUDA / AMD), next to PyTorch on the same GPU.

python bench/gpu.py [--device CUDA] [--small]   (--small: tiny sizes, for a smoke run in the interpreter)
Each row: first call (render + Triton compile + run), then the best of several warm runs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from tgrad import Tensor
from tgrad.device import get_runtime


def best_of(fn, sync, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="CUDA")
    parser.add_argument("--small", action="store_true", help="tiny sizes (interpreter smoke run)")
    args = parser.parse_args()
    dev = get_runtime(args.device)
    tdev = dev.torch_device
    sync = dev.synchronize
    n, m = (4096, 256) if args.small else (1 << 24, 4096)
    mm = 64 if args.small else 2048
    repeats = 2 if args.small else 20
    rng = np.random.default_rng(0)

    def arr(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    a, b, c = (Tensor(arr(n), device=args.device) for _ in range(3))
    x = Tensor(arr(m, m), device=args.device)
    p, q = Tensor(arr(mm, mm), device=args.device), Tensor(arr(mm, mm), device=args.device)
    ta, tb, tc = (torch.from_numpy(t.numpy()).to(tdev) for t in (a, b, c))
    tx, tp, tq = (torch.from_numpy(t.numpy()).to(tdev) for t in (x, p, q))
    rows = [  # name, tgrad fn, torch fn, bytes moved, flops
        ("add", lambda: (a + b).realize(), lambda: ta + tb, 12 * n, n),
        ("(a*b+c).relu().sum()", lambda: (a * b + c).relu().sum().realize(),
         lambda: (ta * tb + tc).relu().sum(), 12 * n, 4 * n),
        ("sum", lambda: a.sum().realize(), lambda: ta.sum(), 4 * n, n),
        ("softmax rows", lambda: x.softmax(1).realize(), lambda: tx.softmax(1), 8 * m * m, 5 * m * m),
        (f"matmul {mm}", lambda: (p @ q).realize(), lambda: tp @ tq, 12 * mm * mm, 2 * mm**3),
    ]
    where = torch.cuda.get_device_name() if tdev == "cuda" else "interpreter"
    print(f"device {args.device} ({where})")
    header = f"{'workload':24s} {'first ms':>10s} {'tgrad ms':>10s} {'GB/s':>8s} {'GFLOP/s':>9s}"
    print(header + f" {'torch ms':>9s}")
    for name, fn, tfn, nbytes, flops in rows:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        first = time.perf_counter() - t0
        warm = best_of(fn, sync, repeats)
        ref = best_of(tfn, torch.cuda.synchronize if tdev == "cuda" else (lambda: None), repeats)
        print(f"{name:24s} {first * 1e3:10.1f} {warm * 1e3:10.3f} {nbytes / warm / 1e9:8.1f} "
              f"{flops / warm / 1e9:9.1f} {ref * 1e3:9.3f}")


if __name__ == "__main__":
    main()
