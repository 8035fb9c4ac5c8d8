"""Tensor's elementwise primitives with broadcasting and dtype promotion, comparisons and logic,
Python's operators and the in-place forms (PyTorch's trailing underscore)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tgrad import autodiff, symbolic, symbolic_ops
from tgrad import graph as g
from tgrad.dtype import DType, check_fits, dtypes, promote, promote_dims, promote_scalar
from tgrad.errors import ArgumentError, DeviceError, DTypeError, ShapeError
from tgrad.graph import Node, Op
from tgrad.ops.helpers import Scalar, _broadcast_shape, _expand_node
from tgrad.ops.numerics import (
    _DIVISOR_EDGE,
    _float_floordiv,
    _float_fmod,
    _gradient_only,
    _pow_value,
    _rounded_quotient,
    _true_divide,
)

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


_SYM_DATA = g.SYM.data  # (non-empty only while a tensor with a symbolic axis lives)


_NARROW = ("float16", "bfloat16")  # float dtypes PyTorch computes in float32 (its opmath), rounded per op


class ElementwiseOps:
    """Tensor's elementwise ops (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def _const(self, value: Scalar, dtype: DType | None = None) -> Tensor:
        node = g.const(value, dtype or self.dtype, self.device, self.node.shape)
        if _SYM_DATA and self.node in g.SYM:  # self's symbolic axes too (a node of its own: symbolic.py)
            node = symbolic.like(node, g.SYM[self.node])
        return type(self)(node)

    def _broadcasted(self, y, reverse: bool = False, dtype: DType | None = None) -> tuple[Tensor, Tensor]:
        x = self
        xn = x.node
        if dtype is None:  # the common cases first: every op of a model's step passes through here
            if isinstance(y, type(self)):
                yn = y.node
                if yn.shape == xn.shape and yn.dtype is xn.dtype and yn.device == xn.device and (
                        not _SYM_DATA or g.SYM.get(xn) == g.SYM.get(yn)):  # (symbolic axes: compared below)
                    return (y, x) if reverse else (x, y)
            elif type(y) is float and xn.dtype.kind == "f" or type(y) is int and xn.dtype.kind in "iuf":
                y = x._const(y) if _SYM_DATA else type(self)(g.const(y, xn.dtype, xn.device, xn.shape))
                return (y, x) if reverse else (x, y)
        if not isinstance(y, type(self)):
            if not isinstance(y, (bool, int, float)):
                y = type(self)(y, device=x.device)
            else:
                dt = dtype or promote_scalar(x.dtype, y)
                x = x.cast(dt)
                y = type(self)(g.const(y, dt, x.device))
        if x.device != y.device:
            raise DeviceError(
                f"tensors are on different devices ({x.device} and {y.device}); move one with .to()"
            )
        dt = dtype or promote_dims(x.dtype, not x.node.shape, y.dtype, not y.node.shape)
        x, y = x.cast(dt), y.cast(dt)
        shape = _broadcast_shape(x.shape, y.shape)
        x, y = x._expand_to(shape), y._expand_to(shape)
        return (y, x) if reverse else (x, y)

    def _expand_to(self, shape: tuple[int, ...]) -> Tensor:
        """_broadcast_to for a shape that _broadcast_shape made from this tensor's (nothing to check)."""
        node = self.node
        if node.shape == shape:
            return self
        if _SYM_DATA and symbolic.has_var(shape):  # a variable's extent is its max in the graph
            return symbolic_ops.expand(self, shape)
        steps = ((Op.EXPAND, shape),)
        if len(shape) != len(node.shape):
            lead = (1,) * (len(shape) - len(node.shape)) + node.shape
            node, steps = g.move(node, Op.RESHAPE, lead), ((Op.RESHAPE, lead),) + steps
        return self._from(g.move(node, Op.EXPAND, shape), view=steps)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        if len(shape) < self.ndim:
            raise ShapeError(f"cannot broadcast {self.shape} to {shape}")
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
        _broadcast_shape(x.shape, shape)
        if any(s != n and s != 1 for s, n in zip(x.shape, shape)):
            raise ShapeError(f"cannot broadcast {self.shape} to {shape}")
        return x._expand_to(shape)

    def _alu(self, op: Op, *srcs: Tensor) -> Tensor:
        if not srcs:  # (a unary op: no generator to make)
            return self._from(g.alu(op, self.node))
        return self._from(g.alu(op, self.node, *(s.node for s in srcs)), *srcs)

    def _operands(self, y, reverse: bool = False) -> tuple[Node, Node] | None:
        """The nodes _broadcasted's tensors would hold, in its common cases: y a tensor of self's dtype and
        device (the shapes broadcast) or a Python scalar of self's kind; None in the others. The binary
        ops build on these without a tensor for each operand (the same nodes: the same graph)."""
        xn = self.node
        if _SYM_DATA:  # (symbolic axes: _broadcasted compares them)
            return None
        if isinstance(y, type(self)):
            yn = y.node
            if yn.dtype is not xn.dtype or yn.device != xn.device:
                return None
            if yn.shape != xn.shape:
                shape = _broadcast_shape(xn.shape, yn.shape)
                xn, yn = _expand_node(xn, shape), _expand_node(yn, shape)
        elif type(y) is float and xn.dtype.kind == "f" or type(y) is int and xn.dtype.kind in "iuf":
            yn = g.const(y, xn.dtype, xn.device, xn.shape)
        else:
            return None
        return (yn, xn) if reverse else (xn, yn)

    def _binop(self, op: Op, y, reverse: bool = False, dtype: DType | None = None) -> Tensor:
        nodes = self._operands(y, reverse) if dtype is None else None
        if nodes is None:
            a, b = self._broadcasted(y, reverse, dtype)
            return a._alu(op, b)
        node = g.alu(op, *nodes)
        return self._from(node, y) if isinstance(y, type(self)) else self._from(node)

    # (self not bool: neither is the promoted dtype, so these are the op itself)
    def add(self, y, reverse=False, *, alpha=None) -> Tensor:
        """self + y (PyTorch's add: alpha scales y first, self + alpha * y)."""
        if alpha is not None:
            return self._scaled(Op.ADD, y, alpha, "add")
        if self.node.dtype.kind != "b":
            return self._binop(Op.ADD, y, reverse)
        a, b = self._broadcasted(y, reverse)
        if a.node.dtype.kind == "b":
            return a | b
        return a._alu(Op.ADD, b)

    def sub(self, y, reverse=False, *, alpha=None) -> Tensor:
        """self - y (PyTorch's sub: self - alpha * y)."""
        if alpha is not None:
            return self._scaled(Op.SUB, y, alpha, "sub")
        if self.node.dtype.kind != "b":
            return self._binop(Op.SUB, y, reverse)
        a, b = self._broadcasted(y, reverse)
        if a.node.dtype.kind == "b":
            raise DTypeError("subtraction of bool tensors is not supported; use ^ or logical_not()")
        return a._alu(Op.SUB, b)

    def _scaled(self, op: Op, y, alpha, name: str) -> Tensor:
        """self op alpha * y as PyTorch's add / sub with alpha: in the result's dtype (float16 and bfloat16
        in float32, rounded once), a float alpha refused for integer and bool results."""
        a, b = self._broadcasted(y)
        if type(alpha) not in (bool, int, float):
            raise ArgumentError(f"{name}: alpha must be a Python number, got {type(alpha).__name__}")
        kind = a.node.dtype.kind
        if kind != "f" and type(alpha) is float or (kind == "b") != (type(alpha) is bool):
            raise DTypeError(f"{name}: alpha {alpha!r} does not fit {a.dtype.name} tensors (PyTorch: integer "
                             "tensors take an integer alpha, and only bool tensors a bool)")
        if kind == "b":  # (alpha True: a or b; False: a)
            return a | b if alpha else a | (b & False)
        wide = a.node.dtype.name in _NARROW
        x, z = (a.float(), b.float()) if wide else (a, b)
        out = x._alu(op, z * alpha)
        return out.cast(a.dtype) if wide else out

    def _exact_scalar(self, y) -> bool:
        """Whether PyTorch multiplies or divides this tensor by y in float32 with y as it is: self float16 or
        bfloat16 with dimensions, y a Python number or a 0-d float tensor (60000 * 1e-10 is 6e-06 in
        float16, not 0); add, sub and comparisons take y as self's dtype, as PyTorch's do."""
        if self.node.dtype.name not in _NARROW:
            return False
        if type(y) in (int, float):
            return True
        return (isinstance(y, type(self)) and not y.node.shape and y.node.dtype.kind == "f"
                and bool(self.node.shape))

    def mul(self, y, reverse=False) -> Tensor:
        if self._exact_scalar(y):
            z = y.float() if isinstance(y, type(self)) else y
            return self.float()._binop(Op.MUL, z, reverse).cast(self.node.dtype)
        if self.node.dtype.kind != "b":
            return self._binop(Op.MUL, y, reverse)
        a, b = self._broadcasted(y, reverse)
        if a.node.dtype.kind == "b":
            return a & b
        return a._alu(Op.MUL, b)

    def _contract_mul(self, y: Tensor, kind: str = g.CONTRACT) -> Tensor:
        """self * y, broadcast, as the products of a contraction of `kind` (graph.CONTRACTS): the sum of
        them an op builds next is a matmul the optimizer may run as one (einsum's, conv2d's, col2im's)."""
        a, b = self._broadcasted(y)
        return a._from(g.alu(Op.MUL, a.node, b.node, arg=kind), b)

    def div(self, y, reverse=False, rounding_mode: str | None = None) -> Tensor:
        if reverse and rounding_mode is None and type(y) in (int, float) and self.node.dtype.name in _NARROW:
            # PyTorch's number / tensor is the reciprocal (a float16 one: 1e-3 / 1e-7 is inf) times the
            # number
            return self.reciprocal().mul(y)
        if rounding_mode == "trunc":
            a, b = self._broadcasted(y, reverse)
            return a._alu(Op.IDIV, b) if a.dtype.is_int else _rounded_quotient(a, b).trunc()
        if rounding_mode == "floor":
            return self.floordiv(y, reverse)
        if rounding_mode is not None:
            raise ArgumentError(f"div: rounding_mode must be None, 'trunc' or 'floor', not {rounding_mode!r}")
        if not reverse and isinstance(y, type(self)):  # a 0-d float tensor beside a float16 one, either side
            narrow = self if self._exact_scalar(y) else y if y._exact_scalar(self) else None
            if narrow is not None:
                return self.float().div(y.float()).cast(narrow.node.dtype)
        a, b = self._broadcasted(y, reverse)
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool):
            if a._exact_scalar(y):  # in float32 with the number as it is, rounded once (as _true_divide)
                return a.cast(dtypes.float32).div(y).cast(a.dtype)
            edge = _DIVISOR_EDGE.get(a.dtype, 100)
            if y == 0 or not math.isfinite(y) or 2.0**-edge <= abs(y) <= 2.0**edge:  # 1 / y is a number
                return a._alu(Op.MUL, b.reciprocal())
        return _true_divide(a, b)

    def floordiv(self, y, reverse=False) -> Tensor:
        if self.node.dtype.name in _NARROW and not reverse and type(y) in (int, float):
            # in float32 with the number as it is, rounded once (PyTorch's: 1 // 0.1 is 9, as in Python)
            return self.float().floordiv(y).cast(self.node.dtype)
        a, b = self._broadcasted(y, reverse)
        if a.dtype.name in _NARROW:  # in float32, rounded once (PyTorch's)
            return a.float().floordiv(b.float()).cast(a.dtype)
        if a.dtype.is_float:
            return _float_floordiv(a, b)
        q = a._alu(Op.IDIV, b)
        r = a._alu(Op.MOD, b)
        adjust = (r != 0) & ((r < 0) ^ (b < 0))
        return q - adjust.cast(q.dtype)

    def mod(self, y, reverse=False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        if a.dtype.name in _NARROW:  # in float32 (a number taken as this dtype), rounded once: PyTorch's
            return a.float().mod(b.float()).cast(a.dtype)
        if a.dtype.is_float:  # PyTorch's (and Python's): fmod, moved into b's sign
            r = _float_fmod(a, b)
            return ((r != 0) & ((r < 0) ^ (b < 0))).where(r + b, r)
        r = a._alu(Op.MOD, b)
        adjust = (r != 0) & ((r < 0) ^ (b < 0))
        return r + adjust.where(b, 0)

    def fmod(self, y) -> Tensor:
        a, b = self._broadcasted(y)
        return a._alu(Op.MOD, b) if a.dtype.is_int else _float_fmod(a, b)

    def pow(self, y, reverse=False) -> Tensor:
        """self ** y. Small integer exponents multiply; integer tensors to integer powers stay integers
        (wrapping like PyTorch); otherwise exp2(y * log2|x|) with the signs and special values of C's pow,
        and PyTorch's gradients (also at 0, inf and negative bases)."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool):
            if y == 0:  # 1 everywhere, gradient 0 (still connected to self, as in PyTorch)
                x = self if self.dtype.is_float or isinstance(y, int) else self.float()
                if not x.dtype.is_float:
                    return x.ones_like()
                return x.ones_like() + _gradient_only(x, x.zeros_like())
            if y == 0.5:
                return self.sqrt()
            if y == -0.5 and self.dtype.is_float:  # PyTorch's rsqrt: -0.0 -> -inf, -inf -> nan
                return self._pow_gradient(self.detach().sqrt().reciprocal(), -0.5)
            if isinstance(y, int) and not self.dtype.is_float:
                return self._int_pow(y)
            if float(y).is_integer() and abs(y) <= 8:
                base = self if isinstance(y, int) else self.cast(promote_scalar(self.dtype, y))
                out = base
                for _ in range(int(abs(y)) - 1):
                    out = out * base
                # 1 / x**n's own gradient is nan at 0 and inf: PyTorch's y * x**(y - 1) instead
                return base._pow_gradient(out.detach().reciprocal(), y) if y < 0 else out
        if isinstance(y, (int, float)) and not isinstance(y, bool):  # one side a Python number
            x = self._float()
            return x._pow_scalar_base(float(y)) if reverse else x._pow_scalar(float(y))
        a, b = self._broadcasted(y, reverse)
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        value = _pow_value(a.detach(), b.detach())
        if Tensor.no_grad:
            return value
        a_node, b_node = a.node, b.node

        def rule(grad: Node) -> tuple[Node, Node]:  # PyTorch's, everywhere (0, inf, nan, negative bases)
            ta, tb, gr = Tensor(a_node), Tensor(b_node), Tensor(grad)
            da = (tb == 0).where(0.0, tb * ta.pow(tb - 1))
            db = ((ta == 0) & (tb >= 0)).where(0.0, ta.pow(tb) * ta.log())
            return (gr * da).node, (gr * db).node

        return a._from(autodiff.custom_gradient(value.node, (a_node, b_node), rule, "pow"), b)

    def _pow_gradient(self, value: Tensor, e: float) -> Tensor:
        """value (self ** e) with PyTorch's gradient e * self ** (e - 1) everywhere: at 0, inf, nan and
        negative self too (built from differentiable ops, so higher derivatives follow)."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        if Tensor.no_grad:
            return value
        x_node = self.node

        def rule(grad: Node) -> tuple[Node]:
            return ((Tensor(grad) * (e * Tensor(x_node).pow(e - 1))).node,)

        return self._from(autodiff.custom_gradient(value.node, (x_node,), rule, "pow"))

    def _pow_scalar(self, e: float) -> Tensor:
        """self ** e for a Python exponent: pow's rules with the exponent's cases decided on the host."""
        value = _pow_value(self.detach(), e)
        if type(self).no_grad or e == 0:
            return value
        return self._pow_gradient(value, e)

    def _pow_scalar_base(self, c: float) -> Tensor:
        """c ** self for a Python base c (c ** 0 is 1 for every c, as in C)."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        if c == 1:  # 1 ** nan and 1 ** inf are 1 too; gradient 0
            return self.ones_like() + _gradient_only(self, self.zeros_like())
        if c > 0 and math.isfinite(c):
            return (self * math.log2(c)).exp2()
        if math.isnan(c):
            value = self * math.nan
        elif c == 0:
            value = (self > 0).where(0.0, (self < 0).where(math.inf, math.nan))
        else:  # negative or infinite
            mag = (self * math.log2(abs(c))).exp2()
            value = mag
            if c < 0:
                is_int = self.trunc() == self
                signed = (is_int & ((self.abs() % 2) == 1)).where(-mag, mag)
                value = is_int.where(signed, mag if c == -math.inf else math.nan)
            if c == -1:
                value = self.isinf().where(1.0, value)
        value = (self == 0).where(1.0, value).detach()
        if Tensor.no_grad:
            return value
        # PyTorch: d/dx c**x = c**x * log(c), and 0 where c == 0 <= x (nan at x = nan: no mask there)
        log_c = math.log(c) if c > 0 else (-math.inf if c == 0 else math.nan)
        slope = value * log_c
        if c == 0:
            slope = (self.detach() >= 0).where(0.0, slope)
        x_node = self.node

        def rule(grad: Node) -> tuple[Node]:
            return ((Tensor(grad) * slope).node,)

        return self._from(autodiff.custom_gradient(value.node, (x_node,), rule, "pow"))

    def _int_pow(self, n: int) -> Tensor:
        """An integer tensor to a non-negative integer power by repeated squaring (wraps on overflow)."""
        if n < 0:
            raise ArgumentError(f"pow: integers to negative integer powers ({n}) are not allowed")
        out, base = self.ones_like(), self
        while n:
            if n & 1:
                out = out * base
            base, n = base * base, n >> 1
        return out

    def maximum(self, y) -> Tensor:
        return self._binop(Op.MAX, y)

    def minimum(self, y) -> Tensor:
        a, b = self._broadcasted(y)
        if a.dtype.is_float:
            return -((-a).maximum(-b))
        return (a < b).where(a, b)

    def where(self, x, y) -> Tensor:
        """self (a condition) ? x : y, with broadcasting and Python scalars."""
        cond = self if self.node.dtype.kind == "b" else self != 0
        x_tensor = isinstance(x, type(self))
        if x_tensor or isinstance(y, type(self)):
            ref, other = (x, y) if x_tensor else (y, x)
            if type(other) in (int, float) and other != 0 and promote_scalar(ref.dtype, other) is ref.dtype:
                # PyTorch refuses a value the dtype cannot hold (0 fits all; float16 / bfloat16 take inf)
                strict = ref.dtype.name in ("float32", "float64")
                other = check_fits(other, ref.dtype, "where", strict_float=strict)
            nodes = ref._operands(other, reverse=not x_tensor)
            if nodes is not None:  # (the nodes of the lines below, without a tensor for each)
                xn, yn = nodes
                cn = cond.node
                if cn.shape != xn.shape:
                    shape = _broadcast_shape(cn.shape, xn.shape)
                    cn, xn, yn = _expand_node(cn, shape), _expand_node(xn, shape), _expand_node(yn, shape)
                node = g.alu(Op.WHERE, cn, xn, yn)
                return ref._from(node, other) if isinstance(other, type(self)) else ref._from(node)
            xa, ya = ref._broadcasted(other, reverse=not x_tensor)
        else:
            dt = promote(dtypes.from_py(x), dtypes.from_py(y))
            xa, ya = type(self)(g.const(x, dt, self.device)), type(self)(g.const(y, dt, self.device))
        shape = _broadcast_shape(cond.shape, xa.shape)
        cond, xa, ya = cond._broadcast_to(shape), xa._broadcast_to(shape), ya._broadcast_to(shape)
        return xa._from(g.alu(Op.WHERE, cond.node, xa.node, ya.node), xa, ya)

    # comparisons and logic
    def __lt__(self, y) -> Tensor:
        return self._binop(Op.CMPLT, y)

    def __gt__(self, y) -> Tensor:
        return self._binop(Op.CMPLT, y, reverse=True)

    def __le__(self, y) -> Tensor:
        a, b = self._broadcasted(y)
        if a.dtype.is_float:  # not (a > b) would be True where either is nan
            return (a < b) | (a == b)
        return (a > b).logical_not()

    def __ge__(self, y) -> Tensor:
        a, b = self._broadcasted(y)
        if a.dtype.is_float:
            return (a > b) | (a == b)
        return (a < b).logical_not()

    def __ne__(self, y) -> Tensor:  # type: ignore[override]
        return self._binop(Op.CMPNE, y)

    def __eq__(self, y) -> Tensor:  # type: ignore[override]
        return (self != y).logical_not()

    def logical_not(self) -> Tensor:
        return self.bool()._alu(Op.XOR, self.bool()._const(True))

    def _bitwise(self, op: Op, y, reverse=False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        if a.dtype.is_float:
            raise DTypeError(f"{op.name.lower()} needs bool or integer tensors, not {a.dtype.name}")
        return a._alu(op, b)

    def __and__(self, y) -> Tensor:
        return self._bitwise(Op.AND, y)

    def __or__(self, y) -> Tensor:
        return self._bitwise(Op.OR, y)

    def __xor__(self, y) -> Tensor:
        return self._bitwise(Op.XOR, y)

    def __rand__(self, y) -> Tensor:
        return self._bitwise(Op.AND, y, True)

    def __ror__(self, y) -> Tensor:
        return self._bitwise(Op.OR, y, True)

    def __rxor__(self, y) -> Tensor:
        return self._bitwise(Op.XOR, y, True)

    def __invert__(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        if self.dtype.is_float:
            raise DTypeError("~ needs bool or integer tensors")
        return self ^ -1 if self.dtype.kind == "i" else self ^ int(np.iinfo(self.dtype.np).max)

    def bitwise_not(self) -> Tensor:
        return ~self

    def _check_shift(self, n, op: str) -> None:
        n_int = isinstance(n, type(self)) and n.dtype.is_int or isinstance(n, int) and not isinstance(n, bool)
        if not self.dtype.is_int or not n_int or (isinstance(n, int) and n < 0):
            what = n.dtype.name if isinstance(n, type(self)) else repr(n)
            raise DTypeError(f"{op} needs integer tensors and shifts >= 0, not {self.dtype.name} {op} {what}")

    def lshift(self, n: int | Tensor) -> Tensor:
        """self * 2**n for integer tensors: bits shifted out are lost, as in C (the factor wraps too)."""
        self._check_shift(n, "<<")
        if isinstance(n, type(self)):
            return self._shift_by(n, lambda x, k: x * (1 << k), self.zeros_like())
        bits = 8 * self.dtype.itemsize
        factor = (1 << n) % (1 << bits)
        return self * (factor - (1 << bits) if factor > self.dtype.max else factor)

    def rshift(self, n: int | Tensor) -> Tensor:
        """Arithmetic shift: floor(self / 2**n), as PyTorch's >> on signed integers."""
        self._check_shift(n, ">>")
        if isinstance(n, type(self)):
            sign = (self < 0).where(-1, 0).cast(self.dtype) if self.dtype.kind == "i" else self.zeros_like()
            return self._shift_by(n, lambda x, k: x // (1 << k), sign)
        if (1 << n) > self.dtype.max:  # everything shifted out: the sign is left
            return (self < 0).where(-1, 0).cast(self.dtype) if self.dtype.kind == "i" else self.zeros_like()
        return self // (1 << n)

    def _shift_by(self, n: Tensor, step, outside: Tensor) -> Tensor:
        """Shift each element by its own count n: one conditional shift by 2**j for each bit j of n (so
        every factor fits the dtype); counts >= the bit width give `outside`."""
        bits, x = 8 * self.dtype.itemsize, self
        n = n.cast(self.dtype) if self.dtype.kind == "u" else n
        for j in range(bits.bit_length() - 1):
            x = ((n // (1 << j)) % 2 == 1).where(step(x, 1 << j), x)
        return (n >= bits).where(outside, x)

    def bitwise_left_shift(self, n: int | Tensor) -> Tensor:
        return self.lshift(n)

    def bitwise_right_shift(self, n: int | Tensor) -> Tensor:
        return self.rshift(n)

    def __lshift__(self, n: int | Tensor) -> Tensor:
        return self.lshift(n)

    def __rshift__(self, n: int | Tensor) -> Tensor:
        return self.rshift(n)

    # python operators
    def __add__(self, y):
        return self.add(y)

    def __radd__(self, y):
        return self.add(y, True)

    def __sub__(self, y):
        return self.sub(y)

    def __rsub__(self, y):
        return self.sub(y, True)

    def __mul__(self, y):
        return self.mul(y)

    def __rmul__(self, y):
        return self.mul(y, True)

    def __truediv__(self, y):
        return self.div(y)

    def __rtruediv__(self, y):
        return self.div(y, True)

    def __floordiv__(self, y):
        return self.floordiv(y)

    def __rfloordiv__(self, y):
        return self.floordiv(y, True)

    def __mod__(self, y):
        return self.mod(y)

    def __rmod__(self, y):
        return self.mod(y, True)

    def __pow__(self, y):
        return self.pow(y)

    def __rpow__(self, y):
        return self.pow(y, True)

    def __neg__(self):
        return self.neg()

    def __matmul__(self, y):
        return self.matmul(y)

    def __rmatmul__(self, y):
        return type(self)(y, device=self.device).matmul(self)

    def __iadd__(self, y):
        return self.assign(self + y)

    def __isub__(self, y):
        return self.assign(self - y)

    def __imul__(self, y):
        return self.assign(self * y)

    def __itruediv__(self, y):
        return self.assign(self / y)

    # in place (PyTorch's trailing underscore): assign() the result to this tensor
    def add_(self, y) -> Tensor:
        return self.assign(self + y)

    def sub_(self, y) -> Tensor:
        return self.assign(self - y)

    def mul_(self, y) -> Tensor:
        return self.assign(self * y)

    def div_(self, y) -> Tensor:
        return self.assign(self / y)

    def clamp_(self, min=None, max=None) -> Tensor:  # noqa: A002 - PyTorch's names
        return self.assign(self.clamp(min, max))

    def zero_(self) -> Tensor:
        return self.assign(self.zeros_like())

    def fill_(self, value) -> Tensor:
        return self.assign(self.full_like(value))

    def uniform_(self, low: float = 0.0, high: float = 1.0) -> Tensor:
        return self.assign(type(self).uniform(*self.shape, low=low, high=high, **self._like_kw()))

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> Tensor:
        return self.assign(type(self).normal(*self.shape, mean=mean, std=std, **self._like_kw()))

    def _like_kw(self) -> dict:
        return {"dtype": self.dtype, "device": self.device}
