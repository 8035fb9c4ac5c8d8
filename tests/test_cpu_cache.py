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

from tgrad import Tensor, device, fuse

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
    """Compile the tensor's kernel on a new CPUDevice (its in-memory cache empty) and run it."""
    (item,) = fuse.schedule([tensor.node])
    dev = device.CPUDevice()
    program = dev.compile(item.kernel)
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
    assert set(pickle.loads(entry.read_bytes())) == {"name", "object", "symbols"}  # rewritten


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
