"""ms per training step (forward, backward, Adam) with and without TinyJit, and PyTorch on the same model.

    python bench/bench_train.py [--model mlp|cnn] [--steps 20] [--batch-size 128]

mlp is 784-128-10 on 28x28 inputs; cnn is the conv net of examples/beautiful_mnist.py for 8x8 digits.
Compile time is excluded (three warm-up steps); the numbers are medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import beautiful_mnist as demo  # noqa: E402

from tgrad import Tensor  # noqa: E402
from tgrad.jit import TinyJit  # noqa: E402
from tgrad.nn.optim import Adam  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402


def time_steps(step, x, y, steps: int) -> float:
    for _ in range(3):
        step(x, y).numpy()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, y).numpy()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def tgrad_step(model_name: str, jit: bool):
    model = demo.MLP(28) if model_name == "mlp" else demo.ConvNet(8)
    opt = Adam(get_parameters(model), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        return loss

    return TinyJit(step) if jit else step


def torch_step(model_name: str):
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    nn = torch.nn
    if model_name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
            nn.BatchNorm2d(16), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.BatchNorm2d(32), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(128, 10),
        )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    a = p.parse_args()
    size = 28 if a.model == "mlp" else 8
    rng = np.random.default_rng(0)
    xs = rng.random((a.batch_size, 1, size, size), dtype=np.float32)
    ys = rng.integers(0, 10, a.batch_size).astype(np.int32)
    Tensor.training = True
    x, y = Tensor(xs), Tensor(ys)
    jit_ms = time_steps(tgrad_step(a.model, True), x, y, a.steps)
    plain_ms = time_steps(tgrad_step(a.model, False), x, y, a.steps)
    import torch

    torch_ms = time_steps(torch_step(a.model), torch.tensor(xs), torch.tensor(ys).long(), a.steps)
    print(f"{a.model} batch {a.batch_size}: tgrad TinyJit {jit_ms:.2f} ms/step, tgrad without jit "
          f"{plain_ms:.2f} ms/step, PyTorch {torch_ms:.2f} ms/step")


if __name__ == "__main__":
    main()
