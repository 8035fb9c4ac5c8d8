"""Train a small MLP on scikit-learn's handwritten digits with plain tgrad ops (no nn module needed),
then print the test accuracy and the kernels one training step runs."""

import time

import numpy as np
from sklearn.datasets import load_digits

from tgrad import Tensor
from tgrad.device import Stats
from tgrad.fuse import schedule


def main(steps: int = 300) -> float:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    X_train, Y_train, X_test, Y_test = Tensor(x[:split]), y[:split], Tensor(x[split:]), y[split:]

    Tensor.manual_seed(0)
    w1 = Tensor.kaiming_uniform(64, 128, a=5**0.5, requires_grad=True)
    w2 = Tensor.kaiming_uniform(128, 10, a=5**0.5, requires_grad=True)
    params, lr, batch = [w1, w2], 0.5, 128
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for step in range(steps):
        idx = rng.integers(0, split, batch)
        xb, yb = Tensor(x[:split][idx]), Tensor(Y_train[idx])
        loss = (xb @ w1).relu().matmul(w2).cross_entropy(yb)
        for p in params:
            p.grad = None
        loss.backward()
        if step == 0:
            print("kernels of one training step:")
            for item in schedule([loss.node] + [p.grad.node for p in params]):
                k = item.kernel
                print(
                    f"  {k.name:16s} {'reduce ' + k.reduce_op if k.reduce_op else 'elementwise':14s} "
                    f"shape {k.shape}"
                )
        with Tensor.no_grad:
            for p in params:
                p.assign(p - p.grad * lr)
        Tensor.realize(loss, *params)
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    elapsed = time.perf_counter() - start
    pred = (X_test @ w1).relu().matmul(w2).argmax(1).numpy()
    acc = float((pred == Y_test).mean())
    print(
        f"test accuracy {acc * 100:.1f}% after {steps} steps in {elapsed:.1f} s "
        f"({Stats.kernels_run} kernels run in total)"
    )
    del X_train
    return acc


if __name__ == "__main__":
    main()
