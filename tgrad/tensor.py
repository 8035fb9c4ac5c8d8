"""Tensor: the user-facing API. Every op adds lazy nodes; composite ops are written from primitives."""

from __future__ import annotations

import functools
import inspect
import math
import pathlib
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tgrad import autodiff, inplace, symbolic, symbolic_ops
from tgrad import graph as g
from tgrad import realize as driver
from tgrad.device import Device, check_memory, get_runtime, is_disk, out_of_memory
from tgrad.dtype import (
    DType,
    check_fits,
    dtypes,
    fitted_array,
    from_bytes,
    host_values,
    promote,
    round_bf16,
    to_bytes,
)
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
from tgrad.ops.helpers import Scalar, _normalize_axis
from tgrad.ops.indexing import IndexingOps, file_node
from tgrad.ops.linalg import LinalgOps
from tgrad.ops.losses import LossOps
from tgrad.ops.math import MathOps
from tgrad.ops.movement import MovementOps
from tgrad.ops.nn import EVAL_MODE_NODES, NNOps, warn_eval_mode
from tgrad.ops.reduce import ReduceOps

# tensors created or marked with requires_grad=True, by id (Tensor.__eq__ is elementwise: no WeakSet)
_grad_leaves: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
# tensors with an assign() not realized yet (TinyJit realizes them before and after a jitted call)
PENDING_ASSIGNS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


_SYM_DATA = g.SYM.data  # (non-empty only while a tensor with a symbolic axis lives: symbolic.py)


def pending_assigns() -> list[Tensor]:
    """Take the tensors whose assign() has not run yet."""
    out = [t for t in list(PENDING_ASSIGNS.values()) if t.node.op is Op.ASSIGN and not t.node.realized]
    PENDING_ASSIGNS.clear()
    return out


# tensors backward() ran from, not realized yet: an optimizer step realizes them with its update (the
# usual `loss.backward(); opt.step(); print(loss.item())` would else compute the loss after the update,
# from the overwritten weights)
BACKWARD_ROOTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


# replay.backward (set by tgrad/__init__.py; replay.py needs jit.py, which needs this module): computes
# backward() when it returns, replaying a structure seen before, or returns False where it stays lazy
BACKWARD_REPLAY: Callable[[Tensor, Tensor | None], bool] | None = None


def backward_roots() -> list[Tensor]:
    """Take the tensors backward() ran from since the last call that are still alive and not realized."""
    out = [t for t in list(BACKWARD_ROOTS.values()) if not t.node.realized]
    BACKWARD_ROOTS.clear()
    return out


def _dtype_on(dtype: DType, device: str) -> DType:
    """dtype, after checking that the device has it (dtype.py: UINT_DEVICES...)."""
    if dtype.name in dtypes.ON_EVERY_DEVICE or is_disk(device):  # (by name: no DType comparison); a file
        return dtype  # holds the bytes of any dtype
    if dtype in dtypes.fp8s and device not in dtypes.FP8_DEVICES:
        raise DTypeError(f"{dtype.name} tensors exist on {' and '.join(dtypes.FP8_DEVICES)} only, not on "
                         f"{device}; cast to float16 or bfloat16 first")
    homes = dtypes.UINT32_DEVICES if dtype == dtypes.uint32 else dtypes.HOST_DEVICES
    homes = dtypes.UINT_DEVICES if dtype in (dtypes.uint16, dtypes.uint64) else homes
    if device not in homes and dtype in dtypes.HOST_ONLY + dtypes.HOST_FLOATS:
        instead = "float32 or float16" if dtype.is_float else "a signed integer type"
        where = f"{', '.join(homes[:-1])} and {homes[-1]}"
        raise DTypeError(f"{dtype.name} exists on {where} only, not on {device}; cast to {instead} first")
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


class Tensor(ElementwiseOps, MathOps, ReduceOps, MovementOps, IndexingOps, LinalgOps, NNOps, LossOps,
             metaclass=_NoGradMeta):
    """A lazy n-dimensional array with autograd. Nothing runs until numpy()/tolist()/item()/realize()."""

    # _base: (the tensor whose memory this view shares, the view ops from it) or None: not a view; _views:
    # views of this one (weak references). See inplace.py: they make assign() act as PyTorch's in-place ops
    # _before: weak references to nodes this leaf held before an assign() (or before realize() replaced its
    # graph): a graph built earlier reads them, and backward() gives their gradient to this leaf (PyTorch's
    # gradient through the old value of a tensor changed in place under no_grad)
    __slots__ = ("node", "_requires_grad", "grad", "_base", "_views", "_before", "__weakref__")
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
        elif isinstance(data, pathlib.PurePath):  # tinygrad's: the file's bytes, memory-mapped (on DISK)
            node = file_node(Tensor, data, device, dtype)
        elif isinstance(data, symbolic.Sym):  # its value, a 0-d int32 tensor read at launch
            node = data.node(Device.canonicalize(device))
            if dtype is not None:
                node = g.cast(node, _dtype_on(dtypes.from_any(dtype), node.device))
        else:
            device = Device.canonicalize(device)
            dtype = dtypes.from_any(dtype) if dtype is not None else None
            if isinstance(data, Tensor):
                node = data.node if device == data.device else data.to(device).node
                if dtype is not None:
                    node = g.cast(node, _dtype_on(dtype, device))
            elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
                dtype = _dtype_on(dtype or dtypes.from_py(data), device)
                node = g.const(check_fits(data, dtype, "Tensor"), dtype, device)
            else:
                node = _node_from_host(data, device, dtype)
        self.node: Node = node
        self.grad: Tensor | None = None
        self._requires_grad: bool | None = None
        self._base = self._views = None
        self._before: tuple[weakref.ref, ...] = ()
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
        """The sizes of the axes; an axis whose extent is a bound Variable shows it (symbolic.py)."""
        return self.node.shape if not _SYM_DATA else symbolic.shape_of(self.node)

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def device(self) -> str:
        return self.node.device

    @property
    def ndim(self) -> int:
        return len(self.node.shape)  # (shape's length: a symbolic axis is one axis too)

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[_normalize_axis(dim, self.ndim)]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_floating_point(self) -> bool:
        """Whether the dtype is a float one (PyTorch's and tinygrad's method)."""
        return self.dtype.is_float

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
            inplace.realize(nodes)
        for t in tensors:
            t._drop_history()
        return self

    def _drop_history(self) -> None:
        # a realized leaf, or a realized tensor no gradient flows through, keeps only its buffer, so the
        # graph that computed it (and that graph's buffers) can be freed
        is_leaf = not self.requires_grad or _grad_leaves.get(id(self)) is self
        under = self.node
        while under.op is Op.DETACH and under.buffer is None:  # (a kernel wrote the constant under it:
            under = under.srcs[0]  # Tensor.zeros(...).contiguous().realize() holds that buffer)
        if under is not self.node and under.op is Op.CONST and under.realized and (
                under.shape == self.node.shape):
            self.node.buffer = under.buffer
        if is_leaf and self.node.op is not Op.BUFFER and self.node.realized:
            if self._requires_grad:
                self._remember(self.node)
            sym = symbolic.of(self.node)
            self.node = g.Node.from_buffer(self.node.buffer, self.node.shape, self.dtype, self.device)
            symbolic.register(self.node, sym)
            inplace.rebase(self, self.node)  # (its views too: a gradient through one reaches this node)

    def numpy(self) -> np.ndarray:
        if _SYM_DATA and symbolic.of(self.node) is not None:  # its axes cut to their variables' values
            return Tensor(symbolic.concrete(self.node)).numpy()
        out = np.array(inplace.to_numpy(self.node, lambda: self.node), copy=True)
        self._drop_history()
        return out

    def tolist(self):
        return self.numpy().tolist()

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def to(self, *args, device: str | None = None, dtype=None, **kwargs) -> Tensor:
        """This tensor on another device and/or as another dtype, in PyTorch's forms: to(device),
        to(dtype), to(device, dtype), to(other_tensor) (its device and dtype), to(dtype=..., device=...).
        copy and non_blocking are accepted and ignored (a result never shares memory it should not)."""
        if set(kwargs) - {"copy", "non_blocking", "memory_format"}:
            raise ArgumentError(f"to(): unexpected arguments {', '.join(sorted(kwargs))}")
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = device or a.device, dtype or a.dtype
            elif isinstance(a, (bool, type(None))) or _is_dtype(a) is None:
                raise ArgumentError(f"to(): expected a device, a dtype or a Tensor, got {a!r}")
            elif _is_dtype(a):
                dtype = a
            else:
                device = a
        out = self if device is None else self._to_device(device)
        return out if dtype is None else out.cast(dtype)

    def cpu(self) -> Tensor:
        """This tensor on the CPU device (PyTorch's .cpu()); itself when it is there already."""
        return self.to("CPU")

    def dim(self) -> int:
        return self.ndim

    def type(self, dtype=None) -> Tensor | str:
        """PyTorch's Tensor.type: with no argument the type's name ('torch.FloatTensor', as PyTorch names
        a CPU tensor of that dtype), else this tensor cast to dtype (a dtype, 'float64', or a PyTorch tensor
        type: 'torch.DoubleTensor' or torch.DoubleTensor)."""
        if dtype is None:
            return f"torch.{_TORCH_TYPE_NAMES.get(self.dtype.name, self.dtype.name)}"
        if isinstance(dtype, type) and dtype.__name__.endswith("Tensor"):  # torch.DoubleTensor, the class
            dtype = dtype.__name__
        if isinstance(dtype, str) and dtype.endswith("Tensor"):
            name = dtype.removeprefix("torch.")
            named = {v: k for k, v in _TORCH_TYPE_NAMES.items()}
            if name not in named:
                raise DTypeError(f"type({dtype!r}): unknown tensor type; known: {', '.join(sorted(named))}")
            dtype = named[name]
        return self.cast(dtype)

    def _to_device(self, device: str) -> Tensor:
        """This tensor's value on another device. The copy is part of the graph: gradients flow back to
        the source device, and TinyJit replays it (a host step between the two devices' kernels)."""
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        if is_disk(device):  # written into the file now (the file is created or extended to its size)
            return Tensor.empty(self.shape, dtype=self.dtype, device=device).assign(self)
        _dtype_on(self.dtype, device)
        if not get_runtime(device).supports(self.dtype):
            raise DTypeError(f"to({device!r}): {device} has no {self.dtype.name}; cast first")
        source = self.device

        def copy(inputs, outputs):
            outputs[0][...] = inputs[0]

        step = driver.HostStep("to", copy, [(self.shape, self.dtype)], device, key=(source, device))
        node = self.node  # (run_host's realize may drop the graph behind self.node)
        (out,) = Tensor.run_host(step, self)
        if Tensor.no_grad or not self.dtype.is_float or is_disk(source):
            return out

        def rule(grad: Node) -> tuple[Node]:
            return (Tensor(grad)._to_device(source).node,)

        return self._from(autodiff.custom_gradient(out.node, (node,), rule, f"to {source}"), self)

    def detach(self) -> Tensor:
        """The same value, with no gradient flowing back through it; shares this tensor's memory (an
        assign() to either is seen by both, as in PyTorch)."""
        out = Tensor(Node(Op.DETACH, (self.node,), None, self.node.shape, self.dtype, self.device))
        inplace.add_view(self, out, ((Op.DETACH, None),))
        return out

    def __deepcopy__(self, memo: dict) -> Tensor:
        """copy.deepcopy (of a model too): a new tensor holding a copy of the values, with this one's
        requires_grad and a copy of its .grad; like PyTorch, only a leaf (no gradient flows through it)."""
        if self.requires_grad and _grad_leaves.get(id(self)) is not self:
            raise AutogradError("deepcopy: only tensors created by the user (graph leaves) can be copied, as "
                                "in PyTorch; deepcopy x.detach()")
        out = Tensor(self.numpy(), device=self.device, dtype=self.dtype, requires_grad=self._requires_grad)
        memo[id(self)] = out
        out.grad = None if self.grad is None else self.grad.__deepcopy__(memo)
        return out

    def clone(self) -> Tensor:
        """A copy (PyTorch's clone): later assign()s to this tensor, or to the memory it views, leave it
        as it is. Computed lazily (a copy kernel, often fused into its readers), and before any assign
        that would overwrite what it reads. Gradients flow through."""
        copy = Node(Op.CAST, (self.node,), self.dtype, self.node.shape, self.dtype, self.device)
        out = Tensor(autodiff.custom_gradient(copy, (self.node,), lambda grad: (grad,), "clone"))
        if self._requires_grad and not _NoGradMeta._no_grad:
            out._requires_grad = True
        return out

    def contiguous(self) -> Tensor:
        """This value in a buffer of its own, row-major (tinygrad's contiguous; PyTorch's copy of a
        non-contiguous tensor): fusion never recomputes it inside its users' kernels. A view is copied, an
        unrealized result is computed by a kernel of its own; a whole buffer, or a row-major view of one
        (PyTorch's rule: writes into it reach the buffer), is returned as it is.
        Gradients flow through."""
        if self.node.op is Op.BUFFER or self.node.realized or self._contiguous_view():
            return self
        if self.node.op is Op.DETACH and self.node.arg == "contiguous":  # already its own kernel's value:
            return self  # (a second contiguous made a kernel copying it: conv2d's computed input)
        copy = self.node
        if self.node.op in MOVEMENT_OPS:
            copy = Node(Op.CAST, (self.node,), self.dtype, self.node.shape, self.dtype, self.device)
        node = autodiff.custom_gradient(copy, (self.node,), lambda grad: (grad,), "contiguous")
        return self._from(node)

    def assign(self, x: Tensor | Any) -> Tensor:
        """Replace this tensor's value (x broadcast to its shape and cast to its dtype, as PyTorch's copy_);
        writes into its buffer when it has one."""
        if is_disk(self.device):
            return self._write_file(x)
        x = x if isinstance(x, Tensor) else Tensor(x, device=self.device, dtype=self.dtype)
        if symbolic_ops.WINDOWS and symbolic_ops.window_of(self) is not None:  # cache[:, :, pos:pos+n]
            return symbolic_ops.assign_window(self, x)
        if _SYM_DATA and symbolic.of(self.node) is not None:
            raise ShapeError(f"assign: writing into a tensor of symbolic shape {self.shape} is not "
                             "supported; write the whole buffer (where() over arange(n) == variable)")
        if x.shape != self.shape:
            pairs = zip(x.shape[::-1], self.shape[::-1])
            if len(x.shape) > self.ndim or any(a not in (1, b) for a, b in pairs):
                raise ShapeError(f"assign: shape {x.shape} does not match {self.shape} nor broadcasts to it")
            x = x.expand(self.shape)
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
        if self._requires_grad:
            self._remember(old)
        if old.op is Op.BUFFER:
            target = old
            if old.buffer.computed:  # other tensors may hold the node it was computed for: a buffer of its
                buf = get_runtime(self.device).alloc(self.numel(), self.dtype)  # own (x computes all of it)
                target = Node.from_buffer(buf, self.shape, self.dtype, self.device)
            self.node = Node(Op.ASSIGN, (target, x.node), None, self.shape, self.dtype, self.device)
            PENDING_ASSIGNS[id(self)] = self
            inplace.assigned(self.node, old)
        else:  # not realized (or realized with a history): the tensor takes the new value, no write
            self.node = x.node
        if self.node.buffer is None:
            inplace.track(self)
        inplace.rebase(self, self.node)
        return self

    def replace(self, x: Tensor) -> Tensor:
        """tinygrad's replace (load new values into a tensor, as p.replace(loaded)): here assign(x) of a
        tensor of the same shape, dtype and device (tgrad keeps a tensor's dtype and device); returns self."""
        if not isinstance(x, Tensor) or (x.shape, x.dtype, x.device) != (self.shape, self.dtype, self.device):
            got = (x.shape, x.dtype.name, x.device) if isinstance(x, Tensor) else type(x).__name__
            raise ArgumentError(f"replace: needs a tensor of shape, dtype and device {self.shape}, "
                                f"{self.dtype.name}, {self.device}, got {got}; cast or move it first")
        return self.assign(x)

    def _nodes(self) -> list[Node]:
        """This tensor's node and the earlier nodes of it that are still alive (_before)."""
        earlier = [r() for r in self._before]
        return [self.node, *[n for n in earlier if n is not None]]

    def _remember(self, node: Node) -> None:
        """Keep a weak reference to a node this leaf is leaving (see _before); the last 8 live ones."""
        self._before = (*[r for r in self._before if r() is not None][-7:], weakref.ref(node))

    def _contiguous_view(self) -> bool:
        """Whether this tensor is a row-major view of a buffer (x[0]): PyTorch's contiguous() returns such
        a view itself, so writes into the result reach the base."""
        if self._base is None or self._base[0].node.op is not Op.BUFFER:
            return False
        view = inplace.strided_view(self._base[0].shape, self._base[1])
        return view is not None and view.mask is None and all(
            st == want or n == 1 for st, want, n in zip(view.strides, g.strides_for(view.shape), view.shape))

    def _assign_view(self, x: Tensor) -> bool:
        """assign() to a view writes into its base (PyTorch's in-place ops on a view): the base takes x
        where this view's elements are, and its views (this one too) the new value. False when this
        tensor is not a view in PyTorch's sense (a reshape strides cannot express: a copy there)."""
        root, steps = self._base
        if not inplace.strided(root.shape, steps):
            self._base = None
            return False
        if inplace.overlapping(root.shape, steps):
            raise ArgumentError(
                f"assign: several elements of this tensor ({self.shape}) are one element of the "
                f"{root.shape} tensor it views (an expanded axis, or overlapping unfold() windows); in-place "
                "writes into it are refused (PyTorch refuses the expanded kind too); clone() it first"
            )
        shapes = [root.shape]  # the shape before each step
        for op, arg in steps[:-1]:
            shapes.append(inplace.shape_after(shapes[-1], op, arg))
        # each op undone on x and, where the view covers part of the base, on a mask of its elements
        partial = any(op in (Op.SHRINK, Op.EXPAND, inplace.STRIDE, inplace.WINDOWS) for op, _ in steps)
        ts = [x, Tensor.ones(*x.shape, dtype=dtypes.bool, device=self.device)] if partial else [x]
        ts = inplace.undo(ts, steps, shapes)
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
        """Set .grad of every requires_grad tensor this one depends on (adding to an existing one), computed
        when it returns (with this tensor), as in PyTorch; inside a TinyJit function, under JIT=0 or
        TGRAD_BACKWARD_REPLAY=0 lazy instead, computed at the next realize (replay.py)."""
        if not Tensor.training and EVAL_MODE_NODES:  # (empty unless a BatchNorm / Dropout ran in eval)
            warn_eval_mode(self.node)
        if BACKWARD_REPLAY is not None and BACKWARD_REPLAY(self, gradient):
            return self
        return self._backward(gradient)

    def _backward(self, gradient: Tensor | None) -> Tensor:
        seed = self._seed(gradient, "backward")
        if not self.requires_grad:
            raise AutogradError(
                "backward(): nothing in this graph requires a gradient; create leaves with requires_grad=True"
            )
        leaves = [t for t in list(_grad_leaves.values()) if t.requires_grad]
        nodes = [(t, t._nodes()) for t in leaves]
        grads = autodiff.gradients(self.node, seed, {n for _, ns in nodes for n in ns})
        for t, ns in nodes:
            for n in ns:  # (earlier nodes of t too: the graph read its value before an assign)
                gn = grads.get(n)
                if gn is None:
                    continue
                t.grad = Tensor(gn) if t.grad is None else Tensor(g.alu(Op.ADD, t.grad.node, gn))
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
        out = object.__new__(Tensor)  # (Tensor(node)'s fields, without __init__'s checks: every op's result)
        out.node, out.grad, out._base, out._views, out._before = node, None, None, None, ()
        grad = self._requires_grad
        for t in inputs:
            grad = grad or t._requires_grad
        out._requires_grad = True if grad and not _NoGradMeta._no_grad else None
        if node.buffer is None:  # (inplace.track's first line inline: it runs again only to purge)
            inplace.LAZY[id(out)] = weakref.ref(out)
            if len(inplace.LAZY) > inplace._purge_at:
                inplace.track(out)
        if view is not None:
            inplace.add_view(self, out, view)
        return out

    @staticmethod
    def _shape_arg(shape) -> tuple[int, ...]:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        if not all(isinstance(s, (int, np.integer)) for s in shape):
            if all(isinstance(s, (int, np.integer, symbolic.Sym)) for s in shape):
                return tuple(s if isinstance(s, symbolic.Sym) else int(s) for s in shape)
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
        fill = check_fits(fill_value, dt, "full", strict_float=True)
        node = g.const(fill, dt, device, symbolic.physical(shape))
        for axis, s in enumerate(shape):  # an axis of a variable's extent (symbolic.py)
            if isinstance(s, symbolic.Sym):
                node = symbolic.extent(node, axis, s)
        t = Tensor(node)
        if requires_grad is not None:
            t.requires_grad = requires_grad
        return t

    @staticmethod
    def zeros(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape), 0.0, dtype=dtype or dtypes.default_float, device=device,
                           requires_grad=requires_grad)

    @staticmethod
    def ones(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape), 1.0, dtype=dtype or dtypes.default_float, device=device,
                           requires_grad=requires_grad)

    @staticmethod
    def empty(*shape, dtype=None, device=None) -> Tensor:
        """A new buffer whose contents are whatever the memory held (uninitialised, as in PyTorch)."""
        shape = Tensor._shape_arg(shape)
        device = Device.canonicalize(device)
        dt = _dtype_on(dtypes.from_any(dtype) if dtype is not None else dtypes.default_float, device)
        rt = get_runtime(device)
        check_memory(rt, shape, dt, "Tensor.empty")
        try:
            buf = rt.alloc(math.prod(shape), dt)
        except MemoryError as e:
            raise out_of_memory(e, rt, shape, dt, "Tensor.empty") from e
        return Tensor(Node.from_buffer(buf, shape, dt, device))

    def empty_like(self, **kw) -> Tensor:
        """An uninitialised tensor of this shape, dtype and device (PyTorch's empty_like)."""
        return Tensor.empty(self.shape, **{"dtype": self.dtype, "device": self.device, **kw})

    def zeros_like(self, **kw) -> Tensor:
        return Tensor.full(self.shape, 0, **{"dtype": self.dtype, "device": self.device, **kw})

    def ones_like(self, **kw) -> Tensor:
        return Tensor.full(self.shape, 1, **{"dtype": self.dtype, "device": self.device, **kw})

    def full_like(self, fill_value: Scalar, **kw) -> Tensor:
        return Tensor.full(self.shape, fill_value, **{"dtype": self.dtype, "device": self.device, **kw})

    def const_like(self, b: Scalar, dtype=None) -> Tensor:
        """tinygrad's const_like: full_like(b), in self's dtype unless dtype is given."""
        return self.full_like(b, dtype=dtype or self.dtype)

    @staticmethod
    def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if isinstance(start, symbolic.Sym) or isinstance(stop, symbolic.Sym):  # extents (symbolic.py)
            return symbolic_ops.arange(Tensor, start, stop, step, dtype, device)
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
    def _random(draw, shape, dtype, device, requires_grad=None, default=None) -> Tensor:
        """A tensor of host random numbers: draw(rng, n) -> n numbers, with Tensor._rng (see manual_seed).
        Every random constructor comes through here, so that TinyJit can draw again on each replay. A
        tensor too big for its device is refused before anything is drawn."""
        dt = dtypes.from_any(dtype) if dtype is not None else (default or dtypes.default_float)
        device = Device.canonicalize(device)
        rt = get_runtime(device)
        check_memory(rt, shape, dt, "random draw")
        whole = functools.partial(_drawn, draw, shape, dt)
        try:
            # (dt given only where the array's own dtype does not say it, bfloat16 and fp8 held in float32
            # arrays: no second copy of the numbers; without it an fp8 draw became a float32 tensor)
            held = dt in dtypes.HOST_FLOATS + dtypes.fp8s
            node = _node_from_host(whole(Tensor._rng), device, dt if held else None)
        except MemoryError as e:
            raise out_of_memory(e, rt, shape, dt, "random draw") from e
        t = Tensor(node, requires_grad=requires_grad)
        if not t.requires_grad:
            driver.report_random(t.node.buffer, whole, dt, t.device)
        return t

    @staticmethod
    def rand(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        # float16 and bfloat16 draw multiples of 2**-11 and 2**-8 (PyTorch's), so none rounds up to 1; fp8
        # multiples of the spacing of its values below 1 (2**-4 with 3 mantissa bits, 2**-3 with 2)
        steps = {dtypes.float16: 2**11, dtypes.bfloat16: 2**8, dtypes.fp8e4m3: 2**4, dtypes.fp8e4m3fnuz: 2**4,
                 dtypes.fp8e5m2: 2**3, dtypes.fp8e5m2fnuz: 2**3}
        steps = steps.get(dtypes.from_any(dtype) if dtype else None)
        if steps:
            return Tensor._random(lambda rng, n: np.floor(rng.random(n) * steps) / steps, shape, dtype,
                                  device, requires_grad)
        return Tensor._random(lambda rng, n: rng.random(n), shape, dtype, device, requires_grad)

    @staticmethod
    def randn(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        return Tensor._random(lambda rng, n: rng.standard_normal(n), shape, dtype, device, requires_grad)

    @staticmethod
    def randint(*shape, low=0, high=10, dtype=None, device=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        if not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in (low, high)):
            raise DTypeError(f"randint: low and high must be ints, got low={low!r}, high={high!r} (PyTorch's "
                             "TypeError)")
        if low >= high:
            raise ArgumentError(f"randint: low ({low}) must be below high ({high})")
        return Tensor._random(lambda rng, n: rng.integers(low, high, n), shape, dtype, device,
                              default=dtypes.int32)

    @staticmethod
    def randperm(n: int, dtype=None, device=None) -> Tensor:
        """A random permutation of 0..n-1 (torch.randperm), default-int unless dtype is given."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ArgumentError(f"randperm: n must be an int >= 0, got {n!r}")
        draw = lambda rng, _: rng.permutation(n)  # noqa: E731
        return Tensor._random(draw, (n,), dtype, device, default=dtypes.default_int)

    @staticmethod
    def uniform(*shape, low=0.0, high=1.0, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        if low > high:  # (PyTorch's uniform_ takes low == high: every value is low)
            raise ArgumentError(f"uniform: low ({low}) must not be above high ({high})")
        return Tensor._random(lambda rng, n: rng.uniform(low, high, n), shape, dtype, device, requires_grad)

    @staticmethod
    def normal(*shape, mean=0.0, std=1.0, dtype=None, device=None, requires_grad=None) -> Tensor:
        shape = Tensor._shape_arg(shape)
        return Tensor._random(lambda rng, n: rng.normal(mean, std, n), shape, dtype, device, requires_grad)

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
        if dtype.name == self.node.dtype.name:
            return self
        out = self._from(g.cast(self.node, dtype))
        if dtype.kind != "f":
            out._requires_grad = False
        return out

    def bitcast(self, dtype) -> Tensor:
        """The same bits read as another dtype (PyTorch's view(dtype), tinygrad's bitcast). Between dtypes
        of different sizes the last axis takes the bytes (PyTorch's rule: float32 (2, 3) as uint8 is
        (2, 12)). Runs on the host between kernels (a HostStep, which TinyJit replays); not differentiable.
        A view, as PyTorch's: an assign() to it writes this tensor's bits, and this tensor's writes show in
        it (where strides can say it, as in PyTorch)."""
        dtype = _dtype_on(dtypes.from_any(dtype), self.device)
        src, shape = self.dtype, self.shape
        if dtype == src:
            return self
        if _SYM_DATA and symbolic.of(self.node) is not None:  # the stored bits, the variables kept
            return symbolic_ops.bitcast(self, dtype)
        if dtype.itemsize != src.itemsize:
            if not shape or shape[-1] * src.itemsize % dtype.itemsize:
                nbytes = shape[-1] * src.itemsize if shape else "a 0-d tensor has none"
                raise ShapeError(f"bitcast: {src.name} {shape} -> {dtype.name} needs a last axis whose size "
                                 f"in bytes ({nbytes}) is a multiple of {dtype.itemsize}")
            shape = (*shape[:-1], shape[-1] * src.itemsize // dtype.itemsize)
        if self.requires_grad and dtype.is_float and not Tensor.no_grad:
            raise AutogradError("bitcast is not differentiable; bitcast x.detach()")
        if is_disk(self.device):  # the same bytes of the file, read as dtype
            return Tensor(Node.from_buffer(self.node.buffer.retyped(dtype), shape, dtype, self.device))

        def reinterpret(inputs, outputs):
            outputs[0][...] = from_bytes(to_bytes(inputs[0], src), dtype).reshape(shape)

        step = driver.HostStep("bitcast", reinterpret, [(shape, dtype)], self.device, key=(src, dtype))
        out = Tensor.run_host(step, self)[0]
        again = lambda node: Tensor(node).bitcast(dtype).node  # noqa: E731 (rebuilt on a new base node)
        inplace.add_view(self, out, ((inplace.BITCAST, (src, dtype, again)),))  # (PyTorch's view(dtype))
        return out

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


# PyTorch computes a bfloat16 op in float32 and rounds its result once. tgrad's primitive ops do that by
# themselves (each bfloat16 node is rounded); these composite ops run on float32 copies of their bfloat16
# tensors, and a float32 result whose inputs were bfloat16 (no other float dtype) is rounded back. mul and
# div too: PyTorch multiplies by a number in float32 (add and sub round it first); division in float64, so
# that a * (1 / b) rounds to float32's a / b; `number / x` is x.reciprocal() * number. pow, mod and fmod
# round a number to bfloat16 first, as PyTorch does (a float exponent; 1.5 % 0.1 is % 0.10009765625).
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
    name = fn.__name__
    def up(x):
        if isinstance(x, (list, tuple)):
            return type(x)(map(up, x))
        if type(x) is float and name == "pow" or type(x) in (int, float) and name in ("mod", "fmod"):
            return float(round_bf16(x))
        if isinstance(x, (int, float)) and not isinstance(x, bool) and wide == dtypes.float64:
            return float(np.float32(x))  # PyTorch's float32 scalar
        return x.cast(wide) if isinstance(x, Tensor) and x.dtype == dtypes.bfloat16 else x

    def op(*args, **kwargs):
        if not _any_bf16(args, kwargs):
            return fn(*args, **kwargs)
        tensors = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(t, Tensor)]
        floats = [t for t in tensors if t.dtype.is_float]  # (a 0-d one counts beside no other: PyTorch's)
        back = all(t.dtype == dtypes.bfloat16 for t in [t for t in floats if t.shape] or floats)
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


# PyTorch's legacy type names of CPU tensors (Tensor.type())
_TORCH_TYPE_NAMES = {
    "float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
    "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor", "int16": "ShortTensor",
    "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor",
}


def _is_dtype(x) -> bool | None:
    """Whether x names a dtype (True) or a device (False: any other string, which to() then checks) in
    to()'s arguments; None: neither."""
    if isinstance(x, DType) or (not isinstance(x, str) and hasattr(x, "is_floating_point")):
        return True  # (a torch.dtype)
    try:
        dtypes.from_any(x)
        return True
    except (DTypeError, TypeError):
        return False if isinstance(x, str) else None


def _numpy_scalar_dtype(data) -> np.dtype | None:
    """PyTorch's dtype for host data holding numpy scalars (np.float64(3.0) is float64, unlike the Python
    float 3.0): the promotion of the elements' dtypes, Python scalars counting as the default dtypes;
    None when there is no numpy scalar (the usual defaults apply)."""
    if isinstance(data, np.generic):
        return data.dtype
    if not isinstance(data, (list, tuple)):
        return None
    kinds: set[type] = set()
    _leaf_types(data, kinds)
    if not any(issubclass(k, np.generic) for k in kinds):
        return None
    found = [dtypes.from_any(k) if issubclass(k, np.generic) else dtypes.from_py(k())
             for k in kinds if issubclass(k, (np.generic, bool, int, float))]
    return functools.reduce(promote, found).np


def _leaf_types(data: list | tuple, out: set[type]) -> None:
    """The types of the non-sequence elements of nested lists and tuples, into out (map(type, ...) runs
    in C: a Python walk element by element cost far more than np.array itself on a long list)."""
    kinds = set(map(type, data))
    out |= kinds - {list, tuple}
    if list in kinds or tuple in kinds:
        for x in data:
            if type(x) is list or type(x) is tuple:
                _leaf_types(x, out)


# random numbers are drawn this many at a time (float64 from numpy's generator) and stored in the tensor's
# dtype, so a draw never holds float64 numbers for the whole tensor
_DRAW_CHUNK = 1 << 22


def _drawn(draw, shape: tuple[int, ...], dtype: DType, rng) -> np.ndarray:
    """draw(rng, n) for every element of `shape`, as dtype's host values (the same numbers as one call of
    draw(rng, numel) for the sizes up to _DRAW_CHUNK)."""
    n = math.prod(shape)
    if n <= _DRAW_CHUNK:
        return host_values(draw(rng, n), dtype).reshape(shape)
    out = np.empty(n, dtype.np)
    for start in range(0, n, _DRAW_CHUNK):
        out[start : start + _DRAW_CHUNK] = host_values(draw(rng, min(_DRAW_CHUNK, n - start)), dtype)
    return out.reshape(shape)


def _node_from_host(data, device: str, dtype: DType | None) -> Node:
    if data is None:  # tinygrad's Tensor(None): an empty tensor (PyTorch refuses None)
        return _node_from_host(np.empty(0, np.float32), device, dtype or dtypes.default_float)
    if isinstance(data, (bytes, bytearray)):  # tinygrad's: the bytes as uint8 (PyTorch refuses bytes)
        data = np.frombuffer(data, np.uint8)
    if isinstance(data, np.ndarray):
        arr = data
    else:
        arr = np.array(data)
        if arr.dtype == object:
            if all(isinstance(v, int) for v in arr.flat):  # ints past 64 bits
                for v in arr.flat:
                    check_fits(v, dtype or dtypes.default_int, "Tensor")
            raise DTypeError(f"cannot make a tensor from {type(data).__name__}: ragged or non-numeric data")
        scalars = _numpy_scalar_dtype(data) if dtype is None else None
        if scalars is not None:
            arr = arr.astype(scalars)
        else:
            # Python values a dtype cannot hold raise, as in PyTorch (a numpy array wraps, as numpy's astype)
            target = dtype or (dtypes.default_int if arr.dtype.kind in "iu" else None)
            if target is not None:
                arr = fitted_array(arr, data, target, "Tensor")
        if scalars is None and dtype is None:
            if arr.dtype.kind == "f":
                arr = arr.astype(dtypes.default_float.np)
            elif arr.dtype.kind in "iu":
                arr = arr.astype(dtypes.default_int.np)
    if dtype is not None:
        arr = host_values(arr, _dtype_on(dtype, device), copy=False)  # (the upload copies: once)
    dt = _dtype_on(dtype if dtype in dtypes.HOST_FLOATS + dtypes.fp8s else dtypes.from_any(arr.dtype), device)
    try:
        buf = driver.upload(arr, device)
    except MemoryError as e:
        raise out_of_memory(e, get_runtime(device), arr.shape, dt, "a copy of host data") from e
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
    arr = inplace.to_numpy(node)
    buf = get_runtime(node.device).from_numpy(np.ascontiguousarray(arr))
    return Node.from_buffer(buf, node.shape, node.dtype, node.device)

