"""TinyJit: run a function of Tensors once, capture the kernels of its second call, replay them after.

Rules (each broken rule that can be detected raises a JitError that says what to do):
- Call 1 runs the function normally. Call 2 runs it again and records every kernel launch (program,
  output buffer, input buffers). Calls 3+ do not run the Python function: they replay the recorded
  programs with the buffers of the new Tensor arguments substituted for those of call 2.
- Tensor arguments are realized (and copied to a contiguous buffer if they are views) before the call;
  on replay they must have the same count, shapes, dtypes and devices as at capture.
- Non-Tensor arguments are frozen at capture: passing a different value later raises JitError.
  Non-Tensor return values are frozen too: if they differ between call 1 and call 2, JitError.
- Returned Tensors are copied into fresh buffers on every call, so a tensor returned by call N keeps
  its value after call N+1.
- State changed with assign() (parameters, optimizer state, BatchNorm running statistics) is written
  in place, so it keeps updating across replays.
- Inside the function: no .numpy()/.item()/.tolist() (the value would be read once), no host random
  numbers (Tensor.rand/randint/dropout draw on the host and would be frozen: draw outside and pass them
  in). Tensors made from host data inside the function are frozen at capture. Python control flow is
  frozen at capture. A function that launches no kernel raises JitError.
- Gradients must be zeroed inside the function (opt.zero_grad()): a gradient that adds onto the
  previous call's gradient would add the same frozen buffer on every replay, so it raises JitError.
- A returned Tensor must not read a buffer that an assign() in the same call overwrote (the loss
  after opt.step()): realize it with the step, `opt.step(loss)`, or JitError.
- A TinyJit called inside another one's function before it has captured just runs (its kernels are
  captured by the outer one); once captured it replays, inside the outer capture too.
- JIT=0 in the environment turns TinyJit into a plain call. On the NUMPY reference device (which has
  no kernels) the function always runs normally.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from tgrad import device as dev_mod
from tgrad import graph as g
from tgrad import tensor as tensor_mod
from tgrad.dtype import dtypes
from tgrad.errors import JitError
from tgrad.graph import Op
from tgrad.tensor import Tensor


def _copy(t: Tensor) -> Tensor:
    """A contiguous copy of t (one elementwise kernel when realized)."""
    n = t.node
    zero = g.const_like(n, False if n.dtype == dtypes.bool else 0)
    return Tensor(g.alu(Op.OR if n.dtype == dtypes.bool else Op.ADD, n, zero))


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


class _Log(list):
    """The CAPTURE list. It also notes, per written buffer, the node counter at the write: a BUFFER node
    made before that (a smaller id) holds the buffer's old value, which an assign() overwrote."""

    def __init__(self):
        super().__init__()
        self.written: dict[int, int] = {}

    def append(self, item) -> None:
        super().append(item)
        self.written[id(item[1])] = next(g.Node._ids)

    def extend(self, items) -> None:
        super().extend(items)
        self.written.update(items.written)  # items is another _Log: keep the times of its writes


def _stale_leaves(t: Tensor, written: dict[int, int]) -> bool:
    """Whether the unrealized graph of t reads a buffer through a node made before an assign() in this
    call overwrote that buffer."""
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


def _reads(node: g.Node, ids: set[int]) -> bool:
    """Whether computing node reads one of the buffers in ids."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.realized:
            if id(n.buffer) in ids:
                return True
            continue
        stack.extend(n.srcs)
    return False


class _NoHostRandom:
    def __getattr__(self, name: str):
        raise JitError(
            "a TinyJit function drew host random numbers (Tensor.rand/randn/randint/dropout): they would "
            "be frozen at capture. Draw them outside the function and pass them in as Tensor arguments"
        )


def _no_numpy(node):
    raise JitError(
        ".numpy()/.item()/.tolist() inside a TinyJit function reads the value once and replays would not "
        "run it: return the tensor and read it outside the function"
    )


class TinyJit:
    """Decorate a function of Tensors: call 1 runs it, call 2 captures its kernels, later calls replay."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.reset()
        functools.update_wrapper(self, fn)

    def reset(self) -> None:
        """Forget the capture: the next call runs normally again."""
        self.cnt = 0
        self.captured: list[tuple] = []  # (program, out buffer, input buffers), in launch order
        self._in_ids: dict[int, int] = {}  # id(buffer at capture) -> position of the Tensor argument
        self._in_sig: list[tuple] = []
        self._out_ids: dict[int, int] = {}  # id(output copy buffer at capture) -> output number
        self._out_meta: list[tuple] = []  # (shape, dtype, device) per returned Tensor
        self._ret: Any = None
        self._frozen: tuple = ()
        self._first_other: Any = None
        self._first_log: list = []  # call 1's launches, kept until the capture to spot leaked values

    @property
    def kernel_names(self) -> list[str]:
        return [prg.name for prg, _, _ in self.captured]

    def __get__(self, obj, objtype=None):  # works as a method decorator too
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args, **kwargs):
        if os.environ.get("JIT", "1") == "0":
            return self.fn(*args, **kwargs)
        tensors = [v for v in _flatten((args, kwargs)) if isinstance(v, Tensor)]
        others = tuple(
            (type(v).__name__, repr(v)) for v in _flatten((args, kwargs)) if not isinstance(v, Tensor)
        )
        if any(t.device == "NUMPY" for t in tensors) or (not tensors and dev_mod.default_device() == "NUMPY"):
            return self.fn(*args, **kwargs)
        outer = dev_mod.CAPTURE  # set when this call runs inside another TinyJit's function
        if outer is not None and self.cnt < 2:
            return self.fn(*args, **kwargs)  # its kernels become part of the outer capture
        # realized, contiguous buffers for every Tensor argument
        fixed = [t if t.node.realized else _copy(t) for t in tensors]
        if fixed:
            Tensor.realize(*fixed)
        bufs = [t.node.buffer for t in fixed]
        if self.cnt >= 2:
            self._check_inputs(fixed, others)
            return self._replay(bufs)
        capture = self.cnt == 1
        log = _Log()
        saved = (tensor_mod._to_numpy, Tensor._rng)
        tensor_mod._to_numpy, Tensor._rng = _no_numpy, _NoHostRandom()
        dev_mod.CAPTURE = log
        try:
            args, kwargs = _rebuild((args, kwargs), iter(fixed))
            ret = self.fn(*args, **kwargs)
            outs = [v for v in _flatten(ret) if isinstance(v, Tensor)]
            trivial = not log and all(t.node.base.realized for t in outs)
            for i, t in enumerate(outs):
                if _stale_leaves(t, log.written):
                    raise JitError(
                        f"returned tensor {i} ({t.shape}) reads a buffer that an assign() in this call "
                        "already overwrote (e.g. the loss after opt.step()): realize it together with the "
                        "update, opt.step(loss), or call loss.realize() before opt.step()"
                    )
            copies = [_copy(t) for t in outs]
            if copies:
                Tensor.realize(*copies)
        finally:
            tensor_mod._to_numpy, Tensor._rng = saved
            dev_mod.CAPTURE = outer
        if outer is not None:
            outer.extend(log)
        ret = _rebuild(ret, iter(copies))
        ret_others = [v for v in _flatten(ret) if not isinstance(v, Tensor)]
        if not capture:
            self._first_other, self._first_log = ret_others, list(log)
            self.cnt = 1
            return ret
        if trivial:
            raise JitError(
                "TinyJit captured no kernels: the function must compute something with Tensors "
                "(and return or assign it); jitting it has no use"
            )
        if ret_others != self._first_other:
            raise JitError(
                f"TinyJit: the function's non-Tensor return values changed between calls "
                f"({self._first_other!r} -> {ret_others!r}); replays would return the captured ones. "
                "Return them as Tensors or compute them outside"
            )
        self._check_leaks(log)
        self.captured = list(log)
        self._in_ids = {id(b): i for i, b in enumerate(bufs)}
        self._in_sig = [(t.shape, t.dtype, t.device) for t in fixed]
        self._out_ids = {id(c.node.buffer): i for i, c in enumerate(copies)}
        self._out_meta = [(c.shape, c.dtype, c.device) for c in copies]
        self._ret, self._frozen, self.cnt = ret, others, 2
        if dev_mod.DEBUG >= 1:
            print(f"TinyJit: captured {len(log)} kernels: {' '.join(self.kernel_names)}", file=sys.stderr)
        return ret

    def _check_leaks(self, log: list) -> None:
        """Gradients that add onto values from call 1 (no zero_grad() inside the function) would add the
        same frozen call-1 buffer on every replay."""
        first = {id(out) for _, out, _ in self._first_log}
        self._first_log = []
        now = {id(out) for _, out, _ in log}
        leaked = {id(b) for _, _, ins in log for b in ins if id(b) in first and id(b) not in now}
        if not leaked:
            return
        for t in list(tensor_mod._grad_leaves.values()):
            if t.grad is not None and _reads(t.grad.node, leaked):
                raise JitError(
                    f"TinyJit: the gradient of a parameter of shape {t.shape} adds onto a gradient from the "
                    "previous call, which replays would freeze; call opt.zero_grad() inside the function "
                    "(accumulate over micro-batches inside one call instead)"
                )

    def _check_inputs(self, fixed: list[Tensor], others: tuple) -> None:
        sig = [(t.shape, t.dtype, t.device) for t in fixed]
        if len(sig) != len(self._in_sig):
            raise JitError(
                f"TinyJit: captured with {len(self._in_sig)} Tensor arguments, called with {len(sig)}"
            )
        for i, (now, then) in enumerate(zip(sig, self._in_sig)):
            if now != then:
                raise JitError(
                    f"TinyJit: Tensor argument {i} is {now[0]} {now[1].name} on {now[2]} but was "
                    f"{then[0]} {then[1].name} on {then[2]} at capture; make a new TinyJit (or call reset()) "
                    "for each input shape, dtype and device"
                )
        if others != self._frozen:
            raise JitError(
                f"TinyJit: non-Tensor arguments changed since capture ({self._frozen} -> {others}); they are "
                "frozen into the captured kernels. Pass changing values as Tensors, or call reset()"
            )

    def _replay(self, bufs: list) -> Any:
        remap = {k: bufs[i] for k, i in self._in_ids.items()}
        for (shape, dtype, device), key in zip(self._out_meta, self._out_ids):
            remap[key] = dev_mod.get_device(device).alloc(max(1, g.prod(shape)), dtype)
        outer = dev_mod.CAPTURE
        for prg, out, inputs in self.captured:
            out = remap.get(id(out), out)
            inputs = [remap.get(id(b), b) for b in inputs]
            prg(out, *inputs)
            if outer is not None:
                outer.append((prg, out, inputs))
        dev_mod.Stats.kernels_run += len(self.captured)
        if dev_mod.DEBUG >= 1:
            print(f"TinyJit: replayed {len(self.captured)} kernels", file=sys.stderr)
        outs = [  # made after the kernels ran (see _Log)
            Tensor(g.Node.from_buffer(remap[key], shape, dtype, device))
            for (shape, dtype, device), key in zip(self._out_meta, self._out_ids)
        ]
        return _rebuild(self._ret, iter(outs))


__all__ = ["TinyJit"]
