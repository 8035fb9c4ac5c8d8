"""Symbolic shapes: `Variable("pos", 1, 1024).bind(n)` as the extent of one axis (tinygrad's spelling).

A tensor with a bound variable `v` on an axis is stored at the variable's max along that axis; only the
first v.val positions are its elements. Nothing about the value is in a kernel's code: the value is a
0-d int32 buffer (`BoundVariable.node`) that kernels read, so one compiled kernel (and one TinyJit
capture, where the variable is an argument of the call) serves every value in range. `graph.SYM` maps
a node to its per-axis variables: filled by `extent` (the entry point: a DETACH that fusion looks
through) and carried to every node built over a symbolic source by `derive`, which graph.Node calls:
- elementwise ops keep their sources' variables; movement ops move them with their axes (a reshape must
  keep the axis whole; a pad, a flip, or a shrink of the axis other than to v.val raises);
- a reduce over a symbolic axis first replaces the positions past v with the reduce's identity
  (0 for SUM, 1 for PROD, the lowest value for MAX): so sum, mean, softmax and a matmul over the axis
  read only the first v positions (the positions past v hold anything);
- an assign into a symbolic tensor raises (not supported).
Tensor.shape shows the BoundVariable on its axis (as tinygrad shows the variable); arithmetic on it
raises, so an op that needs the axis' size as a number fails clearly instead of using the max.
numpy(), int indexes and reshapes to ints cut each axis to its value (outside TinyJit only).
Compute runs over the max extent (masked), not only over the first v positions.
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


class BoundVariable:
    """A Variable with a value: an axis extent (in shrink, reshape, slices, arange, full...) or, as
    Tensor(bv) or an operand of an elementwise op, a 0-d int32 tensor holding the value."""

    def __init__(self, var: Variable, val: int):
        self.var, self._val = var, val
        self._nodes: dict[str, Node] = {}  # device -> its 0-d int32 buffer holding the value

    name = property(lambda self: self.var.name)
    min = property(lambda self: self.var.min)
    max = property(lambda self: self.var.max)

    @property
    def val(self) -> int:
        if driver.RECORDER is not None:
            raise JitError(f"the value of variable {self.var.name!r} was read inside a TinyJit function: "
                           "a replay would keep it; use the variable itself (a shape, Tensor(v))")
        return self._val

    def unbind(self) -> tuple[Variable, int]:
        return self.var, self.val

    def node(self, device: str) -> Node:
        """The value as a 0-d int32 buffer on device (host data of the call that makes it: inside a TinyJit
        function a variable made there is keyed by the data; one passed in is an argument buffer)."""
        node = self._nodes.get(device)
        if node is None:
            buf = driver.upload(np.array(self._val, np.int32), device)
            node = self._nodes[device] = Node.from_buffer(buf, (), dtypes.int32, device)
        return node

    def _refuse(self, *other):
        if other and isinstance(getattr(other[0], "node", None), Node):
            return NotImplemented  # (v * tensor: the Tensor's reflected op reads the value at launch)
        raise ShapeError(f"the size of an axis is the variable {self.var.name!r} (bound to {self._val}), not "
                         "a number: this op needs it as a number (not supported with symbolic shapes)")

    __index__ = __int__ = __float__ = __add__ = __radd__ = __sub__ = __rsub__ = _refuse
    __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = _refuse

    def __eq__(self, other) -> bool:  # (the same variable bound to the same value twice: one extent)
        return isinstance(other, BoundVariable) and other.var.key == self.var.key and other._val == self._val

    def __hash__(self) -> int:
        return hash((self.var.key, self._val))

    def __repr__(self) -> str:
        return f"<{self.var.name}[{self.var.min}-{self.var.max}]={self._val}>"


SYM = g.SYM


def of(node: Node) -> tuple | None:
    """node's per-axis BoundVariables (None: no symbolic axis)."""
    return SYM.get(node) if SYM.data else None


def shape_of(node: Node) -> tuple:
    sym = of(node)
    return node.shape if sym is None else tuple(s if v is None else v for s, v in zip(node.shape, sym))


def is_var(x) -> bool:
    return isinstance(x, BoundVariable)


def physical(shape) -> tuple[int, ...]:
    """A shape with its variables at their max."""
    return tuple(s.max if isinstance(s, BoundVariable) else s for s in shape)


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


def _inside(shape: tuple[int, ...], axis: int, bv: BoundVariable, device: str) -> Node:
    """A bool node of `shape`: True where the index along axis is below the variable's value."""
    one = tuple(n if i == axis else 1 for i, n in enumerate(shape))
    pos = g.move(g.move(_arange(shape[axis], device), Op.RESHAPE, one), Op.EXPAND, shape)
    val = bv.node(device)
    val = g.move(g.move(val, Op.RESHAPE, (1,) * len(shape)), Op.EXPAND, shape)
    return g.alu(Op.CMPLT, pos, val)


def _fill(node: Node, axis: int, bv: BoundVariable, value) -> Node:
    """node with the positions at or past the variable's value along axis set to value."""
    other = g.const(value, node.dtype, node.device, node.shape)
    return g.alu(Op.WHERE, _inside(node.shape, axis, bv, node.device), node, other)


def extent(node: Node, axis: int, bv: BoundVariable) -> Node:
    """An entry point: node (its axis at bv.max) as a tensor whose axis has the extent bv. A DETACH node of
    its own, which fusion looks through (a matmul's operand stays a view: BLAS, tl.dot): the graph is
    hash-consed, and a node that is also a concrete tensor must not become symbolic. Its positions past
    the value keep what node holds there (every reduce masks them)."""
    if node.shape[axis] != bv.max:
        raise ShapeError(f"axis {axis} of size {node.shape[axis]} cannot have the extent {bv} (its max)")
    sym = list(of(node) or (None,) * len(node.shape))
    if sym[axis] is not None and not _same(sym[axis], bv):
        raise ShapeError(f"axis {axis} already has the extent {sym[axis]}, not {bv}")
    inside = _inside(node.shape, axis, bv, node.device)
    # the gradient that reaches node (a tensor of no variable on axis) has none there, and 0 past the value
    # (keyed by the bound object: under TinyJit each call's is an argument of its own, and a node of an
    # earlier call with the same value must not be handed out, its kernels reading that call's value)
    name = ("extent", axis, bv.var.key, bv._val, id(bv))
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
    if any(isinstance(s, BoundVariable) for s in shape):  # (an op that built a node from Tensor.shape)
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
            if op is Op.SHRINK and arg[i][0] == 0 and arg[i][1] <= v.var.min:
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
    """{id: BoundVariable} of the variables in a flat list of arguments (bound variables, tensors' axes)."""
    out: dict[int, BoundVariable] = {}
    for x in values:
        if isinstance(x, BoundVariable):
            out.setdefault(id(x), x)
        else:
            node = getattr(x, "node", None)
            sym = of(node) if isinstance(node, Node) else None
            for v in sym or ():
                if v is not None:
                    out.setdefault(id(v), v)
    return out


def key_of(node: Node) -> tuple | None:
    """The signature of node's symbolic axes: the variables, not their values."""
    sym = of(node)
    return None if sym is None else tuple(None if v is None else v.var.key for v in sym)


# ---------------------------------------------------------------------------------------------------
# the Tensor ops' symbolic forms (ops/movement.py and ops/indexing.py call these when a shape or an index
# holds a BoundVariable, or the tensor has a symbolic axis)


def has_var(xs) -> bool:
    return any(isinstance(x, BoundVariable) for x in xs)


def shrink(t, arg):
    """t.shrink(arg) where an end is a BoundVariable v (its start 0): the axis cut to v.max, extent v."""
    shape, phys, marks = t.shape, [], []
    for i, (a, s) in enumerate(zip(arg, shape)):
        b, e = (None, None) if a is None else a
        if isinstance(b, BoundVariable):
            raise ShapeError(f"shrink: a variable start ({b}) is not supported, only a variable end")
        if not isinstance(e, BoundVariable):
            phys.append(a)
            continue
        if b not in (0, None):
            raise ShapeError(f"shrink: the axis {i} cut to the variable {e} must start at 0, not {b}")
        if isinstance(s, BoundVariable):
            if not _same(s, e):
                raise ShapeError(f"shrink: axis {i} has the extent {s}, it cannot be cut to {e}")
            phys.append(None)
            continue
        if e.max > s:
            raise ShapeError(f"shrink: variable {e.var.name!r} can be up to {e.max}, past axis {i}'s size "
                             f"{s}")
        phys.append((0, e.max))
        marks.append((i, e))
    out = t.shrink(tuple(phys))
    node = out.node
    for i, e in marks:
        node = extent(node, i, e)
    return out._from(node, out)


def reshape(t, shape):
    """t.reshape(shape) for a shape with BoundVariables or a tensor with a symbolic axis: each variable
    stays its own axis; a shape of ints cuts the symbolic axes to their values first (outside TinyJit)."""
    if not has_var(shape):
        if of(t.node) is None:
            return None
        if driver.RECORDER is not None:
            raise ShapeError(f"reshape of {t.shape} to the numbers {shape} inside a TinyJit function: the "
                             "variables' values would be frozen in the capture; keep the variables in the "
                             "shape")
        return t._from(concrete(t.node), t).reshape(shape)
    phys = physical(shape)
    if -1 in phys or g.prod(phys) != g.prod(t.node.shape) or min(phys, default=0) < 0:
        raise ShapeError(f"reshape: cannot reshape {t.shape} to {tuple(shape)}")
    out = t._from(g.move(t.node, Op.RESHAPE, phys), t)
    got = of(out.node) or (None,) * len(shape)
    for j, s in enumerate(shape):
        want = s if isinstance(s, BoundVariable) else None
        if (want is None) != (got[j] is None) or want is not None and not _same(want, got[j]):
            raise ShapeError(f"reshape: cannot reshape {t.shape} to {tuple(shape)} (axis {j} would be "
                             f"{got[j] if got[j] is not None else out.node.shape[j]})")
    return out


def expand(t, shape):
    """t.expand(shape) where a size-1 axis becomes a variable's extent."""
    phys = physical(shape)
    lead = len(phys) - t.ndim
    if lead < 0 or any(s not in (1, p) for s, p in zip(t.node.shape, phys[lead:])):
        raise ShapeError(f"expand: cannot expand {t.shape} to {tuple(shape)}")
    out = t._expand_to(phys)
    node, got = out.node, of(out.node) or (None,) * len(shape)
    for j, s in enumerate(shape):
        if got[j] is not None and not _same(got[j], s):
            raise ShapeError(f"expand: cannot expand {t.shape} to {tuple(shape)} (axis {j} is {got[j]})")
        if isinstance(s, BoundVariable) and got[j] is None:
            node = extent(node, j, s)
    return out._from(node, out)


def getitem(t, index: tuple):
    """t[index] where slices end at a BoundVariable (`cache[:, :, :pos]`), beside ints, slices, None and
    one Ellipsis: the variables' slices first (a shrink), then the rest as usual."""
    allowed = (slice, int, np.integer)
    if not all(v is None or v is Ellipsis or isinstance(v, allowed) and not isinstance(v, bool)
               for v in index):
        raise ShapeError(f"an index with a variable takes only ints, slices, None and ...: got {index}")
    n_real = sum(1 for v in index if v is not None and v is not Ellipsis)
    if sum(v is Ellipsis for v in index) > 1 or n_real > t.ndim:
        raise ShapeError(f"index {index} does not fit shape {t.shape}")
    if any(v is Ellipsis for v in index):
        at = next(i for i, v in enumerate(index) if v is Ellipsis)
        index = index[:at] + (slice(None),) * (t.ndim - n_real) + index[at + 1:]
    index = index + (slice(None),) * (t.ndim - sum(1 for v in index if v is not None))
    arg = []
    for v in index:
        if v is None:
            continue
        if isinstance(v, slice) and isinstance(v.stop, BoundVariable):
            if isinstance(v.start, BoundVariable) or v.step not in (None, 1):
                raise ShapeError(f"a slice with a variable takes only a variable end (:v), got {v}")
            arg.append((v.start or 0, v.stop))
        else:
            arg.append(None)
    x = shrink(t, tuple(arg))
    plain = tuple(slice(None) if isinstance(v, slice) and isinstance(v.stop, BoundVariable) else v
                  for v in index)
    return x if all(isinstance(v, slice) and v == slice(None) for v in plain) else x[plain]


def indexable(t, index: tuple):
    """t, where `index` (normalized: one entry per axis, None for new axes) keeps every symbolic axis
    whole (`:`); else t cut to its variables' values (outside TinyJit), which ints and slices then index
    as usual (tinygrad's `out[:3, :i]`)."""
    sym = of(t.node)
    real = [v for v in index if v is not None]
    if all(s is None or isinstance(v, slice) and v == slice(None) for v, s in zip(real, sym)):
        return t
    if driver.RECORDER is not None:
        raise ShapeError(f"indexing {t.shape} with {index} inside a TinyJit function: an axis whose extent "
                         "is a variable takes only ':' there (its value would be frozen in the capture)")
    return t._from(concrete(t.node), t)


def count(t, axes: tuple[int, ...], dtype):
    """The number of elements over axes, some of them variables: a 0-d tensor read at launch."""
    n, known = None, 1
    for a in axes:
        s = t.shape[a]
        if isinstance(s, BoundVariable):
            v = type(t)(s, device=t.device).cast(dtype)
            n = v if n is None else n * v
        else:
            known *= s
    return n * known


def mean(t, axes: tuple[int, ...], keepdim: bool):
    """t.mean(axes) where some reduced axes are variables: the sum divided by the count."""
    total = t.sum(axes, keepdim)
    return total / count(t, axes, total.dtype)


def var(t, axes: tuple[int, ...], keepdim: bool, correction: int):
    """t.var(axes) (t a float tensor) where some reduced axes are variables: shifted by the first element
    (a variable's min is at least 1 here), then sum((x - mean)**2) / max(0, count - correction)."""
    if any(isinstance(t.shape[a], BoundVariable) and t.shape[a].min < 1 for a in axes):
        raise ShapeError(f"var over an axis of {t.shape} whose variable can be 0 is not supported")
    first = tuple((0, 1) if i in axes else None for i in range(t.ndim))
    x = t - t.shrink(first).detach()
    d = x - mean(x, axes, True)
    return d.square().sum(axes, keepdim) / (count(t, axes, t.dtype) - correction).maximum(0)


g.SYM_RULE = derive
__all__ = ["Variable", "BoundVariable"]
