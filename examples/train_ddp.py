"""Data-parallel training over MPI: the MLP or conv net of examples/beautiful_mnist.py on N ranks.

    python examples/train_ddp.py                                 # one process: a world of one rank
    mpiexec -n 4 python examples/train_ddp.py --model cnn        # 4 ranks on this machine
    mpiexec -n 8 --hostfile hosts python examples/train_ddp.py   # several machines (README)

Every rank builds the model, takes rank 0's initial values (broadcast_parameters) and trains on its shard
of each epoch's shuffled training set (shard_indices) with batch --batch-size / N; a DistributedOptimizer
averages the gradients over the ranks before each Adam update, so N ranks follow the same trajectory as
one process with the whole batch. The conv net's BatchNorm uses each rank's own batch statistics (like
PyTorch's DDP without SyncBatchNorm); its running statistics are averaged over the ranks before the test.
Rank 0 prints the progress, the test accuracy and the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from beautiful_mnist import MLP, ConvNet, load  # noqa: E402

from tgrad import Tensor  # noqa: E402
from tgrad import distributed as dist  # noqa: E402
from tgrad.jit import TinyJit  # noqa: E402
from tgrad.nn.optim import Adam  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402


def batches(n: int, local: int, seed: int):
    """(epoch, this rank's indices) for each step: every epoch is a new shuffle, shared out over the ranks."""
    epoch = 0
    while True:
        shard = dist.shard_indices(n, seed=seed, epoch=epoch)
        for k in range(len(shard) // local):
            yield epoch, shard[k * local : (k + 1) * local]
        epoch += 1


def train(model_name: str = "mlp", steps: int = 200, batch_size: int = 128, lr: float = 3e-3,
          dataset: str = "auto", seed: int = 0, quiet: bool = False) -> dict:
    world, rank = dist.init(), dist.rank()
    if batch_size % world:
        raise ValueError(f"train_ddp: --batch-size {batch_size} is not a multiple of the {world} ranks")
    local = batch_size // world
    say = print if rank == 0 and not quiet else (lambda *a, **k: None)
    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test, name = load(dataset)
    size = x_train.shape[-1]
    model = ConvNet(size) if model_name == "cnn" else MLP(size)
    params = get_parameters(model)
    dist.broadcast_parameters(params)  # every rank starts from rank 0's values
    opt = dist.DistributedOptimizer(Adam(params, lr=lr))

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)  # kernels -> gradient allreduce (a host step) -> update kernels
        return loss

    Tensor.training = True
    times, loss = [], None
    t_train = time.perf_counter()
    try:
        for i, (epoch, idx) in zip(range(steps), batches(len(x_train), local, seed)):
            t0 = time.perf_counter()
            loss = train_step(Tensor(x_train[idx]), Tensor(y_train[idx]))
            times.append(time.perf_counter() - t0)
            if i % 50 == 0 or i == steps - 1:
                say(f"step {i:4d}  epoch {epoch}  loss on rank 0 {loss.item():6.3f}", flush=True)
    finally:
        Tensor.training = False
    train_time = time.perf_counter() - t_train
    for t in opt.buffers:  # BatchNorm running statistics: each rank kept its own (the counts agree)
        if t.dtype.is_float:
            t.assign(dist.allreduce(t, "mean")).realize()
    pred = model(Tensor(x_test)).argmax(1).numpy()
    acc = float((pred == y_test).mean())
    steady = times[3:] or times  # call 1 runs the function, call 2 captures it, the rest replay
    result = {
        "dataset": name, "model": model_name, "ranks": world, "steps": steps, "batch_size": batch_size,
        "accuracy": acc, "final_loss": loss.item() if loss is not None else float("nan"),
        "train_s": train_time, "step_ms_min": min(steady) * 1e3,
        "step_ms_median": float(np.median(steady)) * 1e3,
    }
    say(f"{name} {model_name} on {world} ranks (batch {local} each): test accuracy {acc * 100:.2f}% after "
        f"{steps} steps, training {train_time:.1f} s, step {result['step_ms_median']:.1f} ms (median)")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=128, help="the global batch, shared out over the ranks")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dataset", choices=["auto", "mnist", "digits"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="rank 0 writes the result here")
    a = p.parse_args()
    result = train(a.model, a.steps, a.batch_size, a.lr, a.dataset, a.seed)
    if a.json and dist.rank() == 0:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
