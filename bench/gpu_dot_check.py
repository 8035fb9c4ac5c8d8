"""Every implicit-GEMM (tl.dot) kernel of convolutions' forward and backward graphs, run on the GPU and
checked against the same kernel rendered as a plain reduction (TGRAD_TRITON_IMPLICIT_GEMM=0), which the
device tests check against PyTorch. Written when Triton's software pipelining of masked gathers summed
wrongly on an H200 (bench/HISTORY.md "Implicit GEMM"). `--stages` also launches each dot with 1 and 2 pipeline
stages. Exit status 1 when a kernel is wrong. Runs in Triton's interpreter too (TRITON_INTERPRET=1)."""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tgrad import Tensor  # noqa: E402
from tgrad import emit_triton as et  # noqa: E402
from tgrad.fuse import schedule  # noqa: E402
from tgrad.opt import optimize  # noqa: E402
from tgrad.runtime import triton as triton_rt  # noqa: E402
from tgrad.runtime.triton_source import load_source  # noqa: E402

CONFIGS = [  # input shape, weight shape, conv2d arguments
    ((2, 4, 13, 14), (4, 4, 9, 9), dict(stride=2, padding=3, dilation=2)),
    ((2, 4, 13, 14), (4, 4, 9, 9), dict()),
    ((2, 4, 13, 14), (4, 2, 9, 9), dict(groups=2, stride=(1, 3))),
    ((2, 4, 7, 7), (6, 4, 3, 3), dict(padding=(1, 2), dilation=2)),
    ((2, 4, 7, 7), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
    ((2, 4, 9, 7), (6, 2, 3, 2), dict(padding=(2, 1), stride=2, dilation=(1, 2), groups=2)),
    ((2, 3, 7, 6), (4, 3, 5, 5), dict(stride=2, padding=2)),
    ((2, 3, 7, 6), (4, 3, 9, 9), dict(stride=2, padding=4)),
    ((4, 8, 12, 12), (8, 8, 5, 5), dict(padding=2)),
    ((3, 5, 11, 10), (7, 5, 3, 3), dict(stride=3, padding=(0, 2), dilation=(2, 1))),
    ((2, 32, 24, 24), (32, 32, 5, 5), dict()),
    ((2, 6, 10, 10), (6, 1, 3, 3), dict(groups=6, padding=1)),
]


def render(kernel, implicit: bool, props):
    os.environ["TGRAD_TRITON_IMPLICIT_GEMM"] = "1" if implicit else "0"
    return et.render(optimize(kernel, props))  # the opts the device's optimizer picks


def main() -> int:
    gpu = torch.cuda.is_available()
    dev = triton_rt.TritonRuntime()
    rng = np.random.default_rng(0)
    stages = (None, 1, 2) if "--stages" in sys.argv else (None,)
    t0, wrong = time.time(), 0
    for xs, ws, kw in CONFIGS:
        x = Tensor(rng.standard_normal(xs).astype(np.float32), device="NUMPY", requires_grad=True)
        w = Tensor(rng.standard_normal(ws).astype(np.float32), device="NUMPY", requires_grad=True)
        y = x.conv2d(w, **kw)
        g = Tensor(rng.standard_normal(y.shape).astype(np.float32), device="NUMPY")
        gx, gw = (y * g).sum().gradient(x, w)
        bufs = {}
        for it in schedule([y.node, gx.node, gw.node]):
            for n in it.inputs:
                if n not in bufs:
                    bufs[n] = dev.from_numpy(n.buffer.data)
            inputs = [bufs[n] for n in it.inputs]
            out = bufs[it.out] = dev.alloc(math.prod(it.out.shape), it.out.dtype)
            dev.compile(render(it.kernel, False, dev.props), it.kernel)(out, *inputs)  # the reference
            program = render(it.kernel, True, dev.props)
            if "tl.dot(" not in program.source or program.launch.get("split"):
                continue
            fn = load_source(program.source, program.name, not gpu)
            scale = max(float(out.data.abs().max()), 1e-6) if out.data.numel() else 1.0
            errs = []
            for s in stages:
                opts = et.launch_options(program)
                if s is not None and gpu:
                    opts["num_stages"] = s
                got = torch.empty_like(out.data)
                fn[program.global_size](got, *(b.data for b in inputs), **opts)
                errs.append(float((got - out.data).abs().max()) / scale if got.numel() else 0.0)
            ok = errs[0] <= 1e-5
            wrong += not ok
            st, rel = program.launch.get("num_stages", "-"), " / ".join(f"{e:.2g}" for e in errs)
            print(f"{'ok' if ok else 'WRONG':5s} {it.kernel.name:28s} stages {st} rel err {rel}  {kw}")
            if not ok and "--src" in sys.argv:
                print(program.source)
    print(f"{wrong} wrong dot kernels, {time.time() - t0:.1f} s")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
