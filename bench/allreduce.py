"""MPI allreduce through tgrad vs raw mpi4py, and the data-parallel training step on 1 and 2 ranks.

    python bench/allreduce.py [--sizes 1,16,64] [--repeats 20] [--models mlp:400,cnn:60]

Needs `pip install -e '.[distributed]'` (mpi4py, Open MPI's mpiexec). It starts the runs itself:
- `mpiexec -n 2 python bench/allreduce.py --collectives`: a float32 sum-allreduce of each size (MiB)
  between 2 ranks, as a raw `comm.Allreduce` of numpy arrays into the same output array each time and
  into a new one (whose pages are touched for the first time), and as `tgrad.distributed.allreduce` of
  a CPU tensor (a host step: MPI reads and writes the buffers in place; the output is a new buffer each
  call). Rank 0 prints min and median ms (a call lasts until both ranks have it) and the bandwidth
  (size / median time, like nccl-tests' algbw).
- `examples/train_ddp.py --json` on 1 rank (plain python) with 2 threads and with 1 thread for Numba and
  BLAS, and on 2 ranks with 1 thread each, per model: the min and median time of the jitted step (steps
  4 on; 400 MLP steps, 60 CNN steps) at the same global batch (128) on sklearn digits.
The load average is printed with the results: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# 2 ranks on 2 cores: one thread each for Numba's kernels and for numpy's BLAS (matmuls), else their
# spinning thread pools fight over the cores (a 0.5 ms MLP step took 15-25 ms)
SETTLE_S = 3.0
ONE_THREAD = {"NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def mpiexec() -> str:
    found = Path(sys.executable).parent / "mpiexec"
    return str(found) if found.exists() else "mpiexec"


def contenders(n: int) -> dict:
    """name -> a call that sum-allreduces n float32 values between the ranks."""
    from mpi4py import MPI

    from tgrad import Tensor
    from tgrad import distributed as dist

    comm = MPI.COMM_WORLD
    send, recv = np.ones(n, np.float32), np.empty(n, np.float32)
    t = Tensor(send).realize()
    return {
        "mpi4py Allreduce, numpy, same output": lambda: comm.Allreduce(send, recv, MPI.SUM),
        # what any call that returns a new array pays: the output's pages are touched for the first time
        "mpi4py Allreduce, numpy, new output": lambda: comm.Allreduce(send, np.empty_like(send), MPI.SUM),
        "tgrad allreduce, CPU tensor (new output)": lambda: dist.allreduce(t, "sum"),
    }


def collectives(sizes_mib: list[int], repeats: int) -> None:
    """Run on every rank (under mpiexec): time each allreduce; rank 0 prints a markdown table."""
    from mpi4py import MPI

    from tgrad import distributed as dist

    comm = MPI.COMM_WORLD
    dist.init()
    # the launcher is still busy for a second or two after the ranks start (every 1 MiB contender timed
    # then took 10-30 ms instead of 0.5-1.5): let it settle
    time.sleep(SETTLE_S)
    comm.Barrier()
    rows = []
    for mib in sizes_mib:
        n = mib * 2**20 // 4
        for name, fn in contenders(n).items():
            times = []
            for i in range(repeats + 2):
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                if i >= 2:  # 2 warm-up calls
                    times.append(time.perf_counter() - t0)
            slowest = comm.allreduce(times, MPI.SUM)  # both ranks' times: a call ends when both are done
            per_call = [max(a, b) for a, b in zip(slowest[:repeats], slowest[repeats:])]
            best, median = min(per_call), statistics.median(per_call)
            rows.append((mib, name, best * 1e3, median * 1e3, mib / 1024 / median))
    if comm.Get_rank() == 0:
        print("| size | allreduce (2 ranks) | min ms | median ms | GiB/s (median) |")
        print("| --- | --- | --- | --- | --- |")
        for mib, name, best, median, gibs in rows:
            print(f"| {mib} MiB | {name} | {best:.2f} | {median:.2f} | {gibs:.2f} |")


def train_steps(models: dict[str, int]) -> None:
    """The jitted training step of examples/train_ddp.py on 1 rank and on 2 ranks, per model."""
    print("| model | ranks x threads | batch per rank | min ms | median ms | test accuracy |")
    print("| --- | --- | --- | --- | --- | --- |")
    example = str(ROOT / "examples" / "train_ddp.py")
    for model, steps in models.items():
        for ranks, threads in ((1, 2), (1, 1), (2, 1)):
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                args = [sys.executable, example, "--model", model, "--steps", str(steps),
                        "--dataset", "digits", "--json", out]
                env = dict(os.environ, PYTHONPATH=str(ROOT))
                if threads == 1:
                    env.update(ONE_THREAD)
                if ranks > 1:
                    args = [mpiexec(), "-n", str(ranks), "--oversubscribe", *args]
                    env.update(MPI_ENV)
                subprocess.run(args, env=env, check=True, capture_output=True, timeout=1800)
                r = json.loads(Path(out).read_text())
            print(f"| {model} | {ranks} x {threads} | {r['batch_size'] // ranks} | {r['step_ms_min']:.1f} | "
                  f"{r['step_ms_median']:.1f} | {r['accuracy'] * 100:.1f}% |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,16,64", help="allreduce sizes in MiB")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--models", default="mlp:400,cnn:60", help="model:steps pairs (the MLP step is short)")
    p.add_argument("--collectives", action="store_true", help="(internal) run the timing loop under mpiexec")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.collectives:
        collectives(sizes, a.repeats)
        return
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    cmd = [mpiexec(), "-n", "2", "--oversubscribe", sys.executable, __file__, "--collectives",
           "--sizes", a.sizes, "--repeats", str(a.repeats)]
    subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT), **MPI_ENV), check=True, timeout=1800)
    print(f"load average: {os.getloadavg()[0]:.2f}\n", flush=True)
    if a.models:
        train_steps({m.split(":")[0]: int(m.split(":")[1]) for m in a.models.split(",")})
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
