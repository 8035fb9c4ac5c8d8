"""Compile CPU kernels in helper processes while the main process compiles others.

Numba compiles in Python under one lock: a process compiles one kernel at a time (each a sizeable fraction of
a second, after a one-time set-up that costs more than a kernel). With a cold cache, the CPU runtime starts
worker processes (`python -m tgrad.runtime.cpu.pool`; `TGRAD_COMPILE_WORKERS` of them, default one fewer than
the cores, at most 2; 0 turns them off) when it opens, so their set-up overlaps the program's own start; with
a
warm cache it starts them only when a schedule needs several new kernels. Before a schedule runs,
CPURuntime.prepare queues the kernels it has to compile: workers take the longest source first while
the main process compiles from the front, claiming for itself any kernel no worker has taken (and, while
it waits for one a worker compiles, compiling the front of the queue).
A worker returns the kernel's object code (what the disk cache keeps) and the main process loads it
with llvmlite. A worker that fails or dies only means the main process compiles that kernel itself,
so errors are reported the usual way. Workers are separate interpreters started with `-m`, not
multiprocessing, so they never import the user's `__main__`; they exit when the main process does or
after IDLE_EXIT_S without work.
"""

from __future__ import annotations

import collections
import functools
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

from tgrad import config
from tgrad.errors import DeviceError
from tgrad.runtime.cpu import gemm as cpu_gemm
from tgrad.runtime.cpu.compile import compile_object, use_cpu_features

MIN_JOBS_TO_START = 3  # with a warm cache, a worker (slow to start) is not worth it for one or two kernels
IDLE_EXIT_S = 20.0  # a worker with nothing to do for this long exits (it holds ~150 MB); more start on demand


@functools.cache
def cores() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads() -> int:
    """Threads a threaded kernel runs on: TGRAD_THREADS or NUMBA_NUM_THREADS (the name Numba users know),
    else the cores this process may use. Read at each launch, so a change of the variable takes effect."""
    for name in ("TGRAD_THREADS", "NUMBA_NUM_THREADS"):
        text = config.get(name)
        if text:
            if not text.isdigit() or int(text) < 1:
                raise DeviceError(f"{name}={text!r}: expected a number of threads (1 or more)")
            return int(text)
    return cores()


def default_workers() -> int:
    text = config.get("TGRAD_COMPILE_WORKERS")
    if text:
        if not text.isdigit():
            raise DeviceError(f"TGRAD_COMPILE_WORKERS={text!r}: expected a number of compile worker "
                              "processes (0 for none)")
        return int(text)
    return max(0, min(cores() - 1, 2))


class CompilePool:
    """Jobs are (key, arguments of numba_compile.compile_object); a result is an entry or None (compile it
    here)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.queue: collections.deque = collections.deque()  # in the order the schedule needs them
        self.later: list = []  # optional jobs (a faster variant the caller can do without): when idle
        self.queued: set = set()
        self.running: set = set()
        self.done: dict = {}
        self.live = 0  # workers started and not exited
        self.ready = 0  # workers that finished their set-up and take jobs
        self.delivered = 0  # entries workers compiled and the main process claimed

    def start(self, workers: int) -> None:
        """Start worker processes until `workers` are live."""
        root = str(Path(__file__).resolve().parents[3])  # the folder holding tgrad/
        paths = [root, *filter(None, [config.get("PYTHONPATH")])]
        env = config.child_environment(PYTHONPATH=os.pathsep.join(paths))
        with self.cond:
            more, self.live = max(0, workers - self.live), max(self.live, workers)
        for _ in range(more):
            threading.Thread(target=self._serve, args=(env,), daemon=True, name="tgrad-compile").start()

    def submit(self, jobs: list[tuple], optional: bool = False) -> None:
        """Queue (key, compile_object's arguments) jobs; optional ones only when no other job waits."""
        with self.cond:
            for key, args in jobs:
                if key not in self.queued and key not in self.running and key not in self.done:
                    (self.later if optional else self.queue).append((key, args))
                    self.queued.add(key)
            self.cond.notify_all()

    def next_job(self) -> tuple:
        """The job a worker takes next (the caller holds the lock; some job waits): the longest source
        first (a kernel's compile time grows with it), so that the main process, which takes the front,
        is not left waiting at the end for a long one (the MNIST CNN's first step waited for conv2's
        weight gradient when it was taken from the back); optional jobs only when no other job waits."""
        jobs = self.queue or self.later
        job = max(jobs, key=lambda j: len(j[1][0]))
        jobs.remove(job)
        self.queued.discard(job[0])
        return job

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no job is queued or compiling (optional ones included); False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.queued and not self.running, timeout=timeout)

    def compiled(self, key) -> bool:
        """Whether claim(key) would not wait: a worker compiled it, or nothing compiles it (a worker that
        failed: the caller compiles it)."""
        with self.cond:
            return key in self.done or (key not in self.running and key not in self.queued)

    def claim(self, key) -> dict | None:
        """The entry a worker compiled for `key`, waiting while one compiles it; None when no worker has
        it (it leaves the queue: the caller compiles it) or the worker failed. While it waits, the caller
        compiles the front of the queue itself (compile_object, as a worker would), so that it does not
        sit idle (the MNIST CNN's first step waited at its end for a worker's last kernel)."""
        with self.cond:
            if key in self.queued:
                self.queued.discard(key)
                self.queue = collections.deque(job for job in self.queue if job[0] != key)
                self.later = [job for job in self.later if job[0] != key]
                return None
            while key in self.running:
                if not self.queue:
                    self.cond.wait()
                    continue
                other, args = self.queue.popleft()
                self.queued.discard(other)
                self.running.add(other)
                self.cond.release()
                try:
                    entry = compile_object(*args)
                except Exception:  # (the kernel's own claim compiles it again and reports the error)
                    entry = None
                finally:
                    self.cond.acquire()
                self.running.discard(other)
                if entry is not None:
                    self.done[other] = entry
                self.cond.notify_all()
            entry = self.done.pop(key, None)
            self.delivered += entry is not None
            return entry

    def _serve(self, env: dict) -> None:
        """Start one worker process, then hand it the last queued job, one at a time, until it idles."""
        key, proc, ready = None, None, False
        try:
            proc = subprocess.Popen([sys.executable, "-m", "tgrad.runtime.cpu.pool"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=env)
            if pickle.load(proc.stdout) != "ready":
                raise RuntimeError("the compile worker did not start")
            with self.cond:
                self.ready, ready = self.ready + 1, True
                self.cond.notify_all()
            while True:
                with self.cond:
                    if not self.cond.wait_for(lambda: self.queue or self.later, timeout=IDLE_EXIT_S):
                        break
                    key, args = self.next_job()
                    self.running.add(key)
                pickle.dump(args, proc.stdin)
                proc.stdin.flush()
                entry = pickle.load(proc.stdout)
                with self.cond:
                    self.running.discard(key)
                    self.done[key] = entry
                    self.cond.notify_all()
                key = None
        except Exception:  # the worker could not start or died: the main process compiles its jobs
            pass
        finally:
            with self.cond:
                self.running.discard(key)
                self.ready -= ready
                self.live -= 1
                self.cond.notify_all()
            if proc is not None:
                proc.kill()
                proc.wait()


def _worker() -> None:
    """A worker process: compile jobs from stdin, write entries (None on failure) to stdout."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # anything printed goes to stderr, not the protocol
    from numba.core.registry import cpu_target

    # the target features first: Numba's code generator is made with them once, and the set-up below made
    # it with the host's defaults (every kernel a worker compiled ran 8 floats wide on AVX-512 hosts)
    use_cpu_features()
    cpu_gemm.available()  # BLAS's gemm under the names cpu_gemm's functions call, if numpy's BLAS has it
    cpu_target.typing_context.refresh()  # Numba's one-time set-up, before the first job
    cpu_target.target_context.refresh()
    try:
        pickle.dump("ready", out)
        out.flush()
    except BrokenPipeError:  # the main process exited while this one started
        return
    while True:
        try:
            args = pickle.load(sys.stdin.buffer)
        except EOFError:  # the main process is gone
            return
        try:
            entry = compile_object(*args)
        except Exception:
            entry = None
        try:
            pickle.dump(entry, out)
            out.flush()
        except BrokenPipeError:  # the main process exited while this compiled (an optional job, say)
            return


if __name__ == "__main__":
    _worker()
