"""What tests/test_distributed.py runs on each rank under `mpiexec -n 2` (and in one process, as the
reference): `python -m tests.mpi_worker MODE OUTDIR`.

MODE "check": broadcast (and its mismatch errors), allreduce of every op, then data-parallel training of a
small MLP for a few steps with and without TinyJit; each rank saves what it saw to OUTDIR/rank<r>.npz.
MODE "fault": rank 1 raises while rank 0 waits in an allreduce; the job must end with the error.
"""

from __future__ import annotations

import sys

import numpy as np

from tgrad import Tensor
from tgrad import distributed as dist
from tgrad.errors import DistributedError
from tgrad.jit import TinyJit
from tgrad.nn import Linear
from tgrad.nn.optim import SGD, Adam

RNG = np.random.default_rng(0)
X = RNG.standard_normal((100, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 100).astype(np.int32)
GLOBAL_BATCH, STEPS = 16, 6


class MLP:
    def __init__(self, hidden: int = 12):
        self.l1, self.l2 = Linear(6, hidden), Linear(hidden, 3)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())

    def params(self) -> list[Tensor]:
        return [self.l1.weight, self.l1.bias, self.l2.weight, self.l2.bias]


def train(jit: bool, seed: int = 0) -> list[np.ndarray]:
    """Train the MLP for STEPS steps of GLOBAL_BATCH samples shared out over the ranks; returns the
    parameters. Each rank starts from other random values, so the result also shows the broadcast."""
    Tensor.manual_seed(seed + dist.rank())
    model = MLP()
    dist.broadcast_parameters(model.params())
    opt = dist.DistributedOptimizer(Adam(model.params(), lr=0.02))

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        return loss

    run = TinyJit(step) if jit else step
    shard = dist.shard_indices(len(X), seed=1, epoch=0)
    local = GLOBAL_BATCH // dist.world_size()
    for k in range(STEPS):
        idx = shard[k * local : (k + 1) * local]
        run(Tensor(X[idx]), Tensor(Y[idx]))
    if jit:
        assert run.replays == STEPS - 2, run.replays
    return [p.numpy() for p in model.params()]


def errors() -> list[str]:
    """The messages of broadcast_parameters and DistributedOptimizer with parameter lists that differ
    between the ranks, and of allreduce with tensors that differ."""
    found = []
    odd = dist.rank() == 1
    for params in ([Tensor.zeros(3), *([Tensor.zeros(2)] if odd else [])],  # counts differ
                   [Tensor.zeros(4 if odd else 3)],  # shapes differ
                   {"w" if odd else "v": Tensor.zeros(3)}):  # names differ
        try:
            dist.broadcast_parameters(params)
        except DistributedError as e:
            found.append(str(e))
    try:
        dist.DistributedOptimizer(SGD([Tensor.zeros(4 if odd else 3, requires_grad=True)]))
    except DistributedError as e:
        found.append(str(e))
    try:
        dist.allreduce(Tensor.ones(4 if odd else 3))
    except DistributedError as e:
        found.append(str(e))
    return found


def check(outdir: str) -> None:
    r = dist.rank()
    base = Tensor(np.array([r + 1.0, -r, 2.0 * r], np.float32))
    reduced = {op: dist.allreduce(base, op).numpy() for op in dist.OPS}
    ints = dist.allreduce(Tensor(np.array([r, 10], np.int32)), "max").numpy()
    plain, jitted = train(jit=False), train(jit=True)
    np.savez(
        f"{outdir}/rank{r}.npz", world=dist.world_size(), errors=np.array(errors()), ints=ints,
        **{f"reduce_{op}": v for op, v in reduced.items()},
        **{f"plain{i}": p for i, p in enumerate(plain)}, **{f"jit{i}": p for i, p in enumerate(jitted)},
    )


def fault() -> None:
    if dist.rank() == 1:
        raise RuntimeError("boom from rank 1")
    dist.allreduce(Tensor.ones(4))  # rank 0 waits here for rank 1, which never comes
    print("rank 0 was not stopped", flush=True)


if __name__ == "__main__":
    dist.init()
    if sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        fault()
