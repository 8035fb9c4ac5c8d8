"""Devices: the registry of names, the runtime base class, Buffers and the compiled-kernel cache folder.

Every device has one runtime (a `Runtime` subclass in `tgrad/runtime/<device>.py`), opened on first use
and kept for the process. A runtime owns Buffers and turns a Kernel into a `Runner`: it asks its
emitter (`emit_*.render`) for a Program, compiles that once, and caches the result in memory (and
on disk under `cache_dir()`). The driver that runs schedules is `tgrad/realize.py`.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tgrad import config, schedule_cache
from tgrad.dtype import DType, dtypes
from tgrad.errors import DeviceError, OutOfMemoryError, byte_size
from tgrad.opt import DeviceProps, optimize, search
from tgrad.program import Program

DEBUG = int(config.get("DEBUG"))

# the one list of devices: name -> its runtime ("module:class"). A runtime is imported only when its
# device is opened, so a missing driver package never breaks `import tgrad`.
RUNTIMES = {
    "CPU": "tgrad.runtime.cpu.runtime:CPURuntime",
    "NUMPY": "tgrad.runtime.numpy:NumpyRuntime",
    "CUDA": "tgrad.runtime.triton:CUDARuntime",
    "AMD": "tgrad.runtime.triton:AMDRuntime",
    "TRITON": "tgrad.runtime.triton:TritonRuntime",
    "CL": "tgrad.runtime.opencl:CLRuntime",
    "QCOM": "tgrad.runtime.opencl:QCOMRuntime",
    "METAL": "tgrad.runtime.metal:MetalRuntime",
    "WEBGPU": "tgrad.runtime.webgpu:WebGPURuntime",
}
DEVICES = tuple(RUNTIMES)
# devices that hold a file's bytes and run no kernels (tinygrad's `disk:`): named "DISK:<path>", one
# runtime per file; not compute devices, so not in DEVICES (nor in the test suite's device list)
FILE_DEVICES = {"DISK": "tgrad.runtime.disk:DiskRuntime"}
# devices that run another one's code on other hardware: where that hardware is missing they are
# exercised through the device named here (the test suite runs TRITON for CUDA and AMD, CL for QCOM)
VARIANT_OF = {"CUDA": "TRITON", "AMD": "TRITON", "QCOM": "CL"}
ALIASES = {"GPU": "CL", "OPENCL": "CL", "WGPU": "WEBGPU"}


def cache_dir() -> Path | None:
    """Where compiled kernels are kept, an absolute path: TGRAD_CACHE (a directory, or 0 for no disk
    cache), else $XDG_CACHE_HOME/tgrad when that is an absolute path (the XDG rule: an empty or relative
    one is ignored), else ~/.cache/tgrad. A directory named tgrad in an import path (the working directory,
    a sys.path entry) would shadow the package on the next `import tgrad`: it is refused with a warning."""
    value = config.get("TGRAD_CACHE")
    if value == "0":
        return None
    default = Path.home() / ".cache" / "tgrad"
    if value and value != "1":
        path = Path(value).expanduser().absolute()
    else:
        xdg = config.get("XDG_CACHE_HOME")
        path = Path(xdg) / "tgrad" if xdg and Path(xdg).is_absolute() else default
    if path.name == "tgrad" and path != default:
        imports = {Path(p or os.getcwd()).absolute() for p in sys.path} | {Path.cwd()}
        if path.parent in imports:
            warnings.warn(f"tgrad: a kernel cache at {path} would shadow the tgrad package on import; "
                          f"using {default} (set TGRAD_CACHE to another directory)", stacklevel=2)
            return default
    return path


class Stats:
    """Counters the tests, DEBUG and the bench read: kernels launched, live device bytes and their
    high-water mark since the last `reset_peak()`."""

    kernels_run = 0
    live_bytes = 0
    live_buffers = 0
    peak_live_bytes = 0

    @staticmethod
    def reset_peak() -> int:
        """Start a new high-water mark at the bytes live now (returned)."""
        Stats.peak_live_bytes = Stats.live_bytes
        return Stats.live_bytes


class Buffer:
    """A device allocation of `size` elements of `dtype`. `data` is the device's handle (a numpy array
    on the host devices, a pyopencl / wgpu buffer or a torch tensor elsewhere)."""

    # True for a kernel's result: the graph is hash-consed, so several tensors may hold the node it is the
    # value of, and an assign() to one of them writes a buffer of its own instead (Tensor.assign)
    computed = False

    def __init__(self, device: str, size: int, dtype: DType, data=None):
        self.device, self.size, self.dtype = device, size, dtype
        self.data = data if data is not None else np.empty(size, dtype.np)
        Stats.live_bytes += size * dtype.itemsize
        Stats.live_buffers += 1
        Stats.peak_live_bytes = max(Stats.peak_live_bytes, Stats.live_bytes)

    # a runtime that pools memory sets this to a function taking `data` back (called once, when the Buffer
    # is freed)
    on_free: Callable | None = None

    def __del__(self) -> None:  # (not weakref.finalize: dearer per buffer; an eager step frees dozens)
        try:
            Stats.live_bytes -= self.size * self.dtype.itemsize
            Stats.live_buffers -= 1
            if self.on_free is not None:
                self.on_free(self.data)
        except (AttributeError, TypeError):  # at interpreter exit, module globals may be gone already
            pass

    def numpy(self) -> np.ndarray:
        """The contents as a numpy array (copied back from the device where the data lives there)."""
        return get_runtime(self.device).to_numpy(self)

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.dtype.name}[{self.size}]>"


class Runner:
    """A compiled kernel: call it with the output buffer, then the kernel's input buffers."""

    opts: tuple = ()  # the optimizer's choices it was rendered with (DEBUG=2 prints them)

    def __init__(self, program: Program, fn: Callable[..., None], device: str):
        self.program, self.fn, self.device = program, fn, device
        self.name, self.source = program.name, program.source

    def __call__(self, out: Buffer, *inputs: Buffer) -> None:
        self.fn(out, *inputs)

    def build(self) -> bool:
        """Make now what the first call would make (a CPU row group's function: compiled, or loaded from
        the kernel cache); True if that happened now. realize times it apart from the run, so that DEBUG=2
        does not report a process's first call of a row group as kernel time."""
        build = getattr(self.fn, "build", None)
        return bool(build is not None and build())


class Runtime:
    """One device's runtime. A subclass sets `name` and implements `render` (its emitter) and `compile`;
    the host-memory defaults of alloc / from_numpy / to_numpy suit devices that keep numpy arrays."""

    name = "?"
    # True for a device that evaluates graphs itself instead of running fused kernels (the NUMPY
    # reference): the driver hands it the nodes to compute (`evaluate`)
    evaluates_graphs = False

    def __init__(self):
        self.runners: dict = {}  # Kernel -> Runner
        self.optimized: dict = {}  # Kernel -> the Kernel with this device's opts
        # what the optimizer knows of this device (a subclass sets its limits and tuning defaults)
        self.props = DeviceProps(self.name, kind="host")

    def supports(self, dtype: DType) -> bool:
        """Whether this device holds and computes `dtype` (where not, using it raises a DTypeError).
        bfloat16 lives on the host devices (CPU, NUMPY) only, fp8 on NUMPY only."""
        if dtype in dtypes.fp8s:
            return self.name in dtypes.FP8_DEVICES
        return dtype not in dtypes.HOST_FLOATS or self.name in dtypes.HOST_DEVICES

    def alloc(self, size: int, dtype: DType) -> Buffer:
        return Buffer(self.name, size, dtype)

    # (bytes, what sets them): the largest buffer this device can hold, found on first use (buffer_limit)
    max_buffer: tuple[int, str] | None = None

    def buffer_limit(self) -> tuple[int, str]:
        """The largest buffer this device can hold, in bytes, and what sets that limit (for the message of
        an OutOfMemoryError). Host memory here: the machine's memory and swap, which every byte of a buffer
        a kernel writes must fit in; a device with memory of its own overrides it."""
        if self.max_buffer is None:
            self.max_buffer = host_memory_limit()
        return self.max_buffer

    def buffer_bytes(self, size: int, dtype: DType) -> int:
        """The bytes a buffer of `size` elements of `dtype` takes on this device."""
        return size * dtype.itemsize

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        return Buffer(self.name, flat.size, dtypes.from_any(flat.dtype), flat.copy())

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        return buf.data

    def runner(self, kernel) -> Runner:
        """The kernel compiled for this device (rendered and compiled once per kernel)."""
        hit = self.runners.get(kernel)
        if hit is None:
            optimized = self.optimize(kernel)
            hit = self.runners[kernel] = self.compile(self.render(optimized), optimized)
            if optimized.opts:
                hit.opts = optimized.opts
        return hit

    def set_props(self, props: DeviceProps) -> None:
        """Give the optimizer other properties for this device (e.g. HostTuning values to try): kernels
        compiled from now on use them (what was chosen with the old ones is forgotten; a TinyJit's capture
        keeps its kernels)."""
        self.props = props
        self.optimized.clear()
        self.runners.clear()
        schedule_cache.clear()

    def optimize(self, kernel):
        """The kernel with the opts the optimizer chooses for this device (opt/), chosen once per kernel:
        the heuristic's, or with BEAM=n the fastest a search finds (opt/search.py)."""
        hit = self.optimized.get(kernel)
        if hit is None:
            hit = optimize(kernel, self.props)
            width = int(config.get("BEAM"))
            if width > 0 and not kernel.opts:  # (a kernel given its opts keeps them)
                hit = search.beam(hit, self, width, cache_dir())
            self.optimized[kernel] = hit
        return hit

    def batch(self, launches: list[tuple], varying: set[int]) -> Callable[[dict], None] | None:
        """TinyJit's replay of consecutive launches [(runner, out, inputs)] of this device as one callable
        taking the replay's buffer map (id of a captured buffer -> the buffer this call uses; `varying` are
        the ids it may map), where the runtime can do better than calling each runner (the CPU: one native
        call for a run of compiled functions); None: the runners are called one by one."""
        return None

    def render(self, kernel) -> Program:
        """The kernel as source for this device (a call to the device's emitter)."""
        raise NotImplementedError

    def compile(self, program: Program, kernel) -> Runner:
        raise NotImplementedError

    def prepare(self, kernels: list, groups: list = ()) -> None:
        """Called with the kernels a schedule will compile and the row groups (the Runners of its plan)
        it will run, before it runs (the CPU compiles them in parallel)."""

    def plan(self, items: list, requested: list) -> tuple[dict, set]:
        """How this device runs a schedule's items beyond one runner each (realize.run_schedule asks every
        device of a schedule): {index of a group's last item: (a Runner for the group, the nodes it takes
        after the last item's output, index of its first item)} for runs of consecutive items it runs as
        one, and the indices of items whose output only such a group needs (it gets no buffer). The
        default: none (the CPU's row groups and piece pairs: runtime/cpu/groups.py)."""
        return {}, set()

    def evaluate(self, nodes: list) -> None:
        """(evaluates_graphs devices only) compute the nodes' values into buffers."""
        raise NotImplementedError

    def synchronize(self) -> None:
        pass


def host_memory_limit() -> tuple[int, str]:
    """(bytes, description) of this machine's memory and swap (/proc/meminfo; else sysconf's pages)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.count(":") == 1}
        total = info["MemTotal"] + info.get("SwapTotal", 0)
    except (OSError, KeyError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return 2**63 - 1, "no limit known"
    return total, f"this machine's memory and swap ({byte_size(total)})"


def check_memory(rt: Runtime, shape: tuple[int, ...], dtype: DType, what: str | Callable[[], str]) -> None:
    """Raise an OutOfMemoryError, before anything is allocated or computed, when a tensor of `shape` and
    `dtype` (`what` made it: "random draw", a kernel's name; or a function giving that, called only for
    the message) cannot fit in one buffer on `rt`'s device."""
    size = 1
    for n in shape:
        size *= n
    nbytes = rt.buffer_bytes(size, dtype)
    limit, why = rt.buffer_limit()
    if nbytes > limit:
        what = what if isinstance(what, str) else what()
        raise OutOfMemoryError(f"{what}: a tensor of shape {tuple(shape)} and dtype {dtype.name} needs "
                               f"{byte_size(nbytes)} on {rt.name}, more than {why}")


def out_of_memory(e: BaseException, rt: Runtime, shape: tuple[int, ...], dtype: DType,
                  what: str) -> OutOfMemoryError:
    """The OutOfMemoryError to raise (from `e`) where an allocation of that tensor failed on `rt`'s device
    (a MemoryError from numpy, or one a runtime made of its driver's error)."""
    if isinstance(e, OutOfMemoryError):
        return e
    size = 1
    for n in shape:
        size *= n
    nbytes = rt.buffer_bytes(size, dtype)
    return OutOfMemoryError(f"{what}: out of memory on {rt.name} for a tensor of shape {tuple(shape)} and "
                            f"dtype {dtype.name} ({byte_size(nbytes)}): {type(e).__name__}: {e}")


_runtimes: dict[str, Runtime] = {}
_opening = threading.RLock()  # held while a runtime opens (get_runtime)


def canonical(name: str) -> str:
    """'cpu', 'CPU:0', 'cl' -> 'CPU', 'CL'; unknown names raise a DeviceError listing the known ones. A
    tuple of one device is that device (tinygrad's multi-device form); of several, a DeviceError."""
    if isinstance(name, tuple):
        if len(name) != 1:
            raise DeviceError(f"device={name!r}: a tensor on several devices (tinygrad's shard) is not "
                              "supported; pass one device")
        name = name[0]
    base = str(name).split(":")[0].upper()
    base = ALIASES.get(base, base)
    if base in FILE_DEVICES:  # "disk:/path": the path is part of the name (one device per file)
        path = str(name)[len(base) + 1 :]
        if not path:
            raise DeviceError(f"device {name!r}: a disk device names its file, as 'disk:/path/to/file'")
        return f"{base}:{os.path.abspath(os.path.expanduser(path))}"
    if base not in RUNTIMES:
        raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)} and "
                          "'disk:<path>' (a file's bytes)")
    return base


def is_disk(name: str) -> bool:
    """Whether a canonical device name is a file's (DISK:<path>)."""
    return name.startswith("DISK:")


def get_runtime(name: str) -> Runtime:
    """The runtime of a device, opened on first use (a DeviceError says why one cannot open). Opening
    holds a lock: two threads that both made a first tensor opened two CPU runtimes, and the one dropped
    freed the code of kernels the other thread was running (a segfault), or restarted OpenBLAS's threads
    under the other thread's matmul (a hang)."""
    rt = _runtimes.get(name)  # (a canonical name, the usual case: ~80 calls an eager MLP step)
    if rt is not None:
        return rt
    name = canonical(name)
    rt = _runtimes.get(name)
    if rt is None:
        with _opening:
            rt = _runtimes.get(name)
            if rt is None:
                rt = _runtimes[name] = _open(name)
    return rt


def _open(name: str) -> Runtime:
    if is_disk(name):
        module_name, cls_name = FILE_DEVICES["DISK"].split(":")
        return getattr(importlib.import_module(module_name), cls_name)(name)
    module_name, cls_name = RUNTIMES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("tgrad"):
            raise DeviceError(f"device {name} is not implemented in this version of tgrad") from e
        raise
    return getattr(module, cls_name)()


def default_device() -> str:
    """DEVICE=name, else the first of CPU=1, CL=1, ... set in the environment, else CPU."""
    if config.is_set("DEVICE"):
        name = canonical(config.get("DEVICE"))
        if is_disk(name):
            raise DeviceError(f"DEVICE={config.get('DEVICE')}: a disk device holds a file's bytes and "
                              f"computes nothing; choose a compute device ({', '.join(DEVICES)})")
        return name
    for name in DEVICES:
        if config.device_flag(name):
            return name
    return "CPU"


class _Registry:
    """`Device.DEFAULT` (the default device's name) like tinygrad, and `Device["CL"]` for a runtime."""

    @property
    def DEFAULT(self) -> str:  # noqa: N802 - tinygrad's name
        return default_device()

    def __getitem__(self, name: str) -> Runtime:
        return get_runtime(name)

    def canonicalize(self, name: str | None) -> str:
        return default_device() if name is None else canonical(name)


Device = _Registry()
