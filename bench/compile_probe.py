"""Time the first three MLP training steps in this (new) process: the compile-time workload.

Run by the suite as `python -m bench.compile_probe --framework tgrad|tinygrad|torch` with the cache
directory in the environment (TGRAD_CACHE / CACHEDB). Prints one JSON line: first3_ms (the three steps,
compiles included), step_ms (each step), import_ms (importing the framework), and how the step was built.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.workloads import mlp


def tgrad_step(d):
    from tgrad import Tensor

    try:
        from tgrad import nn
        from tgrad.nn import optim
    except ImportError:
        nn = None
    if nn is not None:
        l1, l2 = nn.Linear(784, 128), nn.Linear(128, 10)
        for layer, w, b in ((l1, "w1", "b1"), (l2, "w2", "b2")):
            layer.weight = Tensor(d[w], requires_grad=True)
            layer.bias = Tensor(d[b], requires_grad=True)
        params = [l1.weight, l1.bias, l2.weight, l2.bias]
        opt = optim.Adam(params, lr=1e-3)
        x, y = Tensor(d["x"]), Tensor(d["y"])

        def step():
            Tensor.training = True
            opt.zero_grad()
            loss = l2(l1(x).relu()).cross_entropy(y)
            loss.backward()
            opt.step()
            return loss.realize(*params).item()

        return step, "tgrad.nn Linear + Adam"
    # tgrad.nn not there yet: the same MLP from Tensor ops, plain SGD through assign
    params = [Tensor(d[n], requires_grad=True) for n in ("w1", "b1", "w2", "b2")]
    x, y = Tensor(d["x"]), Tensor(d["y"])

    def step():
        w1, b1, w2, b2 = params
        loss = x.linear(w1, b1).relu().linear(w2, b2).cross_entropy(y)
        loss.backward()
        for p in params:
            p.assign(p.detach() - p.grad * 1e-3)
            p.grad = None
        return loss.realize(*params).item()

    return step, "Tensor ops + SGD (tgrad.nn absent)"


def tinygrad_step(d):
    from tinygrad import Context, Tensor, nn

    l1, l2 = nn.Linear(784, 128), nn.Linear(128, 10)
    for layer, w, b in ((l1, "w1", "b1"), (l2, "w2", "b2")):
        layer.weight, layer.bias = Tensor(d[w], device="CPU"), Tensor(d[b], device="CPU")
    opt = nn.optim.Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=1e-3)
    x, y = Tensor(d["x"], device="CPU"), Tensor(d["y"], device="CPU")

    def step():
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            return loss.realize(*opt.schedule_step()).item()

    return step, "tinygrad nn.Linear + Adam, CPU device"


def torch_step(d):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step, "torch eager"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--framework", choices=["tgrad", "tinygrad", "torch"], required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    data = mlp(False).make()
    t0 = time.perf_counter()
    step, how = {"tgrad": tgrad_step, "tinygrad": tinygrad_step, "torch": torch_step}[args.framework](data)
    import_ms = (time.perf_counter() - t0) * 1e3
    times, losses = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        losses.append(step())
        times.append((time.perf_counter() - t) * 1e3)
    if not np.isfinite(losses).all():
        raise SystemExit(f"non-finite loss: {losses}")
    print(json.dumps({"first3_ms": sum(times), "step_ms": times, "import_ms": import_ms, "how": how,
                      "losses": losses}))


if __name__ == "__main__":
    main()
