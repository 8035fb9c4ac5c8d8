"""tgrad/runtime/cpu/threads.py: native worker threads for threaded CPU kernels. The pool runs native
functions of the kernels' form (two status slots, int64 arguments, lo, hi); here Numba cfuncs stand in
for kernels, and the CPU device's threaded kernels are checked against numpy."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.helpers import cpu_render
from tgrad import Tensor
from tgrad.opt.opts import HostTuning
from tgrad.runtime.cpu import threads as cpu_threads

SPIN = HostTuning().spin_cycles

pytestmark = pytest.mark.skipif(not cpu_threads.enabled(),
                                reason="native workers: Linux x86-64 only, not with TGRAD_NATIVE_THREADS=0")
numba = pytest.importorskip("numba")
types = numba.types

_I64P = types.CPointer(types.int64)


@numba.cfunc(types.int32(types.voidptr, types.voidptr, _I64P, types.int64, types.int64))
def _count(ret, exc, out, lo, hi):
    for i in range(lo, hi):
        out[i] += 1
    return 0


@numba.cfunc(types.int32(types.voidptr, types.voidptr, _I64P, *[types.int64] * 9, types.int64, types.int64))
def _args(ret, exc, out, a0, a1, a2, a3, a4, a5, a6, a7, a8, lo, hi):
    if lo == 0:
        out[0], out[1], out[2], out[3], out[4] = a0, a1, a2, a3, a4
        out[5], out[6], out[7], out[8] = a5, a6, a7, a8
    for i in range(lo, hi):
        out[9 + i] = i
    return 0


@numba.cfunc(types.int32(types.voidptr, types.voidptr, _I64P, types.int64, types.int64))
def _fails_at_5(ret, exc, out, lo, hi):
    for i in range(lo, hi):
        if i == 5:
            return -1
        out[i] += 1
    return 0


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("n, chunks", [(1, 1), (7, 3), (100, 8), (1000, 1000), (10**5, 65535)])
def test_every_iteration_runs_once(workers, n, chunks):
    """Each index of range(n) is run exactly once, whatever the split, job after job, and after the
    workers went to sleep (waiting past their spin)."""
    pool = cpu_threads.pool(workers, SPIN)
    out = np.zeros(n, np.int64)
    for rep in range(1, 4):
        assert pool.run(_count.address, (out.ctypes.data,), n, chunks) == 0
        np.testing.assert_array_equal(out, np.full(n, rep))
        time.sleep(0.002 if rep == 2 else 0)  # > HostTuning.spin_cycles: the next job wakes them


def test_arguments_and_ranges_reach_the_function():
    pool = cpu_threads.pool(1, SPIN)
    n = 50
    out = np.full(9 + n, -7, np.int64)
    args = (out.ctypes.data, -1, 2**40, 3, -(2**62), 5, 6, 7, 8, 9)
    assert pool.run(_args.address, args, n, 6) == 0
    np.testing.assert_array_equal(out[:9], args[1:])
    np.testing.assert_array_equal(out[9:], np.arange(n))


def test_a_failed_range_is_reported_and_the_pool_goes_on():
    pool = cpu_threads.pool(1, SPIN)
    out = np.zeros(64, np.int64)
    assert pool.run(_fails_at_5.address, (out.ctypes.data,), 64, 16) == -1
    assert pool.run(_count.address, (out.ctypes.data,), 64, 16) == 0


def test_bad_jobs_raise():
    pool = cpu_threads.pool(1, SPIN)
    with pytest.raises(ValueError, match="at most"):
        pool.run(_count.address, (0,) * (cpu_threads.MAX_ARGS + 1), 10, 2)
    with pytest.raises(ValueError, match="ranges"):
        pool.run(_count.address, (0,), 10, 0)
    with pytest.raises(ValueError, match="ranges"):
        pool.run(_count.address, (0,), 3, 4)  # a range of no iteration


@numba.cfunc(types.int32(types.voidptr, types.voidptr, _I64P, types.int64, types.int64, types.int64))
def _stamp(ret, exc, log, value, lo, hi):  # a serial function: log[log[0] + 1] = value (its lo, hi unread)
    log[0] += 1
    log[log[0]] = value
    return 0


def _record(fn, args, n=0, chunks=0, combine=0):
    return [fn, len(args), n, chunks, combine, *args]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_sequence_runs_its_records_in_order_threaded_or_not(workers):
    """Pool.sequence (TinyJit's replay of a run of CPU launches, runtime/cpu/batch.py): serial records,
    threaded ones over their ranges (every index once) and combine calls ([n, n)), in record order."""
    pool = cpu_threads.pool(workers, SPIN)
    log, out = np.zeros(16, np.int64), np.zeros(1000, np.int64)
    words = np.array(_record(_stamp.address, (log.ctypes.data, 11))
                     + _record(_count.address, (out.ctypes.data,), n=1000, chunks=8)
                     + _record(_stamp.address, (log.ctypes.data, 22))
                     + _record(_count.address, (out.ctypes.data,), n=1000, chunks=0)  # on this thread
                     + _record(_args.address, (out.ctypes.data, *range(9)), n=5, chunks=2), np.int64)
    with pool.lock:
        assert pool.sequence(words.ctypes.data, 5) == (0, 0)
    np.testing.assert_array_equal(log[:3], [2, 11, 22])
    np.testing.assert_array_equal(out[:9], range(9))
    np.testing.assert_array_equal(out[9:14], range(5))
    np.testing.assert_array_equal(out[14:], 2)
    # a combine call runs the function once more over [n, n): no index, a second stamp
    words = np.array(_record(_stamp.address, (log.ctypes.data, 33), n=3, combine=1), np.int64)
    with pool.lock:
        assert pool.sequence(words.ctypes.data, 1) == (0, 0)
    np.testing.assert_array_equal(log[:5], [4, 11, 22, 33, 33])
    assert pool.run(_count.address, (out.ctypes.data,), 1000, 4) == 0  # the pool's own jobs go on after
    np.testing.assert_array_equal(out[14:], 3)


def test_a_sequence_stops_at_a_failed_record_and_names_it():
    pool = cpu_threads.pool(1, SPIN)
    log, out = np.zeros(8, np.int64), np.zeros(64, np.int64)
    words = np.array(_record(_stamp.address, (log.ctypes.data, 1))
                     + _record(_fails_at_5.address, (out.ctypes.data,), n=64, chunks=16)
                     + _record(_stamp.address, (log.ctypes.data, 2)), np.int64)
    with pool.lock:
        assert pool.sequence(words.ctypes.data, 3) == (1, -1)  # record 1, its status
        assert log[0] == 1  # the third record did not run
        words = np.array(_record(_fails_at_5.address, (out.ctypes.data,), n=64), np.int64)  # on this thread
        assert pool.sequence(words.ctypes.data, 1) == (0, -1)
    assert pool.run(_count.address, (out.ctypes.data,), 64, 16) == 0


def _threaded_sums(x, want, times, errors):
    try:
        for _ in range(times):
            np.testing.assert_allclose(Tensor(x, device="CPU").sum(0).numpy(), want, rtol=1e-4, atol=1e-3)
    except Exception as e:  # noqa: BLE001  (reported by the main thread)
        errors.append(e)


def test_threaded_kernels_from_two_python_threads(monkeypatch):
    """Two Python threads launching threaded kernels at once: one gets the native workers, the other the
    Python threads; both right."""
    monkeypatch.setenv("TGRAD_THREADS", "2")
    x = np.random.default_rng(1).standard_normal((512, 2048)).astype(np.float32)
    want = x.astype(np.float64).sum(0)
    errors = []
    threads = [threading.Thread(target=_threaded_sums, args=(x, want, 20, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_two_threads_loading_one_function_share_the_first_stored(monkeypatch):
    """Two threads that compile or load the same kernel function at once both run the one stored first:
    storing the second over it freed the first's code while the other thread ran it (a segfault)."""
    import gc

    from tgrad import fuse
    from tgrad.device import get_runtime

    rt = get_runtime("CPU")
    x = Tensor(np.arange(12, dtype=np.float32), device="CPU").realize()
    kernel = fuse.schedule([(x * 3.0 + 0.8125).node])[-1].kernel  # (a constant no other test uses)
    program = cpu_render(kernel)
    load = rt._load

    def slow_load(nat, name):  # both threads miss the table before either stores
        out = load(nat, name)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(rt, "_load", slow_load)
    built, errors = [], []

    def build():
        try:
            built.append(rt._build(program, kernel.name))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(built) == 2
    gc.collect()
    for fn in built:  # each runs the stored function (the other one's code was freed with it)
        out = np.zeros(12, np.float32)
        fn(out, x.node.buffer.data)
        np.testing.assert_allclose(out, np.arange(12, dtype=np.float32) * 3.0 + 0.8125)


def test_without_native_workers(monkeypatch):
    """TGRAD_NATIVE_THREADS=0: threaded kernels run on Python threads, with the same values."""
    from tgrad.runtime.cpu import runtime as cpu

    monkeypatch.setenv("TGRAD_NATIVE_THREADS", "0")
    monkeypatch.setenv("TGRAD_THREADS", "5")  # a pool size no other test started
    monkeypatch.delitem(cpu_threads._POOLS, 4, raising=False)
    assert cpu_threads.pool(4, SPIN) is None
    x = np.random.default_rng(2).standard_normal((64, 128, 256)).astype(np.float32)
    np.testing.assert_allclose(Tensor(x, device="CPU").sum(1).numpy(), x.astype(np.float64).sum(1), rtol=1e-4,
                               atol=1e-3)
    assert 4 not in cpu_threads._POOLS and cpu._THREADS.executor is not None


def test_a_process_exits_cleanly_right_after_threaded_kernels():
    """At exit the workers are stopped and joined before their code is freed (one may still be spinning
    after the last kernel): no crash, no hang."""
    code = ("import numpy as np; from tgrad import Tensor\n"
            "x = np.ones((256, 4096), np.float32)\n"
            "for _ in range(3): print(Tensor(x, device='CPU').sum().item())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "TGRAD_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1048576.0"] * 3
