"""Every error tgrad raises on purpose is a tgrad.errors class whose message says what went wrong, names
the tgrad call ("in Tensor.reshape") and ends with the user's line (the frame outside tgrad). Kernels
that fail to build or run name themselves and show their numbered source. Tested by message, on every
device."""

import dataclasses
import sys

import numpy as np
import pytest

import tgrad.device as tdev
from tgrad import Tensor
from tgrad.device import get_runtime
from tgrad.errors import (
    AutogradError,
    DeviceError,
    DTypeError,
    IndexRangeError,
    JitError,
    KernelError,
    ShapeError,
    TgradError,
)

HERE = "test_errors.py"


def raised(cls, fn) -> str:
    with pytest.raises(cls) as info:
        fn()
    assert isinstance(info.value, TgradError), type(info.value)
    return str(info.value)


def user_line(message: str, call: str) -> None:
    """The message names the tgrad call and the user's line in this file."""
    assert f"(in {call}, at " in message, message
    assert HERE in message, message


# ---------------------------------------------------------------------------------------------------
# shape, dtype, device, backward misuse

SHAPE_DTYPE = [
    # (error class, what fails, the call named, message fragments)
    (ShapeError, lambda: Tensor.ones(2, 3) + Tensor.ones(4), "Tensor.__add__", ["(2, 3) with (4,)"]),
    (ShapeError, lambda: Tensor.ones(2, 3) @ Tensor.ones(4, 2), "Tensor.__matmul__", ["matmul", "3 != 4"]),
    (ShapeError, lambda: Tensor.ones(2, 3).reshape(5), "Tensor.reshape", ["cannot reshape (2, 3)", "(5,)"]),
    (ShapeError, lambda: Tensor.ones(2, 3).permute(0, 0), "Tensor.permute", ["not a permutation"]),
    (ShapeError, lambda: Tensor.ones(2, 3).sum(5), "Tensor.sum", ["axis 5 is out of range"]),
    (ShapeError, lambda: Tensor.ones(2, 3).expand(4, 3), "Tensor.expand", ["(2, 3)", "(4, 3)"]),
    (ShapeError, lambda: Tensor.ones(2, 3).pad(((1, 1),)), "Tensor.pad", ["pad", "per axis"]),
    (ShapeError, lambda: Tensor.ones(2, 3).shrink(((0, 5), (0, 1))), "Tensor.shrink", ["not inside (2, 3)"]),
    (ShapeError, lambda: Tensor.ones(2, 3).cat(Tensor.ones(3, 2)), "Tensor.cat", ["cat", "differ"]),
    (ShapeError, lambda: Tensor.ones(2, 3).item(), "Tensor.item", ["one element"]),
    (ShapeError, lambda: Tensor.ones(2, 3).conv2d(Tensor.ones(2, 3)), "Tensor.conv2d", ["4-d"]),
    (DTypeError, lambda: Tensor([1.0]) ^ Tensor([2.0]), "Tensor.__xor__", ["xor", "float32"]),
    (DTypeError, lambda: Tensor([True]) - Tensor([False]), "Tensor.__sub__", ["subtraction of bool"]),
    (DTypeError, lambda: Tensor([1.0], dtype="complex64"), "Tensor.__init__", ["dtype 'complex64'"]),
    (IndexRangeError, lambda: Tensor.ones(2, 3)[Tensor([0.5])], "Tensor.__getitem__", ["must be integer"]),
    (DTypeError, lambda: Tensor([1, 2], requires_grad=True), "Tensor.__init__", ["floating point"]),
    (AutogradError, lambda: (Tensor.ones(2, requires_grad=True) * 2).backward(), "Tensor.backward",
     ["needs a scalar", "(2,)", ".sum()"]),
    (AutogradError, lambda: Tensor.ones(2).sum().backward(), "Tensor.backward", ["requires_grad=True"]),
    (ShapeError, lambda: (Tensor.ones(2, requires_grad=True) * 2).backward(Tensor.ones(3)), "Tensor.backward",
     ["gradient shape (3,)", "(2,)"]),
    (DeviceError, lambda: Tensor([1.0], device="TPU"), "Tensor.__init__", ["unknown device 'TPU'", "CPU,"]),
    (DeviceError, lambda: Tensor.ones(2).to("FOO"), "Tensor.to", ["unknown device 'FOO'", "known devices"]),
]


@pytest.mark.parametrize("case", range(len(SHAPE_DTYPE)))
def test_user_errors_name_the_call_and_the_line(device, case):
    cls, fn, call, fragments = SHAPE_DTYPE[case]
    message = raised(cls, fn)
    for fragment in fragments:
        assert fragment in message, message
    user_line(message, call)


def test_mixing_devices(device):
    other = "CPU" if device == "NUMPY" else "NUMPY"
    a, b = Tensor([1.0, 2.0]), Tensor([1.0, 2.0], device=other)
    message = raised(DeviceError, lambda: a + b)
    assert f"different devices ({device} and {other})" in message and ".to()" in message
    user_line(message, "Tensor.__add__")
    message = raised(DeviceError, lambda: a.assign(b))
    assert f"value on {other}, tensor on {device}" in message
    user_line(message, "Tensor.assign")


# ---------------------------------------------------------------------------------------------------
# missing packages and drivers

MISSING = [
    # device, module hidden, what to pip install, the extra (None: a core dependency)
    ("CPU", "numba", "pip install numba", None),
    ("CL", "pyopencl", "pip install pyopencl", "tgrad[opencl]"),
    ("WEBGPU", "wgpu", "pip install wgpu", "tgrad[webgpu]"),
    ("TRITON", "triton", "pip install triton", "tgrad[triton]"),
]


@pytest.mark.parametrize("name,module,pip,extra", MISSING)
def test_missing_package_says_what_to_install(monkeypatch, name, module, pip, extra):
    monkeypatch.setattr(tdev, "_runtimes", {})  # open the device afresh
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails like a missing package
    message = raised(DeviceError, lambda: Tensor([1.0], device=name))
    assert f"the {name} device needs" in message and module in message and pip in message, message
    if extra:
        assert extra in message, message
    user_line(message, "Tensor.__init__")


def test_no_opencl_platform_names_a_driver(monkeypatch):
    cl = pytest.importorskip("pyopencl")
    monkeypatch.setattr(tdev, "_runtimes", {})
    monkeypatch.setattr(cl, "get_platforms", lambda: [])
    message = raised(DeviceError, lambda: Tensor([1.0], device="CL"))
    assert "no OpenCL platform found" in message and "pocl-opencl-icd" in message
    user_line(message, "Tensor.__init__")


def test_no_webgpu_adapter_names_a_driver(monkeypatch):
    wgpu = pytest.importorskip("wgpu")
    monkeypatch.setattr(tdev, "_runtimes", {})
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **kw: None)
    message = raised(DeviceError, lambda: Tensor([1.0], device="WEBGPU"))
    assert "no WebGPU adapter found" in message and "mesa-vulkan-drivers" in message
    user_line(message, "Tensor.__init__")


def test_triton_without_a_gpu_says_to_interpret(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.setattr(tdev, "_runtimes", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = raised(DeviceError, lambda: Tensor([1.0], device="TRITON"))
    assert "no GPU found" in message and "TRITON_INTERPRET=1" in message
    user_line(message, "Tensor.__init__")


# ---------------------------------------------------------------------------------------------------
# TinyJit misuse (tests/test_jit.py and tests/test_jit_footguns.py pin each message)


def test_jit_misuse_is_a_jit_error_with_the_user_line(device):
    from tgrad.jit import TinyJit

    @TinyJit
    def f(x):
        y = (x * 2).realize()
        y.numpy()
        return y

    x = Tensor(np.ones((3, 4), np.float32))
    with pytest.raises(JitError) as info:
        for _ in range(3):
            f(x)
    message = str(info.value)
    assert ".numpy()/.item()/.tolist()/bool() inside a TinyJit function" in message, message
    assert HERE in message, message


# ---------------------------------------------------------------------------------------------------
# kernels that fail to build or to run

# device -> (broken source for a function name, source that builds and fails to run because it takes
# fewer arguments than the launch passes, or None: the kernel's input buffer is freed under it instead)
BROKEN = {
    "CPU": (
        lambda name: f"def {name}(:\n",
        None,  # the input buffer is freed under the kernel (its array is gone)
    ),
    "CL": (
        lambda name: f"__kernel void {name}(__global float* out) {{ out[0] = undeclared_thing; }}\n",
        lambda name: f"__kernel void {name}(__global float* out) {{ out[0] = 1.0f; }}\n",
    ),
    "WEBGPU": (
        lambda name: f"@compute @workgroup_size(64) fn {name}() {{ let x: f32 = undeclared_thing; }}\n",
        None,  # a WGSL shader that builds cannot fail to launch by itself: the input buffer is destroyed
    ),
    "TRITON": (
        lambda name: f"import triton\n\n@triton.jit\ndef {name}(:\n",
        lambda name: f"import triton\nimport triton.language as tl\n\n@triton.jit\ndef {name}(out_ptr):\n"
        "    tl.store(out_ptr, 1.0)\n",
    ),
}


def _break_renderer(monkeypatch, device, make_source) -> tuple[list[str], list[str]]:
    """Make the device's emitter return make_source(entry point name) as each Program's source; returns
    the kernel names it was asked for and the sources it gave."""
    runtime = get_runtime(device)
    render = runtime.render
    names: list[str] = []
    sources: list[str] = []

    def broken(kernel):
        program = render(kernel)
        names.append(kernel.name)
        sources.append(make_source(program.name))
        return dataclasses.replace(program, source=sources[-1])

    monkeypatch.setattr(runtime, "render", broken)
    monkeypatch.setattr(runtime, "runners", {})  # compile again, not from the memory cache
    return names, sources


def _check_kernel_message(message: str, names: list[str], what: str, snippet: str) -> None:
    assert names, "the broken renderer was not used"
    assert f"kernel {names[-1]} failed to {what}" in message, message
    assert "   1 | " in message and snippet in message, message  # numbered source
    user_line(message, "Tensor.realize")


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))


def test_kernel_build_failure_names_kernel_and_source(device, fresh_cache, monkeypatch):
    if device == "NUMPY":
        pytest.skip("the NUMPY device compiles no kernels")
    names, sources = _break_renderer(monkeypatch, device, BROKEN[device][0])
    x = Tensor(np.ones((7, 13), np.float32))
    message = raised(KernelError, lambda: (x * 3 + 1).realize())
    _check_kernel_message(message, names, "build", sources[-1].splitlines()[-1].strip())


def test_kernel_run_failure_names_kernel_and_source(device, fresh_cache, monkeypatch):
    if device == "NUMPY":
        pytest.skip("the NUMPY device compiles no kernels")
    x = Tensor(np.ones((7, 13), np.float32)).realize()
    make = BROKEN[device][1]
    if make is None:  # use after free: the launch fails
        names: list[str] = []
        monkeypatch.setattr(get_runtime(device), "runners", {})
        if device == "WEBGPU":
            x.node.buffer.data.destroy()
        else:
            x.node.buffer.data = None
    else:
        names, sources = _break_renderer(monkeypatch, device, make)
    message = raised(KernelError, lambda: (x * 3 + 1).realize())
    if make is None:
        names.append(message.split("kernel ", 1)[1].split()[0])
        snippet = "@compute" if device == "WEBGPU" else "def "
    else:
        snippet = sources[-1].splitlines()[-1].strip()
    _check_kernel_message(message, names, "run", snippet)


def test_cpu_kernel_build_failure_keeps_the_compiler_message(fresh_cache, monkeypatch):
    _break_renderer(monkeypatch, "CPU", lambda name: f"def {name}(:\n")
    x = Tensor(np.ones((7, 13), np.float32), device="CPU")
    message = raised(KernelError, lambda: (x * 3 + 1).realize())
    assert "SyntaxError" in message and "def E_n(:" in message


def test_a_graph_too_deep_to_compile_raises_naming_the_users_line(device):
    """A chain of ops deeper than Python's recursion limit allows (scheduling and lowering recurse over
    it) raises GraphDepthError (a RecursionError too) with advice and the user's line, not a RecursionError
    thousands of frames deep."""
    from tgrad.errors import GraphDepthError

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1500)
    try:
        v, ref = Tensor(np.ones(3, np.float32)), np.ones(3, np.float32)
        for i in range(3000):
            v, ref = v + float(i % 3), ref + np.float32(i % 3)
        message = raised(GraphDepthError, lambda: v.numpy())
    finally:
        sys.setrecursionlimit(limit)
    assert "too deep" in message and "realize() parts of it" in message
    user_line(message, "Tensor.numpy")
    assert issubclass(GraphDepthError, RecursionError)
    parts = Tensor(np.ones(3, np.float32))
    for i in range(3000):  # realized every few hundred ops: computes
        parts = parts + float(i % 3)
        if i % 500 == 499:
            parts = parts.realize()
    np.testing.assert_array_equal(parts.numpy(), ref)
