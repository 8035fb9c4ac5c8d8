"""The OpenCL emitter and runtime: rendered-source checks (no driver needed) and runs on a real OpenCL
device (PoCL here), compared with PyTorch and numpy."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import open_or_skip
from tests.cstyle_cases import CASES, INT_CASES, find_clang, int_inputs, suite_kernels
from tests.helpers import helper_test_op
from tgrad import Tensor, dtypes, fuse
from tgrad.emit_opencl import OPENCL, QCOM, render
from tgrad.errors import DeviceError, DTypeError, KernelError
from tgrad.opt import DeviceProps, optimize

PROPS = DeviceProps("CL")  # the OpenCL runtime's tuning (a PoCL device's limits)
GROUP_REDUCE_MIN, GROUP_REDUCE_MAX_OUT = PROPS.group_min_reduce, PROPS.group_max_outputs


def source(kernel, *args, **kwargs) -> str:
    """The rendered source of the kernel with the opts the optimizer picks for an OpenCL device."""
    return render(optimize(kernel, PROPS), *args, **kwargs).source


def kernels_of(fn, *arrays) -> list:
    """The fused kernels of fn over realized inputs, without running them."""
    out = fn(*[Tensor(a, device="NUMPY") for a in arrays])
    return [it.kernel for it in fuse.schedule([out.node])]


def one_kernel(fn, *arrays):
    ks = kernels_of(fn, *arrays)
    assert len(ks) == 1
    return ks[0]


@pytest.fixture
def cl(monkeypatch):
    open_or_skip("CL")
    monkeypatch.setenv("DEVICE", "CL")
    from tgrad.device import get_runtime

    return get_runtime("CL")


# ---------------------------------------------------------------------------------------------------
# rendered source


def test_render_elementwise_opencl():
    f32 = np.ones((3, 4), np.float32)
    src = source(one_kernel(lambda a, b: a.maximum(b) + 1, f32, f32), OPENCL)
    assert src.startswith("__kernel void E_3_4(__global float* out, __global const float* in0")
    assert "get_global_id(0)" in src and "if (gid >= 12) return;" in src
    assert "fmax" not in src and "!=" in src  # MAX keeps a nan: a ternary, not fmax
    assert "__local" not in src


def test_render_bool_half_double_storage():
    b = np.array([True, False, True])
    h = np.ones(3, np.float16)
    d = np.ones(3, np.float64)
    src = source(one_kernel(lambda x, y, z: x.where(y.float() + 1, z.float()).half(), b, h, d), OPENCL)
    assert "__global const uchar* in0" in src and "__global half* out" in src
    assert "vload_half(" in src and "vstore_half_rte(" in src
    assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in src
    assert "cl_khr_fp16" not in src  # half is computed in float: no extension needed


def test_render_group_reduce_for_long_axes():
    short = source(one_kernel(lambda a: a.sum(1), np.ones((3, GROUP_REDUCE_MIN - 1), np.float32)))
    long = source(one_kernel(lambda a: a.sum(1), np.ones((3, GROUP_REDUCE_MIN), np.float32)))
    assert "__local" not in short and "for (int i1 = 0; i1 < 255; i1++)" in short
    assert "__local float part[" in long and "barrier(CLK_LOCAL_MEM_FENCE);" in long
    assert "get_group_id(0)" in long and "get_local_id(0)" in long
    wide = np.ones((GROUP_REDUCE_MAX_OUT + 1, GROUP_REDUCE_MIN), np.float32)
    many = source(one_kernel(lambda a: a.sum(1), wide))
    assert "__local" not in many  # enough outputs to fill the device one work-item each


def test_render_register_tiles_for_matmul(monkeypatch):
    a, b = np.ones((8, 12), np.float32), np.ones((12, 16), np.float32)
    k = one_kernel(lambda x, y: x @ y, a, b)
    src = source(k)
    assert "acc15" in src and "acc16" not in src  # a 4x4 tile of outputs per work-item
    assert "if (gid >= 8) return;" in src  # 128 outputs / 16 per work-item
    assert src.count("in0[") == 4 and src.count("in1[") == 4  # 8 loads feed 16 multiply-adds
    monkeypatch.setenv("NOOPT", "1")
    assert "acc0" not in source(k) and "if (gid >= 128) return;" in source(k)


def test_render_int_division_guards_zero():
    a, b = int_inputs()
    src = source(one_kernel(lambda x, y: x.fmod(y), a, b))
    assert "== 0 ? " in src  # x % 0 is undefined in C (a CPU driver traps): guarded
    src_const = source(one_kernel(lambda x: x.fmod(3), a))
    assert "% 3" in src_const and "== 0 ?" not in src_const


@pytest.mark.parametrize("dialect", [OPENCL, QCOM], ids=["CL", "QCOM"])
def test_suite_sources_pass_clang_opencl(dialect, tmp_path):
    """Every suite kernel, as OpenCL C, through clang's OpenCL front end (QCOM's native half included,
    which PoCL here cannot run: it has no cl_khr_fp16)."""
    clang = find_clang()
    if clang is None:
        pytest.skip("clang not found (apt-get install clang-15); OpenCL C syntax is not checked")
    src = tmp_path / "kernels.cl"
    src.write_text("\n".join(source(k, dialect, name=f"k{i}") for i, k in enumerate(suite_kernels())))
    assert dialect is OPENCL or "half v" in src.read_text()
    cmd = [clang, "-x", "cl", "-cl-std=CL1.2", "-fsyntax-only", "-Xclang", "-finclude-default-header",
           "-Xclang", "-cl-ext=+cl_khr_fp16,+cl_khr_fp64", str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr[-4000:]


# ---------------------------------------------------------------------------------------------------
# running on the device, against PyTorch


@pytest.mark.parametrize("name", list(CASES))
def test_case_vs_torch(cl, name):
    shapes, fn, kw = CASES[name]
    helper_test_op(shapes, fn, **kw)


@pytest.mark.parametrize("name", list(INT_CASES))
def test_int_case_vs_torch(cl, name):
    fn = INT_CASES[name]
    a, b = int_inputs()
    want = fn(torch.tensor(a), torch.tensor(b)).numpy()
    got = fn(Tensor(a), Tensor(b)).numpy()
    np.testing.assert_array_equal(got, want)


def test_int_division_by_zero_and_minus_one(cl):
    a = np.array([7, -7, -(2**31), -(2**31), 9], np.int32)
    b = np.array([0, 0, -1, 1, -1], np.int32)
    # C leaves these undefined; tgrad defines x/0 = 0 and x%0 = x (as its CPU device does) and wraps
    np.testing.assert_array_equal(Tensor(a).fmod(Tensor(b)).numpy(), [7, -7, 0, 0, 0])
    q = (Tensor(a) - Tensor(a).fmod(Tensor(b))) // Tensor(b)
    np.testing.assert_array_equal(q.numpy()[2:], [-(2**31), -(2**31), -9])


def test_nan_propagates_through_max(cl):
    x = np.array([[np.nan, 1.0, 2.0], [3.0, np.nan, -np.inf], [1.0, 2.0, 3.0]], np.float32)
    np.testing.assert_array_equal(Tensor(x).max(1).numpy(), np.array([np.nan, np.nan, 3.0], np.float32))
    np.testing.assert_array_equal(Tensor(x).relu().numpy(), torch.tensor(x).relu().numpy())
    long = np.ones((2, 700), np.float32)
    long[0, 500] = np.nan
    np.testing.assert_array_equal(Tensor(long).max(1).numpy(), np.array([np.nan, 1.0], np.float32))


def test_dtypes_roundtrip_and_arith(cl):
    for dt in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64):
        x = (np.arange(-6, 6) % 5).astype(dt)
        np.testing.assert_array_equal(Tensor(x).numpy(), x)
        if dt is not np.bool_:
            np.testing.assert_array_equal((Tensor(x) * 3 + 1).numpy(), torch.tensor(x) * 3 + 1)


def test_float16_rounds_like_torch(cl):
    x = np.random.default_rng(0).uniform(-10, 10, 257).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).half().numpy(), torch.tensor(x).half().numpy())
    h = x.astype(np.float16)
    got = (Tensor(h) * 2 + 1).numpy()
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, (torch.tensor(h) * 2 + 1).numpy())
    np.testing.assert_allclose(Tensor(h).sum().numpy(), torch.tensor(h).float().sum().numpy(), rtol=2e-3)


def test_uint8_wraps_and_float_to_int_cast(cl):
    u = np.array([250, 3, 128], np.uint8)
    np.testing.assert_array_equal((Tensor(u) + 10).numpy(), (torch.tensor(u) + 10).numpy())
    f = np.array([-3.7, 2.9, 300.5], np.float32)
    np.testing.assert_array_equal(Tensor(f).int().numpy(), torch.tensor(f).int().numpy())


def test_int64_large_values(cl):
    x = np.array([2**40, -(2**40) + 3, 2**62], np.int64)
    np.testing.assert_array_equal((Tensor(x) + 2**33).numpy(), x + 2**33)
    np.testing.assert_array_equal(Tensor(x).max().numpy(), x.max())


def test_empty_and_scalar(cl):
    empty = Tensor(np.zeros((0, 3), np.float32))
    np.testing.assert_array_equal(empty.sum(0).numpy(), np.zeros(3, np.float32))
    assert Tensor(3.5).exp().item() == pytest.approx(np.exp(3.5), rel=1e-6)


# ---------------------------------------------------------------------------------------------------
# runtime behaviour and errors


def test_debug4_prints_opencl_source():
    env = {**os.environ, "DEBUG": "4", "DEVICE": "CL", "TGRAD_CACHE": "0"}
    code = "from tgrad import Tensor; print((Tensor([1.0, 2.0]) * 3).numpy())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if "not available" in proc.stderr or "OpenCL platform" in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    assert "__kernel void E_2(" in proc.stderr and "[3. 6.]" in proc.stdout


def test_no_platform_is_a_clear_error(monkeypatch):
    cl = pytest.importorskip("pyopencl")
    from tgrad.runtime.opencl import CLRuntime

    monkeypatch.setattr(cl, "get_platforms", lambda: [])
    with pytest.raises(DeviceError, match="install pocl-opencl-icd or a GPU driver"):
        CLRuntime()


def test_build_error_shows_name_source_and_log(cl):
    bad = "__kernel void broken(__global float* out) {\n  out[0] = undefined_name;\n}\n"
    with pytest.raises(KernelError) as info:
        cl.build("broken", bad)
    msg = str(info.value)
    assert "broken" in msg and "   2 |   out[0] = undefined_name;" in msg
    assert "driver log" in msg and "undefined_name" in msg.split("driver log")[1]


def test_float64_without_fp64_is_a_clear_error(cl, monkeypatch):
    monkeypatch.setattr(cl, "exts", cl.exts - {"cl_khr_fp64"})
    k = one_kernel(lambda a: a * 2, np.ones(3, np.float64))
    with pytest.raises(DTypeError, match="cl_khr_fp64"):
        cl.runner(k)
    with pytest.raises(DTypeError, match="cl_khr_fp64"):
        cl.alloc(3, dtypes.float64)


def test_binary_disk_cache(cl, monkeypatch, tmp_path):
    from tgrad.runtime.opencl import CLRuntime

    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    k = one_kernel(lambda a: a * 5 - 1, np.ones(4, np.float32))
    first = CLRuntime()
    first.runner(k)
    binaries = list((tmp_path / "opencl").glob("*.bin"))
    assert len(binaries) == 1
    second = CLRuntime()  # a fresh process would look the same: nothing built in memory
    prg = second.runner(k)
    out = second.alloc(4, dtypes.float32)
    prg(out, second.from_numpy(np.arange(4, dtype=np.float32)))
    np.testing.assert_array_equal(second.to_numpy(out), np.arange(4, dtype=np.float32) * 5 - 1)
    assert second.programs_built == 0
    binaries[0].write_bytes(binaries[0].read_bytes()[:-100])  # cut short: built again, not handed to PoCL
    third = CLRuntime()
    prg = third.runner(k)
    prg(out := third.alloc(4, dtypes.float32), third.from_numpy(np.arange(4, dtype=np.float32)))
    np.testing.assert_array_equal(third.to_numpy(out), np.arange(4, dtype=np.float32) * 5 - 1)
    assert third.programs_built == 1


def _fresh_cl(monkeypatch):
    """A new CL runtime in place of the open one: nothing built in memory, as in a new process."""
    from tgrad import device
    from tgrad.runtime.opencl import CLRuntime

    rt = CLRuntime()
    monkeypatch.setitem(device._runtimes, "CL", rt)
    return rt


def _softmax_case() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((4, 37)).astype(np.float32)
    return x, torch.tensor(x).softmax(1).numpy()


def test_a_schedules_new_kernels_build_as_one_program(cl, monkeypatch, tmp_path):
    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    x, expected = _softmax_case()  # three kernels, two of them named r_4_37
    for built in (1, 0):  # the second runtime loads all three from the one cached binary
        rt = _fresh_cl(monkeypatch)
        np.testing.assert_allclose(Tensor(x, device="CL").softmax(1).numpy(), expected, rtol=1e-6, atol=1e-7)
        assert rt.programs_built == built
    assert len(list((tmp_path / "opencl").glob("*.bin"))) == 1
    assert len(list((tmp_path / "opencl").glob("*.ref"))) == 3


@pytest.mark.parametrize("damage", ["truncated binary", "missing binary", "garbled reference"])
def test_a_damaged_batch_entry_is_built_again(cl, monkeypatch, tmp_path, damage):
    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    x, expected = _softmax_case()
    _fresh_cl(monkeypatch)
    Tensor(x, device="CL").softmax(1).numpy()
    (binary,) = (tmp_path / "opencl").glob("*.bin")
    if damage == "truncated binary":
        binary.write_bytes(binary.read_bytes()[: binary.stat().st_size // 2])
    elif damage == "missing binary":
        binary.unlink()
    else:
        for ref in (tmp_path / "opencl").glob("*.ref"):
            ref.write_text("nonsense")
    rt = _fresh_cl(monkeypatch)
    np.testing.assert_allclose(Tensor(x, device="CL").softmax(1).numpy(), expected, rtol=1e-6, atol=1e-7)
    assert rt.programs_built == 3  # each kernel from its own source, none from the damaged entry
    rt = _fresh_cl(monkeypatch)  # and those builds are what the cache gives next
    np.testing.assert_allclose(Tensor(x, device="CL").softmax(1).numpy(), expected, rtol=1e-6, atol=1e-7)
    assert rt.programs_built == 0


def test_a_batch_that_fails_to_build_names_the_failing_kernel(cl, monkeypatch, tmp_path):
    from tgrad.runtime import opencl

    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    real = opencl.emit_opencl.render

    def render(kernel, *args, **kwargs):  # the reduction of exp breaks
        program = real(kernel, *args, **kwargs)
        if "exp2" in program.source and program.name.startswith("r_"):
            broken = program.source.replace("acc = 0.0f;", "acc = undefined_name;")
            return dataclasses.replace(program, source=broken)
        return program

    monkeypatch.setattr(opencl.emit_opencl, "render", render)
    rt = _fresh_cl(monkeypatch)
    x, _ = _softmax_case()
    with pytest.raises(KernelError, match="undefined_name") as info:
        Tensor(x, device="CL").softmax(1).numpy()
    assert "OpenCL kernel r_4_37 failed to build" in str(info.value)
    assert rt.programs_built == 3  # the batch, then the first kernel alone, then the broken one alone


def test_qcom_needs_adreno_or_fallback(monkeypatch):
    pytest.importorskip("pyopencl")
    open_or_skip("CL")
    from tgrad.runtime.opencl import QCOMRuntime

    monkeypatch.delenv("QCOM_FALLBACK", raising=False)
    try:
        QCOMRuntime()
    except DeviceError as e:
        assert "Adreno" in str(e) and "QCOM_FALLBACK=1" in str(e)
    monkeypatch.setenv("QCOM_FALLBACK", "1")
    dev = QCOMRuntime()
    k = one_kernel(lambda a: (a * 2).half(), np.arange(5, dtype=np.float32))
    out = dev.alloc(5, dtypes.float16)
    dev.runner(k)(out, dev.from_numpy(np.arange(5, dtype=np.float32)))
    np.testing.assert_array_equal(dev.to_numpy(out), np.arange(5, dtype=np.float16) * 2)
