"""Tensor's linear algebra: matmul, einsum, linear."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from tgrad.dtype import dtypes, promote
from tgrad.errors import ArgumentError, DeviceError, DTypeError, ShapeError
from tgrad.ops.helpers import _matmul_node

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


def _x(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _check_batch(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """matmul's batch dimensions (all but the last two) must broadcast: else a ShapeError naming the user's
    shapes and the first batch dimension that differs (PyTorch's message names it too)."""
    ba, bb = a[:-2], b[:-2]
    n = max(len(ba), len(bb))
    pa, pb = (1,) * (n - len(ba)) + ba, (1,) * (n - len(bb)) + bb
    for i, (p, q) in enumerate(zip(pa, pb)):
        if p != q and p != 1 and q != 1:
            raise ShapeError(
                f"matmul: batch dimensions {ba} of {a} and {bb} of {b} do not broadcast: the size of "
                f"tensor a ({p}) must match the size of tensor b ({q}) at non-singleton dimension {i}"
            )


class LinalgOps:
    """Tensor's linear algebra (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def matmul(self, w: Tensor) -> Tensor:
        """x @ w with PyTorch's rules (1-d operands, broadcast batch dimensions, promoted dtypes): the
        product (..., n, 1, k) * (..., 1, m, k) summed over k (helpers._matmul_node builds it as nodes;
        the optimizer treats that reduce as a contraction)."""
        x = self
        if not isinstance(w, type(self)):
            w = type(self)(w, device=x.device)
        xs, ws = x.node.shape, w.node.shape
        if not xs or not ws:
            raise ShapeError(f"matmul: both arguments need at least 1 dimension, got {xs} and {ws}")
        if xs[-1] != ws[-2 if len(ws) > 1 else -1]:
            mats = f" (mat1 and mat2 shapes cannot be multiplied ({_x(xs)} and {_x(ws)}))" \
                if len(xs) == len(ws) == 2 else ""
            raise ShapeError(
                f"matmul: inner dimensions differ: {xs} @ {ws} "
                f"({xs[-1]} != {ws[-2 if len(ws) > 1 else -1]}){mats}"
            )
        if xs[:-2] != ws[:-2] and len(xs) > 1 and len(ws) > 1:
            _check_batch(xs, ws)
        if x.device != w.device:
            raise DeviceError(
                f"matmul: tensors are on different devices ({x.device} and {w.device}); move one with .to()")
        dt = x.dtype if x.dtype is w.dtype else promote(x.dtype, w.dtype)
        if dt == dtypes.bool:
            raise DTypeError("matmul: not defined for bool tensors (as in PyTorch); cast them to numbers")
        xv = x if len(xs) > 1 else x.unsqueeze(0)
        wv = w if len(ws) > 1 else w.unsqueeze(-1)
        out = x._from(_matmul_node(xv.cast(dt).node, wv.cast(dt).node), w)
        if len(xs) == 1:
            out = out.squeeze(-2)
        if len(ws) == 1:
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
            # (summed below: the products of a contraction, which may run as a matmul)
            product = t if product is None else product._contract_mul(t)
        out = product._broadcast_to(tuple(sizes[c] for c in order))
        return out.sum(tuple(range(len(rhs), len(order))), dtype=dtype) if len(order) > len(rhs) else out

    def dot(self, w: Tensor) -> Tensor:
        return self.matmul(w)

    def sequential(self, layers) -> Tensor:
        """Apply each layer (any callable) in turn: x.sequential([l1, relu, l2]) (tinygrad's)."""
        return functools.reduce(lambda x, f: f(x), layers, self)

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """x @ weight.T + bias, with weight of shape (out_features, in_features) as in PyTorch."""
        wshape = weight.shape if isinstance(weight, type(self)) else None
        if self.ndim and wshape is not None and len(wshape) == 2 and self.shape[-1] != wshape[1]:
            rows = self.numel() // self.shape[-1] if self.shape[-1] else 0
            raise ShapeError(
                f"linear: input {self.shape} has {self.shape[-1]} features, weight {wshape} (out_features, "
                f"in_features) takes {wshape[1]} (mat1 and mat2 shapes cannot be multiplied "
                f"({_x((rows, self.shape[-1]))} and {_x(wshape[::-1])}))"
            )
        out = self.matmul(weight.T)
        return out + bias if bias is not None else out
