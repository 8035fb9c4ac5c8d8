"""Symbolic shapes: `Variable("pos", 1, 1024).bind(n)` as the extent of one axis (tinygrad's spelling), or an
affine expression of bound variables (`Expr`: `pos + 1`, `10 - v`, `2 * v`, `v1 + v2`).

A tensor with an extent e (a BoundVariable or an Expr, both `Sym`) on an axis is stored at e's max along
that axis; only the first e.val positions are its elements. Nothing about the value is in a kernel's
code: a variable's value is a 0-d int32 buffer (`BoundVariable.node`; an Expr's node is arithmetic on
them) that kernels read, so one compiled kernel (and one TinyJit capture, where the variable is an
argument of the call) serves every value in range. `graph.SYM` maps a node to its per-axis extents:
filled by `extent` (the entry point: a DETACH that fusion looks through) and carried to every node built
over a symbolic source by `derive`, which graph.Node calls:
- elementwise ops keep their sources' extents; movement ops move them with their axes (a reshape must
  keep the axis whole; a flip, or a raw pad or shrink of the axis other than to e.val raises: the
  Tensor ops' symbolic forms in symbolic_ops.py handle pads, windows and cats through `release`);
- a reduce over a symbolic axis first replaces the positions past e with the reduce's identity
  (0 for SUM, 1 for PROD, the lowest value for MAX): so sum, mean, softmax and a matmul over the axis
  read only the first e positions (the positions past e hold anything);
- an assign into a symbolic tensor raises (symbolic_ops.assign_window writes a window of a cache).
Tensor.shape shows the extent on its axis (as tinygrad shows the variable). Arithmetic on extents is
affine (+, -, * by an int); int(), bool() and comparisons the ranges do not decide give the value
outside TinyJit and raise a JitError inside. numpy(), int indexes and reshapes to ints cut each axis
to its value (outside TinyJit only). Compute runs over the max extent (masked), not only over the
first e positions.
"""

from __future__ import annotations

import numpy as np

from tgrad import autodiff
from tgrad import graph as g
from tgrad import realize as driver
from tgrad.dtype import DType, dtypes
from tgrad.errors import ArgumentError, JitError, ShapeError
from tgrad.graph import Node, Op


class Variable:
    """A named integer in [min_val, max_val] that a tensor's axis may have as its extent."""

    def __init__(self, name: str, min_val: int, max_val: int):
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"Variable: the name must be a non-empty string, got {name!r}")
        for what, v in (("min_val", min_val), ("max_val", max_val)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ArgumentError(f"Variable {name!r}: {what} must be an int, got {v!r}")
        if not 0 <= min_val <= max_val or max_val < 1:
            raise ArgumentError(f"Variable {name!r}: need 0 <= min_val <= max_val and max_val >= 1, got "
                                f"[{min_val}, {max_val}]")
        self.name, self.min, self.max = name, int(min_val), int(max_val)

    @property
    def key(self) -> tuple:
        return ("Variable", self.name, self.min, self.max)

    def bind(self, val: int) -> BoundVariable:
        if not isinstance(val, (int, np.integer)) or isinstance(val, bool):
            raise ArgumentError(f"Variable {self.name!r}.bind: the value must be an int, got {val!r}")
        if not self.min <= val <= self.max:
            raise ArgumentError(f"Variable {self.name!r}.bind({val}): {val} is outside its range "
                                f"[{self.min}, {self.max}]")
        return BoundVariable(self, int(val))

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, {self.min}, {self.max})"


class Sym:
    """An extent that is not a number: a bound variable or an affine expression of bound variables
    (`v + 2`, `10 - v`, `2 * v`, `v1 + v2`). Its value is known at trace time outside TinyJit (int(),
    bool(), comparisons whose answer the ranges do not decide give it) and read at launch by kernels."""

    terms: tuple  # ((BoundVariable, coefficient), ...) sorted by the variable's key
    const: int

    @property
    def min(self) -> int:
        return self.const + sum(c * (v.var.min if c > 0 else v.var.max) for v, c in self.terms)

    @property
    def max(self) -> int:
        return self.const + sum(c * (v.var.max if c > 0 else v.var.min) for v, c in self.terms)

    @property
    def _val(self) -> int:
        return self.const + sum(c * v._val for v, c in self.terms)

    @property
    def val(self) -> int:
        if driver.RECORDER is not None:
            raise JitError(f"the value of {self} (variables {self._names()}) was read inside a TinyJit "
                           "function: a replay would keep it; use the expression itself (a shape, Tensor(e))")
        return self._val

    @property
    def vars(self) -> tuple:
        return tuple(v for v, _ in self.terms)

    @property
    def ident(self) -> tuple:
        """The structure and the values: two extents are the same when these are."""
        return (self.key, tuple(v._val for v in self.vars))

    def _names(self) -> str:
        return ", ".join(repr(v.var.name) for v in self.vars)

    def rebind(self, current: dict) -> Sym:
        """This expression over the variables of current (var key -> BoundVariable) where it names them."""
        return _make({v.var.key: (current.get(v.var.key, v), c) for v, c in self.terms}, self.const)

    # arithmetic: affine only; the result is an int where the variables cancel (`(v + 2) - v` is 2)
    def __add__(self, other):
        return _combine(self, other, 1, "+")

    def __radd__(self, other):
        return _combine(other, self, 1, "+")

    def __sub__(self, other):
        return _combine(self, other, -1, "-")

    def __rsub__(self, other):
        return _combine(other, self, -1, "-")

    def __neg__(self):
        return _combine(0, self, -1, "-")

    def __pos__(self):
        return self

    def __mul__(self, other):
        if isinstance(other, Sym):
            raise ShapeError(f"{self} * {other}: a product of variables (variables {self._names()}, "
                             f"{other._names()}) is not supported as an extent")
        if not _is_int(other):
            return _not_int(self, other, "*")
        return _make({v.var.key: (v, c * int(other)) for v, c in self.terms}, self.const * int(other))

    __rmul__ = __mul__

    def _refuse(self, other=None):
        if other is not None and isinstance(getattr(other, "node", None), Node):
            return NotImplemented  # (v / tensor: the Tensor's reflected op reads the value at launch)
        raise ShapeError(f"{self}: division and remainder of an extent of variables {self._names()} are not "
                         "supported (only +, - and * by an int)")

    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _refuse

    # comparisons: decided by the ranges where they can be, else by the values (outside TinyJit only)
    def _cmp(self, other, op: str) -> bool:
        if not (_is_int(other) or isinstance(other, Sym)):
            return NotImplemented
        d = self - other
        if isinstance(d, int):
            return _CMP[op](d, 0)
        lo, hi = d.min, d.max
        if op == "!=":
            if lo > 0 or hi < 0:
                return True
        elif _CMP[op](lo, 0) == _CMP[op](hi, 0):  # (d op 0 is true on a ray: the ends agree, so do all)
            return _CMP[op](lo, 0)
        if driver.RECORDER is not None:
            raise JitError(f"{self} {op} {other} depends on the values of variables {d._names()}, read "
                           "inside a TinyJit function (a replay would keep the answer)")
        return _CMP[op](d._val, 0)

    def __lt__(self, other):
        return self._cmp(other, "<")

    def __le__(self, other):
        return self._cmp(other, "<=")

    def __gt__(self, other):
        return self._cmp(other, ">")

    def __ge__(self, other):
        return self._cmp(other, ">=")

    def __int__(self) -> int:
        return self.val

    __index__ = __int__

    def __float__(self) -> float:
        return float(self.val)

    def __bool__(self) -> bool:  # (an extent whose range excludes 0 is true without its value)
        return self.min > 0 or self.max < 0 or self.val != 0

    def __eq__(self, other) -> bool:  # (the same expression of the same variables bound to the same values)
        return isinstance(other, Sym) and other.ident == self.ident

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.ident)


_CMP = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__, "!=": int.__ne__}


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _not_int(a, b, op: str):
    if not isinstance(b, (float, complex, np.floating, bool, np.bool_)):
        return NotImplemented  # (v * tensor: the Tensor's reflected op; [0] * v: the list's repeat)
    raise ShapeError(f"{a} {op} {b!r}: an extent of variables {a._names()} combines only with ints and "
                     "other extents (use Tensor(v) for arithmetic on values)")


def _terms(x) -> tuple[dict, int]:
    if isinstance(x, Sym):
        return {v.var.key: (v, c) for v, c in x.terms}, x.const
    return {}, int(x)


def _combine(a, b, sign: int, op: str):
    """a + sign * b for ints and Syms (a variable bound to two values in one expression raises)."""
    for x, y in ((a, b), (b, a)):
        if not (_is_int(x) or isinstance(x, Sym)):
            return _not_int(y, x, op) if isinstance(y, Sym) else NotImplemented
    ta, ca = _terms(a)
    tb, cb = _terms(b)
    out = dict(ta)
    for k, (v, c) in tb.items():
        if k in out:
            u, cu = out[k]
            if u._val != v._val:
                raise ShapeError(f"{a} {op} {b}: variable {v.var.name!r} is bound to two values "
                                 f"({u._val} and {v._val})")
            out[k] = (u, cu + sign * c)
        else:
            out[k] = (v, sign * c)
    return _make(out, ca + sign * cb)


def _make(terms: dict, const: int):
    items = tuple(sorted(((v, c) for v, c in terms.values() if c), key=lambda vc: vc[0].var.key))
    if not items:
        return int(const)
    if len(items) == 1 and items[0][1] == 1 and const == 0:
        return items[0][0]
    return Expr(items, int(const))


class Expr(Sym):
    """const + sum(coefficient * variable): an affine expression of bound variables."""

    def __init__(self, terms: tuple, const: int):
        self.terms, self.const = terms, const

    @property
    def key(self) -> tuple:
        return ("Expr", tuple((v.var.key, c) for v, c in self.terms), self.const)

    def node(self, device: str) -> Node:
        """The value as a 0-d int32 node over the variables' buffers (read at launch)."""
        out = g.const(self.const, dtypes.int32, device, ())
        for v, c in self.terms:
            term = v.node(device)
            if c != 1:
                term = g.alu(Op.MUL, term, g.const(c, dtypes.int32, device, ()))
            out = g.alu(Op.ADD, out, term)
        return out

    def __repr__(self) -> str:
        parts = [("" if c == 1 else "-" if c == -1 else f"{c}*") + v.var.name for v, c in self.terms]
        text = " + ".join(parts).replace("+ -", "- ")
        if self.const:
            text += f" {'+' if self.const > 0 else '-'} {abs(self.const)}"
        return f"<{text}={self._val}>"


class BoundVariable(Sym):
    """A Variable with a value: an axis extent (in shrink, reshape, slices, arange, full...) or, as
    Tensor(bv) or an operand of an elementwise op, a 0-d int32 tensor holding the value."""

    const = 0

    def __init__(self, var: Variable, val: int):
        self.var, self._value = var, val
        self._nodes: dict[str, Node] = {}  # device -> its 0-d int32 buffer holding the value

    name = property(lambda self: self.var.name)
    min = property(lambda self: self.var.min)
    max = property(lambda self: self.var.max)
    _val = property(lambda self: self._value)
    terms = property(lambda self: ((self, 1),))
    key = property(lambda self: self.var.key)

    @property
    def val(self) -> int:
        if driver.RECORDER is not None:
            raise JitError(f"the value of variable {self.var.name!r} was read inside a TinyJit function: "
                           "a replay would keep it; use the variable itself (a shape, Tensor(v))")
        return self._value

    @property
    def ident(self) -> tuple:
        return (self.var.key, self._value)

    def unbind(self) -> tuple[Variable, int]:
        return self.var, self.val

    def node(self, device: str) -> Node:
        """The value as a 0-d int32 buffer on device (host data of the call that makes it: inside a TinyJit
        function a variable made there is keyed by the data; one passed in is an argument buffer)."""
        node = self._nodes.get(device)
        if node is None:
            buf = driver.upload(np.array(self._value, np.int32), device)
            node = self._nodes[device] = Node.from_buffer(buf, (), dtypes.int32, device)
        return node

    def __repr__(self) -> str:
        return f"<{self.var.name}[{self.var.min}-{self.var.max}]={self._value}>"


SYM = g.SYM


def of(node: Node) -> tuple | None:
    """node's per-axis BoundVariables (None: no symbolic axis)."""
    return SYM.get(node) if SYM.data else None


def shape_of(node: Node) -> tuple:
    sym = of(node)
    return node.shape if sym is None else tuple(s if v is None else v for s, v in zip(node.shape, sym))


def is_var(x) -> bool:
    return isinstance(x, Sym)


def physical(shape) -> tuple[int, ...]:
    """A shape with its variables at their max."""
    return tuple(s.max if isinstance(s, Sym) else s for s in shape)


def register(node: Node, sym) -> Node:
    if sym is not None and any(v is not None for v in sym):
        SYM[node] = tuple(sym)
    return node


_ARANGES: dict[tuple, Node] = {}  # (n, device) -> 0..n-1 as int32, uploaded once (a constant of tgrad's)


def _arange(n: int, device: str) -> Node:
    node = _ARANGES.get((n, device))
    if node is None:
        if len(_ARANGES) >= 64:
            _ARANGES.clear()
        with driver.recording(None):
            buf = driver.upload(np.arange(n, dtype=np.int32), device)
        node = _ARANGES[(n, device)] = Node.from_buffer(buf, (n,), dtypes.int32, device)
        buf.computed = True
    return node


def _inside(shape: tuple[int, ...], axis: int, bv: Sym, device: str) -> Node:
    """A bool node of `shape`: True where the index along axis is below the variable's value."""
    one = tuple(n if i == axis else 1 for i, n in enumerate(shape))
    pos = g.move(g.move(_arange(shape[axis], device), Op.RESHAPE, one), Op.EXPAND, shape)
    val = bv.node(device)
    val = g.move(g.move(val, Op.RESHAPE, (1,) * len(shape)), Op.EXPAND, shape)
    return g.alu(Op.CMPLT, pos, val)


def _fill(node: Node, axis: int, bv: Sym, value) -> Node:
    """node with the positions at or past the variable's value along axis set to value."""
    other = g.const(value, node.dtype, node.device, node.shape)
    return g.alu(Op.WHERE, _inside(node.shape, axis, bv, node.device), node, other)


def extent(node: Node, axis: int, bv: Sym) -> Node:
    """An entry point: node (its axis at bv.max) as a tensor whose axis has the extent bv. A DETACH node of
    its own, which fusion looks through (a matmul's operand stays a view: BLAS, tl.dot): the graph is
    hash-consed, and a node that is also a concrete tensor must not become symbolic. Its positions past
    the value keep what node holds there (every reduce masks them)."""
    if node.shape[axis] != bv.max:
        raise ShapeError(f"axis {axis} of size {node.shape[axis]} cannot have the extent {bv} (its max)")
    if bv.min < 0:
        raise ShapeError(f"the extent {bv} of axis {axis} can be negative (down to {bv.min}) for variables "
                         f"{bv._names()} in their ranges")
    sym = list(of(node) or (None,) * len(node.shape))
    if sym[axis] is not None and not _same(sym[axis], bv):
        raise ShapeError(f"axis {axis} already has the extent {sym[axis]}, not {bv}")
    inside = _inside(node.shape, axis, bv, node.device)
    # the gradient that reaches node (a tensor of no variable on axis) has none there, and 0 past the value
    # (keyed by the bound object: under TinyJit each call's is an argument of its own, and a node of an
    # earlier call with the same value must not be handed out, its kernels reading that call's value)
    name = ("extent", axis, bv.ident, tuple(map(id, bv.vars)))
    out = autodiff.custom_gradient(node, (node,), _extent_gradient(inside, axis), name)
    return register(out, sym[:axis] + [bv] + sym[axis + 1:])


def _extent_gradient(inside: Node, axis: int):
    def rule(grad: Node) -> tuple[Node]:
        zero = g.const(False if grad.dtype == dtypes.bool else 0, grad.dtype, grad.device, grad.shape)
        out = g.alu(Op.WHERE, inside, grad, zero)
        sym = of(out)
        if sym is not None:
            rest = sym[:axis] + (None,) + sym[axis + 1:]
            if any(v is not None for v in rest):
                SYM[out] = rest
            else:
                SYM.pop(out, None)
        return (out,)

    return rule


def like(node: Node, sym: tuple) -> Node:
    """node (not symbolic) with the extents `sym` on its axes (a constant shaped like a symbolic tensor)."""
    for axis, v in enumerate(sym):
        if v is not None:
            node = extent(node, axis, v)
    return node


def _identity(kind: str, dtype: DType):
    if kind == "SUM":
        return False if dtype == dtypes.bool else 0
    if kind == "PROD":
        return True if dtype == dtypes.bool else 1
    if dtype == dtypes.bool:
        return False
    return -float("inf") if dtype.is_float else dtype.min


def _same(a, b) -> bool:
    return a == b


def derive(op: Op, srcs: tuple, arg, shape: tuple[int, ...]) -> tuple[tuple, tuple | None]:
    """(sources, per-axis variables) of a new node over sources some of which are symbolic; a reduce's
    source gets its positions past each variable replaced by the reduce's identity."""
    syms = [SYM.get(s) for s in srcs]
    if not any(syms):
        return srcs, None
    if any(isinstance(s, Sym) for s in shape):  # (an op that built a node from Tensor.shape)
        raise ShapeError(f"{op.name} of shape {shape}: this op does not support symbolic shapes yet")
    s0 = syms[0]
    if op in g.MOVEMENT:
        if s0 is None:
            return srcs, None
        return srcs, _moved(op, srcs[0].shape, arg, shape, s0)
    if op is Op.REDUCE:
        kind, axes = arg
        src = srcs[0]
        for a in axes:
            if s0[a] is not None:
                src = _fill(src, a, s0[a], _identity(kind, src.dtype))
        return (src,), tuple(None if i in axes else v for i, v in enumerate(s0))
    if op is Op.ASSIGN:
        raise ShapeError("assign() of a tensor with a symbolic axis is not supported")
    out: list = [None] * len(shape)
    for sym in syms:
        if sym is None or len(sym) != len(shape):
            continue
        for i, v in enumerate(sym):
            if v is None:
                continue
            if out[i] is not None and not _same(out[i], v):
                raise ShapeError(f"an elementwise {op.name} of axes with different extents {out[i]} and {v}")
            out[i] = v
    return srcs, tuple(out)


def _moved(op: Op, old: tuple, arg, new: tuple, sym: tuple) -> tuple | None:
    if op is Op.PERMUTE:
        return tuple(sym[i] for i in arg)
    if op is Op.EXPAND:
        return sym
    if op in (Op.PAD, Op.SHRINK, Op.FLIP):
        out = list(sym)
        for i, v in enumerate(sym):
            if v is None:
                continue
            if op is Op.SHRINK and tuple(arg[i]) == (0, old[i]):
                continue  # the whole axis (a shrink of other axes)
            if op is Op.SHRINK and arg[i] == (0, v._val) and driver.RECORDER is None:
                out[i] = None  # cut to its value: a concrete axis (outside TinyJit: the value is fixed here)
                continue
            if op is Op.SHRINK and arg[i][0] == 0 and arg[i][1] <= v.min:
                out[i] = None  # the first positions, inside for every value
                continue
            whole = (0, 0) if op is Op.PAD else (0, old[i])
            keeps = i not in arg if op is Op.FLIP else tuple(arg[i]) == whole
            if not keeps:
                raise ShapeError(f"{op.name.lower()} of the axis {i} whose extent is the variable {v} is not "
                                 "supported")
        return tuple(out)
    # RESHAPE: each symbolic axis must stay one axis, with the same elements before it
    out = [None] * len(new)
    for i, v in enumerate(sym):
        if v is None:
            continue
        before = g.prod(old[:i])
        j = next((j for j in range(len(new)) if new[j] == old[i] and g.prod(new[:j]) == before), None)
        if j is None:
            raise ShapeError(f"reshape {old} -> {new} merges or splits the axis {i} whose extent is the "
                             f"variable {v}")
        out[j] = v
    return tuple(out)


def concrete(node: Node) -> Node:
    """node cut to its variables' values (eagerly: a tensor of that concrete shape)."""
    sym = of(node)
    if sym is None:
        return node
    cut = tuple((0, s) if v is None else (0, v._val) for s, v in zip(node.shape, sym))
    out = g.move(node, Op.SHRINK, cut)
    if out is node:  # every value at its max: the same elements, as a node of its own without variables
        zero = g.const(False if node.dtype == dtypes.bool else 0, node.dtype, node.device, node.shape)
        out = g.alu(Op.OR if node.dtype == dtypes.bool else Op.ADD, node, zero)
        SYM.pop(out, None)
    return out


def bound_in(values) -> dict:
    """{id: BoundVariable} of the variables in a flat list of arguments (extents, tensors' axes)."""
    out: dict[int, BoundVariable] = {}
    for x in values:
        if isinstance(x, Sym):
            for v in x.vars:
                out.setdefault(id(v), v)
        else:
            node = getattr(x, "node", None)
            sym = of(node) if isinstance(node, Node) else None
            for e in sym or ():
                for v in () if e is None else e.vars:
                    out.setdefault(id(v), v)
    return out


def key_of(node: Node) -> tuple | None:
    """The signature of node's symbolic axes: the variables and expressions, not their values."""
    sym = of(node)
    return None if sym is None else tuple(None if v is None else v.key for v in sym)


def release(node: Node, axis: int) -> Node:
    """node without its variable on axis: the axis' positions at its max (those past the extent hold
    anything: the caller masks or cuts them). A DETACH node of its own, as extent()'s."""
    sym = of(node)
    if sym is None or sym[axis] is None:
        return node
    v = sym[axis]
    out = autodiff.custom_gradient(node, (node,), _same_gradient, ("release", axis, v.ident,
                                                                   tuple(map(id, v.vars))))
    rest = sym[:axis] + (None,) + sym[axis + 1:]
    if any(e is not None for e in rest):
        SYM[out] = rest
    else:
        SYM.pop(out, None)
    return out


def _same_gradient(grad: Node) -> tuple[Node]:
    return (grad,)


def has_var(xs) -> bool:
    return any(isinstance(x, Sym) for x in xs)


g.SYM_RULE = derive
__all__ = ["Variable", "BoundVariable", "Expr", "Sym"]
