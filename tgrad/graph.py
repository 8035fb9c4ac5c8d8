"""The lazy graph: immutable, hash-consed `Node`s of primitive ops, and the `View`s movement ops become.

A Node is one primitive op applied to source nodes. Movement ops (RESHAPE PERMUTE EXPAND PAD SHRINK
FLIP) are nodes too, so autodiff can see them, but they never copy: fuse.py folds each chain of them
into a `ShapeTracker` (a stack of `View`s) that becomes an index expression in the kernel. Each ALU op's
meaning is its numpy form in REFERENCE (what the NUMPY device evaluates and every emitter must agree with).
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from tgrad.dtype import DType, dtypes, round_to
from tgrad.errors import DiskError


class Op(Enum):
    # leaves
    BUFFER = "BUFFER"  # arg: unique id; the node's `buffer` holds the data
    CONST = "CONST"  # arg: python scalar; shape () unless expanded by movement ops
    # unary
    EXP2 = "EXP2"
    LOG2 = "LOG2"
    SIN = "SIN"
    SQRT = "SQRT"
    RECIP = "RECIP"
    NEG = "NEG"
    TRUNC = "TRUNC"
    CAST = "CAST"  # arg: target DType (the node's dtype)
    # binary
    ADD = "ADD"
    SUB = "SUB"
    MUL = "MUL"
    IDIV = "IDIV"  # integer division truncating toward zero (C semantics)
    MOD = "MOD"  # remainder with the sign of the dividend (C semantics)
    MAX = "MAX"
    CMPLT = "CMPLT"
    CMPNE = "CMPNE"
    AND = "AND"
    OR = "OR"
    XOR = "XOR"
    # ternary
    WHERE = "WHERE"
    # reduce: arg = (reduce op, axes); output keeps the reduced axes as size 1
    REDUCE = "REDUCE"
    # movement
    RESHAPE = "RESHAPE"
    PERMUTE = "PERMUTE"
    EXPAND = "EXPAND"
    PAD = "PAD"
    SHRINK = "SHRINK"
    FLIP = "FLIP"
    # write the value (src 1) into the buffer of the target (src 0)
    ASSIGN = "ASSIGN"
    # identity whose gradient is zero (Tensor.detach); fusion looks through it
    DETACH = "DETACH"

    def __repr__(self) -> str:
        return self.name


def _idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's integer division (toward zero); 0 where b is 0 (what the emitters' kernels give)."""
    safe = np.where(b == 0, 1, b)
    q = a // safe
    q = q + ((q < 0) & (q * safe != a))  # floor -> toward zero
    return np.where(b == 0, 0, q)


# each unary and binary op's meaning as numpy computes it (the NUMPY device runs these; CAST and WHERE,
# which depend on dtypes, are its own): a new primitive op is defined here and in each emitter
REFERENCE = {
    Op.EXP2: np.exp2,
    Op.LOG2: np.log2,
    Op.SIN: np.sin,
    Op.SQRT: np.sqrt,
    Op.NEG: np.negative,
    Op.TRUNC: np.trunc,
    Op.RECIP: lambda x: np.reciprocal(x) if x.dtype.kind == "f" else 1 // x,
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.IDIV: _idiv,
    Op.MOD: lambda a, b: a - b * _idiv(a, b),
    Op.MAX: lambda a, b: np.logical_or(a, b) if a.dtype == np.bool_ else np.maximum(a, b),
    Op.CMPLT: np.less,
    Op.CMPNE: np.not_equal,
    Op.AND: np.bitwise_and,
    Op.OR: np.bitwise_or,
    Op.XOR: np.bitwise_xor,
}
# ops costly enough per element that fusion computes them once rather than under a big expand (fuse_roots)
EXPENSIVE = {Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP, Op.IDIV, Op.MOD}
UNARY = {Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP, Op.NEG, Op.TRUNC, Op.CAST}
BINARY = {Op.ADD, Op.SUB, Op.MUL, Op.IDIV, Op.MOD, Op.MAX, Op.CMPLT, Op.CMPNE, Op.AND, Op.OR, Op.XOR}
ALU = UNARY | BINARY | {Op.WHERE}
MOVEMENT = {Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.PAD, Op.SHRINK, Op.FLIP}
REDUCE_OPS = ("SUM", "PROD", "MAX")


def prod(xs) -> int:
    return math.prod(xs)


_BUFFER, _ASSIGN = Op.BUFFER, Op.ASSIGN
# symbolic shapes (symbolic.py): node -> per-axis BoundVariable or None, for nodes with a symbolic axis;
# SYM_RULE (symbolic.derive, set when symbolic.py is imported) gives a new node's entry from its sources'
SYM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SYM_DATA = SYM.data
SYM_RULE = None


def _SYM_SET(node, sym) -> None:
    if any(v is not None for v in sym):
        SYM[node] = sym


class Node:
    """One vertex of the lazy graph. Equal (op, srcs, arg, shape, dtype, device) give the same Node."""

    __slots__ = ("op", "srcs", "arg", "shape", "dtype", "device", "buffer", "__weakref__")
    # key -> weakref.ref(node): a plain dict of C-level refs (a WeakValueDictionary's callbacks and keyed
    # refs are Python code, a third of building a node); dead entries are dropped when it has doubled
    _cache: dict[tuple, weakref.ref] = {}
    _purge_at = 4096
    _ids = itertools.count()

    op: Op
    srcs: tuple[Node, ...]
    arg: Any
    shape: tuple[int, ...]
    dtype: DType
    device: str

    def __new__(
        cls, op: Op, srcs: tuple[Node, ...], arg: Any, shape: tuple[int, ...], dtype: DType, device: str
    ):
        # (every node of every graph is built here: attribute stores one by one, object.__new__ and no
        # Op.X lookups are each measurably faster)
        sym = None
        if _SYM_DATA and srcs:  # a source with a symbolic axis (symbolic.py): carry it, mask a reduce
            srcs, sym = SYM_RULE(op, srcs, arg, shape)
        if op is _BUFFER or op is _ASSIGN:
            key = None
            if op is _ASSIGN and device.startswith("DISK:"):  # (Tensor.assign writes a disk tensor itself)
                return _on_disk(op, srcs, arg, shape, device)
        else:
            # (the op's and dtype's names: hashing them is cached, hashing an Enum or a dataclass is Python)
            arg_key = arg
            if arg is not None and isinstance(arg, (float, int)):  # (_arg_key(arg), inline)
                arg_key = (type(arg), arg) if arg == arg and arg != 0 else (type(arg), repr(arg))
            key = (op._value_, tuple(map(id, srcs)), arg_key, shape, dtype.name, device)
            ref = _CACHE.get(key)
            if ref is not None:  # (a dead entry's ids may be reused: its node, holding its sources, is gone)
                hit = ref()
                if hit is not None and hit.buffer is None:  # a realized node is not handed out again: a
                    if sym is not None:  # graph built again computes again (else TinyJit's calls differ)
                        _SYM_SET(hit, sym)
                    return hit
            # a file's bytes (runtime/disk.py): views only, never in a kernel (device[0]: the cheap test)
            if device[0] == "D" and device.startswith("DISK:"):
                return _on_disk(op, srcs, arg, shape, device)
        self = object.__new__(cls)
        self.op = op
        self.srcs = srcs
        self.arg = arg
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.buffer = None
        if key is not None:
            _CACHE[key] = weakref.ref(self)
            if len(_CACHE) > cls._purge_at:
                for k, r in list(_CACHE.items()):  # (a snapshot: another thread may be adding nodes)
                    if r() is None:
                        _CACHE.pop(k, None)
                cls._purge_at = max(4096, 2 * len(_CACHE))
        if sym is not None:
            _SYM_SET(self, sym)
        return self

    @staticmethod
    def from_buffer(buffer, shape: tuple[int, ...], dtype: DType, device: str) -> Node:
        node = Node(Op.BUFFER, (), next(Node._ids), shape, dtype, device)
        node.buffer = buffer
        return node

    @property
    def realized(self) -> bool:
        return self.buffer is not None

    def written(self, buffer) -> None:
        """An ASSIGN ran: its value is now `buffer` (its target's). The expression it wrote is dropped
        (ASSIGN has no gradient), so a later graph that reads this node does not keep that expression, and
        every buffer it read, alive: BatchNorm's running statistics read their previous value each step,
        and would otherwise hold every step's activations."""
        self.buffer = buffer
        self.srcs = self.srcs[:1]

    @property
    def base(self) -> Node:
        """The node under a chain of movement ops."""
        node = self
        while node.op in MOVEMENT or node.op is Op.DETACH:
            node = node.srcs[0]
        return node

    def __repr__(self) -> str:
        return (
            f"<Node {self.op.name} {self.arg if self.op is not Op.BUFFER else ''} {self.shape} {self.dtype}>"
        )


def _on_disk(op: Op, srcs: tuple[Node, ...], arg: Any, shape: tuple[int, ...], device: str) -> Node:
    """A node on a disk device: a movement op of a disk buffer is a buffer of its own over the same bytes
    (DiskBuffer.moved; a DiskError where they are not one contiguous range), a DETACH the node itself;
    anything else computes, which a file cannot: a DiskError naming the op."""
    src = srcs[0] if srcs else None
    if src is not None and src.op is Op.BUFFER and src.buffer is not None:
        if op in MOVEMENT:
            buffer = src.buffer.moved(op, arg, src.shape, shape)
            return Node.from_buffer(buffer, shape, src.dtype, device)
        if op is Op.DETACH:
            return src
    what = "a constant (CONST)" if op is Op.CONST else op.name
    raise DiskError(f"a disk tensor ({device}) computes nothing, so {what} cannot run on it: a disk device "
                    "holds a file's bytes and runs no kernels; it supports views of contiguous ranges "
                    "(reshape, shrink, slicing, bitcast), .to(device), assign() and t[...] = value. Copy it "
                    "to a compute device first: t.to('CPU')")


def _arg_key(arg):
    """nan != nan, 0.0 == -0.0 and 1 == 1.0 == True: scalars are keyed by type, and zeros and nan by repr
    (equal other values of one type are the same number: keyed by it, no repr made), so each constant is
    its own node."""
    if isinstance(arg, (float, int)):
        return (type(arg), arg) if arg == arg and arg != 0 else (type(arg), repr(arg))
    return arg


# ---------------------------------------------------------------------------------------------------
# Views: how movement ops map an index of the moved tensor to an offset into the base buffer


def strides_for(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous (row-major) strides, 0 for size-1 axes."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc if s != 1 else 0)
        acc *= s
    return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
    """index -> offset + sum(index[i] * strides[i]); valid where mask[i][0] <= index[i] < mask[i][1]."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0
    mask: tuple[tuple[int, int], ...] | None = None

    @staticmethod
    def contiguous(shape: tuple[int, ...]) -> View:
        return View(shape, strides_for(shape))

    @property
    def is_contiguous(self) -> bool:
        return self.offset == 0 and self.mask is None and self.strides == strides_for(self.shape)

    def permute(self, order: tuple[int, ...]) -> View:
        mask = tuple(self.mask[i] for i in order) if self.mask else None
        return View(
            tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset, mask
        )

    def expand(self, shape: tuple[int, ...]) -> View:
        strides = tuple(st if s == n else 0 for st, s, n in zip(self.strides, self.shape, shape))
        mask = None
        if self.mask:
            mask = tuple(
                m if s == n else ((0, n) if m[0] < m[1] else (0, 0))  # an empty mask stays empty
                for m, s, n in zip(self.mask, self.shape, shape)
            )
        return View(shape, strides, self.offset, mask)

    def shrink(self, arg: tuple[tuple[int, int], ...]) -> View:
        offset = self.offset + sum(b * st for (b, _), st in zip(arg, self.strides))
        mask = None
        if self.mask:
            mask = tuple(
                (max(0, lo - b), max(0, min(e - b, hi - b))) for (lo, hi), (b, e) in zip(self.mask, arg)
            )
        return View(tuple(e - b for b, e in arg), self.strides, offset, mask)

    def pad(self, arg: tuple[tuple[int, int], ...]) -> View:
        offset = self.offset - sum(lo * st for (lo, _), st in zip(arg, self.strides))
        old = self.mask or tuple((0, s) for s in self.shape)
        mask = tuple((m0 + lo, m1 + lo) for (m0, m1), (lo, _) in zip(old, arg))
        shape = tuple(s + lo + hi for s, (lo, hi) in zip(self.shape, arg))
        return View(shape, self.strides, offset, mask)

    def flip(self, axes: tuple[int, ...]) -> View:
        offset = self.offset + sum((self.shape[a] - 1) * self.strides[a] for a in axes if self.shape[a] > 0)
        strides = tuple(-st if i in axes else st for i, st in enumerate(self.strides))
        mask = None
        if self.mask:
            mask = tuple(
                (s - hi, s - lo) if i in axes else (lo, hi)
                for i, ((lo, hi), s) in enumerate(zip(self.mask, self.shape))
            )
        return View(self.shape, strides, offset, mask)

    def reshape(self, shape: tuple[int, ...]) -> View | None:
        """The same memory seen with a new shape, or None when one View cannot express it."""
        if self.is_contiguous:
            return View.contiguous(shape)
        if self.mask is not None:
            return self._reshape_ones(shape)
        # match groups of old axes with groups of new axes of equal product; each old group must be
        # contiguous within itself, and its new axes get strides derived from the group's last stride
        old = [(s, st) for s, st in zip(self.shape, self.strides) if s != 1]
        # walk both sides together
        strides = [0] * len(shape)
        new_idx = [k for k, s in enumerate(shape) if s != 1]
        oi = ni = 0
        while oi < len(old) and ni < len(new_idx):
            og, ng = [old[oi]], [new_idx[ni]]
            op_, np_ = old[oi][0], shape[new_idx[ni]]
            while op_ != np_:
                if op_ < np_:
                    oi += 1
                    if oi >= len(old):
                        return None
                    og.append(old[oi])
                    op_ *= old[oi][0]
                else:
                    ni += 1
                    if ni >= len(new_idx):
                        return None
                    ng.append(new_idx[ni])
                    np_ *= shape[new_idx[ni]]
            for (_, st0), (s1, st1) in zip(og, og[1:]):
                if st0 != st1 * s1:
                    return None
            acc = og[-1][1]
            for k in reversed(ng):
                strides[k] = acc
                acc *= shape[k]
            oi += 1
            ni += 1
        if oi != len(old) or ni != len(new_idx):
            return None
        return View(shape, tuple(strides), self.offset, None)

    def _reshape_ones(self, shape: tuple[int, ...]) -> View | None:
        """Reshape of a masked view: only adding or removing size-1 axes is supported."""
        keep = [i for i, s in enumerate(self.shape) if s != 1]
        if tuple(self.shape[i] for i in keep) != tuple(s for s in shape if s != 1):
            return None
        if any(self.mask[i][0] >= self.mask[i][1] for i, s in enumerate(self.shape) if s == 1):
            return None  # a fully masked size-1 axis would be lost
        strides, mask, it = [], [], iter(keep)
        for s in shape:
            if s == 1:
                strides.append(0)
                mask.append((0, 1))
            else:
                k = next(it)
                strides.append(self.strides[k])
                mask.append(self.mask[k])
        return View(shape, tuple(strides), self.offset, tuple(mask))


@dataclass(frozen=True)
class ShapeTracker:
    """A stack of Views: views[-1] is what the user sees; each view indexes the one before it as if
    that one were contiguous; views[0] indexes the buffer."""

    views: tuple[View, ...]

    @staticmethod
    def contiguous(shape: tuple[int, ...]) -> ShapeTracker:
        return ShapeTracker((View.contiguous(shape),))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.views[-1].shape

    def _replace_last(self, view: View) -> ShapeTracker:
        return ShapeTracker(self.views[:-1] + (view,))

    def apply(self, op: Op, arg) -> ShapeTracker:
        last = self.views[-1]
        if op is Op.RESHAPE:
            if prod(arg) == 0:
                return ShapeTracker.contiguous(arg)
            view = last.reshape(arg)
            if view is None:
                return ShapeTracker(self.views + (View.contiguous(arg),))
            return self._replace_last(view)
        if op is Op.PERMUTE:
            return self._replace_last(last.permute(arg))
        if op is Op.EXPAND:
            return self._replace_last(last.expand(arg))
        if op is Op.PAD:
            return self._replace_last(last.pad(arg))
        if op is Op.SHRINK:
            return self._replace_last(last.shrink(arg))
        if op is Op.FLIP:
            return self._replace_last(last.flip(arg))
        raise ValueError(f"{op} is not a movement op")


_CACHE = Node._cache  # (the same dict, read as a global in Node.__new__)


# ---------------------------------------------------------------------------------------------------
# node constructors with shape and dtype inference (tensor.py, ops/ and autodiff.py build graphs with these)


# the arg of a MUL whose products a reduce sums as a contraction, by the op that builds it: CONTRACT a
# matmul or einsum, CONV a convolution's product (and through the MUL's gradient rule its weight
# gradient's), COL2IM the matmul of a convolution's input gradient (ops/nn.py). Fusion marks the kernel
# (Kernel.contraction) and the optimizer may run it as a matmul, or a convolution's as a direct loop nest
# (opt/host.py), instead of recovering those shapes from any fused sum of products
CONTRACT, CONV, COL2IM = "contract", "conv", "col2im"
CONTRACTS = (CONTRACT, CONV, COL2IM)


@dataclass(frozen=True)
class Col2ImSum:
    """The arg of the last ADD of a convolution's input gradient (ops/nn.py `_conv_input_gradient`): the
    sum, over kernel positions, of the COL2IM matmul's shares cols[groups, n, c, tap, *out] spread by the
    stride and shifted to where each window starts (its input, `input` positions per axis). Fusion keeps
    the mark in the kernel where it evaluates the sum at the kernel's own point, so the CPU optimizer reads
    the geometry here instead of recovering it (blas.col2im)."""

    kernel: tuple[int, ...]
    out: tuple[int, ...]
    input: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int


# (the ops the constructors below test for, as module names: an Enum member's lookup on its class is slow)
_CMPLT, _CMPNE, _WHERE, _CAST, _CONST, _REDUCE = Op.CMPLT, Op.CMPNE, Op.WHERE, Op.CAST, Op.CONST, Op.REDUCE
_RESHAPE, _PERMUTE, _EXPAND = Op.RESHAPE, Op.PERMUTE, Op.EXPAND
_PAD, _SHRINK, _FLIP = Op.PAD, Op.SHRINK, Op.FLIP
_BOOL = dtypes.bool
_new = Node.__new__  # (called as _new(Node, ...): Node(...) goes through type.__call__ first)


def alu(op: Op, *srcs: Node, arg: str | Col2ImSum | None = None) -> Node:
    """An elementwise op; sources already share one shape (and one dtype, except WHERE's condition). `arg`:
    one of CONTRACTS for a MUL that a contraction sums, a Col2ImSum for the ADD that ends a col2im sum."""
    first = srcs[0]
    if op is _CMPNE or op is _CMPLT:
        dtype = _BOOL
    elif op is _WHERE:
        dtype = srcs[1].dtype
    else:
        dtype = first.dtype
    return _new(Node, op, srcs, arg, first.shape, dtype, first.device)


def cast(node: Node, dtype: DType) -> Node:
    if node.dtype.name == dtype.name:  # (DType's ==, without its call)
        return node
    return _new(Node, _CAST, (node,), dtype, node.shape, dtype, node.device)


_INT_SPAN = {d.name: (d.min, 1 << 8 * d.itemsize) for d in dtypes.all if d.is_int}
# float dtypes held as float32 values rounded to themselves (by name: a set of str is read in C)
_ROUNDED = frozenset(d.name for d in dtypes.HOST_FLOATS + dtypes.fp8s)


def const(value, dtype: DType, device: str, shape: tuple[int, ...] = ()) -> Node:
    """A constant of any shape: one node (no memory; every kernel reads it as a literal), which movement
    ops other than PAD fold into (a constant of their shape)."""
    kind = dtype.kind
    if kind == "f":
        value = float(value)
        if dtype.name in _ROUNDED:  # the nearest bfloat16 / fp8 (through float32, as PyTorch)
            value = float(round_to(value, dtype))
        elif dtype.name == "float16":  # a float16 constant holds a float16 value on every device
            with np.errstate(over="ignore"):
                value = float(np.float16(value))
    elif kind == "b":
        value = bool(value)
    else:  # an int past the dtype wraps, as PyTorch's `int8_tensor + 300` (its kernels' literal)
        value = int(value)
        low, span = _INT_SPAN[dtype.name]
        if not low <= value < low + span:
            value = (value - low) % span + low
    return _new(Node, _CONST, (), value, tuple(shape), dtype, device)


def const_like(node: Node, value) -> Node:
    return const(value, node.dtype, node.device, node.shape)


def reduce(node: Node, op: str, axes: tuple[int, ...]) -> Node:
    shape = node.shape
    if len(axes) == 1 and 0 <= axes[0] < len(shape):  # (most reductions: one axis)
        a = axes[0]
        axes, shape = (a,), shape[:a] + (1,) + shape[a + 1 :]
    else:
        axes = tuple(sorted(set(axes)))
        if not axes:
            return node
        shape = tuple(1 if i in axes else s for i, s in enumerate(shape))
    return _new(Node, _REDUCE, (node,), (op, axes), shape, node.dtype, node.device)


def move(node: Node, op: Op, arg) -> Node:
    """A movement op; no-ops return the node itself."""
    shape = node.shape
    if op is _RESHAPE:
        arg = tuple(arg)
        if arg == shape:
            return node
        if node.op is _RESHAPE and node.buffer is None:  # reshape of a reshape is one reshape
            node = node.srcs[0]
            if arg == node.shape:
                return node
        new = arg
    elif op is _EXPAND:
        arg = tuple(arg)
        if arg == shape:
            return node
        new = arg
    elif op is _PERMUTE:
        arg = tuple(arg)
        if node.op is _PERMUTE and node.buffer is None:  # a permute of a permute is one permute
            # (w.T.transpose(-1, -2): none; never past a node holding its own values)
            arg, node = tuple(node.arg[i] for i in arg), node.srcs[0]
            shape = node.shape
        if arg == tuple(range(len(shape))):
            return node
        new = tuple(shape[i] for i in arg)
    elif op is _PAD:
        arg = tuple(tuple(p) for p in arg)
        if all(p == (0, 0) for p in arg):
            return node
        new = tuple(s + lo + hi for s, (lo, hi) in zip(shape, arg))
    elif op is _SHRINK:
        arg = tuple(tuple(p) for p in arg)
        if all(p == (0, s) for p, s in zip(arg, shape)):
            return node
        new = tuple(e - b for b, e in arg)
    elif op is _FLIP:
        arg = tuple(sorted(a for a in arg if shape[a] > 1))
        if not arg:
            return node
        new = shape
    else:
        raise ValueError(f"{op} is not a movement op")
    if node.op is _CONST and op is not _PAD:  # (a pad's border is 0, not the constant)
        return _new(Node, _CONST, (), node.arg, new, node.dtype, node.device)
    return _new(Node, op, (node,), arg, new, node.dtype, node.device)


# ---------------------------------------------------------------------------------------------------
# the structure of a graph: one key for the schedule cache and the replays (schedule_cache.py, replay.py)


class Unkeyable(Exception):
    """A node whose meaning a structure key cannot show (raised by structure()'s `special`)."""


LEAF, _SCALARS = "leaf", (float, int, bool)


def structure(roots: list[Node], through: bool = False, special=None):
    """(key, nodes in walk order, node -> position, the nodes holding buffers in numbering order) of the
    graph under roots. Two graphs with equal keys are the same graph up to which buffers they hold.

    Every node is an entry (op, arg, shape, dtype, device, its sources' positions), numbered in one
    post-order walk; buffers are numbered by first appearance, so aliasing is part of the key. `through`
    False (what fuse.schedule sees): a realized node is a leaf (LEAF, buffer number, shape, dtype,
    device). True (what backward() differentiates: gradients flow through realized nodes): the walk goes
    on below them and their entry ends with the buffer number. `special(node, at)`, called for ASSIGN and
    DETACH nodes not realized, returns the arg to key them by (`at(n)` walks n and gives its position) or
    raises Unkeyable. Raises Unkeyable where the graph is deeper than the interpreter allows from here
    and `special` is given; without it a loop of its own walks such graphs."""
    try:
        return _structure_recursive(roots, through, special)
    except RecursionError:
        return _structure_iterative(roots, through, special)


def _structure_recursive(roots, through, special):
    # (recursive: twice as fast as a loop over a stack of its own, each node being seen once)
    position: dict[Node, int] = {}  # (keyed by the node: Node hashes by identity, in C)
    buffers: dict[int, int] = {}
    nodes: list[Node] = []
    holders: list[Node] = []
    entries: list[tuple] = []
    buffer_op, getpos, asked = Op.BUFFER, position.__getitem__, (Op.ASSIGN, Op.DETACH)

    def at(node: Node) -> int:
        if node not in position:
            visit(node)
        return position[node]

    def visit(node: Node) -> None:  # post-order: a node is numbered once its sources are
        buf = node.buffer
        walk = buf is None or through
        if walk:
            srcs = node.srcs
            for s in srcs:
                if s not in position:
                    visit(s)
        if buf is not None:  # (its buffer numbered once its sources' are, as the iterative walk does)
            number = buffers.get(id(buf))
            if number is None:
                number = buffers[id(buf)] = len(buffers)
                holders.append(node)
        if walk:
            # names, not Op and DType objects: a str caches its hash (Enums, dataclasses hash in Python)
            op, arg = node.op, node.arg
            if op is buffer_op:
                arg = None
            elif isinstance(arg, _SCALARS):  # (_arg_key, inline)
                arg = (type(arg), repr(arg))
            elif special is not None and buf is None and op in asked:
                arg = special(node, at)
            entry = (op._value_, arg, node.shape, node.dtype.name, node.device, tuple(map(getpos, srcs)))
            entries.append(entry if buf is None else entry + (number,))
        else:
            entries.append((LEAF, number, node.shape, node.dtype.name, node.device))
        position[node] = len(nodes)
        nodes.append(node)

    try:
        for root in roots:
            if root not in position:
                visit(root)
    finally:
        visit = at = None  # noqa: F841  (the closures hold each other: a cycle that would keep the graph, and
        # its buffers, alive until the next garbage collection)
    return (tuple(entries), tuple(map(getpos, roots))), nodes, position, holders


def _structure_iterative(roots, through, special):
    """structure() over a stack of its own, for graphs of any depth (the same entries and order)."""
    if special is not None:
        raise Unkeyable("a graph too deep to key with its special nodes")
    position: dict[Node, int] = {}
    buffers: dict[int, int] = {}
    nodes: list[Node] = []
    holders: list[Node] = []
    entries: list[tuple] = []
    for root in roots:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in position:
                stack.pop()
                continue
            buf = node.buffer
            if buf is None or through:
                pending = [s for s in node.srcs if s not in position]
                if pending:
                    stack.extend(reversed(pending))
                    continue
            stack.pop()
            number = None
            if buf is not None:
                number = buffers.get(id(buf))
                if number is None:
                    number = buffers[id(buf)] = len(buffers)
                    holders.append(node)
            if buf is not None and not through:
                entries.append((LEAF, number, node.shape, node.dtype.name, node.device))
            else:
                arg = None if node.op is Op.BUFFER else node.arg
                if isinstance(arg, _SCALARS):
                    arg = (type(arg), repr(arg))
                entry = (node.op._value_, arg, node.shape, node.dtype.name, node.device,
                         tuple(map(position.__getitem__, node.srcs)))
                entries.append(entry if number is None else entry + (number,))
            position[node] = len(nodes)
            nodes.append(node)
    return (tuple(entries), tuple(position[n] for n in roots)), nodes, position, holders
