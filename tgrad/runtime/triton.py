"""The CUDA / AMD / TRITON runtime: `@triton.jit` kernels from emit_triton, buffers as torch tensors.

On a GPU the buffers are CUDA (or ROCm) torch tensors; without one, TRITON_INTERPRET=1 runs the kernels
in Triton's interpreter on CPU torch tensors. Compiling for GPU targets without a GPU: triton_aot.py.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from tgrad import config, emit_triton
from tgrad.device import Buffer, Runner, Runtime
from tgrad.dtype import DType, dtypes
from tgrad.emit_triton import interpreting
from tgrad.errors import DeviceError, KernelError, byte_size, numbered
from tgrad.fuse import Kernel
from tgrad.opt import DeviceProps
from tgrad.program import Program
from tgrad.runtime import triton_aot
from tgrad.runtime.triton_source import load_source

_TORCH_DTYPE = {
    dtypes.bool: "bool",
    dtypes.uint8: "uint8",
    dtypes.int8: "int8",
    dtypes.int16: "int16",
    dtypes.int32: "int32",
    dtypes.int64: "int64",
    dtypes.uint16: "uint16",
    dtypes.uint32: "uint32",
    dtypes.uint64: "uint64",
    dtypes.float16: "float16",
    dtypes.float32: "float32",
    dtypes.float64: "float64",
}
def _shared_llvm_loaded() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return any("/libLLVM" in line for line in maps)
    except OSError:
        return False


def _import_triton():
    """triton, with triton.language. Where a shared libLLVM is already loaded (Mesa's lavapipe behind
    WEBGPU, PoCL behind CL), libtriton's own LLVM binds to it and the import segfaults: it is then
    loaded with RTLD_DEEPBIND so it keeps its own symbols."""
    if "triton" not in sys.modules and hasattr(os, "RTLD_DEEPBIND") and _shared_llvm_loaded():
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
        try:
            import triton._C.libtriton  # noqa: F401
        finally:
            sys.setdlopenflags(flags)
    import triton
    import triton.language

    return triton


def _cache_interpreter_builtins() -> None:
    """Triton's interpreter replaces triton.language's builtins with interpreted ones around every launch
    (GridExecutor: `_patch_lang`, undone after the launch), and again in each jitted function a kernel
    calls (tl.sum), finding them each time with `inspect.getmembers`: ~0.2 ms a launch, a sixth of the
    TRITON tests' time (cProfile of tests/test_replay.py). Here the names of each package's builtins are
    listed once, at the first launch (when nothing is replaced yet, so no later builtin is missed); each
    call then replaces those of them that are builtins now, as Triton's search would, with Triton's own
    replacement and undo. A Triton whose interpreter has no `_patch_builtin(pkg, builder, scope)` is left
    as it is."""
    import inspect

    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    is_builtin = getattr(interpreter.tl.core, "is_builtin", None)
    if None in (original, patch_attr, is_builtin) or getattr(original, "tgrad_cached", False):
        return
    if list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return
    names: dict[int, tuple] = {}  # id(package) -> (package, its builtins' names)

    def patch_builtin(pkg, builder, scope) -> None:
        listed = names.get(id(pkg))
        if listed is None:
            listed = names[id(pkg)] = (pkg, [n for n, m in inspect.getmembers(pkg) if is_builtin(m)])
        for name in listed[1]:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin.tgrad_cached = True
    interpreter._patch_builtin = patch_builtin


class TritonRuntime(Runtime):
    """Kernels rendered as `@triton.jit` functions. Buffers are torch tensors: on the GPU, or on the CPU
    when Triton's interpreter runs the kernels (TRITON_INTERPRET=1, which needs CPU torch tensors)."""

    name = "TRITON"
    vendor = ""  # "cuda" or "hip": the GPU kind this device insists on; "" takes whichever is present

    def __init__(self):
        super().__init__()
        self.interpret = interpreting()
        self.props = DeviceProps(self.name, kind="triton", interpreted=self.interpret,
                                 tile_elements=1 << 16 if self.interpret else 4096)
        try:
            import torch

            triton = _import_triton()
        except ImportError as e:
            raise DeviceError(
                f"the {self.name} device needs triton and torch ({e.name or e} is missing): "
                "pip install triton torch, or the extra tgrad[triton] "
                "(pip install -e .[triton] in a checkout)"
            ) from e
        self.torch = torch
        if not self.interpret and not torch.cuda.is_available():
            raise DeviceError(
                f"{self.name} device: no GPU found; set TRITON_INTERPRET=1 to run Triton kernels on the CPU"
            )
        if (type(triton.language.sum).__name__ == "InterpretedFunction") != self.interpret:
            now = "1" if self.interpret else "unset"
            raise DeviceError(
                f"{self.name} device: triton was imported under another TRITON_INTERPRET than now ({now}); "
                "set it in the environment before anything imports triton"
            )
        if self.interpret:
            self.torch_device = "cpu"
            _cache_interpreter_builtins()
            return
        hip = getattr(torch.version, "hip", None) is not None
        if self.vendor and (self.vendor == "hip") != hip:
            have, use = ("an AMD (ROCm)", "AMD") if hip else ("an NVIDIA (CUDA)", "CUDA")
            raise DeviceError(f"{self.name} device: this torch drives {have} GPU; use DEVICE={use} or TRITON")
        self.torch_device = "cuda"
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        self.props = DeviceProps(self.name, kind="triton", compute_units=int(sms))

    def alloc(self, size: int, dtype: DType) -> Buffer:
        torch_dtype = getattr(self.torch, _TORCH_DTYPE[dtype])
        try:
            t = self.torch.empty(size, dtype=torch_dtype, device=self.torch_device)
        except RuntimeError as e:  # torch.OutOfMemoryError, or the CPU allocator's "can't allocate memory"
            if isinstance(e, self.torch.OutOfMemoryError) or "allocate" in str(e):
                raise MemoryError(f"torch on {self.torch_device}: {e}") from e
            raise
        return Buffer(self.name, size, dtype, t)

    def buffer_limit(self) -> tuple[int, str]:
        if self.max_buffer is None and self.torch_device != "cpu":
            most = int(self.torch.cuda.get_device_properties(self.torch.cuda.current_device()).total_memory)
            self.max_buffer = (most, f"this GPU's memory ({byte_size(most)})")
        return super().buffer_limit()

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1).copy()
        t = self.torch.from_numpy(flat)
        if self.torch_device != "cpu":
            t = t.to(self.torch_device)
        return Buffer(self.name, flat.size, dtypes.from_any(flat.dtype), t)

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        return buf.data.detach().cpu().numpy()

    def synchronize(self) -> None:
        if self.torch_device != "cpu":
            self.torch.cuda.synchronize()

    def render(self, kernel: Kernel) -> Program:
        """The kernel's Triton Program (block sizes for the interpreter or a GPU); with
        TGRAD_TRITON_TARGET set, the kernel is first compiled for each of those GPU targets."""
        for target in triton_aot.targets_from_env():
            triton_aot.compile_for_target(kernel, target)
        return emit_triton.render(kernel)

    def compile(self, program: Program, kernel: Kernel) -> Runner:
        fname, source = program.name, program.source
        split = program.launch.get("split", 0)
        opts = emit_triton.launch_options(program)
        try:
            main = load_source(source, fname, self.interpret)
            launcher = self._launcher(main, program.global_size, opts)
            # a split reduce (emit_triton): its first function fills the scratch array of partial results
            first = None
            if split:
                part = load_source(source, fname + "_part", self.interpret)
                first = self._launcher(part, (*program.global_size, split), opts)
        except Exception as e:
            raise KernelError(f"kernel {fname} failed to build: {e}\n{numbered(source)}") from e
        scratch = [self.torch.empty(n, dtype=getattr(self.torch, _TORCH_DTYPE[dt]), device=self.torch_device)
                   for n, dt in program.scratch]

        def run(out: Buffer, *inputs: Buffer) -> None:
            args = (out.data, *(b.data for b in inputs), *scratch)
            try:
                if first is not None:
                    first(*args)
                launcher(*args)
            except Exception as e:
                raise KernelError(
                    f"kernel {fname} failed to run: {type(e).__name__}: {e}\n{numbered(source)}"
                ) from e

        return Runner(program, run, self.name)

    def _launcher(self, fn, grid: tuple[int, ...], opts: dict):
        """fn[grid] with the launch options (num_warps, num_stages). On a GPU, after the first launch for a
        pattern of pointer alignments, the compiled kernel is launched directly: Triton's per-call dispatch
        (binding the arguments, the specialization key, the globals check) is skipped. That is safe because
        every argument of a tgrad kernel is a tensor of fixed dtype, so 16-byte alignment is all a kernel is
        specialized on (and the device it was loaded on).
        TGRAD_TRITON_DIRECT=0 keeps Triton's dispatch for every launch."""
        launch = fn[grid]
        if self.interpret or not config.on("TGRAD_TRITON_DIRECT"):
            return lambda *args: launch(*args, **opts)
        compiled: dict[tuple, object] = {}
        grid3 = (*grid, 1, 1)[:3]  # a compiled kernel's launcher takes all three grid sizes
        device = self.torch.cuda.current_device  # a compiled kernel is loaded on one device

        def direct(*args) -> None:
            key = (device(), *(a.data_ptr() % 16 == 0 for a in args))
            hit = compiled.get(key)
            if hit is None:
                compiled[key] = launch(*args, **opts)[grid3]
            else:
                hit(*args)

        return direct


class CUDARuntime(TritonRuntime):
    """NVIDIA GPUs through Triton."""

    name = "CUDA"
    vendor = "cuda"


class AMDRuntime(TritonRuntime):
    """AMD GPUs (ROCm) through Triton."""

    name = "AMD"
    vendor = "hip"


