"""The CPU device's compiled-kernel cache: Numba compiles each kernel once to a native function over raw
pointers; tgrad keeps its object code under TGRAD_CACHE/cpu and loads it with llvmlite alone, so a new
process with a warm cache does not import Numba (until a threaded kernel needs its threading layer).
Answers are compared with numpy."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tgrad import Tensor, fuse
from tgrad.runtime.cpu import runtime as device

ROOT = Path(__file__).resolve().parent.parent

# small kernels (elementwise, a reduce over each axis, bool loads and stores, an int division), then a
# threaded full reduction; prints the answers and whether Numba was imported before the threaded one
PROBE = """
import json, sys
import numpy as np
from tgrad import Tensor
rng = np.random.default_rng(0)
a = rng.standard_normal((64, 48)).astype(np.float32)
b = rng.standard_normal((64, 48)).astype(np.float32)
i = rng.integers(-50, 50, (64, 48)).astype(np.int32)
A, B = Tensor(a), Tensor(b)
out = {
    "fused": ((A * B + 1).relu().sum(1)).numpy().tolist(),
    "axis0": (A.exp() * B).sum(0).numpy().tolist(),
    "any0": (A > 1).any(0).numpy().tolist(),
    "mask": (A > B).numpy().tolist(),
    "idiv": (Tensor(i) // 7).numpy().tolist(),
}
out["numba_before_threads"] = "numba" in sys.modules
big = np.arange(1 << 21, dtype=np.float32) % 17
out["threaded"] = float(Tensor(big).sum().numpy())
print(json.dumps(out))
"""


def _probe(cache: Path) -> dict:
    env = {**os.environ, "TGRAD_CACHE": str(cache), "DEVICE": "CPU", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(out: dict) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)
    i = rng.integers(-50, 50, (64, 48)).astype(np.int32)
    np.testing.assert_allclose(out["fused"], np.maximum(a * b + 1, 0).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["axis0"], (np.exp(a) * b).sum(0), rtol=1e-5, atol=1e-5)
    assert out["any0"] == (a > 1).any(0).tolist()
    assert out["mask"] == (a > b).tolist()
    assert out["idiv"] == (i // 7).tolist()
    big = np.arange(1 << 21, dtype=np.float64) % 17
    assert out["threaded"] == pytest.approx(big.sum(), rel=1e-6)


def test_a_warm_cache_runs_without_numba(tmp_path):
    cold = _probe(tmp_path)
    _check(cold)
    entries = list((tmp_path / "cpu").glob("*.pkl"))
    assert len(entries) >= 6, entries
    warm = _probe(tmp_path)
    _check(warm)
    assert warm["numba_before_threads"] is False  # every small kernel came from the cache
    assert sorted((tmp_path / "cpu").glob("*.pkl")) == sorted(entries)  # nothing was compiled again


def _compile_fresh(tensor: Tensor):
    """Compile the tensor's kernel on a new CPU runtime (its in-memory cache empty) and run it."""
    (item,) = fuse.schedule([tensor.node])
    dev = device.CPURuntime()
    program = dev.runner(item.kernel)
    out = dev.alloc(int(np.prod(tensor.shape)), tensor.dtype)
    program(out, *[s.buffer for s in item.inputs])
    return out.data.reshape(tensor.shape)


def test_a_damaged_cache_entry_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    x = np.linspace(-3, 3, 40, dtype=np.float32).reshape(5, 8)
    src = Tensor(x, device="CPU").realize()
    np.testing.assert_allclose(_compile_fresh(src * 3 + 1), x * 3 + 1)
    (entry,) = (tmp_path / "cpu").glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    np.testing.assert_allclose(_compile_fresh(src * 3 + 1), x * 3 + 1)
    assert set(pickle.loads(entry.read_bytes())) == {"name", "object", "symbols", "features"}  # rewritten


def test_an_entry_needing_an_unknown_symbol_is_not_loaded():
    entry = {"name": "f", "object": b"", "symbols": ["llvm.fma.f32", "tgrad_no_such_symbol_anywhere"]}
    assert device._load_object(entry) is None  # the caller compiles the kernel again instead


@pytest.mark.parametrize("reduce", ["any", "all"])
def test_bool_reductions_through_a_row_of_accumulators(reduce, monkeypatch):
    """A reduce over the leading axis keeps a row of bool accumulators (stored as bytes) in scratch."""
    monkeypatch.setenv("TGRAD_CACHE", "0")
    x = np.random.default_rng(1).standard_normal((300, 64)).astype(np.float32)
    got = getattr(Tensor(x, device="CPU") > 0.5, reduce)(0).numpy()
    np.testing.assert_array_equal(got, getattr(x > 0.5, reduce)(0))
    big = np.random.default_rng(2).standard_normal(1 << 21).astype(np.float32)
    got = bool(getattr(Tensor(big, device="CPU") > 4.5, reduce)().numpy())
    assert got == bool(getattr(big > 4.5, reduce)())


# ---------------------------------------------------------------------------------------------------
# compile workers (tgrad/runtime/cpu/pool.py)

GOOD = """import numpy as np

from tgrad.runtime.cpu.numba_rt import kernel


@kernel()
def triple(out, in0, n):
    for i in range(n):
        out[i] = in0[i] * np.float32(3.0)
"""


def _ready_pool(workers: int = 1):
    from tgrad.runtime.cpu import pool as cpu_pool

    pool = cpu_pool.CompilePool()
    pool.start(workers)
    with pool.cond:
        assert pool.cond.wait_for(lambda: pool.ready == workers or pool.live < workers, timeout=120)
    return pool


def test_a_compile_worker_returns_object_code_the_main_process_runs():
    pool = _ready_pool()
    assert pool.ready == 1

    def compiled_by_the_worker(key, job):
        pool.submit([(key, job)])
        with pool.cond:  # the worker takes it (a claim while it is still queued takes it back)
            assert pool.cond.wait_for(lambda: key not in pool.queued, timeout=60)
        return pool.claim(key)

    good = (GOOD, "triple", "tgrad_kernel_test_good", ["float32", "float32"], 1)
    entry = compiled_by_the_worker("good", good)
    assert set(entry) == {"name", "object", "symbols", "features"}
    # compiled for the features the cache key names (the worker's set-up once made Numba's code generator
    # with the host's defaults first: 256-bit vectors on AVX-512 hosts)
    from tgrad.runtime.cpu.compile import cpu_features

    assert entry["features"] == cpu_features()
    broken = ("def broken(:\n", "broken", "tgrad_kernel_test_broken", ["float32"], 0)
    assert compiled_by_the_worker("broken", broken) is None  # the caller builds it and reports the error
    engine, address = device._load_object(entry)
    import ctypes

    fn = ctypes.PYFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 4, ctypes.c_int64)(address)
    x = np.arange(10, dtype=np.float32)
    out = np.zeros(10, np.float32)
    slots = ctypes.addressof(device._RET), ctypes.addressof(device._EXC)
    assert fn(*slots, out.ctypes.data, x.ctypes.data, 10) in device.cpu_batch.RET_OK
    np.testing.assert_array_equal(out, x * 3)


def test_a_worker_that_cannot_start_leaves_the_jobs_to_the_main_process(monkeypatch):
    monkeypatch.setattr(sys, "executable", str(ROOT / "no-such-python"))
    pool = _ready_pool()
    assert pool.live == 0 and pool.ready == 0
    pool.submit([("good", (GOOD, "triple", "tgrad_kernel_test_good2", ["float32", "float32"], 1))])
    assert pool.claim("good") is None  # still queued: the main process compiles it


SCHEDULE = """
import json, time
import numpy as np
from tgrad import Tensor
from tgrad.device import get_runtime
dev = get_runtime("CPU")
with dev.pool.cond:  # wait until the worker is ready, so it surely takes jobs (the test is not timed)
    dev.pool.cond.wait_for(lambda: dev.pool.ready or not dev.pool.live, timeout=120)
rng = np.random.default_rng(3)
a = rng.standard_normal((32, 24)).astype(np.float32)
A = Tensor(a)
outs = [(A * 2).exp().sum(1), (A - 1).relu().max(0), (A * A).sum(), A.sqrt().abs().sum(0), (A > 0).sum(1),
        (A + 3).log().mean(1)]
Tensor.realize(*outs)
print(json.dumps({"ready": dev.pool.ready, "delivered": dev.pool.delivered, "functions": len(dev.functions),
                  "outs": [o.numpy().tolist() for o in outs]}))
"""


def test_compile_workers_build_part_of_a_cold_schedule(tmp_path):
    env = {**os.environ, "TGRAD_CACHE": str(tmp_path), "DEVICE": "CPU", "PYTHONPATH": str(ROOT),
           "TGRAD_COMPILE_WORKERS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCHEDULE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ready"] == 1 and out["delivered"] >= 1, out
    a = np.random.default_rng(3).standard_normal((32, 24)).astype(np.float32)
    with np.errstate(invalid="ignore"):
        want = [np.exp(a * 2).sum(1), np.maximum(a - 1, 0).max(0), (a * a).sum(), np.abs(np.sqrt(a)).sum(0),
                (a > 0).sum(1), np.log(a + 3).mean(1)]
    for got, ref in zip(out["outs"], want):
        np.testing.assert_allclose(np.array(got, dtype=np.float64), ref, rtol=1e-5, atol=1e-5)
    # every native function the schedule needed is cached, what the worker built too (row groups make
    # some of the six kernels one function)
    assert out["functions"] >= 4 and len(list((tmp_path / "cpu").glob("*.pkl"))) >= out["functions"], out


def test_a_bad_worker_count_is_a_clear_error(monkeypatch):
    from tgrad.errors import DeviceError
    from tgrad.runtime.cpu import pool as cpu_pool

    monkeypatch.setenv("TGRAD_COMPILE_WORKERS", "two")
    with pytest.raises(DeviceError, match=r"TGRAD_COMPILE_WORKERS='two': expected a number .*\(0 for none\)"):
        cpu_pool.default_workers()
    monkeypatch.setenv("TGRAD_COMPILE_WORKERS", "3")
    assert cpu_pool.default_workers() == 3


def test_an_unwritable_cache_warns_once_and_still_runs(tmp_path, monkeypatch):
    """A TGRAD_CACHE that cannot be created (here: under a file, which stops root too) is not fatal."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TGRAD_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(device, "_UNWRITABLE", set())
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    src = Tensor(x, device="CPU").realize()
    with pytest.warns(UserWarning, match=r"cannot write compiled kernels to .*Set TGRAD_CACHE to a writable"):
        np.testing.assert_allclose(_compile_fresh(src * 5 - 1), x * 5 - 1)
    np.testing.assert_allclose(_compile_fresh(src * 7 - 1), x * 7 - 1)  # no second warning (not an error)


def test_cache_dir_is_absolute_and_never_shadows_the_package(tmp_path, monkeypatch):
    """An empty or relative XDG_CACHE_HOME is ignored (the XDG rule); a relative TGRAD_CACHE is made
    absolute; a cache directory named tgrad in the working directory (an import path) is refused with a
    warning, and a new process run from there still imports tgrad (the folder once shadowed it)."""
    from tgrad.device import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TGRAD_CACHE", raising=False)
    default = tmp_path / ".cache" / "tgrad"
    for xdg in ("", "relative/dir"):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert cache_dir() == default
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tgrad"
    monkeypatch.setenv("TGRAD_CACHE", "kernels")
    assert cache_dir() == tmp_path / "kernels" and cache_dir().is_absolute()
    monkeypatch.setenv("TGRAD_CACHE", "tgrad")
    with pytest.warns(UserWarning, match="would shadow the tgrad package"):
        assert cache_dir() == default
    env = {**os.environ, "XDG_CACHE_HOME": "", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "DEVICE": "CPU"}
    env.pop("TGRAD_CACHE", None)
    code = "from tgrad import Tensor; print((Tensor([1.0, 2.0]) * 3).sum().item())"
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == "9.0", proc.stderr[-2000:]
    assert not (tmp_path / "tgrad").exists() and (tmp_path / ".cache" / "tgrad").exists()


VECTOR_PROBE = """
import json
import numpy as np
from numba.core import config
from tgrad import Tensor
from tgrad.runtime.cpu import runtime as cpu
x = np.random.default_rng(1).standard_normal((300, 70)).astype(np.float32)
got = Tensor(x).softmax(-1).numpy()
want = np.exp(x - x.max(-1, keepdims=True))
print(json.dumps({"features": config.CPU_FEATURES, "key": cpu._native_key(),
                  "err": float(np.abs(got - want / want.sum(-1, keepdims=True)).max())}))
"""


@pytest.mark.parametrize("bits", ["512", "256"])
def test_kernels_compile_for_wide_vectors_on_avx512_hosts(tmp_path, bits):
    """On an AVX-512 host kernels compile without LLVM's preference for 256-bit vectors (16 floats per
    instruction), unless TGRAD_CPU_VECTOR_BITS=256; the features are part of the cache key, so object code
    for one setting is never loaded for the other. Numba's later compiles in the process use them too."""
    import llvmlite.binding as llvm

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    env.update(TGRAD_CACHE=str(tmp_path), TGRAD_CPU_VECTOR_BITS=bits, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", VECTOR_PROBE], env=env, capture_output=True, text=True,
                         check=True)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    llvm.initialize_native_target()
    host = llvm.get_host_cpu_features()
    wide = bool(host.get("avx512f")) and bits == "512"
    assert out["features"] == host.flatten() + (",-prefer-256-bit" if wide else "")
    assert out["features"] in out["key"]
    assert out["err"] < 1e-6


EARLY_NUMBA_PROBE = """
import json, os
import numpy as np
if os.environ.get("EARLY"):  # a Numba function compiled first: Numba's code generator has the host's defaults
    import numba
    numba.njit(lambda v: v + 1)(1)
from tgrad import Tensor
from tgrad.runtime.cpu.compile import cpu_features
from numba.core.registry import cpu_target
x = np.random.default_rng(1).standard_normal((300, 70)).astype(np.float32)
got = Tensor(x).softmax(-1).numpy()
want = np.exp(x - x.max(-1, keepdims=True))
print(json.dumps({"same": cpu_target.target_context.codegen()._tm_features == cpu_features(),
                  "err": float(np.abs(got - want / want.sum(-1, keepdims=True)).max())}))
"""


def test_kernels_compiled_for_other_features_are_not_cached(tmp_path):
    """In a process whose Numba compiled a function before tgrad's first kernel, Numba's code generator
    keeps the host's default features (on AVX-512: 256-bit vectors), not cpu_features(): its kernels are
    right and used there, but never written to the disk cache under a key that says otherwise (a test
    process left such entries, and softmax ran 1.3 -> 1.6 ms in every later process), with one warning."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", "TGRAD_CPU_VECTOR_BITS")}
    outs = {}
    for early in ("1", ""):
        cache = tmp_path / (early or "plain")
        env.update(TGRAD_CACHE=str(cache), PYTHONPATH=str(ROOT), EARLY=early, TGRAD_COMPILE_WORKERS="0")
        run = subprocess.run([sys.executable, "-c", EARLY_NUMBA_PROBE], env=env, capture_output=True,
                             text=True, check=True)
        outs[early] = json.loads(run.stdout.strip().splitlines()[-1])
        assert outs[early]["err"] < 1e-6
        written = list((cache / "cpu").glob("*.pkl")) if (cache / "cpu").exists() else []
        assert bool(written) == outs[early]["same"], (early, outs[early], written)
        # the user is told once why this process's kernels are not kept
        assert run.stderr.count("are not kept on disk") == (not outs[early]["same"]), run.stderr
    assert outs[""]["same"]  # without the early function, kernels are compiled for cpu_features() and kept


def test_workers_take_the_longest_job_and_optional_ones_last():
    """A worker takes the job with the longest source (the main process compiles from the front); jobs
    submitted as optional (a direct convolution's function, which has a BLAS path meanwhile) only when no
    other job waits; a claim takes a queued job of either kind back for the caller to compile."""
    from tgrad.runtime.cpu import pool as cpu_pool

    pool = cpu_pool.CompilePool()  # (no worker started: next_job is what one would take)
    job = lambda src: (src, "f", "m", ["float32"], 0)  # noqa: E731
    pool.submit([("opt-long", job("x" * 900))], optional=True)
    pool.submit([("short", job("x" * 10)), ("long", job("x" * 500)), ("mid", job("x" * 100))])
    pool.submit([("opt-short", job("x" * 50)), ("opt-gone", job("x" * 60))], optional=True)
    assert pool.claim("opt-gone") is None and "opt-gone" not in pool.queued  # the caller compiles it
    order = []
    with pool.cond:
        while pool.queue or pool.later:
            order.append(pool.next_job()[0])
    assert order == ["long", "mid", "short", "opt-long", "opt-short"]
    assert not pool.queued and pool.compiled("long")  # (nothing compiles it any more: the caller would)
    assert pool.wait_idle(0.01)
    pool.running.add("x")
    assert not pool.wait_idle(0.01)  # (what benchmarks wait on after their warm-up)


def test_the_main_process_compiles_queued_jobs_while_it_waits_for_a_worker(monkeypatch):
    """A claim of a key a worker is compiling does not sit idle: it compiles the front of the queue itself
    (as a worker would) and leaves the result for that job's own claim."""
    from tgrad.runtime.cpu import pool as cpu_pool

    pool = cpu_pool.CompilePool()
    compiled = []

    def fake_compile(*args):
        compiled.append(args[1])
        if args[1] == "last":  # the worker finishes the awaited job meanwhile
            with pool.cond:
                pool.running.discard("busy")
                pool.done["busy"] = {"from": "worker"}
        return {"from": "main", "name": args[1]}

    monkeypatch.setattr(cpu_pool, "compile_object", fake_compile)
    pool.running.add("busy")
    pool.submit([("a", ("src", "first", "m", [], 0)), ("b", ("src", "last", "m", [], 0))])
    assert pool.claim("busy") == {"from": "worker"}
    assert compiled == ["first", "last"]
    assert pool.claim("a") == {"from": "main", "name": "first"} and pool.claim("b")["name"] == "last"


def test_background_compiles_can_be_turned_off():
    """TGRAD_BACKGROUND_COMPILES=0: direct convolutions wait for their functions (reproducible values)."""
    code = "from tgrad.runtime.cpu import runtime; print(runtime.TIERED)"
    for value, want in (("0", "False"), ("1", "True"), (None, "True")):
        env = {k: v for k, v in os.environ.items() if k != "TGRAD_BACKGROUND_COMPILES"}
        if value is not None:
            env["TGRAD_BACKGROUND_COMPILES"] = value
        out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr[-2000:]
