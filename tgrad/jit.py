"""TinyJit: run a function of Tensors normally, capture the kernels of a later call, replay them after.

Per signature of a call (the Tensor arguments' shapes, dtypes, devices and aliasing, the other arguments'
values), the first call runs the function normally, the second runs it and records every kernel launch
(and host step and random draw), and later calls replay the recorded launches with the new buffers
swapped in, without running the Python function: no graph, no scheduling. The main rule: a replay gives
the same values as running the function would, or the capture is refused with a JitError that says what
to do (a value read with .numpy() inside the function, state kept by rebinding an attribute instead of
assign(), arguments whose values change every call...). So arguments are realized into buffers of their
own first, returned tensors get fresh buffers on every call, assign()ed state and gradients are inputs
and outputs of the replay, random tensors are drawn again, and PyTorch's in-place semantics hold
(inplace.py). Replays reuse memory between buffers whose lives do not overlap (jit_replay.py).

The rules in full: README "TinyJit rules" (each has a test in tests/test_jit_footguns.py) and
docs/architecture.md, "TinyJit (jit.py)". JIT=0 turns TinyJit into a plain call; DEBUG=1 prints each
capture and replay.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tgrad import config, device, inplace, jit_replay, symbolic
from tgrad import graph as g
from tgrad import realize as driver
from tgrad import tensor as tensor_mod
from tgrad.device import Stats, get_runtime
from tgrad.dtype import host_values
from tgrad.errors import JitError
from tgrad.graph import Op
from tgrad.jit_replay import _HostCall
from tgrad.tensor import Tensor

MAX_UNSTABLE = 3  # calls in a row that differ from the previous one before JitError


def _copy(t: Tensor) -> Tensor:
    """A contiguous copy of t (one elementwise kernel when realized)."""
    return Tensor(tensor_mod.copy_node(t.node))


def _flatten(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    return [value]


def _rebuild(value: Any, it) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, it) for v in value)
    if isinstance(value, dict):
        return {k: _rebuild(v, it) for k, v in value.items()}
    return next(it) if isinstance(value, Tensor) else value


def _structure(value: Any) -> Any:
    """The shape of an argument tree: containers and where the Tensors are (values are keyed apart)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_structure(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _structure(v)) for k, v in value.items()))
    return "T" if isinstance(value, Tensor) else "."


def _arg_key(v: Any) -> tuple:
    """How a non-Tensor argument enters the signature: plain values by value, objects by identity."""
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return (type(v).__name__, v)
    if isinstance(v, symbolic.Sym):  # the variables, not their values: arguments of the capture
        return v.var.key
    if isinstance(v, (float, complex)):
        return (type(v).__name__, repr(v))  # repr: nan equals nan
    if isinstance(v, np.ndarray):
        raise JitError(
            "a TinyJit function got a numpy array argument: its contents would be frozen at capture. "
            "Pass Tensor(array) instead"
        )
    return (type(v).__name__, id(v))  # the variant keeps the object alive, so the id stays its own


def under_reshapes(node: g.Node) -> g.Node:
    """The node under node's chain of unrealized reshapes (a matmul's result, a weight gradient, x.sum():
    a reshape of the node a kernel computes, the same elements in the same order)."""
    while node.op is Op.RESHAPE and not node.realized:
        node = node.srcs[0]
    return node


def _buffer_of(node: g.Node):
    """The buffer of a realized node or of the realized node a chain of reshapes is over (None: neither)."""
    return under_reshapes(node).buffer


def _bare(t: Tensor, gradient: bool = False) -> Tensor:
    """Make t (in place: the caller's Tensor) a new BUFFER node over a contiguous buffer of its own.

    A new node, even over the same buffer, so that the graph built on it in this call is new: the graph
    is hash-consed, and a node realized by an earlier call would otherwise be reused, not recaptured.
    A `gradient` (a parameter's .grad, read by the function, never written in place) that is a reshape of
    a realized buffer, as backward() leaves a matmul's weight gradient, is that buffer: the same values
    in the same order, no copy kernel."""
    if t.requires_grad and tensor_mod._grad_leaves.get(id(t)) is not t:
        raise JitError(
            f"a Tensor argument of shape {t.shape} carries a gradient history from outside the TinyJit "
            "function; replays cannot recompute it. Compute it inside the function, or pass .detach()"
        )
    buf = _buffer_of(t.node) if gradient else t.node.buffer
    if buf is None:
        buf = _copy(t).realize().node.buffer
    buf.computed = False  # (the argument's own: an assign() to it writes there, and replays write back)
    sym = symbolic.of(t.node)
    t.node = symbolic.register(g.Node.from_buffer(buf, t.node.shape, t.dtype, t.device), sym)
    return t


@contextlib.contextmanager
def _outside_done() -> Iterator[None]:
    """Forget which tensors were made before the call (inplace.OUTSIDE) when it ends, however it ends."""
    try:
        yield
    finally:
        inplace.OUTSIDE = None


def _reaches(nodes: tuple[g.Node, ...], ids: set[int]) -> bool:
    """Whether the graph of one of the nodes reads one of the buffers in ids."""
    stack, seen = list(nodes), set()
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            if n.op is Op.BUFFER and id(n.buffer) in ids:
                return True
            stack.extend(n.srcs)
    return False


def _realize(*tensors: Tensor | None) -> None:
    tensors = [t for t in tensors if t is not None]
    if tensors:
        Tensor.realize(*tensors)


def _digest(arr: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).hexdigest()


def _kernels(launches: list[tuple]) -> list[tuple]:
    """The kernel launches: not host steps, nor the placeholders of kernels a row group computes."""
    return [launch for launch in launches
            if not isinstance(launch[0], _HostCall) and not getattr(launch[0], "placeholder", False)]


class _Recorder(driver.Recorder):
    """What one call of the function did, as the realize driver reports it: the kernel launches (runner,
    out buffer, input buffers) and host steps (_HostCall, output buffers, input buffers) in the order they
    ran, random draws and host uploads. It also notes, per written buffer, the node counter at the write
    (a BUFFER node made before that holds the buffer's old value, which an assign() overwrote), and which
    buffers were allocated in this call (`fresh`). Reading a value back to the host raises: replays would
    not run the Python code that uses it."""

    def __init__(self):
        self.launches: list[tuple] = []
        self.written: dict[int, int] = {}
        # id(buffer allocated in this call) -> (its shape, the nodes its value was computed from, a weak
        # reference to it: once it is freed, its id may name a new buffer)
        self.fresh: dict[int, tuple[tuple[int, ...], tuple[g.Node, ...], weakref.ref]] = {}
        self.randoms: list[tuple] = []  # (buffer, draw, dtype, device)
        self.hosts: list[tuple] = []  # (buffer, host array)
        self.evaluated = False  # whether a graph-evaluating device (NUMPY) computed something

    def launch(self, runner, out, inputs, fresh: bool, node: g.Node) -> None:
        self.launches.append((runner, out, inputs))
        self.written[id(out)] = next(g.Node._ids)
        if fresh:
            self.fresh[id(out)] = (node.shape, (node,), weakref.ref(out))

    def host(self, step, inputs, outputs) -> None:
        call = _HostCall(step, [n.shape for n in inputs])
        self.launches.append((call, outputs, [n.buffer for n in inputs]))
        # the outputs are computed from the inputs, and from what the kernels of this call that wrote
        # the inputs read
        sources = tuple(inputs) + tuple(n for i in inputs for n in self.fresh.get(id(i.buffer), ((), ()))[1])
        for out, (shape, _) in zip(outputs, step.outputs):
            self.written[id(out)] = next(g.Node._ids)
            self.fresh[id(out)] = (shape, sources, weakref.ref(out))

    def upload(self, buf, array) -> None:
        self.hosts.append((buf, array))

    def random(self, buf, draw, dtype, device) -> None:
        self.randoms.append((buf, draw, dtype, device))

    def evaluate(self, device: str) -> None:
        self.evaluated = True  # nothing to replay: the function runs plainly every call

    def read(self, node) -> None:
        raise JitError(
            ".numpy()/.item()/.tolist()/bool() inside a TinyJit function reads a value once, and replays "
            "would not run the Python code that uses it (control flow on tensor values is frozen): return "
            "the tensor and read it outside the function, or use Tensor.where for data-dependent choices"
        )

    def reads(self) -> set[int]:
        return {id(b) for _, _, ins in self.launches for b in ins}

    def host_outputs(self) -> set[int]:
        return {id(b) for prg, outs, _ in self.launches if isinstance(prg, _HostCall) for b in outs}


def _stale_leaves(t: Tensor, written: dict[int, int]) -> bool:
    """Whether the unrealized graph of t reads a buffer through a node made before an assign() in this
    call overwrote that buffer (a view of the buffer sees the write, as in PyTorch: not stale). The
    realize that ran the assign computed every live tensor that read the old value first (inplace.py),
    so this catches only what that missed."""
    if inplace.is_view(t.node):
        return False
    stack, seen = [t.node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Op.BUFFER:
            if written.get(id(n.buffer), -1) > n.arg:
                return True
            continue
        if n.realized:
            continue
        stack.extend(n.srcs[1:] if n.op is Op.ASSIGN else n.srcs)
    return False


def _meta(t: Tensor) -> tuple:
    return (t.node.shape, t.dtype, t.device)  # (a symbolic axis at its variable's max: symbolic.py)


def _variables(flat: list, tensors: list[Tensor]) -> tuple[dict, list[Tensor]]:
    """The bound variables among the arguments (passed, or the extents of Tensor arguments' axes), by
    variable, and a 0-d tensor per variable and device holding its value: argument buffers of the call,
    which kernels read at launch (one capture serves every value)."""
    found = symbolic.bound_in(flat)
    if not found:
        return {}, []
    devices = sorted({t.device for t in tensors} or {device.default_device()})
    values = []
    for bv in found.values():
        for d in devices:
            t = Tensor(bv.node(d))
            _bare(t)
            bv._nodes[d] = t.node
            values.append(t)
    return {bv.var.key: bv for bv in found.values()}, values


def _with_variables(t: Tensor, like: Tensor, current: dict) -> Tensor:
    """t (a returned buffer) with like's symbolic axes, their variables those of this call."""
    sym = symbolic.of(like.node)
    if sym is not None:
        symbolic.register(t.node, tuple(None if v is None else v.rebind(current) for v in sym))
    return t


def _prune(v: _Variant) -> list[tuple]:
    """TinyJit(prune=True): the captured launches a replay must run. Kept: what reads (directly or through
    kept launches' results) an argument, a gradient passed in, a random draw or a bound variable; what
    writes a returned value, a gradient or state in place (an assign: its effect is due at every call);
    what reads a buffer a kept launch writes in place (an earlier kernel reading a weight that the
    step's update overwrites); and what writes a buffer a kept launch writes too (the first value of a
    buffer that a kept assign then updates). The rest ran at the capture and its results stay: their
    buffers leave v.made, so memory planning never gives them to another buffer. (A pruning TinyJit
    records each kernel alone, no CPU row groups: a group's one launch computes several kernels.)"""

    def outs_of(launch: tuple) -> tuple:
        return tuple(launch[1]) if isinstance(launch[0], _HostCall) else (launch[1],)

    needed = set(v.in_ids) | {k for _, k in v.grad_ins} | {k for k, *_ in v.randoms}
    must_write = {k for k, *_ in v.fresh} | set(v.out_ids) | v.inplace
    kept = [False] * len(v.captured)
    changed = True
    while changed:  # (a buffer written in place may be read by an earlier launch: until nothing changes)
        changed = False
        for i, launch in enumerate(v.captured):
            if kept[i]:
                continue
            outs = {id(b) for b in outs_of(launch)}
            # it reads a needed buffer, writes one a kept launch writes too, or writes what must be written
            if (outs | {id(b) for b in launch[2]}) & needed or outs & must_write:
                kept[i] = changed = True
                needed |= outs
    v.made -= {id(b) for launch, keep in zip(v.captured, kept) if not keep for b in outs_of(launch)}
    return [launch for launch, keep in zip(v.captured, kept) if keep]


class _Variant:
    """The capture for one call signature."""

    def __init__(self, keep: list):
        self.keep = keep  # non-Tensor arguments: kept alive so that their ids stay theirs
        self.cnt = 0  # 0: never run, 1: ran once (the next call captures), 2: captured
        # (program, out buffer, input buffers) and (_HostCall, output buffers, input buffers), in order
        self.captured: list[tuple] = []
        self.in_ids: dict[int, int] = {}  # id(argument buffer at capture) -> argument position
        self.fresh: list[tuple] = []  # (id(buffer at capture), (shape, dtype, device)): new each replay
        self.out_ids: list[int] = []  # id(buffer at capture) per returned Tensor
        self.grad_ins: list[tuple] = []  # (leaf ref, id(its .grad buffer before the call at capture))
        self.grad_outs: list[tuple] = []  # (leaf ref, id(its .grad buffer after) or None for no grad)
        self.needs: list[tuple] = []  # (leaf ref, grad meta before the call or None): when this replays
        self.randoms: list[tuple] = []  # (id(buffer at capture), draw, dtype, device) in draw order
        self.inplace: set[int] = set()  # ids of the buffers a replay writes in place (assigned state)
        self.ret: Any = None
        self.first_other: Any = None
        self.first_fresh: dict[int, tuple] = {}  # call 1's new buffers, to spot values kept across calls
        self.first_inputs: list = []  # call 1's argument and random buffers
        self.first_hosts: list[tuple] = []  # call 1's tensors from host data: (shape, digest)
        self.first_progs: list[tuple] = []  # call 1's kernels: (name, source)
        self.unstable = 0  # calls in a row that differed from the one before
        self.made: set[int] = set()  # buffers the capture's kernels wrote first (jit_replay.plan)
        self.planned = False  # whether jit_replay.plan ran (at the first replay)
        self.steps: list = []  # what a replay runs (jit_replay.batched, after plan)

    def matches(self) -> bool:
        """Whether the gradients of the parameters are in the state this capture assumed."""
        for ref, meta in self.needs:
            leaf = ref()
            if leaf is None:
                return False
            now = None if leaf.grad is None else _meta(leaf.grad)
            if now != meta:
                return False
        return True


class TinyJit:
    """Decorate a function of Tensors: per call signature, call 1 runs it, call 2 captures its kernels,
    later calls replay them (see the module docstring for the rules). `@TinyJit(prune=True)` is the
    decorator with options."""

    def __new__(cls, fn: Callable | None = None, *args, **kwargs):
        if fn is None:  # TinyJit(prune=True) as a decorator (tinygrad's spelling)
            return functools.partial(cls, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, fn: Callable, max_captures: int = 8, fallback: bool = False, prune: bool = False):
        """fallback (tgrad's own uses, Optimizer.step): where a capture is refused (its kernels keep
        changing, too many signatures, state kept in Python), run the function plainly from then on
        instead of raising JitError. prune (tinygrad's option): replays leave out the kernels whose
        inputs do not depend on the call's arguments (their results, computed at the capture, are kept),
        e.g. a transform of weights; the function promises that the tensors it reads besides its
        arguments do not change between calls (see _prune)."""
        self.fn, self.max_captures, self.fallback, self.prune = fn, max_captures, fallback, prune
        try:
            self._sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._sig = None
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.reset()
        functools.update_wrapper(self, fn)

    def reset(self) -> None:
        """Forget every capture: the next call runs normally again."""
        self._variants: dict[tuple, list[_Variant]] = {}
        self._last: _Variant | None = None
        self.plain = False  # a fallback TinyJit whose capture was refused: it runs the function plainly
        self.captures = 0  # signatures captured
        self.replays = 0  # calls answered by a replay

    # the state of the variant used last (tests and DEBUG read these)
    @property
    def cnt(self) -> int:
        return self._last.cnt if self._last else 0

    @property
    def captured(self) -> list[tuple]:
        return self._last.captured if self._last else []

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", "fn")

    def _debug(self, message: str) -> None:
        if device.DEBUG >= 1:
            print(f"TinyJit {self.name}: {message}", file=sys.stderr)

    @property
    def kernel_names(self) -> list[str]:
        return [prg.name for prg, _, _ in _kernels(self.captured)]

    def __get__(self, obj, objtype=None):  # a method decorator: one TinyJit (one cache) per instance
        if obj is None:
            return self
        try:
            jit = self._bound.get(obj)
            if jit is None:
                jit = TinyJit(self._weak_method(obj, objtype), self.max_captures, self.fallback, self.prune)
                self._bound[obj] = jit
            return jit
        except TypeError:  # not weak-referenceable or unhashable: the instance joins the signature
            return functools.partial(self.__call__, obj)

    def _weak_method(self, obj, objtype) -> Callable:
        """self.fn bound to obj through a weak reference: the per-instance cache does not keep obj alive."""
        ref, fn = weakref.ref(obj), self.fn

        def method(*args, **kwargs):
            return fn(ref(), *args, **kwargs)

        functools.update_wrapper(method, fn)
        method.__signature__ = inspect.signature(fn.__get__(obj, objtype))
        return method

    def _refuse(self, message: str) -> None:
        """Raise JitError(message); a fallback TinyJit runs the function plainly from then on instead."""
        if not self.fallback:
            raise JitError(message)
        self._debug(f"runs plainly from now on: {message}")
        self.plain = True

    def __call__(self, *args, **kwargs):
        if self.plain or not config.on("JIT"):
            return self.fn(*args, **kwargs)
        names, values = self._arguments(args, kwargs)
        flat = _flatten(values)
        tensors = [v for v in flat if isinstance(v, Tensor)]
        keep = [v for v in flat if not isinstance(v, Tensor)]
        others = tuple(_arg_key(v) for v in keep)
        if driver.RECORDER is not None:  # inside another TinyJit's function: that one captures us
            return self.fn(*args, **kwargs)
        pending = tensor_mod.pending_assigns()  # assign()s made outside and not run yet: run them first
        if pending:
            Tensor.realize(*pending)
        current, values_of = _variables(flat, tensors)
        for t in tensors:
            _bare(t)
        syms = tuple(symbolic.key_of(t.node) for t in tensors) if current else ()
        tensors += values_of
        bufs = [t.node.buffer for t in tensors]
        first = {}
        alias = tuple(first.setdefault(id(b), i) for i, b in enumerate(bufs))
        key = (names, _structure(values), tuple(_meta(t) for t in tensors), alias, others, syms)
        v = self._find(key, keep)
        if v is None:  # (a fallback TinyJit with too many signatures)
            return self.fn(*args, **kwargs)
        self._last = v
        if v.cnt >= 2:
            return self._replay(v, bufs, current)
        # a device without kernels (the NUMPY reference evaluates graphs) has nothing to capture: there
        # the function runs every time, under the same rules
        devices = {t.device for t in tensors} or {device.default_device()}
        plain = any(get_runtime(d).evaluates_graphs for d in devices)
        return self._run(v, args, kwargs, bufs, plain=plain)

    def _arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        """Argument names and values in the function's parameter order, however they were passed."""
        if self._sig is not None:
            try:
                bound = self._sig.bind(*args, **kwargs)
            except TypeError:
                pass
            else:
                values = []
                for name, value in bound.arguments.items():
                    kind = self._sig.parameters[name].kind
                    values.append(
                        dict(sorted(value.items())) if kind is inspect.Parameter.VAR_KEYWORD else value
                    )
                return tuple(bound.arguments), values
        return ("*", *sorted(kwargs)), [list(args), *[kwargs[k] for k in sorted(kwargs)]]

    def _find(self, key: tuple, keep: list) -> _Variant | None:
        variants = self._variants.setdefault(key, [])
        for v in variants:  # a capture whose gradient state matches, else one still warming up
            if v.cnt >= 2 and v.matches():
                return v
        for v in variants:
            if v.cnt < 2:
                return v
        if sum(len(vs) for vs in self._variants.values()) >= self.max_captures:
            return self._refuse(
                f"TinyJit({self.name}) was called with more than "
                f"{self.max_captures} "
                "different signatures (Tensor argument shapes/dtypes/devices, non-Tensor argument values, "
                "gradient state); each one is captured separately. Pass values that change on every call "
                "as Tensors; for a smaller last batch use drop_last=True (or pad it); or raise max_captures"
            )
        v = _Variant(keep)
        variants.append(v)
        return v

    def _run(self, v: _Variant, args, kwargs, bufs: list, plain: bool = False) -> Any:
        """Run the function, for the first time (v.cnt 0) or capturing (v.cnt 1); plain: just run it."""
        capture = v.cnt == 1
        leaves = [t for t in list(tensor_mod._grad_leaves.values()) if t.requires_grad]
        for t in leaves:
            if t.grad is not None:
                _bare(t.grad, gradient=True)
        pre = {id(t): t.grad for t in leaves}
        log = _Recorder()
        log.groups = not self.prune
        inplace.OUTSIDE = dict(inplace.LAZY)
        with driver.recording(log), _outside_done():
            ret = self.fn(*args, **kwargs)
            outs = [t for t in _flatten(ret) if isinstance(t, Tensor)]
            for i, t in enumerate(outs):
                if _stale_leaves(t, log.written):
                    raise JitError(
                        f"returned tensor {i} ({t.shape}) reads a buffer that an assign() in this call "
                        "already overwrote (e.g. a metric built before opt.step()): realize it together with "
                        "the update, opt.step(metric), or call metric.realize() before opt.step()"
                    )
            touched = [t for t in leaves if t.grad is not pre[id(t)]]
            # state updates the function left pending run now, with the outputs and the gradients
            _realize(*outs, *[t.grad for t in touched], *tensor_mod.pending_assigns())
            launched = len(log.launches)  # the function's own work, before copies of returned buffers
            # a value that outlives the call (an argument, a parameter, ...) is returned as a copy
            outs = [t if self._is_fresh(t, log) else _copy(t) for t in outs]
            for t in touched:
                if t.grad is not None and not self._is_fresh(t.grad, log):
                    t.grad = _copy(t.grad)
            _realize(*outs, *[t.grad for t in touched])
            # what leaves the call carries no graph (replays have none either)
            outs = [_with_variables(Tensor(g.Node.from_buffer(_buffer_of(t.node), *_meta(t))), t, {})
                    for t in outs]
            for t in touched:
                if t.grad is not None:
                    t.grad = Tensor(g.Node.from_buffer(_buffer_of(t.grad.node), *_meta(t.grad)))
        ret = _rebuild(ret, iter(outs))
        if plain or log.evaluated:  # (the NUMPY reference computed part of it: e.g. after x.to("NUMPY"))
            return ret
        ret_others = [x for x in _flatten(ret) if not isinstance(x, Tensor)]
        random_ids = {id(b) for b, *_ in log.randoms}
        host_sig = [(a.shape, _digest(a)) for b, a in log.hosts if id(b) not in random_ids]
        progs = [(prg.name, prg.source) for prg, _, _ in log.launches]
        changed = self._changed(v, ret_others, host_sig, progs) if capture else None
        if changed:
            v.unstable += 1
            if v.unstable >= MAX_UNSTABLE:
                self._refuse(
                    f"TinyJit: {v.unstable + 1} calls in a row with the same arguments differed in "
                    f"{changed}; replays would freeze one of them"
                )
                return ret
        if not capture or changed:  # run normally; the next call with these arguments tries to capture
            v.first_other, v.first_hosts, v.first_progs, v.cnt = ret_others, host_sig, progs, 1
            v.first_fresh, v.first_inputs = log.fresh, bufs + [b for b, *_ in log.randoms]
            return ret
        if not launched:
            self._refuse(
                "TinyJit captured no kernels: the function must compute something with Tensors "
                "(and return or assign it); jitting it has no use"
            )
            return ret
        self._record(v, log, bufs, pre, touched, outs)
        if self.plain:  # (_record refused it)
            return ret
        v.ret = ret
        self.captures += 1
        hosts = sum(isinstance(launch[0], _HostCall) for launch in v.captured)
        pruned = len(_kernels(log.launches)) - len(_kernels(v.captured))
        self._debug(
            f"capture {self.captures} ({len(_kernels(v.captured))} kernels: {' '.join(self.kernel_names)}; "
            f"{hosts} host steps{f'; {pruned} pruned: run once, here' if self.prune else ''})"
        )
        return ret

    @staticmethod
    def _changed(v: _Variant, ret_others: list, host_sig: list, progs: list) -> str | None:
        """What differs from the previous call with the same arguments (None: nothing, it can be captured)."""
        if ret_others != v.first_other:
            return (
                f"their non-Tensor return values ({v.first_other!r} -> {ret_others!r}): return them as "
                "Tensors or compute them outside"
            )
        if host_sig != v.first_hosts:
            return (
                "the contents of a Tensor made from host data (Tensor(list or numpy array)) inside the "
                "function: pass it as a Tensor argument"
            )
        if progs != v.first_progs:
            i = next(
                (i for i, (a, b) in enumerate(zip(progs, v.first_progs)) if a != b),
                min(len(progs), len(v.first_progs)),
            )
            was = v.first_progs[i][0] if i < len(v.first_progs) else "nothing"
            now = progs[i][0] if i < len(progs) else "nothing"
            return (
                f"the kernels they ran (kernel {i}: {was} -> {now}): a Python value the function reads (a "
                "global, a closure variable, an attribute) changes between calls; pass it as an argument "
                "(a Tensor if it changes often)"
            )
        return None

    @staticmethod
    def _is_fresh(t: Tensor, log: _Recorder) -> bool:
        """Whether t is a whole buffer that a kernel of this call wrote into a new allocation (or a reshape
        of one, as a matmul's result or a weight's gradient is: the same elements in the same order)."""
        n = under_reshapes(t.node)
        return n.realized and n.op is not Op.ASSIGN and id(n.buffer) in log.fresh

    def _record(
        self, v: _Variant, log: _Recorder, bufs: list, pre: dict, touched: list, outs: list
    ) -> None:
        reads = log.reads()
        v.in_ids = {id(b): i for i, b in enumerate(bufs)}
        leaves = {id(t): t for t in touched}
        for t in list(tensor_mod._grad_leaves.values()):
            g0 = pre.get(id(t))
            if g0 is not None and id(g0.node.buffer) in reads:
                v.grad_ins.append((weakref.ref(t), id(g0.node.buffer)))
                v.needs.append((weakref.ref(t), _meta(g0)))
            elif id(t) in leaves and id(t) in pre and g0 is None:
                v.needs.append((weakref.ref(t), None))  # it had no gradient: replays assume none
        v.grad_outs = [
            (weakref.ref(t), None if t.grad is None else (id(t.grad.node.buffer), _meta(t.grad)))
            for t in touched
        ]
        escaping = [t.node.buffer for t in outs] + [t.grad.node.buffer for t in touched if t.grad is not None]
        seen = log.host_outputs()  # a replay's host steps make those anew
        for b in escaping:
            if id(b) not in seen:
                seen.add(id(b))
                v.fresh.append((id(b), b.size, b.dtype, get_runtime(b.device)))
        v.out_ids = [id(t.node.buffer) for t in outs]
        v.randoms = [(id(b), draw, dt, dev) for b, draw, dt, dev in log.randoms]
        v.inplace = {id(out) for _, out, _ in _kernels(log.launches) if id(out) not in log.fresh}
        # a kernel that reads a value that call 1 computed from its arguments (or random numbers), and that
        # this call does not update in place, reads a tensor that Python kept across calls: replays would
        # read call 1's value forever
        known = set(v.in_ids) | {k for _, k in v.grad_ins}
        first_in = {id(b) for b in v.first_inputs}
        for k in reads:
            shape, nodes, first = v.first_fresh.get(k, (None, (), None))
            if first is None or first() is None:  # (not call 1's buffer: that one was freed, its id reused)
                continue
            if k not in known and k not in log.written and _reaches(nodes, first_in):
                return self._refuse(
                    f"TinyJit: the function reads a tensor {shape} that its previous call computed from "
                    "its arguments and that Python kept (e.g. self.h = self.h * 0.9 + x); replays would "
                    "read that old value forever. Keep such state in a realized tensor updated in place "
                    "with assign(): self.h.assign(self.h * 0.9 + x)"
                )
        v.made = set(log.fresh) - set(log.host_outputs())
        v.first_fresh, v.first_inputs, v.captured, v.cnt = {}, [], list(log.launches), 2
        if self.prune:
            v.captured = _prune(v)

    def _replay(self, v: _Variant, bufs: list, current: dict) -> Any:
        if not v.planned:
            jit_replay.plan(v)
        # tensors made outside and not computed yet that read state this replay overwrites: computed first,
        # as a realize that runs assigns does (inplace.py)
        stale = inplace.computed_before(v.inplace)
        if stale:
            inplace.realize(stale)
        remap = {k: bufs[i] for k, i in v.in_ids.items()}
        for ref, k in v.grad_ins:
            remap[k] = _bare(ref().grad, gradient=True).node.buffer
        for k, draw, dt, dev in v.randoms:  # the same draws, in the same order, as running it
            arr = np.ascontiguousarray(host_values(draw(Tensor._rng), dt))
            remap[k] = get_runtime(dev).from_numpy(arr)
        for k, size, dtype, dev in v.fresh:
            remap[k] = dev.alloc(size, dtype)
        for step in v.steps:
            if not isinstance(step, tuple):  # a batch of launches (Runtime.batch)
                step(remap)
                continue
            prg, out, inputs = step
            ins = [remap.get(id(b), b) for b in inputs]
            if isinstance(prg, _HostCall):
                for old, new in zip(out, prg.step(ins, prg.shapes)):
                    remap[id(old)] = new
            else:
                prg(remap.get(id(out), out), *ins)
        kernels = len(_kernels(v.captured))
        Stats.kernels_run += kernels
        self.replays += 1
        self._debug(
            f"replay {self.replays} ({kernels} kernels, "
            f"{sum(isinstance(launch[0], _HostCall) for launch in v.captured)} host steps, "
            f"{len(v.randoms)} random inputs)"
        )

        def wrap(k: int, meta: tuple) -> Tensor:  # nodes made after the kernels ran (see _Recorder)
            return Tensor(g.Node.from_buffer(remap[k], *meta))

        for ref, out in v.grad_outs:
            leaf = ref()
            if leaf is not None:
                leaf.grad = None if out is None else wrap(*out)
        returned = [t for t in _flatten(v.ret) if isinstance(t, Tensor)]
        outs = [_with_variables(wrap(k, _meta(t)), t, current) for k, t in zip(v.out_ids, returned)]
        return _rebuild(v.ret, iter(outs))


__all__ = ["TinyJit"]
