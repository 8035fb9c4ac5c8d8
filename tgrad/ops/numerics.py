"""Numerics of Tensor's float ops, as PyTorch computes them: pow's special values, division that neither
overflows nor underflows, fmod and floor division rounded once, chosen gradients, series near 0."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tgrad.device import get_runtime
from tgrad.dtype import DType, dtypes
from tgrad.graph import Op

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


# Taylor series of odd functions near 0, as coefficients of x^1, x^3, x^5... (Tensor._near_zero)
_TANH_SERIES = (1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835)
_SINH_SERIES = (1.0, 1 / 6, 1 / 120, 1 / 5040, 1 / 362880)
_ASINH_SERIES = (1.0, -1 / 6, 3 / 40, -15 / 336, 105 / 3456)
_ATANH_SERIES = (1.0, 1 / 3, 1 / 5, 1 / 7, 1 / 9, 1 / 11)
_ERF_SERIES = tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(7))

_DIVISOR_EDGE = {dtypes.float64: 1000}  # else (float32) 100: see _true_divide


def _pow_value(a: Tensor, b: Tensor | float) -> Tensor:
    """a ** b for float tensors as exp2(b * log2|a|), with C pow's signs and special values: a negative
    base needs an integer exponent (else nan; -inf gives inf or 0), b == 0 gives 1. A Python exponent's
    cases are decided here (no constant-only expressions in the kernel). float16 in float32, rounded once
    (log2, the product and exp2 each rounded to float16 were a few float16 steps off PyTorch's)."""
    if a.dtype == dtypes.float16:
        wide = b.cast(dtypes.float32) if isinstance(b, type(a)) else b
        return _pow_value(a.cast(dtypes.float32), wide).cast(a.dtype)
    if not isinstance(b, type(a)):
        if b == 0:
            return a.ones_like()
        if math.isnan(b):  # C's pow(1, nan) is 1
            return (a == 1).where(1.0, math.nan)
        mag = (a.abs().log2() * b).exp2()
        mag = (a == 0).where(0.0 if b > 0 else math.inf, mag)  # not through log2(0): undefined on some GPUs
        if math.isinf(b):  # |a| < 1 -> 0 or inf, |a| > 1 -> inf or 0, |a| == 1 -> 1, whatever a's sign
            return (a.abs() == 1).where(1.0, mag)
        if float(b).is_integer():
            return _signbit(a).where(-mag, mag) if int(b) % 2 else mag  # (-0.0) ** -3 is -inf
        return (a < 0).where((a == -math.inf).where(mag, math.nan), mag)
    mag = (b * a.abs().log2()).exp2()
    is_int = b.trunc() == b
    odd = is_int & ((b.abs() % 2) == 1)
    signed = odd.where(-mag, mag)
    not_int = (a == -math.inf).where(mag, math.nan)
    out = (a < 0).where(is_int.where(signed, not_int), mag)
    zero_base = (b > 0).where(0.0, (b < 0).where(b._const(math.inf), math.nan))  # 0 ** nan is nan
    zero_base = (odd & _signbit(a)).where(-zero_base, zero_base)  # (-0.0) ** -3 is -inf
    out = (a == 0).where(zero_base, out)  # not through log2(0): undefined on some GPUs
    one = (a == 1) | ((a == -1) & b.isinf())  # C's pow(1, nan) and pow(-1, +-inf) are 1
    return ((b == 0) | one).where(1.0, out)


def _signbit(a: Tensor) -> Tensor:
    """a < 0, and True at -0.0 too (1 / -0.0 is -inf)."""
    return (a < 0) | ((a == 0) & (a.reciprocal() < 0))


def _true_divide(a: Tensor, b: Tensor, refine: bool = False) -> Tensor:
    """a / b for float tensors as a * (1 / b), scaled so that 1 / b cannot overflow (|b| tiny) or
    underflow (|b| huge) where a / b itself is a number: 1e-5 / 1e-40 is 1e35, not inf. refine: one Newton
    step more, for the callers that round the quotient (a * (1 / a) can be 0.99999994, trunc 0)."""
    if a.dtype == dtypes.float16:  # in float32, rounded once as PyTorch's (1 / b rounded to float16 first
        return _true_divide(a.cast(dtypes.float32), b.cast(dtypes.float32), refine).cast(a.dtype)  # drifts)
    # |b| outside 2**-edge .. 2**edge is scaled by 2**+-scale: also the gradient's 1 / (b * s)**2 is finite
    edge = _DIVISOR_EDGE.get(a.dtype, 100)
    scale = {dtypes.float64: 1000}.get(a.dtype, 100)
    mag = b.abs()
    up, down, one = mag._const(2.0**scale), mag._const(2.0**-scale), mag._const(1.0)
    s = (mag < 2.0**-edge).where(up, (mag > 2.0**edge).where(down, one))
    a, b = a * s, b * s
    inv = b.reciprocal()
    q = a._alu(Op.MUL, inv)
    if not refine:
        return q
    better = q + (a - q * b) * inv
    return better.isfinite().where(better, q)


def _wider(a: Tensor) -> DType | None:
    """The next wider float type, where a's device has it (exact products and rounded quotients)."""
    wide = {dtypes.float16: dtypes.float32, dtypes.float32: dtypes.float64}.get(a.dtype)
    return wide if wide is not None and get_runtime(a.device).supports(wide) else None


def _rounded_quotient(a: Tensor, b: Tensor) -> Tensor:
    """a / b rounded once, as PyTorch's (what trunc and floor see): in the wider type where there is one."""
    wide = _wider(a)
    if wide is None:
        return _true_divide(a, b, refine=True)
    return _true_divide(a.cast(wide), b.cast(wide), refine=True).cast(a.dtype)


def _float_fmod(a: Tensor, b: Tensor) -> Tensor:
    """C's fmod for floats (the sign of a): nan where a is inf or b is 0 or either is nan, a where b is inf.
    Else a - trunc(a / b) * b in the next wider float type where the device has it: there t * b is exact
    while |a / b| < 2**29 (float32 inputs), and the result is moved back into (-|b|, |b|) where the rounded
    quotient was one off, so it is exact like PyTorch's; in the input's own type it is within an ulp of a."""
    wide = _wider(a)
    x, y = (a.cast(wide), b.cast(wide)) if wide is not None else (a, b)
    r = x - _true_divide(x, y, refine=True).trunc() * y
    step = (x < 0).where(-y.abs(), y.abs())
    r = ((r != 0) & ((r < 0) ^ (x < 0))).where(r + step, r)
    r = (r.abs() >= y.abs()).where(r - step, r)
    r = r.cast(a.dtype) if wide is not None else r
    return (b.isinf() & a.isfinite()).where(a, r)


def _float_floordiv(a: Tensor, b: Tensor) -> Tensor:
    """floor(a / b) as PyTorch and Python compute it (from fmod, so inf // 2 is nan and -0.5 // inf is
    -1): a / b where b is 0."""
    mod = _float_fmod(a, b)
    div = _true_divide(a - mod, b, refine=True)
    div = ((mod != 0) & ((b < 0) ^ (mod < 0))).where(div - 1, div)
    fl = div.floor()
    fl = (div - fl > 0.5).where(fl + 1, fl)
    quotient = _true_divide(a, b).detach()  # PyTorch's floor division has no gradient (0) anywhere
    fl = (div == 0).where((quotient < 0).where(fl._const(-0.0), 0.0), fl)
    return (b == 0).where(quotient, fl)


def _gradient_only(x: Tensor, slope: Tensor) -> Tensor:
    """A tensor of zeros whose gradient with respect to x is the constant slope (may be inf, -inf, nan), so
    that value.detach() + _gradient_only(x, slope) is value with a chosen gradient. Each special slope
    gets its own term behind a where(), so no inf * 0 from another term reaches x's gradient. Where x is
    inf or nan, x - x is not 0: there the gradient is 0 instead."""
    xf = x.isfinite().where(x, 0.0)
    u = xf - xf.detach()  # 0, gradient 1
    slope = slope.detach()
    finite = slope.isfinite()
    out = finite.where(u, 0.0) * finite.where(slope, 0.0)
    for hit, sign in ((slope == math.inf, 1.0), (slope == -math.inf, -1.0)):
        root = hit.where(u, 1.0).sqrt()  # sqrt at 0: value 0, gradient inf
        out = out + hit.where(root * sign, 0.0)
    nan = slope.isnan()
    root = nan.where(u, 1.0).sqrt()
    return out + nan.where(root * 0.0, 0.0)  # value 0, gradient 0 * inf = nan


def _or_nan_bound(hit: Tensor, bound) -> Tensor:
    """Where clip takes the bound: hit, and everywhere the bound is nan (PyTorch's clamp gives nan)."""
    if isinstance(bound, type(hit)) and bound.dtype.is_float:
        return hit | bound.isnan()
    if isinstance(bound, float) and math.isnan(bound):
        return hit.ones_like()
    return hit
