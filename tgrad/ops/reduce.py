"""Tensor's reductions: sum, max, mean, var..., softmax and its kin, sort and topk, cumulative ops;
multinomial sampling (a host step over the weights and uniform draws)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tgrad import autodiff, symbolic, symbolic_ops
from tgrad import graph as g
from tgrad import realize as driver
from tgrad.dtype import dtypes
from tgrad.errors import DTypeError, IndexRangeError, SamplingError, ShapeError
from tgrad.graph import Node, Op
from tgrad.ops.helpers import _exp_node, _expand_node, _log_node, _normalize_axis, _shift_by_max

if TYPE_CHECKING:
    from tgrad.tensor import Tensor

_SYM_DATA = g.SYM.data  # (non-empty only while a tensor with a symbolic axis lives)
# argmax / argmin of an axis of 2**31 elements or more work in blocks of this many (_arg_first_max_blocked;
# its positions 1..ARG_BLOCK are int16)
ARG_BLOCK = 1 << 14
# float16 is summed and multiplied in float32, and float16 and bfloat16 averaged (mean, var, std) in
# float32, each rounded once at the end as PyTorch's reductions do (its acc_type): every device then
# gives PyTorch's value whatever its emitter's accumulator, and a half mean of 70000 elements is not
# divided by a half 1 / 70000 (a subnormal) nor a var by a half 69999 (inf)
_NARROW_FLOATS = (dtypes.float16, dtypes.bfloat16)



def _sample(replacement: bool):
    """multinomial's host step: inputs (weights (rows, n), uniform draws (rows, k)) -> indices (rows, k).
    With replacement each draw is looked up in the row's cumulative sum (a zero weight's category is never
    taken); without, the k largest keys log(1 - u) / w (Efraimidis-Spirakis: a weighted draw without
    replacement), zero weights last, by position. PyTorch's checks, on the values."""

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        w, u = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
        if not np.isfinite(w).all() or (w < 0).any():
            raise SamplingError("multinomial: probability tensor contains either inf, nan or element < 0")
        total = w.sum(-1)
        if (total <= 0).any():
            raise SamplingError(f"multinomial: invalid multinomial distribution (sum of probabilities <= 0) "
                                f"in row {int(np.argmax(total <= 0))}")
        if replacement:
            cdf = np.cumsum(w, -1)
            for i in range(w.shape[0]):
                ids = np.searchsorted(cdf[i], u[i] * cdf[i, -1], side="right")
                outputs[0][i] = np.minimum(ids, w.shape[1] - 1)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                keys = np.where(w > 0, np.log1p(-u) / w, -np.inf)
            outputs[0][...] = np.argsort(-keys, -1, kind="stable")[:, : outputs[0].shape[1]]

    return run


def _pairwise_limit(op: str, axis: int, n: int) -> None:
    """Ops that compare every pair of positions along an axis (sort, topk, cumulative ops) take at most
    2**31 - 1 of them: more raise a ShapeError naming the limit (their position tensors would hold 17 GB
    of int64 before the n**2 comparisons)."""
    if n > dtypes.int32.max:
        raise ShapeError(f"{op}: axis {axis} has {n} elements, more than {op} takes ({dtypes.int32.max}); "
                         "work on pieces of it (a reshape to (k, -1))")


class ReduceOps:
    """Tensor's reductions (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def _axes(self, axis, op: str) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        if type(axis) is int:  # (the common case first)
            return (_normalize_axis(axis, self.ndim, op),)
        if isinstance(axis, (int, np.integer)):
            axis = (axis,)
        if not isinstance(axis, (tuple, list)) or not all(isinstance(a, (int, np.integer)) for a in axis):
            raise DTypeError(f"{op}: dim must be an int or a tuple of ints, got {axis!r}")
        axes = [_normalize_axis(a, self.ndim, op) for a in axis]
        if len(set(axes)) != len(axes):
            raise IndexRangeError(f"{op}: dim {tuple(axis)} names an axis more than once")
        return tuple(sorted(axes))

    def _reduce(self, kind: str, axis, keepdim: bool, op: str) -> Tensor:
        axes = self._axes(axis, op)
        node = self.node
        if not node.shape:
            return self
        if kind != "MAX" and node.dtype.name == "float16":  # (bfloat16's own sums accumulate in float32)
            return self.cast(dtypes.float32)._reduce(kind, axes, keepdim, op).cast(self.dtype)
        if kind == "MAX" and op != "any" and any(self.shape[a] == 0 for a in axes):
            # no identity to return (PyTorch raises too; any() of nothing is False)
            raise IndexRangeError(f"{op}(): the reduced dimension of shape {self.shape} has size 0")
        if keepdim:
            return self._from(g.reduce(node, kind, axes))
        if _SYM_DATA:  # (reshape() keeps symbolic axes)
            shape = tuple(s for i, s in enumerate(self.shape) if i not in axes)
            return self._from(g.reduce(node, kind, axes)).reshape(shape)
        shape = node.shape
        if len(axes) == 1:  # (the usual cases without a generator: one axis, or all of them)
            shape = shape[: axes[0]] + shape[axes[0] + 1 :]
        else:
            shape = () if len(axes) == len(shape) else tuple(s for i, s in enumerate(shape) if i not in axes)
        return self._from(g.move(g.reduce(node, kind, axes), Op.RESHAPE, shape))

    def sum(self, axis=None, keepdim: bool = False, dtype=None, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self
        if dtype is not None:
            x = x.cast(dtype)
        elif x.dtype.kind in "biu":
            x = x.cast(dtypes.int64)  # PyTorch sums bool and integers as int64
        return x._reduce("SUM", axis, keepdim, "sum")

    def prod(self, axis=None, keepdim: bool = False, dtype=None, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        x = (
            self.cast(dtype)
            if dtype is not None
            else (self.cast(dtypes.int64) if self.dtype.kind in "biu" else self)
        )
        return x._reduce("PROD", axis, keepdim, "prod")

    def max(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        return self._reduce("MAX", axis, keepdim, "max")

    def min(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        if self.dtype.is_float:
            return -((-self).max(axis, keepdim))
        return ~((~self).max(axis, keepdim))

    def amax(self, axis=None, keepdim=False) -> Tensor:
        return self.max(axis, keepdim)

    def amin(self, axis=None, keepdim=False) -> Tensor:
        return self.min(axis, keepdim)

    def mean(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self._float()
        if x.dtype in _NARROW_FLOATS:
            return x.cast(dtypes.float32).mean(axis, keepdim).cast(x.dtype)
        axes = self._axes(axis, "mean")
        if symbolic.has_var(x.shape[a] for a in axes):  # a variable's extent: its value at launch
            return symbolic_ops.mean(x, axes, keepdim)
        n = math.prod(self.shape[a] for a in axes)
        total = x.sum(axis, keepdim)
        return total * (1 / n) if n else total * math.nan

    def var(self, axis=None, keepdim: bool = False, correction: int = 1, dim=None, unbiased=None) -> Tensor:
        axis = dim if dim is not None else axis
        if unbiased is not None:
            correction = int(unbiased)
        x = self._float()
        if x.dtype in _NARROW_FLOATS:
            return x.cast(dtypes.float32).var(axis, keepdim, correction).cast(x.dtype)
        axes = self._axes(axis, "var")
        if symbolic.has_var(x.shape[a] for a in axes):  # a variable's extent: its value at launch
            return symbolic_ops.var(x, axes, keepdim, correction)
        n = math.prod(self.shape[a] for a in axes)
        if n:  # shifted by one element (var does not change): no overflowing mean of [3e38, 3e38]
            x = x - x.shrink(tuple((0, 1) if i in axes else (0, s) for i, s in enumerate(x.shape))).detach()
        d = x - x.mean(axis, keepdim=True)
        out = d.square().sum(axis, keepdim) / max(0, n - correction)  # n <= correction: x / 0, inf or nan
        if n - correction > 0 or type(self).no_grad or not x.requires_grad:
            return out
        # no degrees of freedom: PyTorch's gradients (its var_backward). Over every element: g * inf, nan
        # where x is the mean; over axes: g * 2 / (n - correction) * (x - mean), unclamped (inf times x -
        # mean for n == correction, finite past it). The composed gradient would add the mean's path,
        # inf - inf: nan everywhere
        Tensor, d_node, every = type(self), d.node, axis is None or x.ndim == 0
        kept = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        scale = 2 / (n - correction) if n != correction else math.inf

        def rule(grad: Node) -> tuple[Node]:
            g_, dd = Tensor(grad).reshape(kept), Tensor(d_node)
            return ((g_ * (dd == 0).where(math.nan, math.inf) if every else g_ * scale * dd).node,)

        return x._from(autodiff.custom_gradient(out.node, (x.node,), rule, "var"))

    def std(self, axis=None, keepdim: bool = False, correction: int = 1, dim=None, unbiased=None) -> Tensor:
        if self.dtype in _NARROW_FLOATS:
            return self.cast(dtypes.float32).std(axis, keepdim, correction, dim, unbiased).cast(self.dtype)
        var = self.var(axis, keepdim, correction, dim, unbiased)
        out = var.sqrt()
        if type(self).no_grad or not var.requires_grad:
            return out
        Tensor = type(self)

        def rule(grad: Node, std: Node) -> tuple[Node]:  # PyTorch's: 0 where the deviation is 0 (not nan)
            s = Tensor(std)
            return (((s == 0).where(0, Tensor(grad) / (s * 2))).node,)

        return var._from(autodiff.custom_gradient(out.node, (var.node,), rule, "std", reads_output=True))

    def std_mean(self, axis=None, keepdim: bool = False, correction: int = 1, dim=None) -> tuple[Tensor, ...]:
        axis = dim if dim is not None else axis
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def var_mean(self, axis=None, keepdim: bool = False, correction: int = 1, dim=None) -> tuple[Tensor, ...]:
        axis = dim if dim is not None else axis
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """self / max(||self||_p over dim, eps) (PyTorch's F.normalize)."""
        if p == 0:  # the number of nonzero elements, as PyTorch's vector norm
            norm = (self != 0).sum(dim, keepdim=True).cast(self.dtype)
        elif p == 2:
            norm = self.square().sum(dim, keepdim=True).sqrt()
        else:
            norm = self.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
        return self / norm.maximum(eps)

    def softmin(self, axis: int = -1, dim=None) -> Tensor:
        return (-self).softmax(axis, dim)

    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        """(values, indices) sorted along dim; stable (equal values keep their order); nan sorts last
        ascending, first descending, like PyTorch. Compares every pair: O(n**2) along dim."""
        d = _normalize_axis(dim, self.ndim, "sort")
        _pairwise_limit("sort", d, self.shape[d] if self.ndim else 1)
        x = (self.reshape(1) if self.ndim == 0 else self).transpose(d, -1)
        a, b = x.unsqueeze(-1), x.unsqueeze(-2)  # a: element i, b: element j
        before = (b > a) if descending else (b < a)
        if self.dtype.is_float:
            before = before | (b.isnan() & a.isnan().logical_not() if descending else
                               a.isnan() & b.isnan().logical_not())
            same = (b == a) | (a.isnan() & b.isnan())
        else:
            same = b == a
        n = x.shape[-1]
        pos = type(self).arange(n, device=self.device, dtype=dtypes.default_int)
        rank = (before | (same & (pos < pos.reshape(n, 1)))).sum(-1)  # where element i goes
        to = rank.unsqueeze(-2) == pos.reshape(n, 1)  # to[..., r, i]: element i lands at r
        zero = False if self.dtype == dtypes.bool else 0
        values = to.where(x.unsqueeze(-2), zero).sum(-1, dtype=self.dtype)
        indices = to.where(pos, 0).sum(-1, dtype=pos.dtype)
        return self._unprefix(values, d), self._unprefix(indices, d)

    def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:  # noqa: A002
        """The k largest (or smallest) values along dim and their indices, in sorted order."""
        d = _normalize_axis(dim, self.ndim, "topk")
        n = self.shape[d] if self.ndim else 1
        if not 0 <= k <= n:
            raise IndexRangeError(f"topk: k={k} is out of range for dimension {d} of size {n}")
        values, indices = self.sort(d, descending=largest)
        arg = [None] * self.ndim
        if self.ndim:
            arg[d] = (0, k)
        return values.shrink(arg), indices.shrink(arg)

    def _arg_first_max(self, axis, keepdim: bool, positions=dtypes.int32) -> Tensor:
        if axis is None:
            return self.reshape(-1)._arg_first_max(0, keepdim=False)
        axis = _normalize_axis(axis, self.ndim, "argmax")
        n = self.shape[axis]
        if n == 0:
            raise IndexRangeError(f"argmax/argmin: dimension {axis} of shape {self.shape} has size 0")
        if n > dtypes.int32.max:  # its positions would not fit the int32 numbers below
            return self._arg_first_max_blocked(axis, keepdim)
        m = self.max(axis, keepdim=True)
        is_max = self == m
        if self.dtype.is_float:  # a NaN is the maximum (PyTorch: the first NaN's index)
            is_max = is_max | (self.isnan() & m.isnan())
        rev = type(self).arange(n, 0, -1, device=self.device, dtype=positions)
        rev = rev.reshape((n,) + (1,) * (self.ndim - axis - 1))
        best = is_max.where(rev, 0).max(axis, keepdim)
        return (n - best).cast(dtypes.default_int)

    def _arg_first_max_blocked(self, axis: int, keepdim: bool) -> Tensor:
        """_arg_first_max along an axis of 2**31 elements or more: the axis (moved last) padded to blocks
        of ARG_BLOCK with values that never win (they come last, so ties keep the first position), the
        first maximum of each block and the first block holding the overall maximum; the int64 position
        is block * ARG_BLOCK + the position in it."""
        n, last = self.shape[axis], self.ndim - 1
        x = self.permute([i for i in range(self.ndim) if i != axis] + [axis])
        blocks = -(-n // ARG_BLOCK)
        low = -math.inf if self.dtype.is_float else (False if self.dtype == dtypes.bool else self.dtype.min)
        x = x.pad([(0, 0)] * last + [(0, blocks * ARG_BLOCK - n)], value=low)
        x = x.reshape(*x.shape[:-1], blocks, ARG_BLOCK)
        within = x._arg_first_max(-1, False, dtypes.int16)  # (..., blocks); (int16: NUMPY holds them all)
        block = x.max(-1)._arg_first_max(-1, True)  # (..., 1)
        out = block * ARG_BLOCK + within.gather(-1, block)
        out = out.reshape(self.shape[:axis] + self.shape[axis + 1 :])
        return out.unsqueeze(axis) if keepdim else out

    def argmax(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        return self._arg_first_max(axis, keepdim)

    def argmin(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        return (-self if self.dtype.is_float else ~self)._arg_first_max(axis, keepdim)

    def any(self, axis=None, keepdim: bool = False) -> Tensor:
        return self.bool()._reduce("MAX", axis, keepdim, "any")

    def all(self, axis=None, keepdim: bool = False) -> Tensor:
        return self.bool().logical_not().any(axis, keepdim).logical_not()

    def softmax(self, axis: int = -1, dim=None, dtype=None) -> Tensor:
        """PyTorch's softmax; dtype: the input is cast to it first (as F.softmax's dtype=)."""
        if dtype is not None:
            return self.cast(dtype).softmax(axis, dim)
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        axis = dim if dim is not None else axis
        x = self._float()
        if x.node.dtype.name == "float16":  # in float32, rounded once (as PyTorch: ops/math._through_float32)
            return x.cast(dtypes.float32).softmax(axis).cast(x.dtype)
        ax = _normalize_axis(axis, x.ndim, "softmax")
        if x.ndim and x.shape[ax] == 0:
            return x  # nothing to normalize (PyTorch returns the empty tensor too)
        # the result does not depend on the shift, so no gradient flows through the max:
        # e = (x - x.max(axis, keepdim=True).detach()).exp(); p = e * e.sum(axis, keepdim=True).reciprocal()
        # (the sum is >= 1: no overflowing reciprocal), as graph nodes; a 0-d tensor reduces over no axis
        axes = (ax,) if x.ndim else ()
        e = _exp_node(_shift_by_max(x.node, axes))
        p = x._from(g.alu(Op.MUL, e, _expand_node(g.alu(Op.RECIP, g.reduce(e, "SUM", axes)), e.shape)))
        if Tensor.no_grad:
            return p
        def rule(grad: Node, out: Node) -> tuple[Node]:  # PyTorch's p * (g - sum(g * p)), reading the
            g, q = Tensor(grad), Tensor(out)  # output p (the node the forward realized), not exp again
            return ((q * (g - (g * q).sum(axis, keepdim=True))).node,)

        return x._from(autodiff.custom_gradient(p.node, (x.node,), rule, "softmax", reads_output=True))

    def log_softmax(self, axis: int = -1, dim=None, dtype=None) -> Tensor:
        """PyTorch's log_softmax; dtype: the input is cast to it first (as F.log_softmax's dtype=)."""
        if dtype is not None:
            return self.cast(dtype).log_softmax(axis, dim)
        axis = dim if dim is not None else axis
        x = self._float()
        if x.node.dtype.name == "float16":  # in float32, rounded once
            return x.cast(dtypes.float32).log_softmax(axis).cast(x.dtype)
        ax = _normalize_axis(axis, x.ndim, "log_softmax")
        if x.ndim and x.shape[ax] == 0:
            return x
        # m - m.exp().sum(axis, keepdim=True).log() with m = x - x.max(axis, keepdim=True).detach(), as nodes
        axes = (ax,) if x.ndim else ()
        m = _shift_by_max(x.node, axes)
        lse = _log_node(g.reduce(_exp_node(m), "SUM", axes))
        return x._from(g.alu(Op.SUB, m, _expand_node(lse, m.shape)))

    def logsumexp(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self._float()
        if x.dtype == dtypes.float16:  # in float32, rounded once
            return x.cast(dtypes.float32).logsumexp(axis, keepdim).cast(x.dtype)
        if x.ndim and any(x.shape[a] == 0 for a in x._axes(axis, "logsumexp")):
            return x.exp().sum(axis, keepdim=keepdim).log()  # log(0): -inf as in PyTorch (no max to shift by)
        m = x.max(axis, keepdim=True).detach()
        m = m.isinf().where(0, m)  # an all -inf row gives -inf, a +inf gives inf (not nan)
        out = (x - m).exp().sum(axis, keepdim=True).log() + m
        return (
            out
            if keepdim
            else out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in x._axes(axis, "lse")))
        )

    def _prefixes(self, axis: int, fill, op: str) -> tuple[Tensor, int]:
        """For each position i along axis, the row of elements 0..i (the rest `fill`) on a new last axis:
        (..., n) with axis moved last -> (..., n, n). Cumulative ops reduce that last axis."""
        axis = _normalize_axis(axis, self.ndim, op)
        x = self.reshape(1) if self.ndim == 0 else self
        n = x.shape[axis]
        _pairwise_limit(op, axis, n)  # (positions are int32 numbers below)
        idx = type(self).arange(n, device=self.device, dtype=dtypes.int32)
        lower = idx.reshape(n, 1) >= idx.reshape(1, n)  # lower[i, j] = j <= i
        return lower.where(x.transpose(axis, -1).unsqueeze(-2), fill), axis

    def _unprefix(self, out: Tensor, axis: int) -> Tensor:
        """The result of a cumulative op back in this tensor's layout."""
        return out.transpose(axis, -1).reshape(self.shape)

    def cumsum(self, axis: int = 0, dim=None) -> Tensor:
        rows, axis = self._prefixes(dim if dim is not None else axis, 0, "cumsum")
        return self._unprefix(rows.sum(-1, dtype=self.dtype if self.dtype.is_float else None), axis)

    def cumprod(self, axis: int = 0, dim=None) -> Tensor:
        rows, axis = self._prefixes(dim if dim is not None else axis, 1, "cumprod")
        return self._unprefix(rows.prod(-1), axis)

    def cummax(self, axis: int = 0, dim=None) -> tuple[Tensor, Tensor]:
        """(values, indices) of the running maximum; the index is the last position of the maximum."""
        low = -math.inf if self.dtype.is_float else (False if self.dtype == dtypes.bool else self.dtype.min)
        if self.numel() == 0:  # nothing to scan: empty values and indices of the same shape
            self._axes(dim if dim is not None else axis, "cummax")
            return self, type(self).zeros(*self.shape, dtype=dtypes.default_int, device=self.device)
        rows, axis = self._prefixes(dim if dim is not None else axis, low, "cummax")
        values = rows.max(-1)
        n = rows.shape[-1]
        pos = type(self).arange(n, device=self.device, dtype=dtypes.default_int)
        same = rows == values.unsqueeze(-1)
        if self.dtype.is_float:  # a nan is the maximum from where it appears on: the last nan's index
            same = same | (rows.isnan() & values.unsqueeze(-1).isnan())
        hit = same & (pos.reshape(n, 1) >= pos)  # only j <= i can be the max
        indices = hit.where(pos, -1).max(-1)
        if self.dtype.is_float:  # the value taken at its index: the gradient goes there alone (ties, nan)
            values = (pos == indices.unsqueeze(-1)).where(rows, 0).sum(-1, dtype=self.dtype)
        return self._unprefix(values, axis), self._unprefix(indices, axis)

    def cummin(self, axis: int = 0, dim=None) -> tuple[Tensor, Tensor]:
        """(values, indices) of the running minimum; the index is the last position of the minimum."""
        values, indices = (-self if self.dtype.is_float else ~self).cummax(axis, dim)
        return (-values if self.dtype.is_float else ~values), indices

    def logcumsumexp(self, axis: int = 0, dim=None) -> Tensor:
        rows, axis = self._float()._prefixes(dim if dim is not None else axis, -math.inf, "logcumsumexp")
        return self._unprefix(rows.logsumexp(-1), axis)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """torch.multinomial: num_samples category indices drawn from each row of weights (1 or 2 dims, not
        necessarily summing to 1), as default-int indices of shape (num_samples,) or (rows, num_samples).
        Integer weights are taken too (tinygrad's); PyTorch's errors for negative, nan or inf weights and
        a row of zeros. The uniform draws are Tensor.rand's (manual_seed, fresh on each TinyJit replay)."""
        if self.ndim not in (1, 2):
            raise SamplingError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {self.shape}")
        if not self.dtype.is_float and (self.dtype == dtypes.bool or not self.dtype.is_int):
            raise SamplingError(f"multinomial: weights must be numbers, got {self.dtype.name}")
        if not isinstance(num_samples, (int, np.integer)) or isinstance(num_samples, bool):
            raise SamplingError(f"multinomial: num_samples must be an int, got {num_samples!r}")
        if num_samples <= 0:
            raise SamplingError(f"multinomial: cannot sample n_sample <= 0 samples (got {num_samples})")
        num_samples = int(num_samples)
        w = self.reshape(1, -1) if self.ndim == 1 else self
        rows, n = w.shape
        if not replacement and num_samples > n:
            raise SamplingError(f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples without "
                                f"replacement ({num_samples} > {n})")
        if n == 0:
            raise SamplingError("multinomial: invalid multinomial distribution (a row of no categories)")
        if rows == 0:
            return type(self).zeros(0, num_samples, dtype=dtypes.default_int, device=self.device)
        out = [((rows, num_samples), dtypes.default_int)]
        u = type(self).rand(rows, num_samples if replacement else n, device=self.device)
        step = driver.HostStep("multinomial", _sample(bool(replacement)), out, self.device,
                               key=("multinomial", bool(replacement)))
        idx = type(self).run_host(step, w.detach(), u)[0]
        return idx.reshape(num_samples) if self.ndim == 1 else idx
