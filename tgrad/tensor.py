"""Tensor: the user-facing API. Every op adds lazy nodes; composite ops are written from primitives."""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tgrad import autodiff, blas, inplace
from tgrad import graph as g
from tgrad import realize as driver
from tgrad.device import Device, get_runtime
from tgrad.dtype import DType, dtypes, from_bytes, host_values, promote, round_bf16, to_bytes
from tgrad.errors import (
    ArgumentError,
    AutogradError,
    DeviceError,
    DTypeError,
    ShapeError,
    TgradError,
    ValueOverflowError,
)
from tgrad.graph import MOVEMENT as MOVEMENT_OPS
from tgrad.graph import Node, Op
from tgrad.ops.elementwise import ElementwiseOps
from tgrad.ops.helpers import (
    Scalar,
    _expand_node,
    _matmul_node,
    _normalize_axis,
    _position_dtype,
    _spatial_pads,
    _spread_node,
    _tuple,
)
from tgrad.ops.indexing import IndexingOps
from tgrad.ops.math import MathOps
from tgrad.ops.movement import MovementOps
from tgrad.ops.numerics import _gradient_only
from tgrad.ops.reduce import ReduceOps

# kernel positions up to which a conv's input gradient is col2im (that many shifted terms summed in one
# elementwise kernel); larger kernels take the transposed convolution
COL2IM_MAX_TERMS = 64
# elements of a conv's windows above which they are not kept for its weight's gradient (256 MiB of float32)
KEEP_WINDOWS_MAX = 1 << 26
# tensors created or marked with requires_grad=True, by id (Tensor.__eq__ is elementwise: no WeakSet)
_grad_leaves: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
# tensors with an assign() not realized yet (TinyJit realizes them before and after a jitted call)
PENDING_ASSIGNS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


driver.WRITES = inplace.with_writes


def pending_assigns() -> list[Tensor]:
    """Take the tensors whose assign() has not run yet."""
    out = [t for t in list(PENDING_ASSIGNS.values()) if t.node.op is Op.ASSIGN and not t.node.realized]
    PENDING_ASSIGNS.clear()
    return out


# tensors backward() ran from, not realized yet: an optimizer step realizes them with its update (the
# usual `loss.backward(); opt.step(); print(loss.item())` would else compute the loss after the update,
# from the overwritten weights)
BACKWARD_ROOTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


# backward_replay.replay (set when it is imported): runs backward() of a graph of a known structure as a
# replay, or returns False
BACKWARD_REPLAY: Callable[[Tensor], bool] | None = None


def backward_roots() -> list[Tensor]:
    """Take the tensors backward() ran from since the last call that are still alive and not realized."""
    out = [t for t in list(BACKWARD_ROOTS.values()) if not t.node.realized]
    BACKWARD_ROOTS.clear()
    return out


def _uint8_linear_weights(n: int, out: int, align_corners: bool) -> tuple[np.ndarray, int]:
    """(out, n) int32 weights and their fixed-point bits of PyTorch's uint8 linear resize along one axis
    (aten's _compute_index_ranges_int16_weights: a triangle filter around each output's centre,
    normalized, scaled to the most bits that keep the largest weight below 2**15, rounded half away)."""
    delta = 0.5 if align_corners else 0.0
    scale = ((n - 1) / (out - 1) if out > 1 else 0.0) if align_corners else n / out
    w = np.zeros((out, n), np.float64)
    for i in range(out):
        centre = scale * (i + 0.5 - delta)
        lo = max(int(centre - 0.5 + delta), 0)
        taps = np.arange(lo, min(max(int(centre + 1.5 + delta), lo), n, lo + 3))
        tw = np.maximum(1.0 - np.abs(taps - centre + 0.5 - delta), 0.0)
        w[i, taps] = tw / tw.sum() if tw.sum() else tw
    bits = 0
    while bits < 22 and int(0.5 + w.max() * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    return np.trunc(w * (1 << bits) + 0.5).astype(np.int32), bits


def _dtype_on(dtype: DType, device: str) -> DType:
    """dtype, after checking that the device has it (uint16/32/64 live on CPU and NUMPY only)."""
    if device not in dtypes.HOST_DEVICES and dtype in dtypes.HOST_ONLY + dtypes.HOST_FLOATS:
        instead = "float32 or float16" if dtype.is_float else "a signed integer type"
        raise DTypeError(f"{dtype.name} exists on {' and '.join(dtypes.HOST_DEVICES)} only, not on {device}; "
                         f"cast to {instead} first")
    return dtype


class _NoGradMeta(type):
    """Makes `Tensor.no_grad` both a flag and a context manager, like tinygrad and torch.no_grad."""

    _no_grad = False

    @property
    def no_grad(cls):
        return _NoGradFlag(_NoGradMeta._no_grad)

    @no_grad.setter
    def no_grad(cls, value):
        _NoGradMeta._no_grad = bool(value)


class _NoGradFlag:
    """`Tensor.no_grad`: true while gradients are off; `with Tensor.no_grad:`, `with Tensor.no_grad():`,
    `@Tensor.no_grad` and `@Tensor.no_grad()` turn them off (torch.no_grad's forms)."""

    def __init__(self, value: bool):
        self.value = value

    def __call__(self, fn=None):
        if fn is None:
            return self
        if not callable(fn):
            raise TypeError("Tensor.no_grad() takes no arguments, or decorates a function")

        @functools.wraps(fn)
        def without_grad(*args, **kwargs):
            with _NoGradFlag(True):
                return fn(*args, **kwargs)

        return without_grad

    def __bool__(self) -> bool:
        return self.value

    def __enter__(self):
        self.prev = _NoGradMeta._no_grad
        _NoGradMeta._no_grad = True
        return self

    def __exit__(self, *exc):
        _NoGradMeta._no_grad = self.prev


class _Training:
    """`with Tensor.train():` (or `Tensor.train(False)`, also as a decorator) sets Tensor.training for a
    block, like tinygrad's Tensor.train."""

    def __init__(self, mode: bool = True):
        self.mode = mode

    def __enter__(self):
        self.prev, Tensor.training = Tensor.training, self.mode
        return self

    def __exit__(self, *exc):
        Tensor.training = self.prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def in_mode(*args, **kwargs):
            with _Training(self.mode):
                return fn(*args, **kwargs)

        return in_mode


class Tensor(ElementwiseOps, MathOps, ReduceOps, MovementOps, IndexingOps, metaclass=_NoGradMeta):
    """A lazy n-dimensional array with autograd. Nothing runs until numpy()/tolist()/item()/realize()."""

    # _base: (the tensor whose memory this view shares, the view ops from it) or None: not a view; _views:
    # views of this one (weak references). See inplace.py: they make assign() act as PyTorch's in-place ops
    __slots__ = ("node", "_requires_grad", "grad", "_base", "_views", "__weakref__")
    __array_ufunc__ = None  # numpy_array * tensor calls Tensor.__rmul__ instead of converting the tensor
    training = False
    train = _Training
    _rng = np.random.default_rng(0)

    def __init__(
        self,
        data: Any,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ):
        if isinstance(data, Node):  # an op's result: no device lookup (it reads the environment)
            node = data
        else:
            device = Device.canonicalize(device)
            dtype = dtypes.from_any(dtype) if dtype is not None else None
            if isinstance(data, Tensor):
                node = data.node if device == data.device else data.to(device).node
                if dtype is not None:
                    node = g.cast(node, dtype)
            elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
                node = g.const(data, dtype or dtypes.from_py(data), device)
            else:
                node = _node_from_host(data, device, dtype)
        self.node: Node = node
        self.grad: Tensor | None = None
        self._requires_grad: bool | None = None
        self._base = self._views = None
        if node.buffer is None:
            inplace.track(self)
        if isinstance(data, Tensor) and node is data.node:  # Tensor(t) shares t's memory, as in PyTorch
            inplace.add_view(data, self, ())
        if requires_grad is not None:
            self.requires_grad = requires_grad

    # ----------------------------------------------------------------------------------------------
    # properties

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def device(self) -> str:
        return self.node.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[_normalize_axis(dim, self.ndim)]

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def requires_grad(self) -> bool | None:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        """Three states, as in tinygrad: True, False (frozen: an optimizer leaves it alone) and None (not
        decided, the default of a new tensor: an optimizer given it makes it True)."""
        if value is None:
            self._requires_grad = None
            _grad_leaves.pop(id(self), None)
            return
        if value and not self.dtype.is_float:
            raise DTypeError(
                f"only floating point tensors can require gradients, this one is {self.dtype.name}"
            )
        self._requires_grad = bool(value)
        if value:
            if self.node.op is not Op.BUFFER:  # a leaf needs its own node: constants are shared
                self.realize()
                if self.node.op is not Op.BUFFER:
                    self.node = _fresh_buffer(self.node)
            _grad_leaves[id(self)] = self

    def requires_grad_(self, value: bool = True) -> Tensor:
        self.requires_grad = value
        return self

    def __repr__(self) -> str:
        """The values (like PyTorch's print) when the tensor is computed or small (<= 1000 elements, then
        computed now); else its shape, dtype and device."""
        rg = f", requires_grad={self.requires_grad}" if self.requires_grad else ""
        if self.node.realized or self.numel() <= 1000:
            try:
                values = np.array2string(self.numpy(), separator=", ", threshold=100, prefix="Tensor(")
                return f"Tensor({values}, dtype={self.dtype.name}, device={self.device}{rg})"
            except TgradError:  # e.g. inside a TinyJit capture, where reading values is refused
                pass
        return f"<Tensor {self.shape} {self.dtype.name} on {self.device}{rg}>"

    def __format__(self, spec: str) -> str:
        """f"{loss:.3f}" formats a one-element tensor's value."""
        return format(self.item(), spec) if spec and self.numel() == 1 else format(repr(self), spec)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """np.asarray(t) and np.array(t): the values (a copy)."""
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def __hash__(self) -> int:
        return id(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ValueError(
                f"the truth value of a tensor with {self.numel()} elements is ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    # ----------------------------------------------------------------------------------------------
    # running and data out

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and others) now; no-op for an already computed value."""
        tensors = [self, *others]
        nodes = [t.node for t in tensors]
        if any(n.buffer is None for n in nodes):  # (nothing to compute, nothing to schedule otherwise)
            driver.realize(nodes)
        for t in tensors:
            t._drop_history()
        return self

    def _drop_history(self) -> None:
        # a realized leaf, or a realized tensor no gradient flows through, keeps only its buffer, so the
        # graph that computed it (and that graph's buffers) can be freed
        is_leaf = not self.requires_grad or _grad_leaves.get(id(self)) is self
        if is_leaf and self.node.op is not Op.BUFFER and self.node.realized:
            self.node = g.Node.from_buffer(self.node.buffer, self.shape, self.dtype, self.device)
            inplace.rebase(self, self.node)  # (its views too: a gradient through one reaches this node)

    def numpy(self) -> np.ndarray:
        out = np.array(driver.to_numpy(self.node, lambda: self.node), copy=True)
        self._drop_history()
        return out

    def tolist(self):
        return self.numpy().tolist()

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def to(self, device: str) -> Tensor:
        """This tensor's value on another device. The copy is part of the graph: gradients flow back to
        the source device, and TinyJit replays it (a host step between the two devices' kernels)."""
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        _dtype_on(self.dtype, device)
        if not get_runtime(device).supports(self.dtype):
            raise DTypeError(f"to({device!r}): {device} has no {self.dtype.name}; cast first")
        source = self.device

        def copy(inputs, outputs):
            outputs[0][...] = inputs[0]

        step = driver.HostStep("to", copy, [(self.shape, self.dtype)], device, key=(source, device))
        node = self.node  # (run_host's realize may drop the graph behind self.node)
        (out,) = Tensor.run_host(step, self)
        if Tensor.no_grad or not self.dtype.is_float:
            return out

        def rule(grad: Node) -> tuple[Node]:
            return (Tensor(grad).to(source).node,)

        return self._from(autodiff.custom_gradient(out.node, (node,), rule, f"to {source}"), self)

    def detach(self) -> Tensor:
        """The same value, with no gradient flowing back through it; shares this tensor's memory (an
        assign() to either is seen by both, as in PyTorch)."""
        out = Tensor(Node(Op.DETACH, (self.node,), None, self.shape, self.dtype, self.device))
        inplace.add_view(self, out, ((Op.DETACH, None),))
        return out

    def clone(self) -> Tensor:
        """A copy (PyTorch's clone): later assign()s to this tensor, or to the memory it views, leave it
        as it is. Computed lazily (a copy kernel, often fused into its readers), and before any assign
        that would overwrite what it reads. Gradients flow through."""
        copy = Node(Op.CAST, (self.node,), self.dtype, self.shape, self.dtype, self.device)
        out = Tensor(autodiff.custom_gradient(copy, (self.node,), lambda grad: (grad,), "clone"))
        if self._requires_grad and not _NoGradMeta._no_grad:
            out._requires_grad = True
        return out

    def contiguous(self) -> Tensor:
        """This value in a buffer of its own, row-major (tinygrad's contiguous; PyTorch's copy of a
        non-contiguous tensor): fusion never recomputes it inside its users' kernels. A view is copied, an
        unrealized result is computed by a kernel of its own; a whole buffer is returned as it is.
        Gradients flow through."""
        if self.node.op is Op.BUFFER or self.node.realized:
            return self
        if self.node.op is Op.DETACH and self.node.arg == "contiguous":  # already its own kernel's value:
            return self  # (a second contiguous made a kernel copying it: conv2d's computed input, 1 ms)
        copy = self.node
        if self.node.op in MOVEMENT_OPS:
            copy = Node(Op.CAST, (self.node,), self.dtype, self.shape, self.dtype, self.device)
        node = autodiff.custom_gradient(copy, (self.node,), lambda grad: (grad,), "contiguous")
        return self._from(node)

    def assign(self, x: Tensor | Any) -> Tensor:
        """Replace this tensor's value (same shape and dtype); writes into its buffer when it has one."""
        x = x if isinstance(x, Tensor) else Tensor(x, device=self.device, dtype=self.dtype)
        if x.shape != self.shape:
            raise ShapeError(f"assign: shape {x.shape} does not match {self.shape}")
        if x.device != self.device:
            raise DeviceError(f"assign: value on {x.device}, tensor on {self.device}; use .to()")
        x = x.cast(self.dtype)
        if self._base is not None and self._assign_view(x):
            return self
        if self.node.op is Op.ASSIGN:  # assigned before: that write runs first (both write this buffer)
            if self.node.buffer is None:
                self.realize()
            if self.node.op is Op.ASSIGN:
                self.node = Node.from_buffer(self.node.buffer, self.shape, self.dtype, self.device)
        old = self.node
        if x.node is old:
            return self
        if old.op is Op.BUFFER:
            target = old
            if old.buffer.computed:  # other tensors may hold the node it was computed for: a buffer of its
                buf = get_runtime(self.device).alloc(self.numel(), self.dtype)  # own (x computes all of it)
                target = Node.from_buffer(buf, self.shape, self.dtype, self.device)
            self.node = Node(Op.ASSIGN, (target, x.node), None, self.shape, self.dtype, self.device)
            PENDING_ASSIGNS[id(self)] = self
            inplace.assigned(self.node)
        else:  # not realized (or realized with a history): the tensor takes the new value, no write
            self.node = x.node
        if self.node.buffer is None:
            inplace.track(self)
        inplace.rebase(self, self.node)
        return self

    def _assign_view(self, x: Tensor) -> bool:
        """assign() to a view writes into its base (PyTorch's in-place ops on a view): the base takes x
        where this view's elements are, and its views (this one too) the new value. False when this
        tensor is not a view in PyTorch's sense (a reshape strides cannot express: a copy there)."""
        root, steps = self._base
        if not inplace.strided(root.shape, steps):
            self._base = None
            return False
        shapes = [root.shape]  # the shape before each step
        for op, arg in steps[:-1]:
            shapes.append(inplace.shape_after(shapes[-1], op, arg))
        # each op undone on x and, where the view covers part of the base, on a mask of its elements
        partial = any(op is Op.SHRINK or op == inplace.STRIDE for op, _ in steps)
        ts = [x, Tensor.ones(*x.shape, dtype=dtypes.bool, device=self.device)] if partial else [x]
        for (op, arg), shape in zip(reversed(steps), reversed(shapes)):
            if op is Op.RESHAPE:
                ts = [t.reshape(shape) for t in ts]
            elif op is Op.PERMUTE:
                back = tuple(np.argsort(arg))
                ts = [t.permute(back) for t in ts]
            elif op is Op.SHRINK:
                pads = tuple((b, n - e) for (b, e), n in zip(arg, shape))
                ts = [t.pad(pads) for t in ts]
            elif op == inplace.STRIDE:  # every step-th element: the first in each row of a (count, step)
                axis, step = arg
                grow = [(0, 0)] * (len(shape) + 1)
                grow[axis + 1] = (0, step - 1)
                flat = shape[:axis] + (ts[0].shape[axis] * step,) + shape[axis + 1 :]
                keep = [None] * len(shape)
                keep[axis] = (0, shape[axis])
                ts = [t.unsqueeze(axis + 1).pad(tuple(grow)).reshape(flat).shrink(keep) for t in ts]
            elif op is Op.EXPAND and tuple(arg) != tuple(shape):
                raise ArgumentError(
                    f"assign: this tensor ({self.shape}) is an expanded view of a {root.shape} tensor, so "
                    "several of its elements are one element of that tensor (PyTorch refuses such in-place "
                    "writes too); clone() it first"
                )
        root.assign(ts[1].where(ts[0], root) if partial else ts[0])
        return True

    # ----------------------------------------------------------------------------------------------
    # autograd

    def _seed(self, gradient: Tensor | None, op: str) -> Node:
        """The gradient of self that backward()/gradient() start from: ones for a one-element tensor."""
        if gradient is None:
            if self.numel() != 1:
                raise AutogradError(
                    f"{op}() needs a scalar (one element) but this tensor has shape {self.shape}; "
                    "reduce it first (e.g. .sum() or .mean()) or pass gradient="
                )
            gradient = Tensor.ones(*self.shape, device=self.device, dtype=self.dtype)
        elif gradient.shape != self.shape:
            raise ShapeError(f"{op}: gradient shape {gradient.shape} does not match {self.shape}")
        return gradient.cast(self.dtype).node

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Set .grad of every requires_grad tensor this one depends on (adding to an existing one). Lazy,
        but for a graph of a structure seen before: computed now, by a replay (backward_replay.py)."""
        if gradient is None and BACKWARD_REPLAY is not None and self.requires_grad and self.numel() == 1 \
                and BACKWARD_REPLAY(self):
            return self
        return self._backward(gradient)

    def _backward(self, gradient: Tensor | None) -> Tensor:
        seed = self._seed(gradient, "backward")
        if not self.requires_grad:
            raise AutogradError(
                "backward(): nothing in this graph requires a gradient; create leaves with requires_grad=True"
            )
        leaves = [t for t in list(_grad_leaves.values()) if t.requires_grad]
        targets = {t.node for t in leaves}
        grads = autodiff.gradients(self.node, seed, targets)
        for t in leaves:
            gn = grads.get(t.node)
            if gn is None:
                continue
            gt = Tensor(gn)
            t.grad = gt if t.grad is None else Tensor(g.alu(Op.ADD, t.grad.node, gn))
        BACKWARD_ROOTS[id(self)] = self
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d self / d target for each target, as new lazy tensors (tinygrad's functional autograd): no
        .grad is touched and the targets need not require gradients. A target self does not depend on
        gets zeros. Differentiating the result again gives higher derivatives (when a target requires
        grad, the results do too, so realizing them keeps their graph). A tensor realized before this
        call that no requires_grad tensor flows into has no graph left: mark the targets requires_grad."""
        seed = self._seed(gradient, "gradient")
        for t in (self, *targets):
            if not t.dtype.is_float:
                raise AutogradError(f"gradient: only float tensors have gradients, got {t.dtype.name}")
        grads = autodiff.gradients(self.node, seed, {t.node for t in targets})
        out = [Tensor(grads[t.node]) if t.node in grads else t.zeros_like() for t in targets]
        if not _NoGradMeta._no_grad and (self._requires_grad or any(t._requires_grad for t in targets)):
            for t in out:  # they keep their graph when realized (.numpy()): higher derivatives stay right
                t._requires_grad = True
        return out

    # ----------------------------------------------------------------------------------------------
    # construction helpers

    def _from(self, node: Node, *inputs: Tensor, view: inplace.Steps | None = None) -> Tensor:
        """A tensor of node, which self and inputs made; `view`: node is these view ops of self, and the
        result a view of self's memory (inplace.py)."""
        out = Tensor(node)
        if (self._requires_grad or any(t._requires_grad for t in inputs)) and not _NoGradMeta._no_grad:
            out._requires_grad = True
        if view is not None:
            inplace.add_view(self, out, view)
        return out

    @staticmethod
    def _shape_arg(shape) -> tuple[int, ...]:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        if not all(isinstance(s, (int, np.integer)) for s in shape):
            raise ShapeError(f"a shape is a sequence of ints, got {shape}")
        out = tuple(int(s) for s in shape)
        if any(s < 0 for s in out):
            raise ShapeError(f"negative dimension in shape {out}")
        return out

    @staticmethod
    def full(shape, fill_value: Scalar, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,))
        device = Device.canonicalize(device)
        dt = _dtype_on(dtypes.from_any(dtype) if dtype is not None else dtypes.from_py(fill_value), device)
        t = Tensor(g.const(fill_value, dt, device, shape))
        if requires_grad is not None:
            t.requires_grad = requires_grad
        return t

    @staticmethod
    def zeros(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        return Tensor.full(
            Tensor._shape_arg(shape),
            0.0,
            dtype=dtype or dtypes.default_float,
            device=device,
            requires_grad=requires_grad,
        )

    @staticmethod
    def ones(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        return Tensor.full(
            Tensor._shape_arg(shape),
            1.0,
            dtype=dtype or dtypes.default_float,
            device=device,
            requires_grad=requires_grad,
        )

    @staticmethod
    def empty(*shape, dtype=None, device=None) -> Tensor:
        """A new buffer whose contents are whatever the memory held (uninitialised, as in PyTorch)."""
        shape = Tensor._shape_arg(shape)
        device = Device.canonicalize(device)
        dt = _dtype_on(dtypes.from_any(dtype) if dtype is not None else dtypes.default_float, device)
        return Tensor(Node.from_buffer(get_runtime(device).alloc(math.prod(shape), dt), shape, dt, device))

    def zeros_like(self, **kw) -> Tensor:
        return Tensor.full(self.shape, 0, **{"dtype": self.dtype, "device": self.device, **kw})

    def ones_like(self, **kw) -> Tensor:
        return Tensor.full(self.shape, 1, **{"dtype": self.dtype, "device": self.device, **kw})

    def full_like(self, fill_value: Scalar, **kw) -> Tensor:
        return Tensor.full(self.shape, fill_value, **{"dtype": self.dtype, "device": self.device, **kw})

    @staticmethod
    def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ArgumentError("arange: step must not be zero")
        all_int = all(isinstance(v, int) for v in (start, stop, step))
        if dtype is not None:
            dt = dtypes.from_any(dtype)
        elif all_int:
            fits = dtypes.default_int.min <= min(start, stop) and max(start, stop) <= dtypes.default_int.max
            dt = dtypes.default_int if fits else dtypes.int64
        else:
            dt = dtypes.default_float
        n = max(0, math.ceil((stop - start) / step))
        if dt.is_int and n and not dt.min <= min(start, start + (n - 1) * step) <= max(
            start, start + (n - 1) * step) <= dt.max:
            raise ValueOverflowError(f"arange({start}, {stop}, {step}): values outside {dt.name}")
        return Tensor(
            (start + np.arange(n, dtype=np.float64 if not all_int else np.int64) * step).astype(dt.np),
            device=device,
            dtype=dt,
        )

    @staticmethod
    def linspace(start, stop, steps: int, dtype=None, device=None) -> Tensor:
        dt = dtypes.from_any(dtype) if dtype is not None else dtypes.default_float
        if dt == dtypes.bool:
            raise DTypeError("linspace: bool is not a supported dtype")
        if not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ArgumentError(f"linspace: steps must be an int >= 0, got {steps!r}")
        return Tensor(np.linspace(start, stop, steps).astype(dt.np), device=device, dtype=dt)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype=None, device=None, requires_grad=None) -> Tensor:
        dt = dtypes.from_any(dtype) if dtype is not None else dtypes.default_float
        if n < 0 or (m is not None and m < 0):
            raise ShapeError(f"eye: sizes must be >= 0, got n={n}, m={m}")
        return Tensor(
            np.eye(n, m if m is not None else n, dtype=dt.np),
            device=device,
            dtype=dt,
            requires_grad=requires_grad,
        )

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        Tensor._rng = np.random.default_rng(seed)

    @staticmethod
    def run_host(step: driver.HostStep, *inputs: Tensor) -> list[Tensor]:
        """Run a host step (`realize.HostStep`: a Python function over numpy arrays) on the values of
        `inputs`, after the kernels that compute them and before those that use its outputs; TinyJit
        records it and replays it in that place. Returns its outputs as new realized tensors on
        step.device, with no gradient flowing through them."""
        Tensor.realize(*inputs)
        views = [t for t in inputs if not _whole_buffer(t.node)]  # views and pending assigns: copy them
        copies = {id(t): Tensor(copy_node(t.node)) for t in views}
        if copies:
            Tensor.realize(*copies.values())
        nodes = [copies[id(t)].node if id(t) in copies else t.node for t in inputs]
        return [Tensor(n) for n in driver.run_host(step, nodes)]

    @staticmethod
    def _random(draw, dtype, device, requires_grad=None, default=None) -> Tensor:
        """A tensor of host random numbers: draw(rng) -> ndarray, with Tensor._rng (see manual_seed).
        Every random constructor comes through here, so that TinyJit can draw again on each replay."""
        dt = dtypes.from_any(dtype) if dtype is not None else (default or dtypes.default_float)
        t = Tensor(draw(Tensor._rng), device=device, dtype=dt, requires_grad=requires_grad)
        if not t.requires_grad:
            driver.report_random(t.node.buffer, draw, dt, t.device)
        return t

    @staticmethod
    def rand(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        # float16 and bfloat16 draw multiples of 2**-11 and 2**-8 (PyTorch's), so none rounds up to 1
        steps = {dtypes.float16: 2**11, dtypes.bfloat16: 2**8}.get(dtypes.from_any(dtype) if dtype else None)
        if steps:
            return Tensor._random(lambda rng: np.floor(rng.random(shape) * steps) / steps, dtype, device,
                                  requires_grad)
        return Tensor._random(lambda rng: rng.random(shape), dtype, device, requires_grad)

    @staticmethod
    def randn(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        return Tensor._random(lambda rng: rng.standard_normal(shape), dtype, device, requires_grad)

    @staticmethod
    def randint(*shape, low=0, high=10, dtype=None, device=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        if low >= high:
            raise ArgumentError(f"randint: low ({low}) must be below high ({high})")
        return Tensor._random(lambda rng: rng.integers(low, high, shape), dtype, device, default=dtypes.int32)

    @staticmethod
    def uniform(*shape, low=0.0, high=1.0, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        return Tensor._random(lambda rng: rng.uniform(low, high, shape), dtype, device, requires_grad)

    @staticmethod
    def normal(*shape, mean=0.0, std=1.0, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        return Tensor._random(lambda rng: rng.normal(mean, std, shape), dtype, device, requires_grad)

    @staticmethod
    def kaiming_uniform(*shape, a: float = 0.01, **kw) -> Tensor:
        shape = Tensor._shape_arg(shape)
        bound = math.sqrt(2.0 / (1 + a * a)) * math.sqrt(3.0 / math.prod(shape[1:]))
        return Tensor.uniform(*shape, low=-bound, high=bound, **kw)

    @staticmethod
    def kaiming_normal(*shape, a: float = 0.01, **kw) -> Tensor:
        shape = Tensor._shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(math.prod(shape[1:]))
        return Tensor.normal(*shape, mean=0.0, std=std, **kw)

    @staticmethod
    def scaled_uniform(*shape, **kw) -> Tensor:
        """Uniform in [-1, 1) scaled by 1/sqrt(numel) (tinygrad's)."""
        shape = Tensor._shape_arg(shape)
        bound = math.prod(shape) ** -0.5
        return Tensor.uniform(*shape, low=-bound, high=bound, **kw)

    @staticmethod
    def glorot_uniform(*shape, **kw) -> Tensor:
        shape = Tensor._shape_arg(shape)
        bound = math.sqrt(6.0 / (shape[0] + math.prod(shape[1:])))
        return Tensor.uniform(*shape, low=-bound, high=bound, **kw)

    def rand_like(self, **kw) -> Tensor:
        return Tensor.rand(*self.shape, **{"dtype": self.dtype, "device": self.device, **kw})

    def randn_like(self, **kw) -> Tensor:
        return Tensor.randn(*self.shape, **{"dtype": self.dtype, "device": self.device, **kw})

    # ----------------------------------------------------------------------------------------------
    # dtype

    def cast(self, dtype) -> Tensor:
        if dtype is self.node.dtype:
            return self
        dtype = _dtype_on(dtypes.from_any(dtype), self.device)
        if dtype == self.dtype:
            return self
        out = self._from(g.cast(self.node, dtype))
        if not dtype.is_float:
            out._requires_grad = False
        return out

    def bitcast(self, dtype) -> Tensor:
        """The same bits read as another dtype (PyTorch's view(dtype), tinygrad's bitcast). Between dtypes
        of different sizes the last axis takes the bytes (PyTorch's rule: float32 (2, 3) as uint8 is
        (2, 12)). Runs on the host between kernels (a HostStep, which TinyJit replays); not differentiable."""
        dtype = _dtype_on(dtypes.from_any(dtype), self.device)
        src, shape = self.dtype, self.shape
        if dtype == src:
            return self
        if dtype.itemsize != src.itemsize:
            if not shape or shape[-1] * src.itemsize % dtype.itemsize:
                nbytes = shape[-1] * src.itemsize if shape else "a 0-d tensor has none"
                raise ShapeError(f"bitcast: {src.name} {shape} -> {dtype.name} needs a last axis whose size "
                                 f"in bytes ({nbytes}) is a multiple of {dtype.itemsize}")
            shape = (*shape[:-1], shape[-1] * src.itemsize // dtype.itemsize)
        if self.requires_grad and dtype.is_float and not Tensor.no_grad:
            raise AutogradError("bitcast is not differentiable; bitcast x.detach()")

        def reinterpret(inputs, outputs):
            outputs[0][...] = from_bytes(to_bytes(inputs[0], src), dtype).reshape(shape)

        step = driver.HostStep("bitcast", reinterpret, [(shape, dtype)], self.device, key=(src, dtype))
        return Tensor.run_host(step, self)[0]

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)

    # ----------------------------------------------------------------------------------------------
    # linear algebra

    def matmul(self, w: Tensor) -> Tensor:
        x = self
        if not isinstance(w, Tensor):
            w = Tensor(w, device=x.device)
        xn, wn = x.node, w.node
        if (xn.dtype is wn.dtype and xn.dtype.is_float and len(xn.shape) > 1 and len(wn.shape) > 1
                and xn.shape[-1] == wn.shape[-2] and xn.device == wn.device):
            return x._from(_matmul_node(xn, wn), w)  # the common case (the nodes of the lines below)
        if x.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul: both arguments need at least 1 dimension, got {x.shape} and {w.shape}")
        if x.shape[-1] != w.shape[-2 if w.ndim > 1 else -1]:
            raise ShapeError(
                f"matmul: inner dimensions differ: {x.shape} @ {w.shape} "
                f"({x.shape[-1]} != {w.shape[-2 if w.ndim > 1 else -1]})"
            )
        xv = x.unsqueeze(0) if x.ndim == 1 else x
        wv = w.unsqueeze(-1) if w.ndim == 1 else w
        # (..., n, 1, k) * (..., 1, m, k) -> sum over k
        a = xv.reshape(xv.shape[:-1] + (1, xv.shape[-1]))
        b = wv.transpose(-1, -2)
        b = b.reshape(b.shape[:-2] + (1,) + b.shape[-2:])
        out = (a * b).sum(
            -1, dtype=promote(x.dtype, w.dtype) if not promote(x.dtype, w.dtype).is_float else None
        )
        if x.ndim == 1:
            out = out.squeeze(-2)
        if w.ndim == 1:
            out = out.squeeze(-1)
        return out

    @staticmethod
    def einsum(formula: str, *operands, dtype=None) -> Tensor:
        """Einstein summation (PyTorch's einsum): "ij,jk->ik"; operands as arguments or one list; "..."
        for broadcast dims; a repeated letter in one operand takes its diagonal; without "->" the output
        is the "..." dims, then the letters used once, sorted. Multiplies broadcast views, then sums."""
        one_list = len(operands) == 1 and isinstance(operands[0], (list, tuple))
        ops = list(operands[0]) if one_list else list(operands)
        lhs, arrow, rhs = formula.replace(" ", "").partition("->")
        inputs = lhs.split(",")
        if len(inputs) != len(ops):
            raise ArgumentError(f"einsum: {formula!r} names {len(inputs)} operands, got {len(ops)}")
        n_ell = max([t.ndim - len(s) + 3 for s, t in zip(inputs, ops) if "..." in s], default=0)
        ell = "".join(chr(0x100 + i) for i in range(n_ell))  # stand-in letters for the "..." dims
        inputs = [s.replace("...", ell[n_ell - (t.ndim - len(s) + 3) :]) for s, t in zip(inputs, ops)]
        letters = "".join(inputs)
        if not arrow:
            rhs = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
        rhs = rhs.replace("...", ell)
        sizes: dict[str, int] = {}
        terms = []
        for s, t in zip(inputs, ops):
            if len(s) != t.ndim:
                raise ShapeError(f"einsum: operand {s!r} has {len(s)} subscripts for shape {t.shape}")
            for c, n in zip(s, t.shape):
                if sizes.setdefault(c, n) != n and n != 1 and sizes[c] != 1:
                    raise ShapeError(f"einsum: subscript {c!r} is {sizes[c]} in one place and {n} in another")
                sizes[c] = max(sizes[c], n) if n and sizes[c] else 0
            while len(set(s)) != len(s):  # a repeated letter: its diagonal
                c = next(c for c in s if s.count(c) > 1)
                i, j = s.index(c), s.index(c, s.index(c) + 1)
                t, s = t.diagonal(0, i, j), s[:i] + s[i + 1 : j] + s[j + 1 :] + c
            terms.append((s, t))
        if any(c not in sizes for c in rhs):
            raise ShapeError(f"einsum: output subscripts {rhs!r} name letters no operand has")
        order = list(rhs) + sorted(set(letters) - set(rhs))
        product = None
        for s, t in terms:
            mine = [c for c in order if c in s]
            t = t.permute([s.index(c) for c in mine])
            t = t.reshape(tuple(t.shape[mine.index(c)] if c in s else 1 for c in order))
            product = t if product is None else product * t
        out = product._broadcast_to(tuple(sizes[c] for c in order))
        return out.sum(tuple(range(len(rhs), len(order))), dtype=dtype) if len(order) > len(rhs) else out

    def dot(self, w: Tensor) -> Tensor:
        return self.matmul(w)

    def sequential(self, layers) -> Tensor:
        """Apply each layer (any callable) in turn: x.sequential([l1, relu, l2]) (tinygrad's)."""
        return functools.reduce(lambda x, f: f(x), layers, self)

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """x @ weight.T + bias, with weight of shape (out_features, in_features) as in PyTorch."""
        xn = self.node
        wn = weight.node if isinstance(weight, Tensor) else None
        bn = bias.node if isinstance(bias, Tensor) else None
        if (wn is not None and (bias is None or bn is not None) and xn.dtype is wn.dtype and xn.dtype.is_float
                and len(xn.shape) > 1 and len(wn.shape) == 2 and xn.shape[-1] == wn.shape[1]
                and xn.device == wn.device and (bn is None or (
                    bn.dtype is xn.dtype and bn.shape == wn.shape[:1] and bn.device == xn.device))):
            # the common case, as graph nodes (those of the two lines below): no intermediate tensors
            out = _matmul_node(xn, g.move(wn, Op.PERMUTE, (1, 0)))
            if bn is not None:
                out = g.alu(Op.ADD, out, _expand_node(bn, out.shape))
            return self._from(out, weight, *(() if bias is None else (bias,)))
        out = self.matmul(weight.T)
        return out + bias if bias is not None else out

    # ----------------------------------------------------------------------------------------------
    # ---- nn ops (conv, pool, norm, attention)

    def _pool(self, kernel: tuple[int, ...], stride, dilation) -> Tensor:
        """Sliding windows over the last len(kernel) axes as views only (tinygrad's trick):
        (..., *in) -> (..., *out, *kernel). No data is copied; the windows index the input."""
        nk = len(kernel)
        if self.ndim < nk:
            raise ShapeError(f"pool: a {nk}-d window needs at least {nk} dims, got shape {self.shape}")
        s_, d_ = _tuple(stride, nk), _tuple(dilation, nk)
        pre, i_ = self.shape[:-nk], self.shape[-nk:]
        o_ = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(i_, d_, kernel, s_)]
        if any(o <= 0 for o in o_):
            raise ShapeError(f"pool: window {kernel} (dilation {d_}) is larger than the input {i_}")
        n = len(pre)
        if all(s == k for s, k in zip(s_, kernel)) and all(d == 1 for d in d_):
            # windows that tile the input: a reshape (cheaper to index, and its gradient is a reshape too)
            x = self.shrink([None] * n + [(0, o * k) for o, k in zip(o_, kernel)])
            x = x.reshape(*pre, *[v for o, k in zip(o_, kernel) for v in (o, k)])
            return x.permute(*range(n), *[n + 2 * j for j in range(nk)], *[n + 2 * j + 1 for j in range(nk)])
        # repeat each axis e times so that a row of length k*(i+d) holds every shifted window
        e_ = [math.ceil(k * (i + d) / i) for k, i, d in zip(kernel, i_, d_)]
        x = self.reshape(*pre, *[v for i in i_ for v in (1, i)])
        x = x.expand(*pre, *[v for e, i in zip(e_, i_) for v in (e, i)])
        x = x.reshape(*pre, *[e * i for e, i in zip(e_, i_)])
        x = x.shrink([None] * len(pre) + [(0, k * (i + d)) for k, i, d in zip(kernel, i_, d_)])
        x = x.reshape(*pre, *[v for k, i, d in zip(kernel, i_, d_) for v in (k, i + d)])
        # a stride longer than the window needs rows of o*s (the padding is never picked)
        grow = [(0, 0)] * len(pre)
        grow += [p for i, d, o, s in zip(i_, d_, o_, s_) for p in ((0, 0), (0, max(0, o * s - i - d)))]
        x = x.pad(grow)
        x = x.shrink([None] * len(pre) + [p for k, o, s in zip(kernel, o_, s_) for p in ((0, k), (0, o * s))])
        x = x.reshape(*pre, *[v for k, o, s in zip(kernel, o_, s_) for v in (k, o, s)])
        x = x.shrink([None] * len(pre) + [p for k, o in zip(kernel, o_) for p in ((0, k), (0, o), (0, 1))])
        x = x.reshape(*pre, *[v for k, o in zip(kernel, o_) for v in (k, o)])
        return x.permute(*range(n), *[n + 2 * j + 1 for j in range(nk)], *[n + 2 * j for j in range(nk)])

    def _pad_spatial(self, padding, nk: int, value: float = 0.0) -> Tensor:
        """Pad the last nk axes: an int, one int per axis (both sides), or 2*nk ints in F.pad order
        (last axis first: left, right, top, bottom, ...); negative values crop."""
        return self.pad(_spatial_pads(padding, nk), value)

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
               groups: int = 1) -> Tensor:
        """PyTorch's F.conv1d/conv2d/conv3d by the weight's rank: x (N, Cin, *spatial), weight
        (Cout, Cin/groups, *kernel); stride, dilation: int or one per axis; padding: also 2 per axis."""
        nk = weight.ndim - 2
        if nk < 1 or self.ndim != nk + 2:
            raise ShapeError(f"conv2d: input {self.shape} and weight {weight.shape} need rank N+2 (N >= 1)")
        (bs, cin_all), (cout, cin), ks = self.shape[:2], weight.shape[:2], weight.shape[2:]
        if cin_all != groups * cin or cout % groups:
            raise ShapeError(
                f"conv2d: input has {cin_all} channels but weight {weight.shape} with groups={groups} "
                f"expects {groups * cin} (and out channels divisible by groups)"
            )
        keep = weight.requires_grad and not Tensor.no_grad
        # a computed input is computed once, not once per window position in the copy below (the MNIST
        # CNN's relu(conv1 + bias): 73 -> 14 ms)
        computed = keep and self.node.op is not Op.BUFFER and not self.node.base.realized
        src = self.contiguous() if computed else self
        xp = src._pad_spatial(padding, nk)
        x = xp._pool(ks, stride, dilation)  # (bs, cin_all, *out, *ks)
        # the CPU runs a conv whose windows are big in pieces of images (blas.Chunk), copying each piece's
        # windows where BLAS reads them from cache, instead of writing them all to memory. The pieces copy
        # windows of a buffer: a padded or computed input is made one first (1/k^2 of the windows' size;
        # as a prologue the whole windows would be computed into memory again)
        pieces = self.device == "CPU" and math.prod(x.shape) >= blas.CHUNK_MIN
        buffer = src.node.base.realized or src.node.op is Op.BUFFER
        if pieces and (xp.node is not src.node or not buffer):
            xp = xp.contiguous()
            x = xp._pool(ks, stride, dilation)
        if keep and not pieces and math.prod(x.shape) <= KEEP_WINDOWS_MAX:
            # the windows (im2col) are made once, for the forward matmul and again for the weight's
            # gradient: keep them, laid out (cin, *ks, bs, *out) as both matmuls read them (the CPU copied
            # a buffer input's windows in each matmul: the MNIST CNN's conv1 5.5 + 5.7 -> 4.3 + 4.5 ms)
            order = (1, *range(2 + nk, 2 + 2 * nk), 0, *range(2, 2 + nk))
            back = tuple(sorted(range(len(order)), key=order.__getitem__))
            x = x.permute(*order).contiguous().permute(*back)
        out_sp, rcout = x.shape[2 : 2 + nk], cout // groups
        x = x.reshape(bs, groups, 1, cin, *out_sp, *ks).expand(bs, groups, rcout, cin, *out_sp, *ks)
        x = x.permute(0, 1, 2, *range(4, 4 + nk), 3, *range(4 + nk, 4 + 2 * nk))  # cin next to the kernel
        w = weight.reshape(1, groups, rcout, *(1,) * nk, cin, *ks)
        out = (x * w).sum(tuple(range(-nk - 1, 0))).reshape(bs, cout, *out_sp)
        out = out._conv_gradient(xp, weight, w, stride, dilation, groups)
        return out if bias is None else out + bias.reshape(1, cout, *(1,) * nk)

    def _conv_gradient(self, xp: Tensor, weight: Tensor, w: Tensor, stride, dilation, groups: int) -> Tensor:
        """self = conv(xp, weight) (xp already padded; w the weight as the product reads it), with the
        gradient of xp computed as a transposed convolution (a convolution, so it reaches the same matmul
        kernels as the forward) instead of the gradient of the sliding-window view (a col2im reduce over
        overlapping windows, ~20x slower on the CPU). The weight's gradient is the composed one (already
        a matmul over the windows), taken at w: graph building may fold weight's own node away."""
        if Tensor.no_grad:
            return self
        nk = weight.ndim - 2
        s_, d_, ks = _tuple(stride, nk), _tuple(dilation, nk), weight.shape[2:]
        out_sp, in_sp = self.shape[2:], xp.shape[2:]
        # the transposed conv gives (o-1)*s + d*(k-1) + 1 positions; the rest of xp (past the last
        # window) gets no gradient: output_padding covers it
        extra = tuple(i - ((o - 1) * s + d * (k - 1) + 1) for i, o, s, d, k in zip(in_sp, out_sp, s_, d_, ks))
        value, x_node, w_node, weight_node = self.node, xp.node, w.node, weight.node

        def rule(grad: Node, needed: tuple[bool, bool]) -> tuple[Node | None, Node | None]:
            gt, gx, gw = Tensor(grad), None, None
            if needed[0] and math.prod(ks) <= COL2IM_MAX_TERMS:
                gx = gt._conv_input_gradient(Tensor(weight_node), in_sp, s_, d_, groups).node
            elif needed[0]:
                gx = gt.conv_transpose2d(Tensor(weight_node), None, s_, 0, extra, d_, groups).node
            if needed[1]:  # this conv's own product only: the input is a constant here (its graph may
                # hold the same weight, as in conv(conv(x, w), w), whose gradient the outer walk adds)
                gw = autodiff.gradients(value, grad, {w_node}, frozenset({x_node})).get(w_node)
            return gx, gw

        node = autodiff.custom_gradient(self.node, (x_node, w_node), rule, "conv", needs=True)
        return self._from(node, xp, w)

    def _spread(self, s_) -> Tensor:
        """(N, C, *spatial) with s-1 zeros after each element but the last along each spatial axis:
        n -> n + (n - 1) * (s - 1) (a transposed convolution's input)."""
        return self._from(_spread_node(self.node, s_))

    def _conv_input_gradient(self, weight: Tensor, in_sp, s_, d_, groups: int) -> Tensor:
        """The gradient of a convolution's (padded) input, self the output's gradient (N, Cout, *out):
        col2im. One matmul over the output channels makes every window's share,
        cols[g, n, c, k, *out] = sum_o weight[g, o, c, k] * self[n, g, o, *out] (both operands as they
        are stored: a BLAS call per image, no window copy), then each kernel position k's share is spread
        by the stride, shifted to where its window starts and summed: one elementwise kernel. The
        transposed convolution (the gather form) reads the padded gradient's windows instead: 1.45x the
        multiply-adds for a 5x5 kernel on 24x24 (s^2 x for stride s) and a window copy 1.45x this one's."""
        n, cout, out_sp = self.shape[0], self.shape[1], self.shape[2:]
        cin, ks = weight.shape[1], weight.shape[2:]
        og, kk, npos = cout // groups, math.prod(ks), math.prod(out_sp)
        w = weight.reshape(groups, og, cin, kk).permute(0, 2, 3, 1).reshape(groups, 1, cin, kk, 1, og)
        gy = self.reshape(n, groups, og, npos).permute(1, 0, 3, 2).reshape(groups, n, 1, 1, npos, og)
        cols = (w * gy).sum(-1).reshape(groups, n, cin, kk, *out_sp).node
        # each kernel position's share, spread by the stride and padded into place, as nodes (the tensor
        # ops' view bookkeeping made this loop ~3 ms of an eager 5x5 conv step)
        spread = tuple(o + (o - 1) * (s - 1) for o, s in zip(out_sp, s_))
        whole = tuple((0, o) for o in out_sp)
        total = None
        for k, pos in enumerate(itertools.product(*map(range, ks))):
            t = g.move(cols, Op.SHRINK, ((0, groups), (0, n), (0, cin), (k, k + 1), *whole))
            t = g.move(t, Op.RESHAPE, (groups, n, cin, *out_sp))
            t = g.move(t, Op.PERMUTE, (1, 0, *range(2, 3 + len(ks))))
            t = _spread_node(g.move(t, Op.RESHAPE, (n, groups * cin, *out_sp)), s_)
            starts = [p * d for p, d in zip(pos, d_)]
            pads = tuple((b, i - b - e) for b, i, e in zip(starts, in_sp, spread))
            t = g.move(t, Op.PAD, ((0, 0), (0, 0), *pads))
            total = t if total is None else g.alu(Op.ADD, total, t)
        return Tensor(total)

    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                         output_padding=0, dilation=1, groups: int = 1) -> Tensor:
        """PyTorch's F.conv_transpose1d/2d/3d by the weight's rank: weight (Cin, Cout/groups, *kernel).
        The input is spread out with stride-1 zeros between elements, then convolved with the flipped
        kernel and padding dilation*(k-1)-padding."""
        nk = weight.ndim - 2
        if nk < 1 or self.ndim != nk + 2:
            raise ShapeError(f"conv_transpose2d: input {self.shape} and weight {weight.shape} need rank N+2")
        cin, rcout, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
        if self.shape[1] != cin or cin % groups:
            raise ShapeError(f"conv_transpose2d: input has {self.shape[1]} channels, weight {weight.shape}")
        s_, d_, op_ = _tuple(stride, nk), _tuple(dilation, nk), _tuple(output_padding, nk)
        pads = _spatial_pads(padding, nk)[::-1]  # (axis 0 after, axis 0 before, ...) reversed: pairs by axis
        x = self._spread(s_)
        w = weight.reshape(groups, cin // groups, rcout, *ks).transpose(1, 2).flip(tuple(range(3, 3 + nk)))
        w = w.reshape(groups * rcout, cin // groups, *ks)
        flat = []
        for axis in reversed(range(nk)):  # F.pad order: last axis first
            before, after = pads[2 * axis + 1], pads[2 * axis]
            edge = d_[axis] * (ks[axis] - 1)
            flat += [edge - before, edge - after + op_[axis]]
        return x.conv2d(w, bias, 1, tuple(flat), d_, groups)

    def _pool_windows(self, kernel_size, stride, padding, dilation, ceil_mode: bool, value: float,
                      extra: float | None = None) -> tuple[Tensor, tuple[int, ...]]:
        """Windows (..., *out, *kernel) of the input padded with value (ceil_mode pads more on the right,
        with `extra` (default value), so a last partial window fits, as PyTorch); also the kernel size."""
        k = _tuple(kernel_size, len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2)
        nk = len(k)
        s = _tuple(stride if stride is not None else k, nk)
        d = _tuple(dilation, nk)
        pads = _spatial_pads(padding, nk)
        more = [0] * (2 * nk)
        if ceil_mode:
            for axis in range(nk):
                j = 2 * (nk - 1 - axis)  # F.pad order
                n = self.shape[self.ndim - nk + axis] + pads[j] + pads[j + 1]
                span = d[axis] * (k[axis] - 1) + 1
                out = -(-(n - span) // s[axis]) + 1
                if (out - 1) * s[axis] >= self.shape[self.ndim - nk + axis] + pads[j]:
                    out -= 1  # the last window would start in the right padding
                more[j + 1] = max(0, (out - 1) * s[axis] + span - n)
        x = self.pad(pads, value).pad(tuple(more), value if extra is None else extra)
        return x._pool(k, s, d), k

    def max_pool2d(self, kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                   return_indices: bool = False):
        """PyTorch's F.max_pool1d/2d/3d over the last len(kernel_size) axes (2 for an int); padding counts
        as -inf. As PyTorch, each window's pick is its first maximum (its last NaN, if it has one): the
        gradient goes to that element alone, and return_indices=True gives its flat index in the plane."""
        x = self if self.dtype.is_float else self.float()
        win, k = x._pool_windows(kernel_size, stride, padding, dilation, ceil_mode, -math.inf)
        axes = tuple(range(-len(k), 0))
        out = win.max(axes)
        plane = self.shape[-len(k):]
        padded = ceil_mode or any(_spatial_pads(padding, len(k)))
        device = self.device  # (the gradient rule below must not hold a Tensor: inplace.py would keep it)

        def where_in_plane() -> Tensor:  # each window position's flat index in the plane (-1: padding)
            flat = Tensor.arange(math.prod(plane), device=device, dtype=dtypes.default_int)
            flat = flat.reshape(plane)
            return flat._pool_windows(kernel_size, stride, padding, dilation, ceil_mode, -1)[0]

        def pick(win: Tensor, out: Tensor) -> Tensor:  # bool mask of each window's picked element
            n = math.prod(k)
            pos = Tensor.arange(n, device=device, dtype=_position_dtype(n)).reshape(k)
            top = out.reshape(out.shape + (1,) * len(k))
            hit = win == top
            if padded:
                hit = hit & (where_in_plane() >= 0)
            first = hit.where(pos, n).min(axes)
            last_nan = win.isnan().where(pos, -1).max(axes)
            chosen = (last_nan >= 0).where(last_nan, first)
            return pos == chosen.reshape(chosen.shape + (1,) * len(k))

        result = out if self.dtype.is_float else out.cast(self.dtype)
        if self.dtype.is_float and not Tensor.no_grad:
            x_node, win_node = x.node, win.node

            def rule(grad: Node) -> tuple[Node | None]:
                w = Tensor(win_node)
                alt = pick(w, w.max(axes)).where(w, 0).sum(axes)
                return (autodiff.gradients(alt.node, grad, {x_node}, frozenset({x_node})).get(x_node),)

            result = x._from(autodiff.custom_gradient(out.node, (x_node,), rule, "max_pool"))
        if not return_indices:
            return result
        index = pick(win, out).where(where_in_plane(), math.prod(plane)).min(axes)
        return result, index

    def max_unpool2d(self, indices: Tensor, kernel_size=2, stride=None, padding=0, output_size=None
                     ) -> Tensor:
        """PyTorch's F.max_unpool2d: each value put back at its index in a zero plane."""
        k = _tuple(kernel_size, 2)
        s, p = _tuple(stride if stride is not None else k, 2), _tuple(padding, 2)
        if output_size is None:
            output_size = tuple((i - 1) * st - 2 * pp + kk for i, st, pp, kk in zip(self.shape[-2:], s, p, k))
        plane = tuple(output_size)[-2:]
        lead = self.shape[:-2]
        zeros = Tensor.zeros(*lead, math.prod(plane), dtype=self.dtype, device=self.device)
        return zeros.scatter(-1, indices.flatten(-2), self.flatten(-2)).reshape(*lead, *plane)

    def avg_pool2d(self, kernel_size=2, stride=None, padding=0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """PyTorch's F.avg_pool1d/2d/3d over the last len(kernel_size) axes (stride defaults to kernel_size).
        With ceil_mode, the part of a window past the padded input is never counted."""
        win, k = self._float()._pool_windows(kernel_size, stride, padding, 1, ceil_mode, 0.0)
        axes = tuple(range(-len(k), 0))
        total = win.sum(axes)
        ones = Tensor.ones(*self.shape[-len(k):], device=self.device)
        # count_include_pad: the padding counts, ceil_mode's extra never does
        counted, _ = ones._pool_windows(k, stride, padding, 1, ceil_mode, float(count_include_pad), 0.0)
        return total / counted.sum(axes)

    def interpolate(self, size, mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the last len(size) axes (PyTorch's F.interpolate on (N, C, *spatial)): mode "nearest",
        "nearest-exact" or "linear" (also "bilinear", "trilinear": linear along each axis). Each axis is
        a product with a constant (out, in) weight matrix made on the host. uint8 over two axes is
        PyTorch's fixed-point bilinear, bit for bit; other integer cases (PyTorch refuses them) round the
        float result."""
        size = (size,) if isinstance(size, int) else tuple(size)
        if not 0 < len(size) <= self.ndim:
            raise ShapeError(f"interpolate: size {size} for a tensor of shape {self.shape}")
        if any(n == 0 for n in self.shape[self.ndim - len(size) :]) or any(n <= 0 for n in size):
            raise ShapeError(f"interpolate: input {self.shape} and size {size} must be non-empty")
        if mode not in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear"):
            raise ArgumentError(f"interpolate: mode must be nearest, nearest-exact or linear, not {mode!r}")
        if align_corners and mode.startswith("nearest"):
            raise ArgumentError("interpolate: align_corners needs a linear mode")
        if self.dtype == dtypes.uint8 and len(size) == 2 and not mode.startswith("nearest"):
            return self._bilinear_uint8(size, align_corners)
        x = self._float()
        for axis, out in zip(range(self.ndim - len(size), self.ndim), size):
            n = self.shape[axis]
            w = np.zeros((out, n), np.float64)
            o = np.arange(out, dtype=np.float64)
            if mode.startswith("nearest"):
                src = (o + 0.5) * (n / out) if mode == "nearest-exact" else o * np.float32(n / out)
                w[np.arange(out), np.minimum(np.floor(src).astype(np.int64), n - 1)] = 1.0
            else:
                if align_corners:
                    src = o * ((n - 1) / (out - 1)) if out > 1 else o * 0
                else:
                    src = np.maximum((o + 0.5) * (n / out) - 0.5, 0)
                low = np.minimum(np.floor(src).astype(np.int64), n - 1)
                frac = src - low
                np.add.at(w, (np.arange(out), low), 1 - frac)
                np.add.at(w, (np.arange(out), np.minimum(low + 1, n - 1)), frac)
            wt = Tensor(w.astype(x.dtype.np), device=self.device)
            x = (x.unsqueeze(axis) * wt.reshape((out, n) + (1,) * (self.ndim - axis - 1))).sum(axis + 1)
        if self.dtype.is_float:
            return x
        return (x.round() if mode not in ("nearest", "nearest-exact") else x).cast(self.dtype)

    def _bilinear_uint8(self, size: tuple[int, int], align_corners: bool) -> Tensor:
        """PyTorch's uint8 bilinear resize, bit for bit: the last axis first, then the one before, each
        pass a sum of at most 3 pixels times 16-bit fixed-point weights, rounded and clamped to uint8."""
        x = self
        for axis, out in ((self.ndim - 1, size[1]), (self.ndim - 2, size[0])):
            n = self.shape[axis]
            if n == out:
                continue
            w, bits = _uint8_linear_weights(n, out, align_corners)
            wt = Tensor(w, device=self.device).reshape((out, n) + (1,) * (self.ndim - axis - 1))
            acc = (x.cast(dtypes.int32).unsqueeze(axis) * wt).sum(axis + 1, dtype=dtypes.int32)
            x = ((acc + (1 << (bits - 1))) >> bits).clip(0, 255).cast(dtypes.uint8)
        return x

    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                  axis: int = 1) -> Tensor:
        """(x - mean) * invstd * weight + bias, with the 1-d statistics laid along `axis` (tinygrad's)."""
        ax = _normalize_axis(axis, self.ndim, "batchnorm")
        shape = tuple(s if i == ax else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == 1 else invstd)
        return x + bias.reshape(shape) if bias is not None else x

    def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
        """Normalise to mean 0, variance 1 over `axis` (no affine part; nn.LayerNorm adds it)."""
        d = self - self.mean(axis, keepdim=True)
        r = (d * d).mean(axis, keepdim=True).add(eps).rsqrt()
        y = d * r
        if Tensor.no_grad or not self.dtype.is_float:
            return y
        r_node = r.node

        def rule(grad: Node, out: Node) -> tuple[Node]:  # PyTorch's r * (g - mean(g) - y * mean(g * y)),
            g, yy, rr = Tensor(grad), Tensor(out), Tensor(r_node)  # reading the output y
            return ((rr * (g - g.mean(axis, keepdim=True) - yy * (g * yy).mean(axis, keepdim=True))).node,)

        node = autodiff.custom_gradient(y.node, (self.node,), rule, "layernorm", reads_output=True)
        return self._from(node)

    def dropout(self, p: float = 0.5) -> Tensor:
        """Zero each element with probability p and scale the rest by 1/(1-p), only when Tensor.training."""
        if not 0 <= p <= 1:
            raise ArgumentError(f"dropout: p must be in [0, 1], got {p}")
        if not Tensor.training or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = Tensor.rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                     is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
        """PyTorch's F.scaled_dot_product_attention: softmax(q @ k^T / sqrt(d) + mask) @ v. enable_gqa:
        key and value heads (axis -3) are shared by groups of query heads."""
        if enable_gqa and key.shape[-3] != self.shape[-3]:
            if self.shape[-3] % key.shape[-3]:
                raise ShapeError(f"scaled_dot_product_attention: {self.shape[-3]} query heads do not split "
                                 f"into groups for {key.shape[-3]} key heads")
            group = self.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
        qk = self.matmul(key.transpose(-2, -1)) * (1 / math.sqrt(self.shape[-1]))
        if is_causal:
            if attn_mask is not None:
                raise ArgumentError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
            n, m = qk.shape[-2:]
            dt = _position_dtype(n, m)
            rows = Tensor.arange(n, device=self.device, dtype=dt).reshape(n, 1)
            attn_mask = rows >= Tensor.arange(m, device=self.device, dtype=dt).reshape(1, m)
        if attn_mask is not None:
            qk = attn_mask.where(qk, -math.inf) if attn_mask.dtype == dtypes.bool else qk + attn_mask
        return qk.softmax(-1).matmul(value)

    # ----------------------------------------------------------------------------------------------
    # losses

    def cross_entropy(
        self, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100
    ) -> Tensor:
        """PyTorch's F.cross_entropy: class-index targets (N,) or probabilities (N, C); classes on axis 1."""
        _check_reduction(reduction)
        _check_target(target, "cross_entropy")
        x = self if self.ndim != 1 else self.unsqueeze(0)
        logp = x.log_softmax(1)
        c = x.shape[1]
        keep = None  # which rows count (not ignore_index)
        if target.dtype.is_float and target.shape == self.shape:
            if ignore_index >= 0:  # PyTorch's rule (a negative one can match no class)
                raise ArgumentError("cross_entropy: ignore_index is not supported for probability targets")
            _check_smoothing(label_smoothing)
            probs = target if self.ndim != 1 else target.unsqueeze(0)
            if label_smoothing:
                probs = probs * (1 - label_smoothing) + label_smoothing / c
            loss = -(logp * probs).sum(1)  # as PyTorch's: a 0 probability of a -inf logit is nan
        else:
            t = target if self.ndim != 1 else target.reshape(1)
            if target.dtype == dtypes.bool:
                raise DTypeError("cross_entropy: class labels must be integers, got bool")
            if target.dtype.is_float or t.shape != (x.shape[0],) + x.shape[2:]:
                raise ShapeError(
                    f"cross_entropy: target {target.shape} ({target.dtype.name}) fits neither class indices "
                    f"nor probabilities for input {self.shape}"
                )
            ignore = ignore_index if t.dtype.min <= ignore_index <= t.dtype.max else None  # none can be it
            Tensor._check_index(t, 0, c, "cross_entropy (target)", ignore=ignore)
            _check_smoothing(label_smoothing)
            tc, cls = _class_positions(t, c, ignore, x.ndim)
            if ignore is not None and not label_smoothing and reduction == "mean" and x.ndim == 2 \
                    and x.dtype == dtypes.float32:  # the common case: the nodes of the lines below, built
                return x._from(_mean_nll_node(logp.node, tc.node, cls.node, t.node, ignore))  # as nodes
            # picked with where(), not multiplied by a one-hot: another class's -inf logit is no 0 * -inf
            loss = -(tc.unsqueeze(1) != cls).where(0, logp).sum(1)  # (!=: == is != and a not)
            if label_smoothing:
                loss = loss * (1 - label_smoothing) - logp.sum(1) * (label_smoothing / c)
            if ignore is not None:
                keep = t != ignore
                loss = keep.where(loss, 0)  # not loss * 0: an ignored row's inf or nan stays out
        if reduction == "none":
            return loss if self.ndim != 1 else loss.reshape(())
        if reduction == "sum":
            return loss.sum()
        if keep is not None:
            count = keep.sum().cast(loss.dtype)
            if loss.dtype == dtypes.float32:  # (a count in [0, 2**31): no scaling, the quotient is the same)
                return loss.sum() * count.reciprocal()
            return loss.sum() / count
        return loss.mean()

    def sparse_categorical_crossentropy(
        self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> Tensor:  # noqa: N803
        """tinygrad's name: logits (N, C) and class indices Y (N,), classes on the last axis."""
        x = self if self.ndim == 2 else self.reshape(-1, self.shape[-1])
        y = Y.reshape(-1)
        return x.cross_entropy(
            y, reduction=reduction, label_smoothing=label_smoothing, ignore_index=ignore_index
        )

    def _same_shape_target(self, y: Tensor, op: str) -> None:
        _check_target(y, op)
        if y.shape != self.shape:
            shape = y.shape if isinstance(y, Tensor) else type(y).__name__
            raise ShapeError(f"{op}: target {shape} must have the input's shape {self.shape} (PyTorch does "
                             "not broadcast it either)")

    def binary_crossentropy(self, y: Tensor, reduction: str = "mean") -> Tensor:
        """self are probabilities; log is clamped at -100 like PyTorch. Both must lie in [0, 1] (checked
        like PyTorch, by a host step that reads their min and max)."""
        self._same_shape_target(y, "binary_crossentropy")
        _check_reduction(reduction)
        Tensor._check_within(self, 0.0, 1.0, "binary_crossentropy", "input")
        Tensor._check_within(y, 0.0, 1.0, "binary_crossentropy", "target")
        p, t = self.detach(), y.detach()
        loss = -(t * p.log().maximum(-100) + (1 - t) * (1 - p).log().maximum(-100))
        # PyTorch's gradients: (p - y) / max(p (1 - p), 1e-12), finite at p = 0 and 1 where the clamped
        # logs' own would be 0 * inf = nan; for the target log(1 - p) - log(p), not clamped
        loss = loss + _gradient_only(self, (p - t) / (p * (1 - p)).maximum(1e-12))
        if y.dtype.is_float:
            loss = loss + _gradient_only(y, (1 - p).log() - p.log())
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(self, y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
                                   ) -> Tensor:
        """PyTorch's binary_cross_entropy_with_logits; pos_weight scales the positive term."""
        self._same_shape_target(y, "binary_crossentropy_logits")
        log_sig, log_one_minus = self.logsigmoid(), (-self).logsigmoid()
        pos = y * log_sig if pos_weight is None else y * pos_weight * log_sig
        return _reduce_loss(-(pos + (1 - y) * log_one_minus), reduction)

    def nll_loss(self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean") -> Tensor:
        """PyTorch's F.nll_loss: self holds log-probabilities (N, C, ...) or (C,), target class indices."""
        _check_reduction(reduction)
        _check_target(target, "nll_loss")
        if not target.dtype.is_int:
            raise DTypeError(f"nll_loss: target must hold integer class labels, got {target.dtype.name}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        t = target.reshape(1) if self.ndim == 1 else target
        if t.shape != (x.shape[0],) + x.shape[2:]:
            raise ShapeError(f"nll_loss: target shape {target.shape} does not fit input {self.shape}")
        c = x.shape[1]
        if weight is not None and weight.shape != (c,):
            raise ShapeError(f"nll_loss: weight must have one value per class ({c},), got {weight.shape}")
        ignore = ignore_index if t.dtype.min <= ignore_index <= t.dtype.max else None  # none can be it
        Tensor._check_index(t, 0, c, "nll_loss (target)", ignore=ignore)
        tc, cls = _class_positions(t, c, ignore, x.ndim)
        onehot = tc.unsqueeze(1) == cls
        w = (t != ignore).cast(x.dtype) if ignore is not None else t.ones_like(dtype=x.dtype)
        if weight is not None:
            w = w * onehot.where(weight.reshape((1, c) + (1,) * (x.ndim - 2)), 0).sum(1)
        loss = (w != 0).where(-onehot.where(x, 0).sum(1) * w, 0)  # an ignored row's nan or inf stays out
        if reduction == "none":
            return loss.reshape(()) if self.ndim == 1 else loss
        return loss.sum() if reduction == "sum" else loss.sum() / w.sum()

    def mse_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        return _reduce_loss((self - target).square(), reduction)

    def l1_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        return _reduce_loss((self - target).abs(), reduction)

    def smooth_l1_loss(self, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
        """0.5 * d**2 / beta where |d| < beta, else |d| - 0.5 * beta (PyTorch's)."""
        if not beta >= 0:
            raise ArgumentError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
        d = (self - target).abs()
        small = (d < beta) | d.isnan()  # nan: PyTorch's gradient is nan there (d / beta)
        dq = small.where(d, 0)  # the square only sees |d| < beta: no 0 * inf gradient from an inf d
        loss = small.where(0.5 * dq * dq / beta, d - 0.5 * beta) if beta else d
        return _reduce_loss(loss, reduction)


# PyTorch computes a bfloat16 op in float32 and rounds its result once. tgrad's primitive ops do that by
# themselves (each bfloat16 node is rounded); these composite ops (several primitives, whose intermediate
# results PyTorch does not round) run on float32 copies of their bfloat16 tensors, and a float32 result
# whose inputs were bfloat16 (and no other float dtype) is rounded back to bfloat16. mul and div belong
# here for Python scalars too: PyTorch multiplies by a scalar in float32 (add and sub round it first).
# Division computes in float64, so that a * (1 / b) rounds to float32's correctly rounded a / b (PyTorch's
# quotient); `scalar / x` is PyTorch's x.reciprocal() * scalar. pow rounds a scalar exponent to bfloat16
# first, as PyTorch does.
_BF16_IN_FLOAT32 = (
    "mul mod fmod pow exp log rsqrt cos tan logaddexp log10 sinh cosh asin acos atan asinh acosh atanh "
    "lerp leaky_relu elu sigmoid tanh erf gelu quick_gelu silu swish softplus mish hardsigmoid hardswish "
    "celu selu softsign logsigmoid mean var std std_mean var_mean normalize softmin softmax log_softmax "
    "logsumexp cumsum cumprod logcumsumexp isclose matmul dot linear einsum conv2d conv_transpose2d "
    "avg_pool2d interpolate batchnorm layernorm scaled_dot_product_attention cross_entropy "
    "sparse_categorical_crossentropy binary_crossentropy binary_crossentropy_logits nll_loss mse_loss "
    "l1_loss smooth_l1_loss"
).split()


def _bf16_in_float32(fn, wide: DType = dtypes.float32):
    def up(x):
        if isinstance(x, (list, tuple)):
            return type(x)(map(up, x))
        if isinstance(x, float) and fn.__name__ == "pow":
            return float(round_bf16(x))
        if isinstance(x, (int, float)) and not isinstance(x, bool) and wide == dtypes.float64:
            return float(np.float32(x))  # PyTorch's float32 scalar
        return x.cast(wide) if isinstance(x, Tensor) and x.dtype == dtypes.bfloat16 else x

    def op(*args, **kwargs):
        tensors = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(t, Tensor)] if _any_bf16(args, kwargs) else ()
        if all(t.dtype != dtypes.bfloat16 for t in tensors):
            return fn(*args, **kwargs)
        back = all(t.dtype == dtypes.bfloat16 or not t.dtype.is_float for t in tensors)
        down = lambda t: t.cast(dtypes.bfloat16) if back and t.dtype == wide else t  # noqa: E731
        out = fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        return type(out)(map(down, out)) if isinstance(out, tuple) else down(out)

    return _named_like(op, fn)


def _any_bf16(args: tuple, kwargs: dict) -> bool:
    """Whether a bfloat16 tensor is among the arguments (or in a list or tuple among them): the quick test
    every wrapped op makes first."""
    bf16 = dtypes.bfloat16
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, Tensor):
            if a.node.dtype is bf16:
                return True
        elif isinstance(a, (list, tuple)) and any(isinstance(t, Tensor) and t.node.dtype is bf16 for t in a):
            return True
    return False


def _named_like(op, fn):
    """op with fn's name and docstring, also on its code (errors name the Tensor method the user called)."""
    names = {"co_name": fn.__name__}
    if hasattr(op.__code__, "co_qualname"):
        names["co_qualname"] = f"Tensor.{fn.__name__}"  # (fn may be a mixin's)
    op.__code__ = op.__code__.replace(**names)
    return functools.wraps(fn)(op)


def _bf16_div(div):
    in_float64 = _bf16_in_float32(div, dtypes.float64)

    def op(self, y, reverse=False, rounding_mode=None):
        scalar = isinstance(y, (int, float)) and not isinstance(y, bool)
        if reverse and scalar and self.dtype == dtypes.bfloat16:
            return self.reciprocal().mul(y)
        return in_float64(self, y, reverse, rounding_mode)

    return _named_like(op, div)


Tensor.div = _bf16_div(Tensor.div)
for _name in _BF16_IN_FLOAT32:
    _raw = inspect.getattr_static(Tensor, _name)  # (methods of the mixins too)
    _wrapped = _bf16_in_float32(_raw.__func__ if isinstance(_raw, staticmethod) else _raw)
    setattr(Tensor, _name, staticmethod(_wrapped) if isinstance(_raw, staticmethod) else _wrapped)


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 1.0:  # also nan; PyTorch ignores a negative one silently
        raise ArgumentError(f"cross_entropy: label_smoothing must be between 0 and 1, got {label_smoothing}")


def _check_target(target, op: str) -> None:
    if not isinstance(target, Tensor):
        raise DTypeError(f"{op}: target must be a Tensor, got {type(target).__name__}")


def _class_positions(t: Tensor, c: int, ignore: int | None, ndim: int) -> tuple[Tensor, Tensor]:
    """Class labels (checked: in [0, c) or `ignore`) and the classes (1, c, 1...) they are compared with,
    both int32 where every value fits (as `_position_dtype`'s masks), else in the labels' dtype."""
    dt = _position_dtype(c, 0 if ignore is None else ignore) if t.dtype.is_int else t.dtype
    cls = Tensor(g.move(_arange_buffer(c, dt, t.device), Op.RESHAPE, (1, c) + (1,) * (ndim - 2)))
    return (t if t.dtype == dt else t.cast(dt)), cls


def _mean_nll_node(logp: Node, tc: Node, cls: Node, t: Node, ignore: int) -> Node:
    """cross_entropy's float32 (N, C) case with class labels, reduction mean, rows labelled `ignore` left out:
    the nodes its Tensor code builds (-(tc.unsqueeze(1) != cls).where(0, logp).sum(1), kept where
    t != ignore, summed, times the reciprocal of the kept rows' count), without a tensor per step."""
    (n, c), f32, dev = logp.shape, logp.dtype, logp.device
    differ = g.alu(Op.CMPNE, _expand_node(g.move(tc, Op.RESHAPE, (n, 1)), (n, c)), _expand_node(cls, (n, c)))
    picked = g.alu(Op.WHERE, differ, g.const(0, f32, dev, (n, c)), logp)
    loss = g.alu(Op.NEG, g.move(g.reduce(picked, "SUM", (1,)), Op.RESHAPE, (n,)))
    keep = g.alu(Op.CMPNE, t, g.const(ignore, t.dtype, dev, (n,)))
    loss = g.alu(Op.WHERE, keep, loss, g.const(0, f32, dev, (n,)))
    count = g.cast(g.move(g.reduce(g.cast(keep, dtypes.int64), "SUM", (0,)), Op.RESHAPE, ()), f32)
    return g.alu(Op.MUL, g.move(g.reduce(loss, "SUM", (0,)), Op.RESHAPE, ()), g.alu(Op.RECIP, count))


_ARANGES: dict[tuple, Node] = {}  # (n, dtype name, device) -> its BUFFER node


def _arange_buffer(n: int, dtype: DType, device: str) -> Node:
    """0, 1, ..., n - 1 as a realized node that ops read and never write, uploaded once instead of at each
    call (Tensor.arange is a host array sent to the device: ~75 us of a cross_entropy's 265). At most 64
    kept (then they are made again). Made outside any TinyJit recording: a constant of tgrad's, like a
    parameter, not host data of the call (else the call that made it differed from the next, which
    found it made, and the capture waited a call more)."""
    key = (n, dtype.name, device)
    node = _ARANGES.get(key)
    if node is None:
        if len(_ARANGES) >= 64:
            _ARANGES.clear()
        with driver.recording(None):
            node = _ARANGES[key] = Tensor.arange(n, device=device, dtype=dtype).realize().node
        node.buffer.computed = True  # (an assign to a tensor holding it would write a buffer of its own)
    return node


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    _check_reduction(reduction)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _node_from_host(data, device: str, dtype: DType | None) -> Node:
    if isinstance(data, np.ndarray):
        arr = data
    else:
        arr = np.array(data)
        if arr.dtype == object:
            raise DTypeError(f"cannot make a tensor from {type(data).__name__}: ragged or non-numeric data")
        if dtype is None:
            if arr.dtype.kind == "f":
                arr = arr.astype(dtypes.default_float.np)
            elif arr.dtype.kind in "iu":
                arr = arr.astype(dtypes.default_int.np)
    if dtype is not None:
        arr = host_values(arr, dtype)
    dt = _dtype_on(dtype if dtype == dtypes.bfloat16 else dtypes.from_any(arr.dtype), device)
    buf = driver.upload(arr, device)
    return Node.from_buffer(buf, tuple(arr.shape), dt, device)


def copy_node(node: Node) -> Node:
    """A node computing a contiguous copy of node (one elementwise kernel when realized). Floats add -0.0,
    which keeps every value, -0.0 included (x + 0.0 turned -0.0 into 0.0)."""
    zero = g.const_like(node, False if node.dtype == dtypes.bool else (-0.0 if node.dtype.is_float else 0))
    return g.alu(Op.OR if node.dtype == dtypes.bool else Op.ADD, node, zero)


def _whole_buffer(node: Node) -> bool:
    """Whether node is realized as a buffer of its own size (not a view of a realized one)."""
    return node.realized and node.buffer.size == math.prod(node.shape)


def _fresh_buffer(node: Node) -> Node:
    """A node of its own (a copy in a new buffer) for a value that may be shared."""
    arr = driver.to_numpy(node)
    buf = get_runtime(node.device).from_numpy(np.ascontiguousarray(arr))
    return Node.from_buffer(buf, node.shape, node.dtype, node.device)
