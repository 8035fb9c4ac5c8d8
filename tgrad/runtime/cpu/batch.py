"""Running compiled CPU functions on threads: a threaded kernel's ranges (`Threads`), and TinyJit's
replay of CPU launches in one native call (`Batch`; device.Runtime.batch, runtime/cpu/runtime.py `batch`).

A replay calls each captured launch from Python: the Runner, the run closure, the arguments' addresses,
a ctypes call or a hand-off to the native workers. That costs microseconds a launch, twice as many inside a
training step as with warm caches (the step's kernels have pushed the interpreter's own data out of the
caches): about a tenth of a GPT step of a few hundred launches (bench/HISTORY.md, "Batched CPU replays"). Here
a run of launches of compiled functions becomes records of one call of cpu_threads' `sequence` (each record
the function's address, its arguments and how it is threaded, as runtime.py's `call` would run it), bound
once; a replay writes the addresses of the buffers that are new
at each call (arguments, fresh outputs, gradients, host steps' results) into their records' slots and makes
one call per run. A matmul that is one BLAS call per matrix, reading its operands in place and writing its
output in order, is a record too (cpu_gemm's gemm_batch, called on this thread: BLAS's threads split it).
Launches of anything else (a matmul with a prologue, epilogue or copies, convolutions' pieces, a float16
kernel) run from Python between the runs, as before.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
import weakref

import numpy as np

from tgrad.errors import KernelError, numbered
from tgrad.opt.opts import HostTuning
from tgrad.runtime.cpu import threads as cpu_threads
from tgrad.runtime.cpu.pool import threads

RET_OK = (0, -2)  # Numba's status codes for "returned" and "returned None"
_ADDRESSES: dict[int, tuple] = {}  # id(array) -> (weakref to the array, address of its data)


def address(array: np.ndarray) -> int:
    """The data address of an array, remembered while the array lives (`.ctypes.data` is slow for a
    launch's budget: about a microsecond)."""
    hit = _ADDRESSES.get(id(array))
    if hit is not None and hit[0]() is array:
        return hit[1]
    key = id(array)
    addr = array.ctypes.data
    _ADDRESSES[key] = (weakref.ref(array, lambda _, key=key: _ADDRESSES.pop(key, None)), addr)
    return addr


def chunks(n: int, workers: int, tuning: HostTuning) -> int:
    """Ranges a threaded function over range(n) is cut into on `workers` threads (0: it runs on the
    calling thread alone): `chunks_per_thread` each, so a thread that finishes early takes another (threads
    run at different speeds on a shared machine)."""
    count = min(workers, n)
    return min(n, tuning.chunks_per_thread * count, cpu_threads.MAX_CHUNKS) if count > 1 else 0


class Threads:
    """The threads that run a threaded kernel (emit_numba's `split`): its outer loop cut into ranges, each
    a call of the native function. On Linux x86-64 the ranges go to cpu_threads' native workers (a
    hand-off of a few microseconds); elsewhere, with TGRAD_NATIVE_THREADS=0, or while another Python
    thread holds those, to Python threads here (one range each, the caller running the first; a hand-off an
    order of magnitude slower). Numba's own parallel loops compiled several times slower than a serial
    function, started a threading layer (whose OpenMP threads spin and starved OpenBLAS, and which slowed
    PyTorch's CPU attention 70x when started before torch was imported)."""

    def __init__(self):
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.workers = 0  # the executor's threads (the caller is one more)
        self.pid = os.getpid()  # a forked child has none of its parent's threads: it starts its own
        self.local = threading.local()  # per thread: Numba's return-value and exception slots

    def call(self, native, args: tuple, lo: int | None, hi: int | None) -> None:
        """The native function on [lo, hi) (lo None: a serial function) with this thread's slots."""
        slots = getattr(self.local, "slots", None)
        if slots is None:
            ret, exc = (ctypes.c_void_p * 2)(), (ctypes.c_void_p * 2)()
            slots = self.local.slots = (ret, exc, ctypes.addressof(ret), ctypes.addressof(exc))
        ends = () if lo is None else (lo, hi)
        status = native(slots[2], slots[3], *args, *ends)
        if status not in RET_OK:
            raise RuntimeError(f"the compiled function returned error status {status}")

    def run(self, native, address: int, args: tuple, n: int, combine: bool, tuning: HostTuning) -> None:
        """Run the native function (at `address`) on range(n), then its combine call (lo == hi == n);
        `tuning`: the CPU device's (the native workers' spin, the ranges per thread)."""
        count = min(threads(), n)
        fits = count > 1 and len(args) <= cpu_threads.MAX_ARGS
        pool = cpu_threads.pool(count - 1, tuning.spin_cycles) if fits else None
        if pool is not None and pool.lock.acquire(blocking=False):
            try:
                status = pool.run(address, args, n, chunks(n, count, tuning))
            finally:
                pool.lock.release()
            if status not in RET_OK:
                raise RuntimeError(f"the compiled function returned error status {status}")
        elif count > 1:
            if self.executor is None or self.workers < count - 1 or self.pid != os.getpid():
                if self.executor is not None and self.pid == os.getpid():
                    self.executor.shutdown(wait=False)  # more threads wanted: a bigger pool
                self.executor = concurrent.futures.ThreadPoolExecutor(count - 1, "tgrad-cpu")
                self.workers, self.pid = count - 1, os.getpid()
            cuts = [n * i // count for i in range(count + 1)]
            futures = [self.executor.submit(self.call, native, args, cuts[i], cuts[i + 1])
                       for i in range(1, count)]
            try:
                self.call(native, args, 0, cuts[1])
            finally:
                for f in futures:
                    f.result()
        else:
            self.call(native, args, 0, n)
        if combine:
            self.call(native, args, n, n)


class Batch:
    """Launches [(runner, out, inputs)] replayed in order: runs of bindable ones (a runner whose function
    has `bind`, see runtime/cpu/runtime.py) as records of one `sequence` call, the others called from Python.
    `varying`: ids of the buffers a replay replaces (its `remap` keys); their slots are written per call."""

    def __init__(self, launches: list[tuple], varying: set[int], workers: int, tuning: HostTuning):
        self.workers, self.spin = workers, tuning.spin_cycles
        self.parts: list[tuple] = []  # ("run", words, patches, launches) or ("call", (runner, out, inputs))
        words: list[int] = []
        patches: list[tuple[int, int]] = []  # (word, id of the buffer whose address goes there)
        run: list[tuple] = []
        self.keep: list = []  # scratch arrays the records point at

        def flush() -> None:
            if run:
                self.parts.append(("run", np.array(words, np.int64), list(patches), list(run)))
            words.clear(), patches.clear(), run.clear()

        for runner, out, inputs in launches:
            bind = getattr(runner.fn, "bind", None)
            spec = None if bind is None else bind(out.data, [b.data for b in inputs])
            if spec is None or len(spec[1]) > cpu_threads.MAX_ARGS:
                flush()
                self.parts.append(("call", (runner, out, inputs)))
                continue
            fn, args, where, n, threaded, combine, scratch = spec
            self.keep.append(scratch)
            at = len(words) + cpu_threads.RECORD_HEAD
            for j, w in enumerate(where):  # (argument j is the output's address, or input w's)
                buf = out if w < 0 else inputs[w]
                if id(buf) in varying:
                    patches.append((at + j, id(buf)))
            ranges = chunks(n, workers, tuning) if threaded else 0
            words += [fn, len(args), n, ranges, int(bool(combine)), *args]
            run.append((runner, out, inputs))
        flush()

    def __call__(self, remap: dict) -> None:
        pool = cpu_threads.pool(self.workers - 1, self.spin) if threads() == self.workers else None
        for part in self.parts:
            if part[0] == "call":
                _launch(part[1], remap)
                continue
            _, words, patches, launches = part
            if pool is None or not pool.lock.acquire(blocking=False):  # (another thread has the workers)
                for launch in launches:
                    _launch(launch, remap)
                continue
            try:
                for at, key in patches:
                    buf = remap.get(key)
                    if buf is not None:
                        words[at] = address(buf.data)
                failed, status = pool.sequence(words.ctypes.data, len(launches))
            finally:
                pool.lock.release()
            if status:
                runner = launches[failed][0]
                raise KernelError(f"kernel {runner.name} failed to run: RuntimeError: the compiled function "
                                  f"returned error status {status}\n{numbered(runner.source)}")


def _launch(launch: tuple, remap: dict) -> None:
    """One launch from Python, with the buffers this replay uses instead of the captured ones."""
    runner, out, inputs = launch
    runner(remap.get(id(out), out), *[remap.get(id(b), b) for b in inputs])
