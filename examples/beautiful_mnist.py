"""Train tinygrad's beautiful_mnist conv net (or an MLP) with Adam and a TinyJit training step.

    python examples/beautiful_mnist.py                 # MNIST if TGRAD_DATA holds it, else sklearn digits
    python examples/beautiful_mnist.py --model mlp --steps 200

The conv net is tinygrad's: conv 1->32 5x5, relu, conv 32->32 5x5, relu, BatchNorm, max_pool; conv 32->64
3x3, relu, conv 64->64 3x3, relu, BatchNorm, max_pool; Linear 576->10, on 28x28 images. Without MNIST it
trains on scikit-learn's 8x8 digits, each scaled to 24x24 and centred in 28x28 (as MNIST's 20x20 digits
are). The progress bar shows the loss and, every 25 steps, the test accuracy.

Prints the test accuracy, the wall time and the kernels one training step runs.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tgrad import Tensor  # noqa: E402
from tgrad.datasets import DatasetError, digits, mnist  # noqa: E402
from tgrad.device import Stats  # noqa: E402
from tgrad.jit import TinyJit  # noqa: E402
from tgrad.nn import BatchNorm2d, Conv2d, Linear  # noqa: E402
from tgrad.nn.optim import Adam  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402


class ConvNet:
    """28x28 MNIST: tinygrad's 5x5/3x3 layers; 8x8 digits: 3x3 convs with padding, fewer channels."""

    def __init__(self, size: int):
        if size == 28:
            self.layers = [Conv2d(1, 32, 5), Tensor.relu, Conv2d(32, 32, 5), Tensor.relu, BatchNorm2d(32),
                           Tensor.max_pool2d, Conv2d(32, 64, 3), Tensor.relu, Conv2d(64, 64, 3), Tensor.relu,
                           BatchNorm2d(64), Tensor.max_pool2d, lambda x: x.flatten(1), Linear(576, 10)]
        else:  # 8x8 (train(..., size=8)): 3x3 convs with padding, fewer channels
            self.layers = [Conv2d(1, 16, 3, padding=1), Tensor.relu, Conv2d(16, 16, 3, padding=1),
                           Tensor.relu, BatchNorm2d(16), Tensor.max_pool2d, Conv2d(16, 32, 3, padding=1),
                           Tensor.relu, BatchNorm2d(32), Tensor.max_pool2d, lambda x: x.flatten(1),
                           Linear(128, 10)]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MLP:
    def __init__(self, size: int, hidden: int = 128):
        self.l1, self.l2 = Linear(size * size, hidden), Linear(hidden, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x.flatten(1)).relu())


def load(dataset: str):
    """(X_train, Y_train, X_test, Y_test) as numpy arrays scaled to [0, 1], and the data set's name."""
    if dataset in ("auto", "mnist"):
        try:
            data, name, scale = mnist(), "mnist", 255.0
        except DatasetError:
            if dataset == "mnist":
                raise
            data, name, scale = digits(), "digits", 16.0
    else:
        data, name, scale = digits(), "digits", 16.0
    x_train, y_train, x_test, y_test = (t.numpy() for t in data)
    return x_train / scale, y_train, x_test / scale, y_test, name


def to_28(x: np.ndarray) -> np.ndarray:
    """8x8 digits as 28x28 images: each pixel 3x3, centred with a 2-pixel border."""
    big = x.reshape(*x.shape[:-2], 8, 1, 8, 1).repeat(3, -3).repeat(3, -1).reshape(*x.shape[:-2], 24, 24)
    return np.pad(big, [(0, 0)] * (x.ndim - 2) + [(2, 2), (2, 2)]).astype(np.float32)


def progress(steps: int):
    try:
        from tqdm import trange

        return trange(steps)
    except ImportError:
        return range(steps)


def train(model_name: str = "cnn", steps: int = 60, batch_size: int = 128, lr: float = 3e-3,
          dataset: str = "auto", seed: int = 0, quiet: bool = False, size: int = 28) -> dict:
    """size: 28 scales 8x8 digits up to MNIST's 28x28 (the conv net of tinygrad's beautiful_mnist);
    8 keeps them (a smaller conv net)."""
    t_start = time.perf_counter()
    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test, name = load(dataset)
    if x_train.shape[-1] == 8 and size == 28:
        x_train, x_test = to_28(x_train), to_28(x_test)
    size = x_train.shape[-1]
    model = ConvNet(size) if model_name == "cnn" else MLP(size)
    opt = Adam(get_parameters(model), lr=lr)

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)  # realize the loss with the update, before the parameters are overwritten
        return loss

    def accuracy() -> float:
        Tensor.training = False
        try:
            return float((model(Tensor(x_test)).argmax(1).numpy() == y_test).mean())
        finally:
            Tensor.training = True

    rng = np.random.default_rng(seed)
    Tensor.training = True
    bar, loss, kernels_per_step, acc = progress(steps) if not quiet else range(steps), None, 0, float("nan")
    t_train = time.perf_counter()
    try:
        for i in bar:
            idx = rng.integers(0, len(x_train), batch_size)
            before = Stats.kernels_run
            loss = train_step(Tensor(x_train[idx]), Tensor(y_train[idx]))
            kernels_per_step = Stats.kernels_run - before
            if not quiet and (i % 25 == 24 or i == steps - 1):
                acc = accuracy()
            # (the accuracy once it has been measured: nothing, not nan, before)
            shown = "" if math.isnan(acc) else f" accuracy {acc * 100:5.2f}%"
            if hasattr(bar, "set_description") and (i % 10 == 0 or i == steps - 1):
                bar.set_description(f"loss {loss.item():6.3f}{shown}")
            elif not quiet and not hasattr(bar, "set_description") and (i % 50 == 0 or i == steps - 1):
                rate = (i + 1) / (time.perf_counter() - t_train)
                print(f"step {i:4d}  loss {loss.item():6.3f}{shown}  {rate:6.1f} steps/s", flush=True)
    finally:
        Tensor.training = False
    train_time = time.perf_counter() - t_train
    acc = accuracy()
    Tensor.training = False
    names = collections.Counter(train_step.kernel_names)
    result = {
        "dataset": name, "model": model_name, "steps": steps, "accuracy": acc,
        "final_loss": loss.item() if loss is not None else float("nan"), "train_s": train_time,
        "total_s": time.perf_counter() - t_start, "kernels_per_step": kernels_per_step,
        "kernel_names": names,
    }
    if not quiet:
        kinds = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(names.items()))
        print(f"one jitted training step runs {kernels_per_step} kernels: {kinds}")
        print(f"{name} {model_name}: test accuracy {acc * 100:.2f}% after {steps} steps, "
              f"training {train_time:.1f} s, total {result['total_s']:.1f} s")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "cnn"], default="cnn")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dataset", choices=["auto", "mnist", "digits"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    train(a.model, a.steps, a.batch_size, a.lr, a.dataset, a.seed)


if __name__ == "__main__":
    main()
