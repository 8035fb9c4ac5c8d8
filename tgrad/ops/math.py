"""Tensor's unary math (float results for int inputs, like PyTorch) and activations."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from tgrad import autodiff
from tgrad.dtype import check_fits, dtypes, promote_scalar
from tgrad.errors import ArgumentError, DTypeError
from tgrad.graph import Node, Op
from tgrad.ops.helpers import _exp_node, _log_node
from tgrad.ops.numerics import (
    _ASINH_SERIES,
    _ATANH_SERIES,
    _ERF_SERIES,
    _SINH_SERIES,
    _TANH_SERIES,
    _or_nan_bound,
)

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


def _through_float32(method):
    """A formula of several steps (exp is exp2(x / ln 2), tanh a sigmoid...) on float16 computed in float32
    and rounded once, as PyTorch computes each of its float16 ops: rounded after every step (as float16
    arithmetic is, on every device) its result drifted a few float16 steps from PyTorch's."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        if self.node.dtype.name == "float16":
            return method(self.cast(dtypes.float32), *args, **kwargs).cast(dtypes.float16)
        return method(self, *args, **kwargs)

    return wrapped


class MathOps:
    """Tensor's unary math and activations (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def _float(self) -> Tensor:
        return self if self.node.dtype.kind == "f" else self.float()

    def neg(self) -> Tensor:
        if self.node.dtype.kind == "b":
            raise DTypeError("negation of a bool tensor is not supported; use logical_not()")
        return self._alu(Op.NEG)

    def exp2(self) -> Tensor:
        x = self._float()
        return x._alu(Op.EXP2)

    def log2(self) -> Tensor:
        x = self._float()
        return x._alu(Op.LOG2)

    @_through_float32
    def exp(self) -> Tensor:
        x = self._float()
        return x._from(_exp_node(x.node))

    @_through_float32
    def log(self) -> Tensor:
        x = self._float()
        return x._from(_log_node(x.node))

    def sqrt(self) -> Tensor:
        x = self._float()
        return x._alu(Op.SQRT)

    @_through_float32
    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        x = self._float()
        return x._alu(Op.RECIP)

    def sin(self) -> Tensor:
        x = self._float()
        return x._alu(Op.SIN)

    @_through_float32
    def cos(self) -> Tensor:
        return (math.pi / 2 - self._float()).sin()

    @_through_float32
    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        return self._alu(Op.TRUNC) if self.dtype.is_float else self

    def floor(self) -> Tensor:
        t = self.trunc()
        return (self < t).where(t - 1, t) if self.dtype.is_float else self

    def ceil(self) -> Tensor:
        t = self.trunc()
        return (self > t).where(t + 1, t) if self.dtype.is_float else self

    def round(self) -> Tensor:
        """Round half to even, like PyTorch."""
        x = self._float()
        f = x.floor()
        diff = x - f
        even = (f % 2) == 0
        return (diff > 0.5).where(f + 1, (diff < 0.5).where(f, even.where(f, f + 1)))

    def abs(self) -> Tensor:
        if not self.dtype.is_float:
            return (self < 0).where(-self, self)
        return self.relu() + (-self).relu()

    def sign(self) -> Tensor:
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)

    def isnan(self) -> Tensor:
        return self != self

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        pos, neg = self == math.inf, self == -math.inf
        if detect_positive and detect_negative:
            return pos | neg
        return pos if detect_positive else neg if detect_negative else self.zeros_like(dtype=dtypes.bool)

    def isfinite(self) -> Tensor:
        return (self.isinf() | self.isnan()).logical_not()

    def isclose(self, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol * |other| elementwise (PyTorch's); an inf only equals itself."""
        a, b = self._broadcasted(other)
        near = (a - b).abs() <= atol + rtol * b.abs()
        out = (a == b) | (a.isfinite() & b.isfinite() & near)
        return out | (a.isnan() & b.isnan()) if equal_nan else out

    def allclose(self, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def copysign(self, other) -> Tensor:
        """|self| with the sign of other (-0.0 counts as negative, like PyTorch)."""
        a, b = self._float()._broadcasted(other)
        negative = (b < 0) | ((b == 0) & (b.reciprocal() < 0))
        return negative.where(-a.abs(), a.abs())

    def logaddexp(self, other) -> Tensor:
        """log(exp(self) + exp(other)) without overflow."""
        a, b = self._float()._broadcasted(other)
        # max + log(1 + exp(-|a - b|)): its gradient is PyTorch's also at an inf (1 and 0, not inf / inf)
        same = a == b  # the same infinity included, where a - b is nan: kept out of the other branch
        d = same.where(0.0, -(a - b).abs())
        return same.where(a * 0.5 + b * 0.5 + math.log(2), a.maximum(b) + (d.exp() + 1).log())

    @_through_float32
    def log10(self) -> Tensor:
        return self.log2() * math.log10(2)

    @_through_float32
    def sinh(self) -> Tensor:
        x = self._float()
        return x._near_zero((x.exp() - (-x).exp()) * 0.5, _SINH_SERIES, 0.5)

    @_through_float32
    def cosh(self) -> Tensor:
        return (self.exp() + (-self).exp()) * 0.5

    @_through_float32
    def asin(self) -> Tensor:
        """Abramowitz & Stegun 4.4.46 (|error| <= 2e-8) on a = |x|, the sign put back by where(): the
        gradient is 1 at 0 and inf at +-1 as PyTorch's; nan outside [-1, 1]."""
        x = self._float()
        pos = x >= 0
        a = pos.where(x, -x)
        poly = a * 0
        for c in (-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874,
                  -0.2145988016, 1.5707963050):
            poly = poly * a + c
        y = math.pi / 2 - (1 - a).sqrt() * poly
        # near 0 that formula's absolute error (1e-7: asin(0) would be 1.2e-7) is larger than asin itself:
        # the Taylor series there, x + x**3/6 + 3x**5/40 + ... (8 terms: below 1e-9 relative for a < 1/4)
        small = a < 0.25
        s = small.where(a, 0.0)
        s2, series = s * s, s * 0
        for c in (143 / 10240, 231 / 13312, 63 / 2816, 35 / 1152, 5 / 112, 3 / 40, 1 / 6, 1.0):
            series = series * s2 + c
        y = small.where(s * series, y)
        return pos.where(y, -y)

    @_through_float32
    def acos(self) -> Tensor:
        return math.pi / 2 - self.asin()

    @_through_float32
    def atan(self) -> Tensor:
        """Abramowitz & Stegun 4.4.49 on [-1, 1] (|error| <= 2e-8), and pi/2 - atan(1/x) beyond, written
        with where() on safe inputs so that the gradient is right at 0, large |x| and +-inf."""
        x = self._float()
        big = (x > 1) | (x < -1)
        z = big.where(1 / big.where(x, 1.0), x)  # |z| <= 1
        z2, poly = z * z, z * 0
        for c in (0.0028662257, -0.0161657367, 0.0429096138, -0.0752896400, 0.1065626393, -0.1420889944,
                  0.1999355085, -0.3333314528, 1.0):
            poly = poly * z2 + c
        near = z * poly
        return big.where((x > 0).where(math.pi / 2, -math.pi / 2) - near, near)

    @_through_float32
    def asinh(self) -> Tensor:
        """log(a + sqrt(a^2 + 1)) on a = |x| (log(2a) beyond 1e4), with the sign put back by where():
        gradient 1 at 0 and 0 at +-inf."""
        x = self._float()
        pos = x >= 0
        a = pos.where(x, -x)
        big = a > 1e4
        small = big.where(0.0, a)
        y = big.where(big.where(a, 1.0).log() + math.log(2), (small + (small * small + 1).sqrt()).log())
        return x._near_zero(pos.where(y, -y), _ASINH_SERIES, 0.25)

    @_through_float32
    def acosh(self) -> Tensor:
        """log(x + sqrt(x^2 - 1)), log(2x) beyond 1e4 (gradient 0 at inf); nan below 1."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        x = self._float()
        big = x > 1e4
        small = big.where(2.0, x)
        y = big.where(big.where(x, 2.0).log() + math.log(2), (small + (small * small - 1).sqrt()).log())
        out = (x < 1).where(math.nan, y)
        if Tensor.no_grad:
            return out
        x_node = x.node

        def rule(grad: Node) -> tuple[Node]:  # PyTorch's 1 / sqrt(x^2 - 1) everywhere (also below -1)
            t = Tensor(x_node)
            return ((Tensor(grad) * (t * t - 1).sqrt().reciprocal()).node,)

        return x._from(autodiff.custom_gradient(out.node, (x_node,), rule, "acosh"))

    @_through_float32
    def atanh(self) -> Tensor:
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        x = self._float()
        out = x._near_zero(((1 + x) / (1 - x)).log() * 0.5, _ATANH_SERIES, 0.25)
        if Tensor.no_grad:
            return out
        x_node = x.node

        def rule(grad: Node) -> tuple[Node]:  # PyTorch's 1 / (1 - x^2): inf at +-1, -0 at +-inf (not nan)
            t = Tensor(x_node)
            return ((Tensor(grad) * (1 - t * t).reciprocal()).node,)

        return x._from(autodiff.custom_gradient(out.node, (x_node,), rule, "atanh"))

    def square(self) -> Tensor:
        return self * self

    @_through_float32
    def lerp(self, end: Tensor, weight) -> Tensor:
        """PyTorch's formula: self + w (end - self) for |w| < 0.5, else end - (end - self)(1 - w) (exactly
        end at w = 1)."""
        step = end - self
        if isinstance(weight, (int, float)):
            return self + step * weight if abs(weight) < 0.5 else end - step * (1 - weight)
        return (weight.abs() < 0.5).where(self + step * weight, end - step * (1 - weight))

    # activations
    def relu(self) -> Tensor:
        return ((self > 0) | self.isnan()).where(self, 0)

    def leakyrelu(self, neg_slope: float = 0.01) -> Tensor:
        return (self > 0).where(self, self * neg_slope)

    def leaky_relu(self, negative_slope: float = 0.01) -> Tensor:
        return self.leakyrelu(negative_slope)

    @_through_float32
    def elu(self, alpha: float = 1.0) -> Tensor:
        """x above 0, alpha * (exp(x) - 1) at or below (exp of 0 elsewhere: no inf * 0 in the gradient)."""
        neg = (self < 0) | (self == 0)  # not `<=`: NaN takes the linear side, as in PyTorch
        return neg.where((neg.where(self, 0).exp() - 1) * alpha, self)

    @_through_float32
    def sigmoid(self) -> Tensor:
        """With e = exp(-|x|) (in (0, 1]: it never overflows, so the gradient at large |x| is 0, not
        inf * 0) and s = 1 / (1 + e): s for x >= 0, e * s (= exp(x) / (1 + exp(x))) below. One exp and one
        reciprocal per element, forward and backward."""
        x = self._float()
        pos = x >= 0
        e = (-pos.where(x, -x)).exp()
        s = (1 + e).reciprocal()
        return pos.where(s, e * s)

    @_through_float32
    def tanh(self) -> Tensor:
        x = self._float()
        return x._near_zero(x._tanh_far(), _TANH_SERIES, 0.3)

    def _tanh_far(self) -> Tensor:
        """tanh as 2 * sigmoid(2x) - 1: absolute error ~1e-7, so relative error grows near 0 (see _near_zero);
        enough for 1 + tanh (GELU's)."""
        return 2.0 * (2.0 * self).sigmoid() - 1.0

    def _near_zero(self, far: Tensor, series: tuple[float, ...], limit: float) -> Tensor:
        """`far` (an odd function's formula, which cancels near 0: tanh(1e-8) was 0, erf(1e-5) 1.7% off),
        with x * sum(series[k] * x^2k) where |x| < limit: there the series' next term, and beyond it the
        formula's error, is within a few float32 roundings of the value (float64: within limit / 20). The
        series reads x only where it is taken, so its gradient is finite everywhere."""
        x = self
        small = x.abs() < (limit / 20 if x.dtype == dtypes.float64 else limit)
        z = small.where(x, 0.0)
        z2, poly = z * z, z * 0
        for c in reversed(series):
            poly = poly * z2 + c
        return small.where(z * poly, far)

    @_through_float32
    def erf(self) -> Tensor:
        """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), its Taylor series near 0 (_near_zero)."""
        x = self._float()
        return x._near_zero(x._erf_far(), _ERF_SERIES, 0.5)

    def _erf_far(self) -> Tensor:
        """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7) on a = |x| capped at 10 (erf is 1 there), the sign
        put back by where(): the gradient is 2/sqrt(pi) at 0 and 0 at +-inf. Enough for 1 + erf (GELU's)."""
        x = self
        pos = x >= 0
        a = pos.where(x, -x)
        a = (a > 10).where(10.0, a)
        t = (1.0 + 0.3275911 * a).reciprocal()  # in [0.23, 1]: no scaling against overflow (see _true_divide)
        poly = t * (
            0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
        )
        y = 1.0 - poly * (-a * a).exp()
        return pos.where(y, -y)

    @_through_float32
    def gelu(self, approximate: str = "none") -> Tensor:
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        if approximate not in ("none", "tanh"):
            raise ArgumentError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")
        if approximate == "tanh":  # 0.5 * x * (1 + tanh(u)) = x * sigmoid(2u): fewer ops and roundings
            inner = (2 * math.sqrt(2 / math.pi)) * (self + 0.044715 * self * self * self)
            out = self * inner._float().sigmoid()
            if Tensor.no_grad:
                return out
            x_node = self.node

            def rule(grad: Node) -> tuple[Node]:
                # d/dx x * s(z) = s + x * s * (1 - s) * z'(x), s * (1 - s) = e / (1 + e)^2 with e = exp(-|z|):
                # about 20 operations (the composed gradient of the line above had 50, and one division more)
                x = Tensor(x_node)._float()
                z = (2 * math.sqrt(2 / math.pi)) * (x + 0.044715 * x * x * x)
                pos = z >= 0
                e = (-pos.where(z, -z)).exp()
                r = (1 + e).reciprocal()
                slope = (2 * math.sqrt(2 / math.pi)) * (1 + 3 * 0.044715 * x * x)
                return ((Tensor(grad) * (pos.where(r, e * r) + x * (e * r * r) * slope)).node,)

            return self._from(autodiff.custom_gradient(out.node, (x_node,), rule, "gelu"))
        return 0.5 * self * (1 + (self * (1 / math.sqrt(2)))._float()._erf_far())

    @_through_float32
    def quick_gelu(self) -> Tensor:
        return self * (self * 1.702).sigmoid()

    @_through_float32
    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def swish(self) -> Tensor:
        return self.silu()

    @_through_float32
    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        # max(bx, 0) + log(1 + exp(-|bx|)): no overflow, so no inf * 0 in the gradient (and 1/2 at 0)
        bx = self * beta
        linear = bx > threshold
        bx = linear.where(0.0, bx)  # the smooth branch never sees inf (no inf - inf in its gradient)
        m = bx.maximum(0)
        return linear.where(self, (m + (1 + (bx - 2 * m).exp()).log()) * (1 / beta))

    @_through_float32
    def mish(self) -> Tensor:
        return self * self.softplus().tanh()

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """clip, with PyTorch's gradient: 0 at the bounds too (clip's is 1 there)."""
        outside = (self < min_val) | (self == min_val) | (self > max_val) | (self == max_val)
        return outside.where(self.clip(min_val, max_val).detach(), self)  # NaN is inside, as in PyTorch

    @_through_float32
    def hardsigmoid(self) -> Tensor:
        """x / 6 + 1/2 clipped to [0, 1]; PyTorch's gradient: 1/6 strictly inside (-3, 3), else 0 (NaN
        too)."""
        inside = (self > -3) & (self < 3)
        return inside.where(self / 6 + 0.5, (self / 6 + 0.5).clip(0, 1).detach())

    def relu6(self) -> Tensor:
        return self.hardtanh(0, 6)

    @_through_float32
    def hardswish(self) -> Tensor:
        # PyTorch's pieces: 0 below -3, x (x + 3) / 6 up to 3 (gradient -0.5 at -3), x above (and at NaN)
        low = self < -3
        mid = low.logical_not() & ((self < 3) | (self == 3))
        xm = mid.where(self, 0.0)  # the middle piece never sees +-inf (no inf * 0 in its gradient)
        return low.where(self * 0, mid.where(xm * (xm + 3) * (1 / 6), self))

    @_through_float32
    def celu(self, alpha: float = 1.0) -> Tensor:
        neg = (self < 0) | (self == 0)
        return neg.where(((neg.where(self, 0) / alpha).exp() - 1) * alpha, self)

    @_through_float32
    def selu(self) -> Tensor:
        alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
        return self.elu(alpha) * scale

    @_through_float32
    def softsign(self) -> Tensor:
        return self / (1 + self.abs())

    @_through_float32
    def logsigmoid(self) -> Tensor:
        return -(-self).softplus()

    def clip(self, min_=None, max_=None) -> Tensor:
        if min_ is None and max_ is None:
            raise ArgumentError("clip needs min or max (or both)")
        out = self
        # a Python bound that stays in self's dtype must fit it (PyTorch raises; uint8's -1 wraps to 255)
        min_, max_ = (
            check_fits(b, self.dtype, "clamp", strict_float=True)
            if type(b) in (int, float) and promote_scalar(self.dtype, b) is self.dtype
            else b for b in (min_, max_)
        )
        if min_ is not None:
            out = _or_nan_bound(out < min_, min_).where(min_, out)
        if max_ is not None:
            out = _or_nan_bound(out > max_, max_).where(max_, out)
        return out

    def clamp(self, min=None, max=None) -> Tensor:  # noqa: A002 - PyTorch's names
        return self.clip(min, max)
