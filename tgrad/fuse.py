"""Scheduling: cut the lazy graph into fused Kernels.

A Kernel is plain data (the contract with the emitters): an iteration shape whose first `n_global`
axes are parallel and whose remaining axes are reduced, an optional reduce expression, an output
expression and an output index, all expression trees (`Expr`) over loop indices, constants and
loads from input buffers. Equal kernels hash equal, so compiled programs cache by kernel.

Fusion rules (each kernel has one output):
- a node becomes a kernel output ("is realized") when a tensor asks for it, when it is a REDUCE whose
  result goes through a movement op (expand-after-reduce, reshape, ...), when a kernel would hold two
  reduces, or when two kernels would both contain the same REDUCE (reduces are computed once);
- everything else is fused: elementwise work and movement ops into the kernel that needs them,
  a reduce together with its elementwise inputs and the elementwise epilogue after it;
- elementwise nodes used by two kernels are recomputed in each (no extra memory traffic), unless that
  is costly over a big shape (index arithmetic of their own, or a matmul's computed operand): then they
  are computed once (fuse_roots.py, which decides what is realized);
- movement ops become index arithmetic on loads (a ShapeTracker per load); a PAD over computed values
  becomes a `WHERE(valid, value, 0)`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from tgrad.dtype import DType, dtypes
from tgrad.fuse_roots import FuseTuning, kernel_body, kernel_roots
from tgrad.graph import ALU, CONTRACTS, MOVEMENT, Col2ImSum, Node, Op, ShapeTracker, strides_for
from tgrad.schedule_order import order_assigns

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))

INF = float("inf")


class Expr:
    """A node of the kernel IR. ops: IDX (arg=(axis, size)), CONST (arg=value), LOAD (arg=input number,
    srcs=(index, valid)), ACC (the reduce result), and the ALU ops of graph.Op by name.

    Exprs are interned: building one equal to a live Expr returns that object, so equal kernels share
    their trees and comparing them (the compiled-program caches do it on every realize) is by identity."""

    __slots__ = ("op", "srcs", "arg", "dtype", "_hash", "__weakref__")
    _live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def __new__(cls, op: str, srcs: tuple[Expr, ...], arg: Any, dtype: DType):
        key = (op, srcs, (type(arg), repr(arg)) if op == "CONST" else arg, dtype)
        self = cls._live.get(key)
        if self is None:
            self = object.__new__(cls)
            self.op, self.srcs, self.arg, self.dtype = op, srcs, arg, dtype
            self._hash = hash(key)
            cls._live[key] = self
        return self

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, Expr) or self._hash != other._hash:
            return False
        same_arg = (repr(self.arg) == repr(other.arg)) if self.op == "CONST" else self.arg == other.arg
        return self.op == other.op and same_arg and self.dtype == other.dtype and self.srcs == other.srcs

    def __repr__(self) -> str:
        if self.op == "IDX":
            return f"i{self.arg[0]}"
        if self.op == "CONST":
            return repr(self.arg)
        if self.op == "LOAD":
            mask = "" if is_true(self.srcs[1]) else f" if {self.srcs[1]!r}"
            return f"in{self.arg}[{self.srcs[0]!r}]{mask}"
        if self.op == "ACC":
            return "acc"
        return f"{self.op}({', '.join(map(repr, self.srcs))})"

    # bounds of integer index expressions
    @property
    def vmin(self) -> float:
        return _bounds(self)[0]

    @property
    def vmax(self) -> float:
        return _bounds(self)[1]


IDX_DT = dtypes.int64
# ops whose result need not be a value of a narrow float (float16, bfloat16) even when the operands are:
# an emitter that computes those dtypes in float32 rounds after each of them, so a fused chain gives what
# op-by-op evaluation (PyTorch's, numpy's) gives; the others (negation, max, where...) are exact
NARROW_ROUNDED = frozenset({"ADD", "SUB", "MUL", "EXP2", "LOG2", "SIN", "SQRT", "RECIP", "IDIV", "MOD"})


def const(value, dtype: DType) -> Expr:
    return Expr("CONST", (), value, dtype)


def is_const(e: Expr, value=None) -> bool:
    return e.op == "CONST" and (value is None or e.arg == value)


def is_true(e: Expr) -> bool:
    return e.op == "CONST" and e.arg is True


class _Narrowed(threading.local):
    """Index ranges known to hold while `view_index` works out a load's offset under a view's mask (axis ->
    (lo, hi) inclusive): the load happens only where the mask holds, so its offset may assume it. Per
    thread, since two threads may schedule at once."""

    axes: dict[int, tuple[int, int]] = {}


_narrowed = _Narrowed()


def _bounds(e: Expr) -> tuple[float, float]:
    if e.op == "IDX":
        return _narrowed.axes.get(e.arg[0]) or (0, e.arg[1] - 1)
    if e.op == "CONST" and e.dtype.is_int:
        return e.arg, e.arg
    if e.op == "ADD":
        (a0, a1), (b0, b1) = _bounds(e.srcs[0]), _bounds(e.srcs[1])
        return a0 + b0, a1 + b1
    if e.op == "MUL" and is_const(e.srcs[1]):
        (a0, a1), c = _bounds(e.srcs[0]), e.srcs[1].arg
        return (a0 * c, a1 * c) if c >= 0 else (a1 * c, a0 * c)
    if e.op == "IDIV" and is_const(e.srcs[1]) and _bounds(e.srcs[0])[0] >= 0:
        (a0, a1), c = _bounds(e.srcs[0]), e.srcs[1].arg
        return a0 // c, a1 // c if a1 != INF else INF
    if e.op == "MOD" and is_const(e.srcs[1]) and _bounds(e.srcs[0])[0] >= 0:
        return 0, e.srcs[1].arg - 1
    return -INF, INF


# ---------------------------------------------------------------------------------------------------
# index arithmetic with the simplifications that make views cheap


def linear_terms(e: Expr) -> list[tuple[int, Expr | None]]:
    """e as a sum of coef*atom terms (atom None for the constant term)."""
    if e.op == "ADD":
        return linear_terms(e.srcs[0]) + linear_terms(e.srcs[1])
    if e.op == "CONST":
        return [(e.arg, None)]
    if e.op == "MUL" and is_const(e.srcs[1]):
        return [(c * e.srcs[1].arg, a) for c, a in linear_terms(e.srcs[0])]
    return [(1, e)]


def from_terms(terms: list[tuple[int, Expr | None]]) -> Expr:
    merged: dict[Expr | None, int] = {}
    for c, a in terms:
        merged[a] = merged.get(a, 0) + c
    out = None
    for a, c in merged.items():
        if c == 0 or a is None:
            continue
        term = a if c == 1 else Expr("MUL", (a, const(c, IDX_DT)), None, IDX_DT)
        out = term if out is None else Expr("ADD", (out, term), None, IDX_DT)
    k = merged.get(None, 0)
    if out is None:
        return const(k, IDX_DT)
    return out if k == 0 else Expr("ADD", (out, const(k, IDX_DT)), None, IDX_DT)


def iadd(a: Expr, b: Expr) -> Expr:
    return from_terms(linear_terms(a) + linear_terms(b))


def imul(a: Expr, c: int) -> Expr:
    return from_terms([(k * c, t) for k, t in linear_terms(a)])


def _split_terms(a: Expr, c: int) -> tuple[Expr, Expr] | None:
    """(q, r) with a == q * c + r, r's coefficients in [0, c), when a and its atoms are >= 0 (then
    a // c == q + r // c and a % c == r % c): i + 29 * j mod 28 is i + j mod 28, which bounds can drop."""
    terms = linear_terms(a)
    if a.vmin < 0 or any(t is not None and _bounds(t)[0] < 0 for _, t in terms):
        return None
    return from_terms([(k // c, t) for k, t in terms]), from_terms([(k % c, t) for k, t in terms])


def _common_factor(r: Expr, c: int) -> tuple[int, Expr, Expr] | None:
    """(g, A, B) with r == g * A + B, 0 <= B < g, g a divisor of c above 1 (r's terms all >= 0):
    then r // c == A // (c / g) and r % c == g * (A % (c / g)) + B. (20 * y + x) // 40 with x < 20 is
    y // 2: how a pooled gradient's index into the pooled output reads."""
    terms = linear_terms(r)
    for g in sorted({k for k, t in terms if t is not None and k > 1 and c % k == 0}, reverse=True):
        big = [(k // g, t) for k, t in terms if t is not None and k % g == 0]
        small = [(k, t) for k, t in terms if t is not None and k % g != 0]
        k0 = sum(k for k, t in terms if t is None)
        rest = from_terms([*small, (k0 % g, None)])
        if rest.vmin >= 0 and rest.vmax < g:
            return g, from_terms([*big, (k0 // g, None)]), rest
    return None


def _multiples_and_rest(a: Expr, c: int) -> tuple[Expr, Expr] | None:
    """(W, R) with a == c * W + R and 0 <= R < c by bounds, when a >= 0: then a // c == W, a % c == R.
    Tried first: a shifted index (i - 64 where i >= 64 under a pad's mask) keeps its shift in R whole."""
    terms = linear_terms(a)
    whole = [(k // c, t) for k, t in terms if k % c == 0]
    rest = from_terms([(k, t) for k, t in terms if k % c != 0])
    if a.vmin >= 0 and rest.vmin >= 0 and rest.vmax < c:  # (a < 0 would truncate toward zero)
        return from_terms(whole), rest
    return None


def idiv(a: Expr, c: int) -> Expr:
    if c == 1:
        return a
    if a.vmin >= 0 and a.vmin // c == a.vmax // c:  # one quotient over a's range
        return const(a.vmin // c, IDX_DT)
    hit = _multiples_and_rest(a, c)
    if hit is not None:
        return hit[0]
    split = _split_terms(a, c)
    if split is not None:  # a // c == q + r // c
        q, r = split
        if r.vmin // c == r.vmax // c:  # r // c is one number (0 unless narrowed: i in [64, 128) // 64)
            return iadd(q, const(r.vmin // c, IDX_DT))
        f = _common_factor(r, c)
        return iadd(q, idiv(f[1], c // f[0]) if f else Expr("IDIV", (r, const(c, IDX_DT)), None, IDX_DT))
    return Expr("IDIV", (a, const(c, IDX_DT)), None, IDX_DT)


def imod(a: Expr, c: int) -> Expr:
    if c == 1:
        return const(0, IDX_DT)
    if a.vmin < 0:
        return Expr("MOD", (a, const(c, IDX_DT)), None, IDX_DT)
    if a.vmin // c == a.vmax // c:  # one quotient over a's range
        return iadd(a, const(-(a.vmin // c) * c, IDX_DT))
    hit = _multiples_and_rest(a, c)
    if hit is not None:
        return hit[1]
    split = _split_terms(a, c)
    if split is not None:  # a % c == r % c
        r = split[1]
        if r.vmin // c == r.vmax // c:
            return iadd(r, const(-(r.vmin // c) * c, IDX_DT))
        f = _common_factor(r, c)
        if f is None:
            return Expr("MOD", (r, const(c, IDX_DT)), None, IDX_DT)
        return iadd(imul(imod(f[1], c // f[0]), f[0]), f[2])
    rest = from_terms([(k, t) for k, t in linear_terms(a) if k % c != 0])
    if rest.vmin < 0:
        # dropping multiples of c left a value that can be negative (4 - i becomes -i): C, WGSL and
        # Triton truncate, so bring it back to >= 0 with a multiple of c (floor mod is unchanged)
        if rest.vmin == -INF:
            return Expr("MOD", (a, const(c, IDX_DT)), None, IDX_DT)
        rest = iadd(rest, const(-(rest.vmin // c) * c, IDX_DT))
    if rest.vmin >= 0 and rest.vmax < c:
        return rest
    return Expr("MOD", (rest, const(c, IDX_DT)), None, IDX_DT)


def iless(a: Expr, c: int) -> Expr:
    """a < c as a bool Expr, folded when the bounds decide it."""
    if a.vmax < c:
        return const(True, dtypes.bool)
    if a.vmin >= c:
        return const(False, dtypes.bool)
    return Expr("CMPLT", (a, const(c, IDX_DT)), None, dtypes.bool)


def igreater_eq(a: Expr, c: int) -> Expr:
    """a >= c, written c - 1 < a."""
    if a.vmin >= c:
        return const(True, dtypes.bool)
    if a.vmax < c:
        return const(False, dtypes.bool)
    return Expr("CMPLT", (const(c - 1, IDX_DT), a), None, dtypes.bool)


def land(a: Expr, b: Expr) -> Expr:
    if is_true(a) or is_const(b, False):
        return b
    if is_true(b) or is_const(a, False):
        return a
    return Expr("AND", (a, b), None, dtypes.bool)


def view_index(st: ShapeTracker, idx: list[Expr]) -> tuple[Expr, Expr]:
    """(offset into the buffer, validity) of the element at `idx` of a tracked view."""
    if any(s == 0 for v in st.views for s in v.shape):  # an empty view: nothing is ever loaded
        return const(0, IDX_DT), const(False, dtypes.bool)
    valid = const(True, dtypes.bool)
    offset = None
    outer = _narrowed.axes
    _narrowed.axes = narrowed = dict(outer)
    try:
        for view in reversed(st.views):
            if offset is not None:  # unflatten the outer view's offset into this view's axes
                flat, idx = offset, []
                for s, acc in zip(view.shape, strides_for(view.shape)):
                    idx.append(imod(idx_div(flat, acc), s) if s != 1 else const(0, IDX_DT))
            offset = const(view.offset, IDX_DT)
            for i, st_ in zip(idx, view.strides):
                if st_ != 0:
                    offset = iadd(offset, imul(i, st_))
            if view.mask is not None:
                for i, (lo, hi), s in zip(idx, view.mask, view.shape):
                    if (lo, hi) != (0, s):
                        valid = land(valid, land(iless(i, hi), igreater_eq(i, lo)))
                        if i.op == "IDX":  # the inner views' offsets are only used where lo <= i < hi
                            was_lo, was_hi = _bounds(i)
                            narrowed[i.arg[0]] = (max(was_lo, lo), min(was_hi, hi - 1))
    finally:
        _narrowed.axes = outer
    return offset, valid


def idx_div(a: Expr, c: int) -> Expr:
    return idiv(a, c) if c > 1 else a


# ---------------------------------------------------------------------------------------------------
# the Kernel contract


@dataclass(frozen=True)
class Kernel:
    name: str
    shape: tuple[int, ...]  # iteration space: global (parallel) axes first, then reduce axes
    n_global: int
    reduce_op: str | None  # SUM, PROD, MAX or None
    reduce_expr: Expr | None  # value reduced over the reduce axes (uses every IDX)
    expr: Expr  # value stored (uses global IDX and ACC)
    out_index: Expr  # where it is stored (global IDX only)
    out_dtype: DType
    in_dtypes: tuple[DType, ...]
    # how to compute it (tgrad/opt/): chosen by the optimizer for a device, rendered by its emitter; () is
    # the plain kernel (one output per work-item, no tiles)
    opts: tuple = ()
    # the reduce sums the products of an op that said it is a contraction, and which (graph.CONTRACTS: a
    # matmul or einsum, a convolution or its weight gradient, a convolution's input-gradient matmul), which
    # the optimizer may run as such (opt/host.py); None: any other kernel
    contraction: str | None = None

    def with_opts(self, opts: tuple) -> Kernel:
        return dataclasses.replace(self, opts=tuple(opts))

    def __hash__(self) -> int:  # a dict key at every launch (runners, row counts): hashed once
        if "_hash" not in self.__dict__:
            fields = tuple(getattr(self, f) for f in self.__dataclass_fields__)
            object.__setattr__(self, "_hash", hash(fields))
        return self.__dict__["_hash"]

    @property
    def global_shape(self) -> tuple[int, ...]:
        return self.shape[: self.n_global]

    @property
    def reduce_shape(self) -> tuple[int, ...]:
        return self.shape[self.n_global :]

    @property
    def acc_dtype(self) -> DType:
        return self.reduce_expr.dtype if self.reduce_expr is not None else self.out_dtype


class StatementPlacer:
    """For emitters: where each Expr's statement goes in a kernel's loop nest. levels[L] holds the
    statements that live inside the first L loops (one past the innermost loop whose index they use);
    post holds those that use the reduce result (and those at post_from or deeper), after the reduce."""

    def __init__(self, axis_level: list[int], nlevels: int):
        self.axis_level = axis_level              # level of each kernel axis' index
        self.levels: list[list[str]] = [[] for _ in range(nlevels)]
        self.post: list[str] = []
        self.post_from = nlevels
        self._level: dict[Expr, int] = {}
        self._acc: dict[Expr, bool] = {}

    def level(self, e: Expr) -> int:
        hit = self._level.get(e)
        if hit is None:
            if e.op == "IDX":
                hit = self.axis_level[e.arg[0]]
            else:
                hit = max((self.level(s) for s in e.srcs), default=0)
            self._level[e] = hit
        return hit

    def uses_acc(self, e: Expr) -> bool:
        hit = self._acc.get(e)
        if hit is None:
            hit = self._acc[e] = e.op == "ACC" or any(self.uses_acc(s) for s in e.srcs)
        return hit

    def place(self, e: Expr, stmt: str) -> None:
        post = self.uses_acc(e) or self.level(e) >= self.post_from
        (self.post if post else self.levels[self.level(e)]).append(stmt)


@dataclass
class ScheduleItem:
    kernel: Kernel
    out: Node  # gets the output buffer
    inputs: list[Node]  # realized (or realized earlier in the schedule) buffers, in order
    target: Node | None = None  # for ASSIGN: the buffer node written into


def reduce_identity(op: str, dtype: DType):
    if op == "SUM":
        return False if dtype == dtypes.bool else (0.0 if dtype.is_float else 0)
    if op == "PROD":
        return True if dtype == dtypes.bool else (1.0 if dtype.is_float else 1)
    if dtype.is_float:
        return -INF
    if dtype == dtypes.bool:
        return False
    info = dtype.np
    import numpy as np

    return int(np.iinfo(info).min)


# ---------------------------------------------------------------------------------------------------
# lowering one kernel


class _Lowerer:
    def __init__(self, root: Node, realize: set[Node]):
        self.root, self.realize = root, realize
        self.inputs: list[Node] = []
        self.memo: dict[tuple, Expr] = {}
        self.point: tuple[Expr, ...] | None = None  # an elementwise kernel's root index (lower_kernel)

    def buffer_number(self, node: Node) -> int:
        if node not in self.inputs:
            self.inputs.append(node)
        return self.inputs.index(node)

    def is_leaf(self, node: Node) -> bool:
        return node is not self.root and (node.realized or node in self.realize)

    def lower(self, node: Node, path: tuple[Node, ...], idx: tuple[Expr, ...]) -> Expr:
        key = (node, path, idx)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._lower(node, path, idx)
        return hit

    def _tracker(self, shape: tuple[int, ...], path: tuple[Node, ...]) -> ShapeTracker:
        st = ShapeTracker.contiguous(shape)
        for m in reversed(path):
            st = st.apply(m.op, m.arg)
        return st

    def _lower(self, node: Node, path: tuple[Node, ...], idx: tuple[Expr, ...]) -> Expr:
        if self.is_leaf(node):
            offset, valid = view_index(self._tracker(node.shape, path), list(idx))
            load = Expr("LOAD", (offset, valid), self.buffer_number(node), node.dtype)
            return load
        if node.op is Op.CONST:
            return const(node.arg, node.dtype)
        if node.op in MOVEMENT:
            inner = self.lower(node.srcs[0], (*path, node), idx)
            if node.op is Op.PAD and not self.is_leaf(node.srcs[0].base):
                _, valid = view_index(self._tracker(node.srcs[0].shape, (*path, node)), list(idx))
                if not is_true(valid):
                    zero = const(_zero(node.dtype), node.dtype)
                    inner = Expr("WHERE", (valid, inner, zero), None, node.dtype)
            return inner
        if node.op in ALU:
            srcs = tuple(self.lower(s, path, idx) for s in node.srcs)
            arg = node.dtype if node.op is Op.CAST else None
            if isinstance(node.arg, Col2ImSum) and not path and idx == self.point:
                arg = node.arg  # (a col2im sum at the kernel's own point: its geometry holds there)
            return Expr(node.op.name, srcs, arg, node.dtype)
        if node.op is Op.REDUCE:
            assert all(m.op is Op.RESHAPE for m in path), "a fused reduce is only reached through reshapes"
            return Expr("ACC", (), None, node.dtype)
        if node.op is Op.ASSIGN:
            return self.lower(node.srcs[1], path, idx)
        if node.op is Op.DETACH:
            return self.lower(node.srcs[0], path, idx)
        raise NotImplementedError(f"cannot lower {node.op}")


def _zero(dtype: DType):
    return False if dtype == dtypes.bool else (0.0 if dtype.is_float else 0)


def _find_reduce(root: Node, realize: set[Node]) -> Node | None:
    return next((n for n in kernel_body(root, realize) if n.op is Op.REDUCE), None)


def _contracts(red: Node | None, realize: set[Node]) -> str | None:
    """The kind of contraction (graph.CONTRACTS) whose products a SUM reduces (a MUL so marked, reached
    through movement ops inside the kernel), else None."""
    if red is None or red.arg[0] != "SUM":
        return None
    src = red.srcs[0]
    while src.op in MOVEMENT and src not in realize and not src.realized:
        src = src.srcs[0]
    marked = src.op is Op.MUL and src.arg in CONTRACTS and src not in realize and not src.realized
    return src.arg if marked else None


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def lower_kernel(root: Node, realize: set[Node]) -> ScheduleItem:
    red = _find_reduce(root, realize)
    out_shape = root.shape
    full = red.srcs[0].shape if red is not None else out_shape
    axes = red.arg[1] if red is not None else ()
    # iteration order: global axes, then reduce axes; size-1 axes are dropped (their index is 0)
    order = [a for a in range(len(full)) if a not in axes and full[a] != 1]
    order += [a for a in axes if full[a] != 1]
    kshape = tuple(full[a] for a in order)
    n_global = sum(1 for a in order if a not in axes)
    full_idx = [const(0, IDX_DT)] * len(full)
    for pos, a in enumerate(order):
        full_idx[a] = Expr("IDX", (), (pos, full[a]), IDX_DT)
    out_idx = tuple(const(0, IDX_DT) if a in axes else full_idx[a] for a in range(len(full)))
    lw = _Lowerer(root, realize)
    lw.point = None if red is not None else tuple(out_idx)
    reduce_expr = lw.lower(red.srcs[0], (), tuple(full_idx)) if red is not None else None
    # the output is stored row-major; the root may be a reshape of the reduce's (keepdim) shape
    out_index = const(0, IDX_DT)
    for i, st in zip(out_idx, strides_for(red.shape if red is not None else out_shape)):
        if st:
            out_index = iadd(out_index, imul(i, st))
    if red is not None and root.shape != red.shape:
        root_idx = tuple(imod(idx_div(out_index, st), s) if s > 1 else const(0, IDX_DT)
                         for s, st in zip(root.shape, _row_major(root.shape)))
    else:
        root_idx = out_idx
    expr = lw.lower(root, (), root_idx)
    kind = "r" if red is not None else "E"
    name = kind + "_" + "_".join(str(s) for s in kshape) if kshape else kind
    reduce_op = red.arg[0] if red is not None else None
    kernel = Kernel(name=name, shape=kshape, n_global=n_global, reduce_op=reduce_op,
                    reduce_expr=reduce_expr, expr=expr, out_index=out_index, out_dtype=root.dtype,
                    in_dtypes=tuple(n.dtype for n in lw.inputs), contraction=_contracts(red, realize))
    target = root.srcs[0] if root.op is Op.ASSIGN else None
    return ScheduleItem(kernel, root, lw.inputs, target)


def schedule(outputs: list[Node], tuning: FuseTuning | None = None) -> list[ScheduleItem]:
    """The kernels that make every output node realized, in an order that respects dependencies (fusion's
    choices by `tuning`, the device's DeviceProps.fuse; default: FuseTuning's)."""
    roots = kernel_roots(outputs) if tuning is None else kernel_roots(outputs, tuning)
    realize = set(roots)
    items = [lower_kernel(r, realize) for r in roots]
    return order_assigns(items)


# ---------------------------------------------------------------------------------------------------
# facts about scheduled items that the driver and the runtimes' plans ask


def has_work(kernel: Kernel) -> bool:
    """Whether a kernel has work (an empty output needs no launch, a 0-d one does)."""
    return math.prod(kernel.global_shape) > 0 or not kernel.shape


def same_index(a: Expr, b: Expr) -> bool:
    """Whether two index expressions are the same sum of terms (in any order)."""
    diff = iadd(a, imul(b, -1))
    return is_const(diff) and diff.arg == 0


_ELSEWHERE: dict[tuple[Kernel, int], bool] = {}  # (kernel, input) -> reads_target_elsewhere's answer


def reads_target_elsewhere(it: ScheduleItem) -> bool:
    """Whether an assign's kernel reads its target anywhere but at the element it writes (x.assign(x.flip(0)),
    x.assign(x + x[0]), a reduce over x): written in place, later elements would read new values, so the
    target is read from a copy (realize.run_schedule). Remembered per kernel."""
    if it.target is None:
        return False
    k, buf = it.kernel, it.target.buffer
    for p in (i for i, n in enumerate(it.inputs) if n.buffer is buf):  # the target, or a node aliasing it
        hit = _ELSEWHERE.get((k, p))
        if hit is None:
            seen, stack, hit = set(), [k.expr] + ([k.reduce_expr] if k.reduce_expr is not None else []), False
            while stack and not hit:
                e = stack.pop()
                if e not in seen:
                    seen.add(e)
                    stack.extend(e.srcs)
                    if e.op == "LOAD" and e.arg == p:  # not exactly the element written: another one
                        hit = not (is_true(e.srcs[1]) and same_index(e.srcs[0], k.out_index))
            _ELSEWHERE[(k, p)] = hit
        if hit:
            return True
    return False
