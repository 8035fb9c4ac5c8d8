"""Native worker threads for threaded CPU kernels: a hand-off in a few microseconds instead of tens.

A threaded kernel (emit_numba's `split`) runs its outer loop in ranges on several threads. Handing the
ranges to Python threads (a ThreadPoolExecutor: futures, a condition variable, the GIL back and forth)
cost tens of microseconds per kernel, more than half of a short kernel's time. Here the workers are
threads that never enter Python: functions written in LLVM IR (below), started with pthread_create. A
worker waits for a job by spinning on a counter (GEN) for the device's `spin_cycles`, then sleeps on it
(a futex); the caller publishes a job (function, arguments, n, number of ranges), wakes sleepers, and
then it and the workers claim the job's ranges one at a time (a compare-and-swap on CLAIM, which carries
the job's number, so a worker that wakes late cannot take a range of the next job) until none is left;
the caller waits until every range is done. All of that is one native call (`run`): a hand-off costs a
few microseconds, a little more when the workers sleep (the caller does not wait for them to wake: it
runs the ranges they have not claimed). PyTorch's OpenMP threads wait the same way.

Short threaded kernels (elementwise, softmax rows) gain; the training steps do not change (their threaded
kernels are few and long); measured: see bench/HISTORY.md, "Native worker threads". Only on Linux x86-64
(futex, the pause instruction); elsewhere, with TGRAD_NATIVE_THREADS=0, or while another Python thread is
using the pool, runtime.py keeps its Python threads. A forked child starts its own workers; at exit they are
stopped and joined before their code is freed.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import platform
import sys
import threading
import warnings

from tgrad import config

MAX_ARGS = 64  # int64 arguments of a kernel function (pointers, sizes) the workers can call with

# the context: one int64 array shared by the caller and the workers (word index -> meaning)
GEN, DONE, SLEEPERS, FN, NARGS, ARGV, N, CLAIM, SPIN, SYSCALL, YIELD, STOP, STATUS = range(13)
WORDS = 16
MAX_CHUNKS = 65535  # ranges of one job (CLAIM packs the job's number, its chunks and the next one)
RECORD_HEAD = 5  # words of a `sequence` record before its arguments: fn, nargs, n, chunks, combine


def _ir() -> str:
    """The LLVM IR of `worker` and `run`, and what they share: `chunks` claims and runs ranges (chunks) of
    the current job until none is left; `call_range` calls the job's function on one range.

    A kernel function takes (two status slots, its int64 arguments, lo, hi); `call_range` calls every one
    with MAX_ARGS + 2 int64 arguments after the slots: its own, lo, hi, then zeros it does not read. In the
    x86-64 System V convention that is the same call (arguments fill registers then stack slots in order,
    and the caller pops them), and one call site compiles far faster than a switch over the arity."""
    w = lambda i: f"getelementptr inbounds i64, ptr %ctx, i64 {i}"  # noqa: E731  (address of word i)

    def spin(again: str, then: str) -> str:  # back to `again` (pausing) until %spin cycles from %t0 passed
        return (f"check:\n  %t = call i64 @llvm.readcyclecounter()\n  %dt = sub i64 %t, %t0\n"
                f"  %more = icmp ult i64 %dt, %spin\n  br i1 %more, label %pause, label %{then}\n"
                f"pause:\n  call void @llvm.x86.sse2.pause()\n  br label %{again}\n")

    width = MAX_ARGS + 2
    loads = "".join(f"  %q{i} = getelementptr inbounds i64, ptr %buf, i64 {i}\n"
                    f"  %v{i} = load i64, ptr %q{i}\n" for i in range(width))
    params = ", ".join(["ptr %ret", "ptr %exc", *[f"i64 %v{i}" for i in range(width)]])
    return f"""
declare void @llvm.x86.sse2.pause()
declare i64 @llvm.readcyclecounter()
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

define internal i32 @call_range(ptr %ctx, i64 %lo, i64 %hi) {{
entry:
  %slots = alloca [4 x i64], align 8
  %ret = getelementptr inbounds i64, ptr %slots, i64 0
  %exc = getelementptr inbounds i64, ptr %slots, i64 2
  %buf = alloca [{width} x i64], align 8
  call void @llvm.memset.p0.i64(ptr %buf, i8 0, i64 {8 * width}, i1 false)
  %pf = {w(FN)}
  %fi = load i64, ptr %pf
  %fn = inttoptr i64 %fi to ptr
  %pa = {w(ARGV)}
  %ai = load i64, ptr %pa
  %argv = inttoptr i64 %ai to ptr
  %pk = {w(NARGS)}
  %nargs = load i64, ptr %pk
  %bytes = mul i64 %nargs, 8
  call void @llvm.memcpy.p0.p0.i64(ptr %buf, ptr %argv, i64 %bytes, i1 false)
  %plo = getelementptr inbounds i64, ptr %buf, i64 %nargs
  store i64 %lo, ptr %plo
  %plo1 = getelementptr inbounds i64, ptr %plo, i64 1
  store i64 %hi, ptr %plo1
{loads}  %r = call i32 %fn({params})
  ret i32 %r
}}

; claim chunks of job `gen` (CLAIM = gen << 32 | chunks << 16 | next) and run them until none is left
define internal void @chunks(ptr %ctx, i32 %gen) {{
entry:
  %pclaim = {w(CLAIM)}
  %tag = zext i32 %gen to i64
  br label %claim
claim:
  %c = load atomic i64, ptr %pclaim acquire, align 8
  %ctag = lshr i64 %c, 32
  %mine = icmp eq i64 %ctag, %tag
  %next = and i64 %c, 65535
  %c16 = lshr i64 %c, 16
  %count = and i64 %c16, 65535
  %left = icmp ult i64 %next, %count
  %ok = and i1 %mine, %left
  br i1 %ok, label %take, label %out
take:
  %c1 = add i64 %c, 1
  %cas = cmpxchg ptr %pclaim, i64 %c, i64 %c1 acq_rel acquire, align 8
  %won = extractvalue {{ i64, i1 }} %cas, 1
  br i1 %won, label %work, label %claim
work:
  %pn = {w(N)}
  %n = load i64, ptr %pn
  %nlo = mul i64 %n, %next
  %lo = udiv i64 %nlo, %count
  %next1 = add i64 %next, 1
  %nhi = mul i64 %n, %next1
  %hi = udiv i64 %nhi, %count
  %st = call i32 @call_range(ptr %ctx, i64 %lo, i64 %hi)
  %st64 = sext i32 %st to i64
  %fine0 = icmp eq i64 %st64, 0
  %fine1 = icmp eq i64 %st64, -2
  %fine = or i1 %fine0, %fine1
  br i1 %fine, label %counted, label %failed
failed:
  %pstatus = {w(STATUS)}
  store atomic i64 %st64, ptr %pstatus monotonic, align 8
  br label %counted
counted:
  %pdone = {w(DONE)}
  %d = atomicrmw add ptr %pdone, i64 1 release, align 8
  br label %claim
out:
  ret void
}}

define ptr @worker(ptr %ctx) {{
entry:
  %gen = {w(GEN)}
  %sleepers = {w(SLEEPERS)}
  %pspin = {w(SPIN)}
  %spin = load i64, ptr %pspin
  %psys = {w(SYSCALL)}
  %sysi = load i64, ptr %psys
  %sys = inttoptr i64 %sysi to ptr
  %pstop = {w(STOP)}
  br label %loop
loop:
  %seen = phi i32 [0, %entry], [%seen, %woke], [%g, %ran]
  %t0 = call i64 @llvm.readcyclecounter()
  br label %spinning
spinning:
  %g = load atomic i32, ptr %gen acquire, align 8
  %new = icmp ne i32 %g, %seen
  br i1 %new, label %run, label %check
{spin("spinning", "sleep")}sleep:
  %s0 = atomicrmw add ptr %sleepers, i32 1 seq_cst, align 8
  %g2 = load atomic i32, ptr %gen seq_cst, align 8
  %same = icmp eq i32 %g2, %seen
  br i1 %same, label %wait, label %woke
wait:
  %seen64 = zext i32 %seen to i64
  %fr = call i64 (i64, ...) %sys(i64 202, ptr %gen, i64 128, i64 %seen64, ptr null)
  br label %woke
woke:
  %s1 = atomicrmw sub ptr %sleepers, i32 1 seq_cst, align 8
  br label %loop
run:
  %stop = load atomic i64, ptr %pstop acquire, align 8
  %stopped = icmp ne i64 %stop, 0
  br i1 %stopped, label %exit, label %work
work:
  call void @chunks(ptr %ctx, i32 %g)
  br label %ran
ran:
  br label %loop
exit:
  ret ptr null
}}

; the caller: publish the job of `count` chunks (its other words are written), run chunks, wait for all
define i64 @run(ptr %ctx, i64 %count) {{
entry:
  %gen = {w(GEN)}
  %pdone = {w(DONE)}
  store i64 0, ptr %pdone
  %pstatus = {w(STATUS)}
  store i64 0, ptr %pstatus
  %g0 = load i32, ptr %gen
  %g1 = add i32 %g0, 1
  %tag = zext i32 %g1 to i64
  %tag32 = shl i64 %tag, 32
  %c16 = shl i64 %count, 16
  %claim = or i64 %tag32, %c16
  %pclaim = {w(CLAIM)}
  store atomic i64 %claim, ptr %pclaim seq_cst, align 8
  store atomic i32 %g1, ptr %gen seq_cst, align 8
  %sleepers = {w(SLEEPERS)}
  %s = load atomic i32, ptr %sleepers seq_cst, align 8
  %any = icmp ne i32 %s, 0
  br i1 %any, label %wake, label %mine
wake:
  %psys = {w(SYSCALL)}
  %sysi = load i64, ptr %psys
  %sys = inttoptr i64 %sysi to ptr
  %fr = call i64 (i64, ...) %sys(i64 202, ptr %gen, i64 129, i64 2147483647, ptr null)
  br label %mine
mine:
  call void @chunks(ptr %ctx, i32 %g1)
  %pspin = {w(SPIN)}
  %spin = load i64, ptr %pspin
  %pyield = {w(YIELD)}
  %yi = load i64, ptr %pyield
  %yield = inttoptr i64 %yi to ptr
  %t0 = call i64 @llvm.readcyclecounter()
  br label %waiting
waiting:
  %d = load atomic i64, ptr %pdone acquire, align 8
  %finished = icmp eq i64 %d, %count
  br i1 %finished, label %out, label %check
{spin("waiting", "give")}give:
  %yr = call i32 %yield()
  br label %waiting
out:
  %st = load atomic i64, ptr %pstatus acquire, align 8
  ret i64 %st
}}

; records one after another, each [fn, nargs, n, chunks, combine, its nargs arguments]: run as `run` runs a
; job (chunks > 0: on the workers too) or on this thread over [0, n) (chunks 0; a function without lo, hi
; ignores them), then its combine call [n, n) where asked. 0, or 1 + the index of the record that failed
; (its status in STATUS)
define i64 @sequence(ptr %ctx, ptr %rec, i64 %nrec) {{
entry:
  %pf = {w(FN)}
  %pk = {w(NARGS)}
  %pn = {w(N)}
  %pa = {w(ARGV)}
  %ps = {w(STATUS)}
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %next]
  %off = phi i64 [0, %entry], [%off1, %next]
  %more = icmp ult i64 %i, %nrec
  br i1 %more, label %body, label %finish
body:
  %r0 = getelementptr inbounds i64, ptr %rec, i64 %off
  %fn = load i64, ptr %r0
  %r1 = getelementptr inbounds i64, ptr %r0, i64 1
  %nargs = load i64, ptr %r1
  %r2 = getelementptr inbounds i64, ptr %r0, i64 2
  %n = load i64, ptr %r2
  %r3 = getelementptr inbounds i64, ptr %r0, i64 3
  %chunks = load i64, ptr %r3
  %r4 = getelementptr inbounds i64, ptr %r0, i64 4
  %combine = load i64, ptr %r4
  %args = getelementptr inbounds i64, ptr %r0, i64 {RECORD_HEAD}
  %argsi = ptrtoint ptr %args to i64
  store i64 %fn, ptr %pf
  store i64 %nargs, ptr %pk
  store i64 %n, ptr %pn
  store i64 %argsi, ptr %pa
  %threaded = icmp ne i64 %chunks, 0
  br i1 %threaded, label %par, label %ser
par:
  %st1 = call i64 @run(ptr %ctx, i64 %chunks)
  br label %ran
ser:
  %s32 = call i32 @call_range(ptr %ctx, i64 0, i64 %n)
  %st2 = sext i32 %s32 to i64
  br label %ran
ran:
  %st = phi i64 [%st1, %par], [%st2, %ser]
  %ok0 = icmp eq i64 %st, 0
  %ok1 = icmp eq i64 %st, -2
  %ok = or i1 %ok0, %ok1
  br i1 %ok, label %comb, label %fail
comb:
  %want = icmp ne i64 %combine, 0
  br i1 %want, label %docomb, label %next
docomb:
  %c32 = call i32 @call_range(ptr %ctx, i64 %n, i64 %n)
  %c64 = sext i32 %c32 to i64
  %cok0 = icmp eq i64 %c64, 0
  %cok1 = icmp eq i64 %c64, -2
  %cok = or i1 %cok0, %cok1
  br i1 %cok, label %next, label %cfail
cfail:
  store i64 %c64, ptr %ps
  br label %failed
fail:
  store i64 %st, ptr %ps
  br label %failed
failed:
  %idx = add i64 %i, 1
  ret i64 %idx
next:
  %i1 = add i64 %i, 1
  %h = add i64 %nargs, {RECORD_HEAD}
  %off1 = add i64 %off, %h
  br label %loop
finish:
  ret i64 0
}}
"""


def supported() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


class Pool:
    """`workers` native threads and the context they share with the caller (see the module's doc)."""

    def __init__(self, workers: int, spin: int):
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = llvm.parse_assembly(_ir())
        module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(opt=0, jit=True)
        self.engine = llvm.create_mcjit_compiler(module, machine)
        self.engine.finalize_object()
        self.libc = libc = ctypes.CDLL(None)
        self.ctx = (ctypes.c_int64 * WORDS)()
        self.argv = (ctypes.c_int64 * MAX_ARGS)()
        c, self.address = self.ctx, ctypes.addressof(self.ctx)
        c[SPIN], c[ARGV] = spin, ctypes.addressof(self.argv)
        c[SYSCALL] = ctypes.cast(libc.syscall, ctypes.c_void_p).value
        c[YIELD] = ctypes.cast(libc.sched_yield, ctypes.c_void_p).value
        self.workers, self.pid = workers, os.getpid()
        self.lock = threading.Lock()  # one job at a time; a second Python thread uses the Python threads
        # called without the GIL: the caller runs chunks like any worker
        self._run = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("run"))
        self._sequence = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("sequence"))
        self.tids: list = []
        start = ctypes.c_void_p(self.engine.get_function_address("worker"))
        for _ in range(workers):
            tid = ctypes.c_ulong()
            err = libc.pthread_create(ctypes.byref(tid), None, start, ctypes.c_void_p(self.address))
            if err:
                self.close()
                raise OSError(err, f"pthread_create: {os.strerror(err)}")
            self.tids.append(tid)

    def run(self, address: int, args: tuple, n: int, chunks: int) -> int:
        """Run the native function at `address` on range(n), cut into `chunks` ranges (at most 65535)
        that the caller and the workers claim one at a time; 0, or the status of a range that failed."""
        if len(args) > MAX_ARGS or not 1 <= chunks <= min(n, MAX_CHUNKS):
            raise ValueError(f"a job of {len(args)} arguments over {chunks} ranges of {n}: at most "
                             f"{MAX_ARGS} arguments, 1 to {MAX_CHUNKS} ranges of at least one iteration")
        c = self.ctx
        c[FN], c[NARGS], c[N] = address, len(args), n
        self.argv[: len(args)] = args
        return self._run(self.address, chunks)

    def sequence(self, records: int, count: int) -> tuple[int, int]:
        """Run `count` records (at address `records`, int64 words: see `sequence` in the IR) in order, the
        threaded ones as `run` runs a job, without coming back to Python between them; the caller holds
        `lock`. (0, 0), or (index of the record that failed, its status)."""
        failed = self._sequence(self.address, records, count)
        self.ctx[ARGV] = ctypes.addressof(self.argv)  # (the records pointed it at their arguments)
        return (0, 0) if failed == 0 else (failed - 1, self.ctx[STATUS])

    def close(self) -> None:
        """Stop the workers and wait for them (at exit: no thread may run code the engine frees)."""
        if self.pid != os.getpid() or not self.tids or not self.lock.acquire(timeout=10):
            return
        try:
            self.ctx[STOP] = 1
            self._run(self.address, 0)  # a job of no ranges: every worker wakes, reads STOP and returns
            for tid in self.tids:
                self.libc.pthread_join(tid, None)
            self.tids = []
        finally:
            self.lock.release()


_POOLS: dict[int, Pool] = {}  # workers -> this process's pool of that many (kept: their code outlives them)


@functools.cache
def _closing() -> None:
    atexit.register(lambda: [p.close() for p in list(_POOLS.values())])


def pool(workers: int, spin: int) -> Pool | None:
    """This process's pool of `workers` native threads (started on first use), whose workers spin `spin`
    time-stamp cycles for a next job before they sleep (HostTuning.spin_cycles), or None where there can be
    none: not Linux x86-64, TGRAD_NATIVE_THREADS=0, or it failed to start (then it warns once)."""
    p = _POOLS.get(workers)
    if p is not None and p.pid == os.getpid():
        p.ctx[SPIN] = spin  # (read by each worker each time it starts waiting)
        return p
    if not enabled():
        return None
    _closing()
    try:
        p = _POOLS[workers] = Pool(workers, spin)
    except Exception as e:  # noqa: BLE001  (the Python threads still work)
        _FAILED.append(f"{type(e).__name__}: {e}")
        warnings.warn(f"tgrad: native CPU worker threads did not start ({_FAILED[-1]}); threaded kernels "
                      "use Python threads", stacklevel=3)
        return None
    return p


_FAILED: list[str] = []


def enabled() -> bool:
    """Whether threaded kernels may use native workers here (read when a pool is started)."""
    return supported() and config.on("TGRAD_NATIVE_THREADS") and not _FAILED
