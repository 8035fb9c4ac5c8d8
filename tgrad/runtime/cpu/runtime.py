"""The CPU runtime: kernels rendered by emit_numba, compiled by Numba to native functions, called through
ctypes; matmul-shaped kernels run as BLAS calls (numpy.matmul, blas.py) with generated code around them.

Numba compiles each function once (compile.py: no Python wrappers), tgrad keeps its object code on disk
(`TGRAD_CACHE/cpu`) and loads it with llvmlite alone, so a process with a warm cache never imports Numba.
Threaded kernels run ranges of the outer loop on tgrad's threads (`batch.Threads`: threads.py's native
workers, else Python's). With a cold cache, compile workers (pool.py) build part of a schedule's new kernels.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import math
import pickle
import sys
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tgrad import blas, config, emit_numba, emit_numba_conv
from tgrad.cachefiles import write_atomic
from tgrad.device import Buffer, Runner, Runtime, cache_dir
from tgrad.dtype import DType, dtypes
from tgrad.emit_numba import BlasPlan
from tgrad.errors import DeviceError, KernelError, numbered
from tgrad.fuse import Kernel
from tgrad.opt import host
from tgrad.opt.opts import DeviceProps
from tgrad.program import Program
from tgrad.runtime.cpu import batch as cpu_batch
from tgrad.runtime.cpu import gemm as cpu_gemm
from tgrad.runtime.cpu import groups as cpu_groups
from tgrad.runtime.cpu import pool as cpu_pool
from tgrad.runtime.cpu import threads as cpu_threads
from tgrad.runtime.cpu.blas import BlasCall, DirectConv, Tiered, _view, openblas_idle_timeout
from tgrad.runtime.cpu.compile import (
    KERNEL_OPT,
    cacheable,
    compile_native,
    cpu_features,
    on_disk,
    use_cpu_features,
    vector_bytes,
)
from tgrad.runtime.cpu.memory import MIN_KEEP, HostMemory, cache_bytes
from tgrad.runtime.cpu.pool import threads

# ---------------------------------------------------------------------------------------------------
# native functions: loaded from object code, called through ctypes

_RET, _EXC = (ctypes.c_void_p * 2)(), (ctypes.c_void_p * 2)()  # Numba's return-value and exception slots
_SLOTS = (ctypes.addressof(_RET), ctypes.addressof(_EXC))  # (serial kernels run holding the GIL)


# direct convolutions (emit_numba_conv) run their BLAS path until a compile worker has their function (see
# CPURuntime._when_ready); False (TGRAD_BACKGROUND_COMPILES=0): the first call waits for it, so that a run's
# values do not depend on when a worker finished (the two paths round differently)
TIERED = config.on("TGRAD_BACKGROUND_COMPILES")


_THREADS = cpu_batch.Threads()


@functools.cache
def _native_key() -> str:
    """What object code depends on besides the source: compiler versions, host CPU and the target features
    kernels compile for, optimization level."""
    from importlib.metadata import version

    import llvmlite.binding as llvm

    return "|".join([version("numba"), version("llvmlite"), llvm.get_host_cpu_name(), cpu_features(),
                     str(KERNEL_OPT), sys.platform, "checked-features"])  # (older entries may not be)


@functools.cache
def _numba_runtime() -> None:
    """Start what Numba-compiled code may call into: its C helpers and math symbols (registered with its
    code generator)."""
    use_cpu_features()  # before Numba's code generator exists: later compiles in this process use them
    from numba.core.registry import cpu_target

    cpu_target.target_context.codegen()


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


def _write_entry(path: Path | None, entry: dict) -> None:
    """Keep a compiled kernel on disk (when it was compiled for what the key says, `cacheable`); a cache that
    cannot be written is warned about once, not fatal."""
    if path is None:
        return
    if not cacheable(entry):
        if not _UNCACHED:
            _UNCACHED.append(path)
            warnings.warn("tgrad: Numba compiled a function in this process before tgrad's first CPU kernel, "
                          "so this process's kernels compile for other CPU features than tgrad's cache "
                          "names and are not kept on disk (import tgrad and run a kernel first, or set "
                          "NUMBA_CPU_FEATURES)", stacklevel=2)
        return
    try:
        write_atomic(path, pickle.dumps(on_disk(entry)))
    except OSError as e:
        if path.parent not in _UNWRITABLE:
            _UNWRITABLE.add(path.parent)
            warnings.warn(f"tgrad: cannot write compiled kernels to {path.parent} ({e}); kernels are "
                          "compiled again in each process. Set TGRAD_CACHE to a writable directory (or 0 for "
                          "none).", stacklevel=2)


_UNWRITABLE: set = set()
_UNCACHED: list = []  # warned once: kernels compiled for other features than the cache key names


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
    """One native function a CPU kernel needs: its Program and where it is cached."""

    program: Program
    digest: str  # of the source
    path: Path | None  # its disk-cache entry

    @property
    def storage(self) -> tuple[DType, ...]:
        return self.program.launch["storage"]

    @property
    def key(self) -> tuple:  # the same source serves buffers of other dtypes (a copy): one function each
        return (self.digest, *self.storage, _n_ints(self.program))

    @property
    def job(self) -> tuple:  # the arguments of numba_compile.compile_object
        prg = self.program
        return (prg.source, prg.name, f"tgrad_kernel_{self.digest}", [d.name for d in self.storage],
                _n_ints(prg))


def _n_ints(program: Program) -> int:
    """The int64 arguments of a kernel's native function: its `args`, then lo, hi when it is threaded."""
    return len(program.args) + (2 if program.launch.get("split") else 0)


def _native(program: Program) -> _Native:
    path, cdir = None, cache_dir()
    storage = program.launch["storage"]
    if cdir is not None:
        signature = ",".join(d.name for d in storage) + f"+{_n_ints(program)}"
        name = hashlib.sha256(f"{program.source}\0{signature}\0{_native_key()}".encode()).hexdigest()[:32]
        path = cdir / "cpu" / f"{name}.pkl"
    return _Native(program, hashlib.sha256(program.source.encode()).hexdigest()[:20], path)


def _reads(members: tuple) -> tuple[int, ...]:
    """The inputs of a two-kernel group's second kernel that are the first's output."""
    (_, _, at), (_, ins, _) = members
    return tuple(j for j, p in enumerate(ins) if p == at)


def _with_prologues(plan: BlasPlan, prologues: list, inputs: list[np.ndarray], memory: HostMemory):
    """A BLAS kernel's operands: its inputs, then the computed ones its prologue functions make (arrays
    from `memory`, also returned as the scratch for the caller to release)."""
    operands, scratch = list(inputs), []
    for pk, pfn in zip(plan.prologues, prologues):
        scratch.append(memory.array(math.prod(pk.shape), emit_numba.storage_dtype(pk.out_dtype).np))
        operands.append(scratch[-1])
        pfn(scratch[-1], *inputs)
    return operands, scratch


def _functions(program: Program) -> list[Program]:
    """The generated functions a kernel's Program needs (a BLAS plan has some around the matmul)."""
    if "blas" not in program.launch:
        return [program]
    around = [program.launch["epilogue"], program.launch.get("direct")]
    return [*program.launch["prologues"], *filter(None, around)]


def _render(kernel: Kernel, props: DeviceProps) -> Program:
    return emit_numba_conv.render(kernel, vector_bytes(), threads(), props.host)


class CPURuntime(Runtime):
    """Kernels rendered by emit_numba, compiled by Numba to native functions, called through ctypes."""

    name = "CPU"

    def __init__(self):
        super().__init__()
        self.functions: dict[tuple, tuple] = {}  # _Native.key -> (ctypes function, what keeps it alive)
        self.native_calls: dict[int, tuple] = {}  # id(program) -> (program, ctypes function, address)
        self.rendered: dict[Kernel, Program] = {}  # rendered by prepare(), not compiled yet
        self.row_runners: dict = {}  # (members, sizes) -> Runner of a row group, or None: not one
        self.row_counts: dict[Kernel, int | None] = {}  # kernel -> rows, None: never in a row group
        self.piece_pairs: dict[tuple, blas.PiecePair | None] = {}  # (k1, k2, reads) -> blas.piece_pair
        self.seen_groups: weakref.WeakSet[Runner] = weakref.WeakSet()  # row groups prepare() has seen
        if importlib.util.find_spec("numba") is None:  # imported only to compile (a warm cache needs none)
            raise DeviceError("the CPU device needs numba: pip install numba")
        self.props = DeviceProps(self.name, kind="cpu", compute_units=threads(), cache_bytes=cache_bytes(),
                                 native_pieces=cpu_gemm.enabled())
        self.pool = cpu_pool.CompilePool()  # compile workers (none started yet)
        self.memory = HostMemory()  # buffers and BLAS operands, big blocks reused (cpu/memory.py)
        openblas_idle_timeout(self.props.host.openblas_idle)
        if _cold_cache():  # start them now: their set-up overlaps the program's own start
            self.pool.start(cpu_pool.default_workers())

    def set_props(self, props: DeviceProps) -> None:
        super().set_props(props)
        for plans in (self.rendered, self.row_runners, self.row_counts, self.piece_pairs):
            plans.clear()

    def alloc(self, size: int, dtype: DType) -> Buffer:
        return self._buffer(self.memory.array(size, dtype.np), dtype)

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        data = self.memory.array(flat.size, flat.dtype)
        data[:] = flat
        return self._buffer(data, dtypes.from_any(flat.dtype))

    def _buffer(self, data: np.ndarray, dtype: DType) -> Buffer:
        buf = Buffer(self.name, data.size, dtype, data)
        if data.nbytes >= MIN_KEEP:  # its block goes back to self.memory when the Buffer is gone
            buf.on_free = self.memory.release
        return buf

    def render(self, kernel: Kernel) -> Program:
        hit = self.rendered.pop(kernel, None)
        return hit if hit is not None else _render(kernel, self.props)

    def prepare(self, kernels: list, groups: list[Runner] = ()) -> None:
        """Before a schedule runs: queue the native functions it needs that are neither in memory nor on
        disk for the compile workers, which compile from the back while this process compiles from the
        front (see cpu/pool.py); the row groups' functions too, the first time each group comes (an eager
        step that finds its schedule cached brings the same groups again: hashing their sources and
        looking for their cache files was a measurable part of each eager MLP step)."""
        groups = [g for g in groups if g not in self.seen_groups]
        self.seen_groups.update(groups)
        if len(kernels) + len(groups) < 2 or not cpu_pool.default_workers():
            return
        parts, pieces = [], set()
        for kernel in map(self.optimize, kernels):
            program = self.rendered[kernel] = _render(kernel, self.props)
            # (a direct convolution's function is queued when it is compiled, as optional: _when_ready)
            parts += [f for f in _functions(program) if not (TIERED and f is program.launch.get("direct"))]
            plan = program.launch.get("blas")
            # (a direct conv's BLAS path runs too until its function is compiled, when TIERED)
            pieces_run = plan is not None and plan.chunk is not None
            pieces_run = pieces_run and (TIERED or "direct" not in program.launch)
            if pieces_run and kernel.out_dtype in (dtypes.float32, dtypes.float64):
                pieces.add(kernel.out_dtype)
        if pieces and cpu_gemm.enabled():  # the compiled conv pieces it may run (cpu/gemm.py)
            parts += [cpu_gemm.program(dt.np, name) for dt in pieces for name in cpu_gemm.PROGRAMS]
        jobs: dict[tuple, tuple] = {}
        parts += [f for group in groups for f in group.program.launch.get("parts", [group.program])]
        for part in parts:
            nat = _native(part)
            if nat.key not in self.functions and not _cached(nat.path):
                jobs[nat.key] = nat.job
        if len(jobs) >= cpu_pool.MIN_JOBS_TO_START:
            self.pool.start(cpu_pool.default_workers())
        if self.pool.live and len(jobs) >= 2:
            self.pool.submit(list(jobs.items()))

    def plan(self, items: list, requested: list) -> tuple[dict, set]:
        return cpu_groups.plan(self, items, requested)

    def row_count(self, kernel: Kernel) -> int | None:
        """The rows of a kernel that can be in a row group (emit_numba.row_count), remembered."""
        hit = self.row_counts.get(kernel, False)
        if hit is False:
            hit = self.row_counts[kernel] = emit_numba.row_count(self.optimize(kernel))
        return hit

    def rows_runner(self, members: tuple, sizes: tuple, aliases: tuple = ()) -> Runner | None:
        """Consecutive kernels as one function with one loop over rows (emit_numba.render_rows), or None
        when they do not work row by row; called with the group's output and then its inputs."""
        key = (members, sizes, aliases)
        hit = self.row_runners.get(key, False)
        if hit is False:
            if len(members) == 2 and self.pairs(members[0][0], members[1][0], _reads(members)):
                hit = self.row_runners[key] = self._pair_runner(members)
                return hit
            program = emit_numba.render_rows(list(members), dict(sizes), dict(aliases), self.props.host)
            runner = None
            if program is not None:
                runner = Runner(program, self._built_on_first_call(program), self.name)
            hit = self.row_runners[key] = runner
        return hit

    def pairs(self, first: Kernel, second: Kernel, reads: tuple[int, ...]) -> bool:
        key = (first, second, reads)
        hit = self.piece_pairs.get(key, False)
        if hit is False:
            hit = self.piece_pairs[key] = host.piece_pair(self.optimize(first), second, reads, self.props)
        return hit is not None

    def _pair_runner(self, members: tuple) -> Runner:
        """A piece pair (blas.piece_pair) as one Runner over the group's nodes (realize._group): k1's
        matmul in pieces of images (cpu_blas.BlasCall), each followed on its thread by k2's function over
        those images, its pointers moved to them."""
        (k1, ins1, at1), (k2, ins2, _) = members
        pair = self.piece_pairs[(k1, k2, _reads(members))]
        k1 = self.optimize(k1)
        plan = dataclasses.replace(host.plan_for(k1), chunk=pair.chunk)
        matmul = BlasCall(plan, k1, self._run_native)
        program = emit_numba.render_loops(pair.sub, False, self.props.host)
        built: list = []
        memory = self.memory
        made: list = []  # the functions of k1's computed operands (both ways need them)

        def prologues() -> list:
            if not made:
                made.append([self._build(p, k.name) for p, k in
                             zip(emit_numba.render(k1, self.props.host).launch["prologues"], plan.prologues)])
            return made[0]

        scatter: list = []
        conv = host.scatter_input_grad(k1, k2, _reads(members), self.props)
        direct = None if conv is None else emit_numba_conv.render_input_grad(k1, conv)
        last = None if conv is None or conv.epilogue is None else \
            emit_numba.render(conv.epilogue, self.props.host)
        if last is not None:  # (its function compiles with the scatter's: prepare() reads "parts")
            direct = dataclasses.replace(direct, launch={**direct.launch, "parts": (direct, last)})

        ready: list = []  # (queued at the first run that keeps k1's result: else the scatter never runs)

        def run_direct(out: np.ndarray, arrays: list[np.ndarray]) -> None:
            """k1 and k2 as one scatter (emit_numba_conv), then k2's epilogue if any, where nothing else
            reads k1's result."""
            if not scatter:  # (its own list: the same runner may run the pair later, if k1's result is kept)
                scatter.extend(get() for get in ready)
            operands, scratch = _with_prologues(plan, prologues(), [arrays[p] for p in ins1], memory)
            weight = _view(operands[conv.weight.input], conv.weight, direct.launch["pack"], k1.shape)
            total = out if last is None else memory.array(math.prod(k2.shape), conv.epilogue.in_dtypes[-1].np)
            scatter[0](total, np.ascontiguousarray(weight), operands[conv.grad.input])
            if last is not None:
                scatter[1](out, *[arrays[p] for p in ins2], total)
                scratch.append(total)
            for array in scratch:
                memory.release(array)

        def run(out: Buffer, *inputs: Buffer) -> None:
            # (the scatter once its functions are compiled: the pair meanwhile, see _when_ready)
            if direct is not None and not inputs[at1].data.size:
                if not ready:
                    ready.extend(self._when_ready(p, p.name) for p in (direct, last) if p is not None)
                if all(get() is not None for get in ready):
                    try:
                        return run_direct(out.data, [b.data for b in inputs])
                    except Exception as e:
                        raise KernelError(f"kernels {k1.name} and {k2.name} (as one scatter) failed to run: "
                                          f"{type(e).__name__}: {e}\n{numbered(direct.source)}") from e
            if not built:  # k2's function over a piece, and its address
                built.append(self._build(program, program.name, free=True))
                native = self._function(_native(program), program.name)[0]
                built.append(ctypes.cast(native, ctypes.c_void_p).value)
            arrays = [b.data for b in inputs]
            (second, address), whole = built, out.data
            scratch: list = []

            def after(start: int, rows: np.ndarray) -> None:  # k2 over the piece's images
                moved = [rows if p == at1 else arrays[p][start * shift :]
                         for p, shift in zip(ins2, pair.shifts)]
                second(whole[start * pair.out_shift :], *moved)

            # the same call for cpu_gemm's pair_pieces: k2's arguments as (kind, value, bytes per image):
            # an array moved per image, k1's rows (1), an int (2)
            if not program.scratch and not program.launch.get("split"):  # (as _build's `free` call)
                moves = [(0, cpu_batch.address(whole), pair.out_shift * whole.itemsize)]
                for i in program.reads:
                    p, shift = ins2[i], pair.shifts[i]
                    moved = (0, cpu_batch.address(arrays[p]), shift * arrays[p].itemsize)
                    moves.append((1, 0, 0) if p == at1 else moved)
                after.native = (address, [*moves, *((2, v, 0) for v in program.args)])

            try:  # k1's computed operands are made whole first
                operands, scratch = _with_prologues(plan, prologues(), [arrays[p] for p in ins1], memory)
                # k1's output: an empty buffer when the group keeps it (groups._private_of)
                first = arrays[at1] if arrays[at1].size else None
                matmul(operands, memory, out=first, after=after)
                for array in scratch:
                    memory.release(array)
            except Exception as e:
                raise KernelError(f"kernels {k1.name} and {k2.name} (in pieces) failed to run: "
                                  f"{type(e).__name__}: {e}\n{numbered(program.source)}") from e

        # (the functions prepare() queues: the scatter's where it runs from the first call, else the pair's)
        return Runner(program if direct is None or TIERED else direct, run, self.name)

    def _run_native(self, program: Program, arrays: list[np.ndarray], ints: tuple, n: int) -> None:
        """A threaded-signature function (program.launch "split": pointers, ints, then lo, hi) on range(n),
        on the threads threaded kernels use, without the GIL (cpu_gemm's pieces: n slots)."""
        hit = self._native_call(program)
        _THREADS.run(hit[1], hit[2], (*map(cpu_batch.address, arrays), *ints), n, False, self.props.host)

    def _native_call(self, program: Program) -> tuple:
        """(program, its loaded native function, the function's address), loaded once."""
        hit = self.native_calls.get(id(program))
        if hit is None or hit[0] is not program:
            loaded = self._function(_native(program), program.name)
            address = ctypes.cast(loaded[0], ctypes.c_void_p).value
            hit = self.native_calls[id(program)] = (program, loaded[0], address)
        return hit

    def _built_on_first_call(self, program: Program):
        built: list = []
        def build() -> bool:  # True when this call built it (Runner.build: DEBUG=2 times that apart)
            return not built and not built.append(self._build(program, program.name))

        def run(out: Buffer, *inputs: Buffer) -> None:
            build()
            built[0](out.data, *[b.data for b in inputs])

        def bind(out: np.ndarray, inputs: list[np.ndarray]) -> tuple:
            build()
            return built[0].bind(out, inputs)

        run.bind, run.build = bind, build
        return run

    def compile(self, program: Program, kernel: Kernel) -> Runner:
        plan: BlasPlan | None = program.launch.get("blas")
        if plan is None:
            fn = self._build(program, kernel.name)
        else:
            prologues = [self._build(p, k.name) for p, k in zip(program.launch["prologues"], plan.prologues)]
            epilogue = program.launch["epilogue"]
            fn = None if epilogue is None else self._build(epilogue, plan.epilogue.name)
            direct = program.launch.get("direct")
            matmul = BlasCall(plan, kernel, self._run_native)
            if direct is not None:  # BLAS until the direct convolution's function is compiled
                pack = direct.launch.get("pack")
                matmul = Tiered(self._when_ready(direct, kernel.name),
                                 lambda fn: DirectConv(fn, plan, kernel, pack), matmul)
        source = program.source
        widen = [d == dtypes.float16 for d in (kernel.out_dtype, *kernel.in_dtypes)]
        any_widen = any(widen)
        memory = self.memory

        def run(out: Buffer, *inputs: Buffer) -> None:
            try:
                if plan is None and not any_widen:  # the common case, first
                    fn(out.data, *[b.data for b in inputs])
                    return
                args = [b.data.astype(np.float32) if w else b.data for b, w in zip((out, *inputs), widen)]
                if plan is None:
                    fn(*args)
                else:
                    operands, scratch = _with_prologues(plan, prologues, args[1:], memory)
                    if fn is None:  # BLAS writes the output itself when the layout allows
                        acc = matmul(operands, memory, out=args[0])
                        if acc is not None:
                            args[0][:] = acc
                    else:
                        acc = matmul(operands, memory)
                        fn(*args, acc)
                    for array in (*scratch, acc):
                        if array is not None:
                            memory.release(array)
            except Exception as e:
                raise KernelError(
                    f"kernel {kernel.name} failed to run: {type(e).__name__}: {e}\n{numbered(source)}"
                ) from e
            if widen[0]:
                out.data[:] = args[0]

        run.bind = None  # (a replay's record, cpu_batch: a generated function's, or a plain matmul's)
        if plan is None and not any_widen:
            run.bind = fn.bind
        elif plan is not None and fn is None and not prologues and direct is None and not any_widen:
            run.bind = self._blas_bind(matmul, kernel)
        return Runner(program, run, self.name)

    def _blas_bind(self, matmul: BlasCall, kernel: Kernel):
        """`bind` for a BLAS kernel whose matmul is one gemm per batch matrix over its inputs in place
        (BlasCall.bind): a record calling cpu_gemm's gemm_batch, on the calling thread (BLAS's threads)."""
        dt = kernel.reduce_expr.dtype

        def bind(out: np.ndarray, inputs: list[np.ndarray]) -> tuple | None:
            spec = matmul.bind(inputs, out)
            if spec is None:
                return None
            ints, (a, b) = spec
            fn = self._native_call(cpu_gemm.program(dt.np, "gemm_batch"))[2]
            args = [*map(cpu_batch.address, (inputs[a], inputs[b], out)), *ints[1:]]
            return fn, args, [a, b, -1], ints[0], False, False, []

        return bind

    def batch(self, launches: list[tuple], varying: set[int]) -> cpu_batch.Batch | None:
        """TinyJit's replay of `launches` with its compiled functions' launches in one native call each run
        of them (cpu_batch); None without native workers."""
        workers = threads()
        t = self.props.host
        started = cpu_threads.pool(workers - 1, t.spin_cycles)
        return cpu_batch.Batch(launches, varying, workers, t) if started else None

    def wait_for_compiles(self, timeout: float = 120.0) -> bool:
        """Wait for the compile workers' queued jobs, the direct convolutions' optional ones included
        (benchmarks call it after their warm-up runs: the next call of such a kernel runs its direct
        function); False if some are still compiling after `timeout` seconds."""
        return self.pool.wait_idle(timeout) if self.pool.live else True

    def _when_ready(self, program: Program, kernel_name: str) -> Callable[[], Callable | None]:
        """A getter of program's function (as _build makes it): at once where it is loaded or on disk, or
        where there are no compile workers (TGRAD_COMPILE_WORKERS=0, or TIERED off); else it is queued for
        a worker as an optional job (compiled when no other job waits) and the getter gives None until
        one has compiled it. The direct convolutions run their BLAS path meanwhile, so that a first step does
        not wait for their slow compiles (bench/HISTORY.md, "Direct convolution gradients"). A process that
        exits before the worker is done leaves them out of the disk cache: the next one compiles them again,
        in the background too."""
        nat = _native(program)
        workers = cpu_pool.default_workers()
        if not TIERED or not workers or nat.key in self.functions or _cached(nat.path):
            fn = self._build(program, kernel_name)
            return lambda: fn
        if not self.pool.live:  # (a worker starts in the background: nothing here waits for it)
            self.pool.start(workers)
        self.pool.submit([(nat.key, nat.job)], optional=True)
        box: list = []

        def get() -> Callable | None:
            if not box and self.pool.compiled(nat.key):
                box.append(self._build(program, kernel_name))
            return box[0] if box else None

        return get

    def _build(self, program: Program, kernel_name: str, free: bool = False):
        """A callable running one generated function on numpy arrays (the output, then every input of
        the kernel). Functions with the same source (flattened elementwise kernels of different lengths)
        and dtypes share one compiled function. `free`: a serial function called without the GIL, with
        Numba's slots of the calling thread (a piece pair's second kernel runs on the pieces' threads)."""
        hit = self._function(_native(program), kernel_name)
        native, used, extra = hit[0], program.reads, program.args
        address_of_native = ctypes.cast(native, ctypes.c_void_p).value
        if free and not program.launch.get("split") and not program.scratch:
            unlocked = ctypes.CFUNCTYPE(ctypes.c_int32, *native.argtypes)(address_of_native)

            def call_free(out: np.ndarray, *inputs: np.ndarray) -> None:
                args = (cpu_batch.address(out), *[cpu_batch.address(inputs[i]) for i in used], *extra)
                _THREADS.call(unlocked, args, None, None)

            return call_free
        split, combine = program.launch.get("split", 0), program.launch.get("combine", False)
        scratch = tuple((size, dt.np) for size, dt in program.scratch)
        address, pool = cpu_batch.address, []  # scratch arrays between launches (pop/append are atomic)
        tuning = self.props.host  # (set_props forgets the runners built with the old one)

        def call(out: np.ndarray, *inputs: np.ndarray) -> None:
            ptrs = [address(out)]
            for i in used:
                ptrs.append(address(inputs[i]))
            tmp = (pool.pop() if pool else [np.empty(size, dt) for size, dt in scratch]) if scratch else ()
            args = (*ptrs, *map(address, tmp), *extra)
            if split:
                _THREADS.run(native, address_of_native, args, split, combine, tuning)
            else:
                status = native(_SLOTS[0], _SLOTS[1], *args)
                if status not in cpu_batch.RET_OK:
                    raise RuntimeError(f"the compiled function returned error status {status}")
            if scratch:
                pool.append(tmp)

        def bind(out: np.ndarray, inputs: list[np.ndarray]) -> tuple:
            """What `call` would pass, for a replay's record (cpu_batch): (function, its arguments, which
            array each of the first ones is (-1 the output, else an input), its range (lo, hi from 0 to
            n), whether threaded over it, combine, scratch)."""
            tmp = [np.empty(size, dt) for size, dt in scratch]
            args = [address(out), *[address(inputs[i]) for i in used], *map(address, tmp), *extra]
            return address_of_native, args, [-1, *used], split, bool(split), combine, tmp

        call.bind = bind
        return call

    def _function(self, nat: _Native, kernel_name: str) -> tuple:
        """The native function of `nat` as self.functions keeps it (ctypes function, what keeps it alive),
        loaded on first use. Two threads that load it at once both get the one stored first (setdefault):
        storing the second over it freed the first's code while the other thread ran it (a segfault)."""
        hit = self.functions.get(nat.key)
        return hit if hit is not None else self.functions.setdefault(nat.key, self._load(nat, kernel_name))

    def _load(self, nat: _Native, kernel_name: str):
        """The native function as a ctypes function (and what keeps its code alive): from the disk cache
        when it is there, else from a compile worker, else compiled here by Numba (and written to the
        cache)."""
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
            prg = nat.program
            try:
                entry = compile_native(prg.source, prg.name, f"tgrad_kernel_{nat.digest}", nat.storage,
                                       _n_ints(prg))
            except Exception as e:
                raise KernelError(
                    f"kernel {kernel_name} failed to build: {type(e).__name__}: {e}\n{numbered(prg.source)}"
                ) from e
            _write_entry(nat.path, entry)
            loaded = entry["library"], entry["address"]
        keep, address = loaded
        args = [ctypes.c_void_p] * (2 + len(nat.storage)) + [ctypes.c_int64] * _n_ints(nat.program)
        # a serial kernel is called holding the GIL, like a Numba dispatcher; a threaded one releases it,
        # so that each thread runs its range at the same time
        threaded = nat.program.launch.get("split")
        proto = (ctypes.CFUNCTYPE if threaded else ctypes.PYFUNCTYPE)(ctypes.c_int32, *args)
        return proto(address), keep
