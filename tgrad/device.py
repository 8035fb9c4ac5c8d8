"""The runtime: device names, buffers, compiled programs and running a schedule.

A device turns a Kernel into a Program (compiled once per kernel, cached in memory and on disk) and
owns Buffers. `run_schedule` runs fused kernels in order; `realize` is the entry point tensors use.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import os
import pickle
import re
import sys
import time
import types
import warnings
import weakref
from pathlib import Path

import numpy as np

from tgrad.dtype import DType, dtypes
from tgrad.errors import DeviceError, KernelError, numbered
from tgrad.graph import Node, prod

DEBUG = int(os.environ.get("DEBUG", "0") or 0)
KNOWN_DEVICES = ("CPU", "NUMPY", "CUDA", "AMD", "TRITON", "CL", "QCOM", "METAL", "WEBGPU")


def getenv(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def cache_dir() -> Path | None:
    """Where compiled kernels are kept (TGRAD_CACHE: a directory, or 0 for no disk cache)."""
    value = getenv("TGRAD_CACHE")
    if value == "0":
        return None
    if value and value != "1":
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tgrad"


# TinyJit sets this to its log while it runs a function: every kernel launch is recorded with
# CAPTURE.launch(program, out buffer, input buffers, fresh=whether out was allocated for it, node)
CAPTURE: list | None = None


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
    """A device allocation of `size` elements of `dtype`. Host devices keep a numpy array."""

    def __init__(self, device: str, size: int, dtype: DType, data=None):
        self.device, self.size, self.dtype = device, size, dtype
        self.data = data if data is not None else np.empty(size, dtype.np)
        Stats.live_bytes += size * dtype.itemsize
        Stats.live_buffers += 1
        Stats.peak_live_bytes = max(Stats.peak_live_bytes, Stats.live_bytes)
        weakref.finalize(self, _release, size * dtype.itemsize)

    def numpy(self) -> np.ndarray:
        return self.data

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.dtype.name}[{self.size}]>"


def _release(nbytes: int) -> None:
    Stats.live_bytes -= nbytes
    Stats.live_buffers -= 1


class Program:
    """A compiled kernel: call it with the output buffer then the input buffers."""

    def __init__(self, name: str, source: str, fn, device: str):
        self.name, self.source, self.fn, self.device = name, source, fn, device

    def __call__(self, out: Buffer, *inputs: Buffer) -> None:
        self.fn(out, *inputs)


class Device:
    """A device runtime. Subclasses set `name` and implement alloc/copy-in/copy-out/compile."""

    name = "?"

    def __init__(self):
        self.programs: dict = {}

    def alloc(self, size: int, dtype: DType) -> Buffer:
        return Buffer(self.name, size, dtype)

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        return Buffer(self.name, flat.size, dtypes.from_any(flat.dtype), flat.copy())

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        return buf.data

    def program(self, kernel) -> Program:
        prg = self.programs.get(kernel)
        if prg is None:
            prg = self.programs[kernel] = self.compile(kernel)
        return prg

    def compile(self, kernel) -> Program:
        raise NotImplementedError

    def prepare(self, kernels: list) -> None:
        """Called with the kernels a schedule will compile, before it runs (the CPU compiles in parallel)."""

    def synchronize(self) -> None:
        pass


class NumpyDevice(Device):
    """The reference: evaluates the graph node by node with numpy (see tgrad/reference.py)."""

    name = "NUMPY"


# LLVM optimization level of kernel compiles: at 1 they still vectorize and ran as fast as at Numba's
# default 3 in bench/ (elementwise, softmax, reductions), and compile about 20% faster
KERNEL_OPT = 1


@contextlib.contextmanager
def _numba_opt_level(level: int):
    """Numba's NUMBA_OPT for the compiles inside, under its compiler lock so no other compile sees it."""
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        saved = config.OPT
        config.OPT = config._OptLevel(str(level)) if hasattr(config, "_OptLevel") else level
        try:
            yield
        finally:
            config.OPT = saved


PAGE = 4096


def page_aligned(size: int, dtype) -> np.ndarray:
    """np.empty(size, dtype), starting on a page boundary when it is bigger than a page. A kernel that
    reads one array and writes another streams both; when the output starts a little after the input
    modulo 4 KiB (the usual case for two equal-size numpy allocations) each store looks to the CPU like
    it may feed a later load ("4K aliasing") and the loop runs up to 5x slower (softmax's last kernel:
    18 ms instead of 3.6, one thread). With every large buffer page-aligned, the offset is 0 and nothing
    stalls."""
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if nbytes <= PAGE:
        return np.empty(size, dtype)
    raw = np.empty(nbytes + PAGE, np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes].view(dtype)


# ---------------------------------------------------------------------------------------------------
# CPU kernels as native functions: Numba compiles them once (no Python wrappers), tgrad keeps their
# object code on disk and loads it with llvmlite alone, so a process with a warm cache never imports
# Numba (for serial kernels; threaded ones need Numba's threading layer, started on demand)

_RET, _EXC = (ctypes.c_void_p * 2)(), (ctypes.c_void_p * 2)()  # Numba's return-value and exception slots
_RET_OK = (0, -2)  # Numba's status codes for "returned" and "returned None"
_ADDRESSES: dict[int, tuple] = {}  # id(array) -> (weakref to the array, address of its data)


def _address(array: np.ndarray) -> int:
    """The data address of an array, remembered while the array lives (`.ctypes.data` costs ~1 us)."""
    hit = _ADDRESSES.get(id(array))
    if hit is not None and hit[0]() is array:
        return hit[1]
    key = id(array)
    addr = array.ctypes.data
    _ADDRESSES[key] = (weakref.ref(array, lambda _, key=key: _ADDRESSES.pop(key, None)), addr)
    return addr


@functools.cache
def _native_key() -> str:
    """What object code depends on besides the source: compiler versions, host CPU, optimization level."""
    from importlib.metadata import version

    import llvmlite.binding as llvm

    return "|".join([version("numba"), version("llvmlite"), llvm.get_host_cpu_name(),
                     llvm.get_host_cpu_features().flatten(), str(KERNEL_OPT), sys.platform])


@functools.cache
def _numba_runtime() -> None:
    """Start what Numba-compiled code may call into: its C helpers and math symbols (registered with its
    code generator) and its threading layer (parallel kernels)."""
    from numba.core.registry import cpu_target
    from numba.np.ufunc.parallel import _launch_threads

    cpu_target.target_context.codegen()
    _launch_threads()


def _load_object(entry: dict) -> tuple[object, int] | None:
    """Load cached object code into an execution engine of its own (so symbols of different kernels
    never meet) and return (engine, address of the kernel's function); None if a symbol it needs cannot
    be found, even with Numba's runtime started (the caller compiles the kernel again)."""
    import llvmlite.binding as llvm

    def missing() -> list[str]:
        return [s for s in entry["symbols"] if not s.startswith("llvm.") and not llvm.address_of_symbol(s)]

    # an unresolved symbol would abort the process inside LLVM: look each one up first. Elsewhere than
    # Linux and macOS, Numba maps the C math functions to the interpreter's C runtime itself: start it.
    if missing() or sys.platform not in ("linux", "darwin"):
        _numba_runtime()
        if missing():
            return None
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(jit=True)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
    engine.add_object_file(llvm.ObjectFileRef.from_data(entry["object"]))
    engine.finalize_object()
    return engine, engine.get_function_address(entry["name"])


def _declared_symbols(llvm_ir: str) -> list[str]:
    """Functions and globals an LLVM module uses but does not define (resolved when it is loaded)."""
    funcs = re.findall(r'^declare [^@]*@"?([^"(]+)"?\(', llvm_ir, re.M)
    globs = re.findall(r'^@"?([^"=\s]+)"? = external ', llvm_ir, re.M)
    return sorted(set(funcs) | set(globs))


@functools.cache
def _lean_pipeline():
    """Numba's nopython pipeline without the passes generated kernels never need (closures, with-blocks,
    literal unrolling, IR rewrites, inlining): straight-line loops over pointers and scalars."""
    from numba.core import compiler, typed_passes, untyped_passes
    from numba.core.compiler_machinery import PassManager

    class LeanKernelPipeline(compiler.CompilerBase):
        def define_pipelines(self):
            pm = PassManager("tgrad_kernel")
            for pass_ in (untyped_passes.TranslateByteCode, untyped_passes.FixupArgs,
                          untyped_passes.IRProcessing, untyped_passes.ReconstructSSA,
                          typed_passes.NopythonTypeInference, typed_passes.PreLowerStripPhis,
                          typed_passes.NoPythonSupportedFeatureValidation, typed_passes.IRLegalization,
                          typed_passes.AnnotateTypes, typed_passes.NativeLowering,
                          typed_passes.NoPythonBackend):
                pm.add_pass(pass_, pass_.__name__)
            pm.finalize()
            return [pm]

    return LeanKernelPipeline


def _compile_native(source: str, fname: str, modname: str, storage: tuple[DType, ...], n_ints: int) -> dict:
    """Compile a kernel's source with Numba as a native function over raw pointers (then `n_ints` int64
    arguments), without the Python and C wrappers Numba adds for calls from Python (a third of the
    compile time). Returns what the disk cache keeps (function name, object code, the symbols it needs)
    and the loaded function: its Numba code library (which keeps the code alive) and address."""
    import numba
    from numba.core import compiler
    from numba.core import types as nt
    from numba.core.registry import cpu_target

    module = types.ModuleType(modname)
    sys.modules[modname] = module  # Numba looks functions' modules up by name
    exec(compile(source, f"<tgrad kernel {fname}>", "exec"), module.__dict__)
    pyfunc = module.__dict__[fname]
    options = {"nopython": True, "error_model": "numpy", "no_cpython_wrapper": True, "no_cfunc_wrapper": True}
    flags = cpu_target.options.parse_as_flags(compiler.Flags(), {**options, **pyfunc.numba_options})
    flags.no_compile = True  # no Python-callable function object: tgrad calls the address
    args = [nt.CPointer(numba.from_dtype(d.np)) for d in storage] + [nt.int64] * n_ints
    with _numba_opt_level(KERNEL_OPT):
        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
        pipeline = compiler.Compiler if flags.auto_parallel.enabled else _lean_pipeline()
        cres = compiler.compile_extra(cpu_target.typing_context, cpu_target.target_context, pyfunc,
                                      tuple(args), nt.void, flags, {}, pipeline_class=pipeline)
        library, name = cres.library, cres.fndesc.llvm_func_name
        address = library.get_pointer_to_function(name)
        obj = library.serialize_using_object_code()[2][0]
    return {"name": name, "object": obj, "symbols": _declared_symbols(library.get_llvm_str()),
            "library": library, "address": address}


def _on_disk(entry: dict) -> dict:
    """What the disk cache keeps of a compiled kernel (and what a compile worker sends back)."""
    return {k: entry[k] for k in ("name", "object", "symbols")}


def compile_object(source: str, fname: str, modname: str, storage: list[str], n_ints: int) -> dict:
    """What a compile worker (tgrad/compile_pool.py) returns: the disk-cache entry of one kernel."""
    return _on_disk(_compile_native(source, fname, modname, tuple(map(dtypes.from_any, storage)), n_ints))


def _write_entry(path: Path | None, entry: dict) -> None:
    """Keep a compiled kernel on disk; a cache that cannot be written is warned about once, not fatal."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(_on_disk(entry)))
        os.replace(tmp, path)
    except OSError as e:
        if path.parent not in _UNWRITABLE:
            _UNWRITABLE.add(path.parent)
            warnings.warn(f"tgrad: cannot write compiled kernels to {path.parent} ({e}); kernels are "
                          "compiled again in each process. Set TGRAD_CACHE to a writable directory (or 0 for "
                          "none).", stacklevel=2)


_UNWRITABLE: set = set()


def _cached(path: Path | None) -> bool:
    try:
        return path is not None and path.is_file()
    except OSError:  # an unreadable cache directory counts as empty
        return False


def _cold_cache() -> bool:
    """No compiled CPU kernel on disk yet (or no disk cache): compile workers are worth starting early."""
    cdir = cache_dir()
    try:
        return cdir is None or next((cdir / "cpu").glob("*.pkl"), None) is None
    except OSError:
        return True


@dataclasses.dataclass(frozen=True)
class _Native:
    """One native function a CPU kernel needs: its source and how it is called and cached."""

    fname: str
    source: str
    digest: str  # of the source
    used: tuple[int, ...]  # the kernel inputs it reads
    scratch: tuple[tuple[int, np.dtype], ...]  # scratch arrays it takes after the inputs
    extra: tuple[int, ...]  # int64 arguments last (the length of a flat kernel)
    storage: tuple[DType, ...]  # pointer element types: output, used inputs, scratch
    path: Path | None  # its disk-cache entry

    @property
    def key(self) -> tuple:  # the same source serves buffers of other dtypes (a copy): one function each
        return (self.digest, *self.storage, len(self.extra))

    @property
    def job(self) -> tuple:  # the arguments of compile_object
        return (self.source, self.fname, f"tgrad_kernel_{self.digest}", [d.name for d in self.storage],
                len(self.extra))


class CPUDevice(Device):
    """Kernels rendered by emit_numba, compiled by Numba to native functions, called through ctypes."""

    name = "CPU"

    def __init__(self):
        super().__init__()
        self.functions: dict[tuple, tuple] = {}  # _Native.key -> (ctypes function, what keeps it alive)
        if importlib.util.find_spec("numba") is None:  # imported only to compile (a warm cache needs none)
            raise DeviceError("the CPU device needs numba: pip install numba")
        from tgrad import compile_pool

        self.pool = compile_pool.CompilePool()  # compile workers (none started yet)
        if _cold_cache():  # start them now: their set-up overlaps the program's own start
            self.pool.start(compile_pool.default_workers())

    def alloc(self, size: int, dtype: DType) -> Buffer:
        return Buffer(self.name, size, dtype, page_aligned(size, dtype.np))

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        data = page_aligned(flat.size, flat.dtype)
        data[:] = flat
        return Buffer(self.name, flat.size, dtypes.from_any(flat.dtype), data)

    def prepare(self, kernels: list) -> None:
        """Before a schedule runs: queue the native functions it needs that are neither in memory nor on
        disk for the compile workers, which compile from the back while this process compiles from the
        front (see compile_pool.py)."""
        from tgrad import compile_pool, emit_numba

        if len(kernels) < 2 or not compile_pool.default_workers():
            return
        jobs: dict[tuple, tuple] = {}
        for kernel in kernels:
            plan = emit_numba.blas_plan(kernel)
            for part in [kernel] if plan is None else [*plan.prologues, *filter(None, [plan.epilogue])]:
                nat = self._native(part)
                if nat.key not in self.functions and not _cached(nat.path):
                    jobs[nat.key] = nat.job
        if len(jobs) >= compile_pool.MIN_JOBS_TO_START:
            self.pool.start(compile_pool.default_workers())
        if self.pool.live and len(jobs) >= 2:
            self.pool.submit(list(jobs.items()))

    def compile(self, kernel) -> Program:
        from tgrad import emit_numba

        plan = emit_numba.blas_plan(kernel)
        prologues = [self._build(p)[0] for p in plan.prologues] if plan is not None else []
        if plan is None:
            fn, source = self._build(kernel)
        elif plan.epilogue is not None:
            fn, source = self._build(plan.epilogue)
            source = f"# {kernel.name}: the reduce is a BLAS matmul (see emit_numba.blas_plan)\n{source}"
        else:
            fn, source = None, f"# {kernel.name}: a BLAS matmul (see emit_numba.blas_plan)\n"
        widen = [d == dtypes.float16 for d in (kernel.out_dtype, *kernel.in_dtypes)]
        any_widen = any(widen)

        def run(out: Buffer, *inputs: Buffer) -> None:
            try:
                if plan is None and not any_widen:  # the common case, first
                    fn(out.data, *[b.data for b in inputs])
                    return
                args = [b.data.astype(np.float32) if w else b.data for b, w in zip((out, *inputs), widen)]
                if plan is None:
                    fn(*args)
                else:
                    operands = list(args[1:])
                    for pk, pfn in zip(plan.prologues, prologues):
                        operands.append(np.empty(prod(pk.shape), emit_numba.storage_dtype(pk.out_dtype).np))
                        pfn(operands[-1], *args[1:])
                    if fn is None:  # BLAS writes the output itself when the layout allows
                        acc = emit_numba.run_blas(plan, kernel, operands, out=args[0])
                        if acc is not None:
                            args[0][:] = acc
                    else:
                        acc = emit_numba.run_blas(plan, kernel, operands)
                        fn(*args, acc)
            except Exception as e:
                raise KernelError(
                    f"kernel {kernel.name} failed to run: {type(e).__name__}: {e}\n{numbered(source)}"
                ) from e
            if widen[0]:
                out.data[:] = args[0]

        return Program(kernel.name, source, run, self.name)

    def _native(self, kernel) -> _Native:
        from tgrad import emit_numba

        fname = emit_numba.function_name(kernel)
        parallel = emit_numba.want_parallel(kernel)
        source = emit_numba.HEADER + "\n\n" + emit_numba.render(kernel, fname, parallel)
        used = emit_numba.used_inputs(kernel)
        scratch = [(size, emit_numba.storage_dtype(dt))
                   for _, size, dt in emit_numba.scratch(emit_numba.compact(kernel), parallel)]
        # a flat kernel takes its length last
        extra = (prod(kernel.shape),) if emit_numba.flatten(kernel) is not None else ()
        ins = [emit_numba.storage_dtype(kernel.in_dtypes[i]) for i in used]
        storage = (emit_numba.storage_dtype(kernel.out_dtype), *ins, *(d for _, d in scratch))
        path, cdir = None, cache_dir()
        if cdir is not None:
            signature = ",".join(d.name for d in storage) + f"+{len(extra)}"
            name = hashlib.sha256(f"{source}\0{signature}\0{_native_key()}".encode()).hexdigest()[:32]
            path = cdir / "cpu" / f"{name}.pkl"
        digest = hashlib.sha256(source.encode()).hexdigest()[:20]
        scratch_np = tuple((size, d.np) for size, d in scratch)
        return _Native(fname, source, digest, used, scratch_np, extra, storage, path)

    def _build(self, kernel):
        """A callable running one kernel on numpy arrays (the output, then every input of the kernel),
        and the kernel's source. Kernels with the same source (flattened elementwise kernels of different
        lengths) and dtypes share one compiled function."""
        nat = self._native(kernel)
        hit = self.functions.get(nat.key)
        if hit is None:
            hit = self.functions[nat.key] = self._load(kernel, nat)
        native, ret, exc = hit[0], ctypes.addressof(_RET), ctypes.addressof(_EXC)
        used, scratch, extra = nat.used, nat.scratch, nat.extra
        address, pool = _address, []  # scratch arrays between launches (pop/append are atomic)

        def call(out: np.ndarray, *inputs: np.ndarray) -> None:
            ptrs = [address(out)]
            for i in used:
                ptrs.append(address(inputs[i]))
            if not scratch:
                status = native(ret, exc, *ptrs, *extra)
            else:
                tmp = pool.pop() if pool else [np.empty(size, dt) for size, dt in scratch]
                status = native(ret, exc, *ptrs, *map(address, tmp), *extra)
                pool.append(tmp)
            if status not in _RET_OK:
                raise RuntimeError(f"the compiled function returned error status {status}")

        return call, nat.source

    def _load(self, kernel, nat: _Native):
        """The kernel's native function as a ctypes function (and what keeps its code alive): from the
        disk cache when it is there, else from a compile worker, else compiled here by Numba (and written
        to the cache)."""
        loaded = None
        if _cached(nat.path):
            try:
                loaded = _load_object(pickle.loads(nat.path.read_bytes()))
            except Exception:  # a damaged or foreign cache file: compile again and overwrite it
                loaded = None
        if loaded is None:
            entry = self.pool.claim(nat.key)
            loaded = _load_object(entry) if entry is not None else None
            if loaded is not None:
                _write_entry(nat.path, entry)
        if loaded is None:
            try:
                entry = _compile_native(nat.source, nat.fname, f"tgrad_kernel_{nat.digest}", nat.storage,
                                        len(nat.extra))
            except Exception as e:
                raise KernelError(
                    f"kernel {kernel.name} failed to build: {type(e).__name__}: {e}\n{numbered(nat.source)}"
                ) from e
            _write_entry(nat.path, entry)
            loaded = entry["library"], entry["address"]
        keep, address = loaded
        args = [ctypes.c_void_p] * (2 + len(nat.storage)) + [ctypes.c_int64] * len(nat.extra)
        # called holding the GIL, like a Numba dispatcher (threaded kernels release it inside)
        proto = ctypes.PYFUNCTYPE(ctypes.c_int32, *args)
        return proto(address), keep


_devices: dict[str, Device] = {}
_ALIASES = {"GPU": "CL", "OPENCL": "CL", "WGPU": "WEBGPU"}


def canonical(name: str) -> str:
    """'cpu', 'CPU:0', 'cl' -> 'CPU', 'CL'; unknown names raise a DeviceError listing the known ones."""
    base = str(name).split(":")[0].upper()
    base = _ALIASES.get(base, base)
    if base not in KNOWN_DEVICES:
        raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(KNOWN_DEVICES)}")
    return base


def get_device(name: str) -> Device:
    name = canonical(name)
    dev = _devices.get(name)
    if dev is None:
        dev = _devices[name] = _open(name)
    return dev


# device name -> "module:class" of its runtime; each runtime lives beside its emitter
RUNTIMES = {
    "CPU": "tgrad.device:CPUDevice",
    "NUMPY": "tgrad.device:NumpyDevice",
    "CL": "tgrad.emit_opencl:CLDevice",
    "QCOM": "tgrad.emit_opencl:QCOMDevice",
    "METAL": "tgrad.emit_opencl:MetalDevice",
    "WEBGPU": "tgrad.emit_wgsl:WebGPUDevice",
    "CUDA": "tgrad.emit_triton:CUDADevice",
    "AMD": "tgrad.emit_triton:AMDDevice",
    "TRITON": "tgrad.emit_triton:TritonDevice",
}


def _open(name: str) -> Device:
    module_name, cls_name = RUNTIMES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("tgrad"):
            raise DeviceError(f"device {name} is not implemented in this version of tgrad") from e
        raise
    return getattr(module, cls_name)()


def default_device() -> str:
    if getenv("DEVICE"):
        return canonical(getenv("DEVICE"))
    for name in KNOWN_DEVICES:
        if getenv(name) == "1":
            return name
    return "CPU"


class _DeviceRegistry:
    """`Device.DEFAULT` like tinygrad, and `Device["CL"]` for a runtime."""

    @property
    def DEFAULT(self) -> str:  # noqa: N802 - tinygrad's name
        return default_device()

    def __getitem__(self, name: str) -> Device:
        return get_device(name)

    def canonicalize(self, name: str | None) -> str:
        return default_device() if name is None else canonical(name)


Device_ = _DeviceRegistry()


# ---------------------------------------------------------------------------------------------------
# running


def run_schedule(items) -> None:
    t_all = time.perf_counter()
    new: dict[Device, list] = {}  # kernels to compile, by device (the CPU compiles them in parallel)
    for it in items:
        dev = get_device(it.out.device)
        if it.kernel not in dev.programs and (prod(it.kernel.global_shape) > 0 or not it.kernel.shape):
            new.setdefault(dev, []).append(it.kernel)
    for dev, kernels in new.items():
        dev.prepare(kernels)
    for it in items:
        dev = get_device(it.out.device)
        k = it.kernel
        if it.target is not None:
            out = it.target.buffer
        else:
            out = dev.alloc(prod(it.out.shape), it.out.dtype)
        if prod(k.global_shape) > 0 or not k.shape:
            prg = dev.program(k)
            if DEBUG >= 3:
                print(
                    f"kernel {k.name}: shape {k.shape} global {k.global_shape} reduce {k.reduce_op}\n"
                    f"  expr {k.expr!r}\n  reduce {k.reduce_expr!r}",
                    file=sys.stderr,
                )
            if DEBUG >= 4:
                print(prg.source, file=sys.stderr)
            t0 = time.perf_counter()
            inputs = [n.buffer for n in it.inputs]
            prg(out, *inputs)
            Stats.kernels_run += 1
            if CAPTURE is not None:
                CAPTURE.launch(prg, out, inputs, fresh=it.target is None, node=it.out)
            if DEBUG >= 2:
                dev.synchronize()
                dt = time.perf_counter() - t0
                nbytes = out.size * out.dtype.itemsize + sum(
                    n.buffer.size * n.dtype.itemsize for n in it.inputs
                )
                flops = prod(k.shape)
                print(
                    f"  {dev.name:6s} {k.name:30s} {str(k.shape):24s} {dt * 1e3:9.3f} ms "
                    f"{flops / dt / 1e9 if dt else 0:8.2f} GFLOP/s "
                    f"{nbytes / dt / 1e9 if dt else 0:8.2f} GB/s",
                    file=sys.stderr,
                )
        it.out.buffer = out
    if DEBUG >= 1 and items:
        print(
            f"realize: {len(items)} kernels in {(time.perf_counter() - t_all) * 1e3:.2f} ms", file=sys.stderr
        )


def realize(nodes: list[Node]) -> None:
    """Compute every node (grouped by device); movement ops over realized nodes stay views."""
    from tgrad import fuse, reference

    by_device: dict[str, list[Node]] = {}
    for n in nodes:
        by_device.setdefault(n.device, []).append(n)
    for device, group in by_device.items():
        if device == "NUMPY":
            reference.realize(group)
        else:
            run_schedule(fuse.schedule(group))


def to_numpy(node: Node) -> np.ndarray:
    """The value of a realized node (or of movement ops over one) as a numpy array."""
    from tgrad import reference

    realize([node])
    return reference.evaluate_views(node, lambda b: get_device(b.device).to_numpy(b.buffer))
