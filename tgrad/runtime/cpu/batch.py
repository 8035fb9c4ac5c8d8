"""TinyJit's replay of CPU launches in one native call (device.Runtime.batch, runtime/cpu/runtime.py `batch`).

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

import weakref

import numpy as np

from tgrad.errors import KernelError, numbered
from tgrad.runtime.cpu import threads as cpu_threads
from tgrad.runtime.cpu.pool import threads

CHUNKS_PER_THREAD = 4  # ranges per thread of a threaded kernel on the native workers: a thread that
# finishes early takes another (the threads run at different speeds on a shared machine)
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


def chunks(n: int, workers: int) -> int:
    """Ranges a threaded function over range(n) is cut into on `workers` threads (0: it runs on the
    calling thread alone)."""
    count = min(workers, n)
    return min(n, CHUNKS_PER_THREAD * count, cpu_threads.MAX_CHUNKS) if count > 1 else 0


class Batch:
    """Launches [(runner, out, inputs)] replayed in order: runs of bindable ones (a runner whose function
    has `bind`, see runtime/cpu/runtime.py) as records of one `sequence` call, the others called from Python.
    `varying`: ids of the buffers a replay replaces (its `remap` keys); their slots are written per call."""

    def __init__(self, launches: list[tuple], varying: set[int], workers: int):
        self.workers = workers
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
            words += [fn, len(args), n, chunks(n, workers) if threaded else 0, int(bool(combine)), *args]
            run.append((runner, out, inputs))
        flush()

    def __call__(self, remap: dict) -> None:
        pool = cpu_threads.pool(self.workers - 1) if threads() == self.workers else None
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
