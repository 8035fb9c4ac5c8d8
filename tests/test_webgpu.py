"""The WGSL emitter (rendered source) and the WEBGPU runtime (on the adapter wgpu finds: lavapipe here)."""

import numpy as np
import pytest

import tgrad.device
from tests.conftest import open_or_skip
from tgrad import Tensor, dtypes
from tgrad.emit_wgsl import Target, dispatch_size, render
from tgrad.errors import DeviceError, DTypeError
from tgrad.fuse import schedule
from tgrad.opt import optimize
from tgrad.runtime.webgpu import device_props

# WebGPU's default limits
PROPS = device_props({"max-compute-invocations-per-workgroup": 256,
                      "max-compute-workgroups-per-dimension": 65535})


def source(kernel, *args, **kwargs) -> str:
    """The rendered source of the kernel with the opts the optimizer picks for a WebGPU adapter."""
    return render(optimize(kernel, PROPS), *args, **kwargs).source


def kernels(t: Tensor):
    return [it.kernel for it in schedule([t.node])]


def one_kernel(t: Tensor):
    (k,) = kernels(t)
    return k


@pytest.fixture
def webgpu():
    open_or_skip("WEBGPU")
    return tgrad.device.get_runtime("WEBGPU")


# --- rendering (no adapter needed) ---------------------------------------------------------------------


def test_render_elementwise():
    a, b = Tensor(np.ones((4, 5), np.float32), device="NUMPY"), Tensor(np.ones(5, np.float32), device="NUMPY")
    src = source(one_kernel(a * b + 1))
    assert "@compute @workgroup_size(64)" in src
    assert "var<storage, read_write> out: array<f32>" in src
    assert "var<storage, read> in1: array<f32>" in src
    assert "i64" not in src  # index expressions are i32


def test_render_packed_store_uses_atomics():
    a = Tensor(np.ones(7, np.float32), device="NUMPY")
    src = source(one_kernel(a < 2))
    assert "array<atomic<u32>>" in src and "atomicOr" in src and "atomicAnd" in src


def test_render_tree_reduction_for_long_axis():
    long = source(one_kernel(Tensor(np.ones((3, 1000), np.float32), device="NUMPY").sum(axis=1)))
    short = source(one_kernel(Tensor(np.ones((3, 10), np.float32), device="NUMPY").sum(axis=1)))
    assert "var<workgroup> part:" in long and "workgroupBarrier()" in long
    assert "@workgroup_size(256)" in long
    assert "var<workgroup>" not in short and "for (var i1 = 0i; i1 < 10; i1++)" in short


def test_render_int64_native_and_emulated():
    k = one_kernel(Tensor(np.arange(6), device="NUMPY") * 3)
    assert "array<i64>" in source(k, Target(int64=True))
    emulated = source(k, Target(int64=False))
    assert "i64" not in emulated and "array<i32>" in emulated


def test_render_float64_without_feature_raises():
    k = one_kernel(Tensor(np.ones(3, np.float64), device="NUMPY") + 1)
    with pytest.raises(DTypeError, match="float64.*float32"):
        source(k, Target(int64=True, float64=False))


def test_render_int64_constant_too_big_for_emulation():
    k = one_kernel(Tensor(np.arange(3), device="NUMPY") + 2**40)
    with pytest.raises(DTypeError, match="int32"):
        source(k, Target(int64=False))


def test_dispatch_size_splits_large_launches():
    assert dispatch_size(10, 65535) == (10, 1, 1)
    assert dispatch_size(0, 65535) == (1, 1, 1)
    x, y, z = dispatch_size(200000, 65535)
    assert x <= 65535 and y <= 65535 and x * y >= 200000 and z == 1


# --- running -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 5, 7, 9])
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16, np.float16])
def test_packed_roundtrip_odd_lengths(webgpu, dtype, n):
    rng = np.random.default_rng(n)
    a = rng.integers(-120, 120, n).astype(dtype) if dtype != np.bool_ else rng.integers(0, 2, n).astype(bool)
    np.testing.assert_array_equal(webgpu.to_numpy(webgpu.from_numpy(a)), a)


@pytest.mark.parametrize("n", [1, 5, 7, 13])
def test_packed_kernel_outputs_odd_lengths(webgpu, n):
    rng = np.random.default_rng(n)
    x, y = rng.uniform(-3, 3, n).astype(np.float32), rng.uniform(-3, 3, n).astype(np.float32)
    u = rng.integers(0, 256, n).astype(np.uint8)
    i8 = rng.integers(-128, 128, n).astype(np.int8)
    i16 = rng.integers(-30000, 30000, n).astype(np.int16)
    tx, ty = Tensor(x, device="WEBGPU"), Tensor(y, device="WEBGPU")
    np.testing.assert_array_equal((tx < ty).numpy(), x < y)
    np.testing.assert_array_equal((Tensor(u, device="WEBGPU") + 200).numpy(), u + np.uint8(200))  # wraps
    np.testing.assert_array_equal((Tensor(i8, device="WEBGPU") * 3).numpy(), i8 * np.int8(3))
    np.testing.assert_array_equal((Tensor(i16, device="WEBGPU") * 7).numpy(), i16 * np.int16(7))
    h = (tx.half() * ty.half()).numpy()
    np.testing.assert_array_equal(h, x.astype(np.float16) * y.astype(np.float16))


def test_small_int_ops_match_numpy(webgpu):
    a = np.array([-128, -7, -1, 0, 5, 127, 100], np.int8)
    b = np.array([3, 2, -1, 7, -2, 2, 3], np.int8)
    ta, tb = Tensor(a, device="WEBGPU"), Tensor(b, device="WEBGPU")
    np.testing.assert_array_equal((ta + tb).numpy(), a + b)
    np.testing.assert_array_equal((-ta).numpy(), -a)
    np.testing.assert_array_equal((ta ^ tb).numpy(), a ^ b)
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal(ta.cast(dtypes.uint8).numpy(), a.astype(np.uint8))


def test_max_propagates_nan(webgpu):
    x = np.array([[1.0, np.nan, 3.0], [2.0, -1.0, 0.5], [np.nan, np.nan, 1.0]], np.float32)
    np.testing.assert_array_equal(Tensor(x, device="WEBGPU").max(axis=1).numpy(), [np.nan, 2.0, np.nan])
    y = np.array([np.nan, 1.0, 2.0], np.float32)
    z = np.array([0.0, np.nan, 1.0], np.float32)
    out = Tensor(y, device="WEBGPU").maximum(Tensor(z, device="WEBGPU")).numpy()
    np.testing.assert_array_equal(out, [np.nan, np.nan, 2.0])
    np.testing.assert_array_equal((Tensor(y, device="WEBGPU") != Tensor(y, device="WEBGPU")).numpy(), y != y)


def test_tree_reduction_long_axis(webgpu):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (3, 1000)).astype(np.float32)
    t = Tensor(x, device="WEBGPU")
    np.testing.assert_allclose(t.sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(t.max(axis=1).numpy(), x.max(axis=1))
    np.testing.assert_array_equal(t.argmax(axis=1).numpy(), x.argmax(axis=1))
    b = x > 0.999
    np.testing.assert_array_equal(Tensor(b, device="WEBGPU").any(axis=1).numpy(), b.any(axis=1))


def test_split_dispatch_runs_every_element(webgpu, monkeypatch):
    # the device as if it could launch only 3 workgroups per dimension, its compiled kernels forgotten for
    # the test (not a second wgpu device: opening one next to the first crashed wgpu-native over OpenGL in CI)
    limits = dict(webgpu.limits, **{"max-compute-workgroups-per-dimension": 3})
    monkeypatch.setattr(webgpu, "limits", limits)
    monkeypatch.setattr(webgpu, "props", device_props(limits, dict(webgpu.adapter_info)))
    monkeypatch.setattr(webgpu, "runners", {})
    monkeypatch.setattr(webgpu, "optimized", {})
    x = np.arange(webgpu.props.preferred_local * 7 + 5, dtype=np.float32)  # (8 workgroups at least)
    np.testing.assert_array_equal((Tensor(x, device="WEBGPU") * 2).numpy(), x * 2)
    (runner,) = webgpu.runners.values()
    assert max(runner.program.global_size) <= 3 < np.prod(runner.program.global_size)  # (it did split)


def test_int64_held_as_int32(webgpu):
    a = np.array([-5, 3, 2**31 - 10, 7], np.int64)
    t = Tensor(a, device="WEBGPU")
    np.testing.assert_array_equal((t + 3).numpy(), a + 3)
    np.testing.assert_array_equal(t.max().numpy(), a.max())
    np.testing.assert_array_equal(Tensor.arange(5, device="WEBGPU").numpy(), np.arange(5))
    with pytest.raises(DTypeError, match="int32"):
        Tensor(np.array([2**40]), device="WEBGPU")


def test_assign_reading_its_own_target(webgpu):
    a = Tensor(np.arange(5, dtype=np.float32), device="WEBGPU").realize()
    a.assign(a * 2 + 1).realize()
    np.testing.assert_array_equal(a.numpy(), np.arange(5) * 2 + 1)


def test_float64_native_math(webgpu):
    if not webgpu.target.float64:
        pytest.skip("adapter has no shader-f64")
    x = np.concatenate([np.linspace(-40, 40, 301), [1e-300, 5e-324, 1023.5, -1074, np.inf, -np.inf, np.nan]])
    t = Tensor(x, device="WEBGPU")
    np.testing.assert_allclose((t * 1.5 + 1).numpy(), x * 1.5 + 1, rtol=1e-15)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(t.exp2().numpy(), np.exp2(x), rtol=1e-14, equal_nan=True)
        np.testing.assert_allclose(t.log2().numpy(), np.log2(x), rtol=1e-14, equal_nan=True)
        np.testing.assert_allclose(t.sin().numpy(), np.sin(x), rtol=1e-12, atol=1e-15, equal_nan=True)


def test_debug4_prints_wgsl(webgpu, monkeypatch, capsys):
    monkeypatch.setattr(tgrad.device, "DEBUG", 4)
    (Tensor(np.ones(3, np.float32), device="WEBGPU") * 5).numpy()
    assert "@compute @workgroup_size" in capsys.readouterr().err


def test_no_adapter_names_the_package(monkeypatch):
    wgpu = pytest.importorskip("wgpu")
    from tgrad.runtime.webgpu import WebGPURuntime

    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **kw: None)
    with pytest.raises(DeviceError, match="mesa-vulkan-drivers"):
        WebGPURuntime()


def test_nan_inf_survive_zero_folding(webgpu):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.5], np.float32)
    t = Tensor(x, device="WEBGPU")
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal((t * 0).numpy(), x * 0)
        np.testing.assert_array_equal((t - t).numpy(), x - x)


def test_missing_wgpu_names_the_pip_package(monkeypatch):
    import sys

    from tgrad.runtime.webgpu import WebGPURuntime

    monkeypatch.setitem(sys.modules, "wgpu", None)  # makes `import wgpu` raise ImportError
    with pytest.raises(DeviceError, match="pip install wgpu"):
        WebGPURuntime()


def test_webgpu_float32_remainder_and_floor_division_as_pytorch(webgpu):
    """1 % 0.1 and 1 // 0.1 in float32 as PyTorch's (an exact fmod): right over Vulkan. Over OpenGL they are
    a known wrong answer (1 % 0.1 is 0, 1 // 0.1 is 10): WGSL has no float64 there, so ops/numerics.
    _float_fmod computes a - trunc(a / b) * b in float32, and GL's division is not correctly rounded
    (1 / 0.1 gives 10): reported as xfail, not hidden, until fixed."""
    import torch

    x = np.array([1.0, 60000.0, -3.5, 0.3], np.float32)
    t = Tensor(x, device="WEBGPU")
    got = [(t % 0.1).numpy(), (t // 0.1).numpy()]
    want = [(torch.tensor(x) % 0.1).numpy(), (torch.tensor(x) // 0.1).numpy()]
    if webgpu.adapter_info["backend_type"] == "OpenGL" and not all(map(np.array_equal, got, want)):
        pytest.xfail("known wrong answer over OpenGL: float32 remainders are not exact there")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
