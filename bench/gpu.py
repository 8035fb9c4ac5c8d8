"""Timings of a few workloads on the Triton device (CUDA / AMD), next to PyTorch on the same GPU.

python bench/gpu.py [--device CUDA] [--small]   (--small: tiny sizes, for a smoke run in the interpreter)
Each row: first call (render + Triton compile + run), then the best of several warm runs. Then the model
rows of `python -m bench` (cnn_step, gpt_step): tgrad with TinyJit against eager PyTorch on the same GPU,
from the same weights; the first step's loss is checked against the numpy reference, the second step's
(after one Adam update) against PyTorch's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
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
    parser.add_argument("--profile", action="store_true", help="the slowest kernels of each model step")
    args = parser.parse_args()
    # PyTorch's convolutions default to TF32 on the GPU (10-bit mantissas: the CNN's loss after one step moved
    # 0.7%); tgrad's products are IEEE float32, so PyTorch's are too, for the loss check and a fair time
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
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
    print(header + f" {'torch ms':>9s} {'time/torch':>10s}  (time / PyTorch's time: lower is better)")
    for name, fn, tfn, nbytes, flops in rows:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        first = time.perf_counter() - t0
        warm = best_of(fn, sync, repeats)
        ref = best_of(tfn, torch.cuda.synchronize if tdev == "cuda" else (lambda: None), repeats)
        print(f"{name:24s} {first * 1e3:10.1f} {warm * 1e3:10.3f} {nbytes / warm / 1e9:8.1f} "
              f"{flops / warm / 1e9:9.1f} {ref * 1e3:9.3f} {warm / ref:10.2f}")
    if args.small:
        print("(--small: the model rows take minutes in the interpreter; skipped)")
    else:
        model_rows(args.device, tdev, sync, repeats, args.profile)


def model_rows(device: str, tdev: str, sync, repeats: int, profile: bool) -> None:
    """cnn_step and gpt_step: tgrad (TinyJit) and eager PyTorch on `tdev`, ms per step, loss checks."""
    from bench.contenders import TgradContender, TorchContender
    from bench.models import torch_cnn, torch_gpt
    from bench.workloads import GPT_HEADS, cnn, gpt

    tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
    ours, theirs = TgradContender(device, 1), TorchContender()
    ours.open()
    theirs.open()
    print(f"{'model':24s} {'first ms':>10s} {'tgrad ms':>10s} {'torch ms':>10s} {'time/torch':>10s}  losses")
    for wl, tmodel in ((cnn(), torch_cnn), (gpt(), lambda t, d: torch_gpt(t, d, GPT_HEADS))):
        d = wl.make()
        run = ours.build(wl, d)
        t0 = time.perf_counter()
        loss0 = float(run().numpy())
        first = time.perf_counter() - t0
        loss1 = float(run().numpy())
        tstep = theirs._train(tmodel(torch, d).to(tdev), d["x"], d["y"], tdev)
        ref0, ref1 = float(tstep()), float(tstep())
        warm = best_of(run, sync, repeats)
        ref = best_of(tstep, tsync, repeats)
        expect = float(wl.expected(d))
        ok = abs(loss0 - expect) <= 1e-3 * abs(expect) and abs(loss1 - ref1) <= 1e-3 * abs(ref1)
        print(f"{wl.name:24s} {first * 1e3:10.1f} {warm * 1e3:10.3f} {ref * 1e3:10.3f} {warm / ref:10.2f}  "
              f"{'ok' if ok else 'MISMATCH'}: step 1 {loss0:.6f} (numpy {expect:.6f}, torch {ref0:.6f}), "
              f"step 2 {loss1:.6f} (torch {ref1:.6f})")
        if profile:
            kernel_profile(run, sync)


def kernel_profile(run, sync, steps: int = 5, top: int = 15) -> None:
    """Each kernel launch of `steps` runs timed alone (synchronized before and after): the slowest names."""
    from collections import defaultdict

    from tgrad.device import Runner

    times: dict[str, list[float]] = defaultdict(list)
    call = Runner.__call__

    def timed(self, *args):
        sync()
        t0 = time.perf_counter()
        call(self, *args)
        sync()
        times[self.name].append(time.perf_counter() - t0)

    Runner.__call__ = timed
    try:
        for _ in range(steps):
            run()
    finally:
        Runner.__call__ = call
    total = sum(map(sum, times.values())) / steps
    print(f"  {sum(map(len, times.values())) // steps} kernels per step, {total * 1e3:.3f} ms run one by one")
    for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {sum(ts) / steps * 1e3:8.3f} ms  x{len(ts) // steps:<3d} {name}")


if __name__ == "__main__":
    main()
