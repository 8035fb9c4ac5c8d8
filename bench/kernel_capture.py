"""Which CPU programs a set of workloads compiles, to show that a change to the optimizer or the emitters
renders the same kernels (then the bench can only differ by noise) or exactly which ones it changed.

    python -m bench.kernel_capture before.json         # in the old checkout
    python -m bench.kernel_capture after.json          # in the new one
    python -m bench.kernel_capture --compare before.json after.json

Recorded per compiled kernel: its name, a digest of its source (a BLAS kernel's first line, a comment
naming where it was planned, left out), its BLAS plan (pieces included), whether it has a direct
convolution, its thread split; per row group or piece pair the CPU's plan offers: its members and a
digest of its function. The workloads: 10 conv shapes forward and backward, 7 matmuls, 3 attention
shapes, a jitted MLP + Adam at 3 widths, the MNIST CNN step at batch 128 and 32, and 3 GPT steps
(examples/gpt.py's model); ~1 minute with a warm kernel cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from tgrad import Tensor, TinyJit, nn
from tgrad.nn import optim
from tgrad.runtime.cpu import runtime as cpu_runtime

ROOT = Path(__file__).resolve().parent.parent


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def record() -> list[tuple]:
    """Run the workloads with the CPU runtime's compile and rows_runner recorded."""
    found: list[tuple] = []
    compile_, rows_runner = cpu_runtime.CPURuntime.compile, cpu_runtime.CPURuntime.rows_runner

    def compile_seen(self, program, kernel):
        plan, source = program.launch.get("blas"), program.source
        if plan is not None:
            source = source.split("\n", 1)[-1]
        found.append(("kernel", kernel.name, _digest(source), repr(plan), "direct" in program.launch,
                      program.launch.get("split")))
        return compile_(self, program, kernel)

    def rows_seen(self, members, sizes, aliases=()):
        runner = rows_runner(self, members, sizes, aliases)
        found.append(("group", [m[0].name for m in members],
                      None if runner is None else _digest(runner.program.source),
                      None if runner is None else runner.program.launch.get("split")))
        return runner

    cpu_runtime.CPURuntime.compile, cpu_runtime.CPURuntime.rows_runner = compile_seen, rows_seen
    try:
        _workloads()
    finally:
        cpu_runtime.CPURuntime.compile, cpu_runtime.CPURuntime.rows_runner = compile_, rows_runner
    return found


def _workloads() -> None:
    rng = np.random.default_rng(0)

    def t(*shape):
        return Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)

    Tensor.training = True
    convs = [(8, 1, 32, 28, 5), (8, 32, 32, 24, 5), (8, 32, 64, 12, 3, 1, 1), (32, 64, 64, 12, 3, 1, 1),
             (4, 3, 16, 32, 3, 2, 1), (4, 16, 16, 16, 3, 1, 1, 4), (2, 8, 8, 20, 3, 1, 2, 1, 2),
             (16, 64, 128, 8, 3, 1, 1), (64, 16, 32, 16, 5, 1, 2), (128, 32, 32, 12, 3)]
    for n, cin, cout, hw, k, *rest in convs:
        stride, pad, groups, dil = list(rest) + [1, 0, 1, 1][len(rest):]
        x, w = t(n, cin, hw, hw), t(cout, cin // groups, k, k)
        x.conv2d(w, stride=stride, padding=pad, groups=groups, dilation=dil).relu().sum().backward()
        x.grad.numpy(), w.grad.numpy()
    for m, k, n in [(256, 512, 128), (1024, 1024, 1024), (64, 784, 10), (1, 512, 512), (512, 512, 1),
                    (3, 70000, 4), (4096, 64, 16)]:
        a, b = t(m, k), t(k, n)
        (a @ b).relu().sum().backward()
        a.grad.numpy(), b.grad.numpy()
    for bsz, h, tt, d in [(4, 4, 64, 32), (2, 8, 128, 64), (1, 12, 256, 64)]:
        q, kk, v = t(bsz, h, tt, d), t(bsz, h, tt, d), t(bsz, h, tt, d)
        ((q @ kk.transpose(-1, -2) / 8).softmax(-1) @ v).sum().backward()
        q.grad.numpy()
    for width, bs in [(512, 128), (2048, 64), (100, 7)]:
        layers = [nn.Linear(784, width), nn.Linear(width, 10)]
        _train(lambda x, ls=layers: ls[1](ls[0](x).relu()), layers, rng, (bs, 784), 10, "cross_entropy")
    for bs in (128, 32):
        c = [nn.Conv2d(1, 32, 5), nn.Conv2d(32, 32, 5), nn.Conv2d(32, 64, 3), nn.Conv2d(64, 64, 3),
             nn.BatchNorm(32), nn.BatchNorm(64), nn.Linear(576, 10)]

        def cnn(x, c=c):
            x = c[4](c[1](c[0](x).relu()).relu()).max_pool2d()
            return c[6](c[5](c[3](c[2](x).relu()).relu()).max_pool2d().flatten(1))

        _train(cnn, c, rng, (bs, 1, 28, 28), 10, "cross_entropy")
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt  # noqa: PLC0415 - examples/gpt.py's model, importable only from its folder

    for vocab, ctx, width, heads, layers, bs in [(65, 64, 64, 4, 2, 16), (96, 128, 128, 4, 4, 8),
                                                  (80, 32, 256, 8, 2, 4)]:
        model = gpt.GPT(vocab, ctx, width, heads, layers)
        _train(model, model, rng, (bs, ctx), vocab, "sparse_categorical_crossentropy")


def _train(model, holder, rng, shape: tuple[int, ...], classes: int, loss: str) -> None:
    """Three jitted Adam steps of `model` (its parameters: those of `holder`)."""
    opt = optim.Adam(nn.state.get_parameters(holder), lr=1e-3)

    @TinyJit
    def step(x, y):
        opt.zero_grad()
        out = getattr(model(x), loss)(y)
        out.backward()
        opt.step()
        return out

    ints = loss.startswith("sparse")
    for _ in range(3):
        x = rng.integers(0, classes, shape) if ints else rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, classes, shape if ints else shape[:1])
        step(Tensor(x), Tensor(y)).numpy()


def compare(before: list, after: list) -> int:
    """Print what one side compiled that the other did not; the number of such records."""
    old, new = Counter(map(json.dumps, before)), Counter(map(json.dumps, after))
    gone, came = list((old - new).elements()), list((new - old).elements())
    print(f"{len(before)} records before, {len(after)} after: {len(gone)} only before, "
          f"{len(came)} only after")
    for side, rows in (("before", gone), ("after", came)):
        for row in rows[:20]:
            print(f"  only {side}: {row[:300]}")
    return len(gone) + len(came)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the records (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two files of records")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        sys.exit(1 if compare(before, after) else 0)
    if not args.out:
        parser.error("give a file to write, or --compare BEFORE AFTER")
    found = record()
    Path(args.out).write_text(json.dumps(found))
    print(f"{len(found)} records written to {args.out}")


if __name__ == "__main__":
    main()
