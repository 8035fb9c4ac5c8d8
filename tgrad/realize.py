"""The driver: schedule -> compile -> run -> read back, the same for every device.

`realize(nodes)` cuts the graph into kernels (fuse.schedule), has each device's runtime compile them
(`Runtime.runner`: its emitter renders, the runtime compiles, both cached) and runs them in order.
`read(node)` reads a realized node back (inplace.realize / inplace.to_numpy first compute what an
assign's write would leave reading overwritten buffers, then call these). `upload` puts host data on a device.
`run_host(step, nodes)` runs a `HostStep`, a Python function over numpy arrays, between kernels (an MPI
allreduce in tgrad/distributed.py): its inputs are read back and its outputs are new device buffers.

A `Recorder` (TinyJit's) sees everything a step does that a replay must repeat: each kernel launch,
each host step, each host upload, each random draw, and each read back to the host. Install one with
`recording()`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Hashable, Iterator

import numpy as np

from tgrad import device, fuse, schedule_cache
from tgrad.device import Buffer, Runner, Runtime, Stats, check_memory, get_runtime, out_of_memory
from tgrad.dtype import DType, dtypes, round_to
from tgrad.errors import GraphDepthError, user_frame
from tgrad.graph import MOVEMENT, Node, Op, prod
from tgrad.runtime.numpy import movement


class Recorder:
    """What the driver reports while a recorder is installed (this base class ignores it all)."""

    # whether kernels may run together as the device plans (the CPU's row groups); a pruning TinyJit
    # records each kernel alone, so that it can leave out some and keep others
    groups = True

    def launch(self, runner: Runner, out: Buffer, inputs: list[Buffer], fresh: bool, node: Node) -> None:
        """A kernel ran: `fresh` when `out` was allocated for it (not an assign()'s target)."""

    def host(self, step: HostStep, inputs: list[Node], outputs: list[Buffer]) -> None:
        """A host step ran: it read the buffers of `inputs` and wrote the new buffers `outputs`."""

    def upload(self, buf: Buffer, array: np.ndarray) -> None:
        """Host data was copied into a new device buffer."""

    def random(self, buf: Buffer, draw: Callable, dtype: DType, device: str) -> None:
        """`buf` holds `draw(rng)`, random numbers drawn on the host (see Tensor._random)."""

    def read(self, node: Node) -> None:
        """A value is about to be read back to the host (.numpy(), .item(), ...)."""

    def evaluate(self, device: str) -> None:
        """A device that evaluates graphs (no kernels to record: the NUMPY reference) computed nodes."""


RECORDER: Recorder | None = None


@contextlib.contextmanager
def recording(recorder: Recorder | None) -> Iterator[Recorder | None]:
    """Report launches, uploads, random draws and reads to `recorder` inside the block (None: to no one,
    as for a constant tgrad keeps across calls)."""
    global RECORDER
    saved, RECORDER = RECORDER, recorder
    try:
        yield recorder
    finally:
        RECORDER = saved


def upload(array: np.ndarray, device: str) -> Buffer:
    """A new buffer on `device` holding a copy of `array`."""
    buf = get_runtime(device).from_numpy(np.ascontiguousarray(array))
    if RECORDER is not None:
        RECORDER.upload(buf, array)
    return buf


class HostStep:
    """A Python function run on the host between kernels, which TinyJit records and replays in order.

    `fn(inputs, outputs)` gets the input values as numpy arrays (read-only: on the CPU they are the
    buffers themselves) and must write every element of `outputs`, new numpy arrays of the shapes and
    dtypes listed in `outputs`; each becomes a new buffer on `device`. A replay calls the same `fn` with
    that call's buffers, so `fn` may depend on its inputs and on Python values that `key` names, nothing
    else: before TinyJit captures, it compares each host step's (name, key) between two calls, as it
    compares kernel sources, and a step whose key changed is not frozen.
    """

    def __init__(self, name: str, fn: Callable[[list[np.ndarray], list[np.ndarray]], None],
                 outputs: list[tuple[tuple[int, ...], DType]], device: str, key: Hashable = None):
        self.name, self.fn, self.outputs, self.device, self.key = name, fn, outputs, device, key

    def __call__(self, inputs: list[Buffer], shapes: list[tuple[int, ...]]) -> list[Buffer]:
        """Run fn over the values of `inputs` (buffers holding arrays of `shapes`); returns the output
        buffers, new ones on self.device."""
        arrays = []
        for buf, shape in zip(inputs, shapes):
            arr = get_runtime(buf.device).to_numpy(buf).reshape(shape)
            arr.setflags(write=False)  # a view: on the CPU this is the buffer itself
            arrays.append(arr)
        if not self.outputs:  # (a check: nothing to allocate or return)
            self.fn(arrays, [])
            return []
        rt = get_runtime(self.device)
        # where buffers are host memory (CPU, NUMPY) fn writes straight into the new buffers
        bufs = [rt.alloc(prod(shape), dtype) for shape, dtype in self.outputs]
        outs = [b.data if isinstance(b.data, np.ndarray) else np.empty(b.size, b.dtype.np) for b in bufs]
        self.fn(arrays, [o.reshape(shape) for o, (shape, _) in zip(outs, self.outputs)])
        for o, (_, dtype) in zip(outs, self.outputs):
            if dtype in dtypes.HOST_FLOATS + dtypes.fp8s:  # float32 arrays holding bfloat16 / fp8 values
                o[:] = round_to(o, dtype)
        return [b if b.data is o else rt.from_numpy(o) for b, o in zip(bufs, outs)]

    def __repr__(self) -> str:
        return f"<HostStep {self.name} on {self.device}>"


def run_host(step: HostStep, inputs: list[Node]) -> list[Node]:
    """Run a host step over realized nodes (each a whole buffer) and report it to the recorder; returns
    BUFFER nodes over its new output buffers."""
    for i, n in enumerate(inputs):
        if not n.realized or n.buffer.size != prod(n.shape):
            raise ValueError(f"run_host({step.name}): input {i} ({n.shape}) is not a realized buffer")
    outputs = step([n.buffer for n in inputs], [n.shape for n in inputs])
    if RECORDER is not None:
        RECORDER.host(step, inputs, outputs)
    return [
        Node.from_buffer(buf, shape, dtype, step.device) for buf, (shape, dtype) in zip(outputs, step.outputs)
    ]


def report_random(buf: Buffer, draw: Callable, dtype: DType, device: str) -> None:
    if RECORDER is not None:
        RECORDER.random(buf, draw, dtype, device)


def _debug_kernel(rt: Runtime, item: fuse.ScheduleItem, out: Buffer, seconds: float, runner,
                  built: float | None = None) -> None:
    k, name = item.kernel, runner.name
    # (an input a pair group kept in its threads' caches has no buffer: not counted as memory traffic)
    nbytes = out.size * out.dtype.itemsize + sum(n.buffer.size * n.dtype.itemsize for n in item.inputs
                                                 if n.buffer is not None)
    flops = prod(k.shape)
    opts = " ".join(map(repr, getattr(runner, "opts", ())))  # (a row group's runner has none)
    print(f"  {rt.name:6s} {name:30s} {str(k.shape):24s} {seconds * 1e3:9.3f} ms "
          f"{flops / seconds / 1e9 if seconds else 0:8.2f} GFLOP/s "
          f"{nbytes / seconds / 1e9 if seconds else 0:8.2f} GB/s {opts}"
          + ("" if built is None else f"(its function built first: {built * 1e3:.3f} ms, not counted)"),
          file=sys.stderr)


def pretty(expr, indent: int = 0, width: int = 100) -> str:
    """A kernel expression for people (DEBUG=3): on one line when it fits in `width`, else one
    sub-expression per line, its arguments indented under it."""
    flat = repr(expr)
    if expr is None or indent + len(flat) <= width or not getattr(expr, "srcs", None):
        return flat
    pad = " " * (indent + 2)
    if expr.op == "LOAD":
        index, valid = expr.srcs[0], expr.srcs[1]
        head = f"in{expr.arg}[\n{pad}{pretty(index, indent + 2, width)}\n{' ' * indent}]"
        return head if fuse.is_true(valid) else f"{head} if\n{pad}{pretty(valid, indent + 2, width)}"
    args = f",\n{pad}".join(pretty(src, indent + 2, width) for src in expr.srcs)
    return f"{expr.op}(\n{pad}{args}\n{' ' * indent})"


class _Progress:
    """Compile time of one realize; once it passes 2 s, a line per second on stderr (kernels compiled /
    to compile) when stderr is a terminal or DEBUG >= 1."""

    def __init__(self, to_compile: int):
        self.total, self.done, self.seconds, self.shown = to_compile, 0, 0.0, 0.0
        # row groups whose function was built (compiled, or loaded from the cache) at their first run
        self.groups, self.group_seconds = 0, 0.0

    def compiled(self, seconds: float) -> None:
        self.done, self.seconds = self.done + 1, self.seconds + seconds
        loud = device.DEBUG >= 1 or sys.stderr.isatty()
        if loud and self.seconds > 2.0 and self.seconds - self.shown >= 1.0 and self.done < self.total:
            self.shown = self.seconds
            print(f"tgrad: compiled {self.done}/{self.total} kernels ({self.seconds:.1f} s)", file=sys.stderr)


class _Later:
    """What TinyJit records for a kernel that its row group's function computes (at the group's last)."""

    name, source, placeholder = "(in a row group)", "", True  # (TinyJit counts no kernel for it)

    def __call__(self, out: Buffer, *inputs: Buffer) -> None:
        pass


_LATER = _Later()


def _copy(rt: Runtime, buf: Buffer, node: Node) -> Buffer:
    """A copy of a buffer made by a kernel (on any device; TinyJit records it like any launch)."""
    n, dt = buf.size, buf.dtype
    idx = fuse.Expr("IDX", (), (0, n), fuse.IDX_DT)
    load = fuse.Expr("LOAD", (idx, fuse.const(True, dtypes.bool)), 0, dt)
    kernel = fuse.Kernel(name=f"E_{n}", shape=(n,), n_global=1, reduce_op=None, reduce_expr=None, expr=load,
                         out_index=idx, out_dtype=dt, in_dtypes=(dt,))
    runner, out = rt.runner(kernel), rt.alloc(buf.size, buf.dtype)
    runner(out, buf)
    if RECORDER is not None:
        RECORDER.launch(runner, out, [buf], fresh=True, node=node)
    return out


def _plan(items: list[fuse.ScheduleItem], requested: list[Node]) -> tuple[dict, set[int]]:
    """What the items' devices run together (Runtime.plan: the CPU's row groups and pairs): {index of a
    group's last item: (its runner, the nodes it takes, index of its first item)}, and the items whose
    output only such a group needs (no buffer, never realized)."""
    groups: dict[int, tuple[Runner, list[Node], int]] = {}
    private: set[int] = set()
    if RECORDER is not None and not RECORDER.groups:
        return groups, private
    for rt in dict.fromkeys(get_runtime(it.out.device) for it in items):
        more, hidden = rt.plan(items, requested)
        groups.update(more)
        private |= hidden
    return groups, private


def run_schedule(items: list[fuse.ScheduleItem], requested: list[Node] = ()) -> None:
    """Run scheduled kernels in order; each item's output node gets its buffer (but the outputs that only
    a pair group needs, `_private_of`; `requested`, the nodes the caller reads, are never among them)."""
    t_all = time.perf_counter()
    groups, private = _plan(items, requested)
    hidden = {id(items[i].out) for i in private}
    later = {i for last, (_, _, first) in groups.items() for i in range(first, last)}  # run by the group
    new: dict[Runtime, list] = {}  # kernels to compile, by device (the CPU compiles them in parallel)
    runs: dict[Runtime, list[Runner]] = {}  # row groups, by device (their functions compile with them)
    for last, (runner, _, _) in groups.items():
        runs.setdefault(get_runtime(items[last].out.device), []).append(runner)
        new.setdefault(get_runtime(items[last].out.device), [])
    for index, it in enumerate(items):
        rt = get_runtime(it.out.device)
        grouped = index in later or index in groups
        if it.kernel not in rt.runners and fuse.has_work(it.kernel) and not grouped:
            new.setdefault(rt, []).append(it.kernel)
        if it.target is None and index not in private:  # before anything runs: nothing is half-written
            check_memory(rt, it.out.shape, it.out.dtype, functools.partial(_what, it))
    progress = _Progress(sum(len(ks) for ks in new.values()))
    t0 = time.perf_counter()
    for rt, kernels in new.items():
        rt.prepare(kernels, runs.get(rt, []))
    progress.seconds += time.perf_counter() - t0
    for index, it in enumerate(items):
        rt = get_runtime(it.out.device)
        k = it.kernel
        if index in private:  # its group keeps it (nothing to allocate, record or realize)
            continue
        out = it.target.buffer if it.target is not None else _alloc(rt, it)
        if index in later:  # written by its group's function, which runs at the group's last kernel
            if RECORDER is not None:
                RECORDER.launch(_LATER, out, [], fresh=it.target is None, node=it.out)
        elif fuse.has_work(k):
            fresh = index not in groups and k not in rt.runners
            t0 = time.perf_counter()
            if index in groups:
                runner, nodes, _ = groups[index]
                # (an output the group keeps: an empty buffer in its place, which tells its runner so)
                inputs = [rt.alloc(0, n.dtype) if id(n) in hidden else n.buffer for n in nodes]
            else:
                runner, inputs = rt.runner(k), [n.buffer for n in it.inputs]
                if fuse.reads_target_elsewhere(it):
                    tb = it.target.buffer
                    inputs = [_copy(rt, b, n) if b is tb else b for n, b in zip(it.inputs, inputs)]
            if fresh:
                progress.compiled(time.perf_counter() - t0)
            built, t0 = None, time.perf_counter()
            if index in groups and runner.build():  # (else its run would time this)
                built = time.perf_counter() - t0
                progress.groups, progress.group_seconds = progress.groups + 1, progress.group_seconds + built
            if device.DEBUG >= 3:
                print(f"kernel {k.name}: shape {k.shape} global {k.global_shape} reduce {k.reduce_op}\n"
                      f"  expr   {pretty(k.expr, 9)}\n  reduce {pretty(k.reduce_expr, 9)}", file=sys.stderr)
            if device.DEBUG >= 4:
                print(runner.source, file=sys.stderr)
            t0 = time.perf_counter()
            runner(out, *inputs)
            Stats.kernels_run += 1
            if RECORDER is not None:
                RECORDER.launch(runner, out, inputs, fresh=it.target is None, node=it.out)
            if device.DEBUG >= 2:
                rt.synchronize()
                _debug_kernel(rt, it, out, time.perf_counter() - t0, runner, built)  # (a row group's name)
        if it.out.op is Op.ASSIGN and RECORDER is None:  # TinyJit's checks walk what a capture wrote
            it.out.written(out)
        else:
            it.out.buffer = out
            if it.target is None:
                out.computed = True
    if device.DEBUG >= 1 and items:
        ms = (time.perf_counter() - t_all) * 1e3
        where = user_frame() or "inside tgrad"
        groups = (f", {progress.groups} row group functions built in {progress.group_seconds * 1e3:.2f} ms"
                  if progress.groups else "")
        print(f"realize: {len(items)} kernels in {ms:.2f} ms ({progress.total} compiled in "
              f"{progress.seconds * 1e3:.2f} ms{groups}, the rest running) {where}", file=sys.stderr)


def _what(it: fuse.ScheduleItem) -> str:
    return f"realize, kernel {it.kernel.name} ({it.out.op.name})"


def _alloc(rt: Runtime, it: fuse.ScheduleItem) -> Buffer:
    """The buffer of a scheduled item's output; the device running out of memory (numpy's MemoryError, or
    one its runtime made of the driver's error) raises an OutOfMemoryError naming the kernel."""
    try:
        return rt.alloc(prod(it.out.shape), it.out.dtype)
    except MemoryError as e:
        raise out_of_memory(e, rt, it.out.shape, it.out.dtype, _what(it)) from e


def realize(nodes: list[Node]) -> None:
    """Compute exactly these nodes (grouped by device); movement ops over realized nodes stay views.
    (inplace.realize adds the live tensors its assigns would leave reading overwritten buffers.)"""
    by_device: dict[str, list[Node]] = {}
    for n in nodes:
        by_device.setdefault(n.device, []).append(n)
    for name, group in by_device.items():
        rt = get_runtime(name)
        try:
            if rt.evaluates_graphs:
                if RECORDER is not None:
                    RECORDER.evaluate(name)
                rt.evaluate(group)
            else:
                run_schedule(schedule_cache.schedule(group, rt.props.fuse), group)
        except MemoryError as e:  # (a reference device's numpy, a kernel's scratch: else _alloc names it)
            raise out_of_memory(e, rt, group[0].shape, group[0].dtype, f"realize on {name}") from e
        except RecursionError as e:
            if isinstance(e, GraphDepthError):
                raise
            # (not chained: the cause is thousands of identical frames)
            raise GraphDepthError(
                f"realize: the graph is too deep to schedule and compile on {name} (a chain of ops longer "
                f"than Python's recursion limit, {sys.getrecursionlimit()}, allows from here); realize() "
                "parts of it as you build it, e.g. every few hundred ops of a loop") from None


def note_read(node: Node) -> None:
    """A value is about to be read back to the host (TinyJit refuses that inside a capture)."""
    if RECORDER is not None:
        RECORDER.read(node)


def read(node: Node) -> np.ndarray:
    """The value of a realized node as a numpy array (movement ops over a realized buffer are applied on
    the host)."""
    return _read_views(node)


def _read_views(node: Node) -> np.ndarray:
    if node.realized:
        return get_runtime(node.device).to_numpy(node.buffer).reshape(node.shape)
    if node.op in MOVEMENT:
        return movement(node.op, node.arg, _read_views(node.srcs[0]))
    if node.op is Op.DETACH:
        return _read_views(node.srcs[0])
    raise ValueError(f"{node} is not realized")
