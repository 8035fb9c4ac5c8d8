"""Tensor's linear algebra: matmul, einsum, linear; svd and qr (LAPACK's, through numpy, in a host step),
newton_schulz."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from tgrad import realize as driver
from tgrad.dtype import dtypes, promote
from tgrad.errors import ArgumentError, AutogradError, DeviceError, DTypeError, ShapeError
from tgrad.graph import SYM as g_SYM
from tgrad.ops.helpers import _broadcast_shape, _matmul_node

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


def _decomposable(x: Tensor, op: str) -> None:
    """The checks torch.linalg's decompositions make (at least 2 dimensions, float32/float64), and one of
    tgrad's: their gradients are not implemented, so an input that requires one is refused (returning
    results without a gradient would make backward() silently leave out what flows through them)."""
    if x.ndim < 2:
        raise ShapeError(f"{op}: the input must have at least 2 dimensions, got shape {x.shape}")
    if x.dtype not in (dtypes.float32, dtypes.float64):
        raise DTypeError(f"{op}: expected a float32 or float64 tensor, got {x.dtype.name} (as torch.linalg, "
                         "which has no low-precision or integer decompositions); cast it with .float()")
    if x.requires_grad and not type(x).no_grad:
        raise AutogradError(f"{op}: gradients through {op} are not implemented; call it on x.detach()")


def _svd_host(full: bool):
    """numpy's svd (LAPACK's gesdd, as PyTorch's on CPU) of each matrix. A matrix with a nan raises as
    torch.linalg.svd does; one with an inf (and none) gives nan everywhere, as PyTorch's."""

    def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        a = inputs[0]
        if np.isnan(a).any():
            raise ArgumentError("svd: the algorithm failed to converge because the input matrix contained "
                                "nan (as torch.linalg.svd)")
        inf = np.isinf(a).any(axis=(-2, -1))
        u, s, vh = np.linalg.svd(np.where(inf[..., None, None], 0, a), full_matrices=full)
        for out, value in zip(outputs, (u, s, vh)):
            out[...] = value
            out[inf] = np.nan

    return run


_SYM = g_SYM
_SYM_DATA = g_SYM.data  # (non-empty only while a tensor with a symbolic axis lives)


def _check_symbolic(xs: tuple, ws: tuple) -> None:
    """x @ w's shapes with their variables (graph.SYM): a variable extent matches only the same variable
    bound to the same value (at the max both would match as numbers)."""
    inner = ws[-2] if len(ws) > 1 else ws[-1]
    if xs[-1] != inner:
        raise ShapeError(f"matmul: inner dimensions differ: {xs} @ {ws} ({xs[-1]} != {inner})")
    if len(xs) > 2 and len(ws) > 2:
        _broadcast_shape(xs[:-2], ws[:-2])


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
        if _SYM_DATA and (x.node in _SYM or w.node in _SYM):  # a variable's extent meets only itself
            _check_symbolic(x.shape, w.shape)
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

    def svd(self, *positional, full_matrices: bool = True, **torch_svd) -> tuple[Tensor, Tensor, Tensor]:
        """torch.linalg.svd (and tinygrad's Tensor.svd): U, S, Vh with A = U @ diag(S) @ Vh over the last
        two axes, S descending; full_matrices=False gives U (..., m, k), Vh (..., k, n), k = min(m, n).
        NOT torch.Tensor.svd, which returns V (Vh transposed): its some=/compute_uv= are refused, and so is a
        positional flag (torch's first one is some=, the opposite of full_matrices=). Computed by LAPACK
        through numpy in a host step (TinyJit replays it); no gradient."""
        if positional or torch_svd:
            raise ArgumentError(
                f"svd: unexpected {', '.join([*map(repr, positional), *torch_svd])}: Tensor.svd is "
                "torch.linalg.svd (returns U, S, Vh; full_matrices= is a keyword); "
                "for torch.Tensor.svd(some=s) use svd(full_matrices=not s) and Vh.transpose(-2, -1) as V")
        _decomposable(self, "svd")
        *batch, m, n = self.shape
        k = min(m, n)
        cols, rows = (m, n) if full_matrices else (k, k)
        outs = [((*batch, m, cols), self.dtype), ((*batch, k), self.dtype), ((*batch, rows, n), self.dtype)]
        run = _svd_host(bool(full_matrices))
        step = driver.HostStep("svd", run, outs, self.device, key=("svd", bool(full_matrices)))
        u, s, vh = type(self).run_host(step, self)
        return u, s, vh

    def qr(self, mode: str = "complete", *, some: bool | None = None) -> tuple[Tensor, Tensor]:
        """QR decomposition over the last two axes, as torch.linalg.qr: mode "complete" (the default here,
        as tinygrad's qr(): Q (..., m, m), R (..., m, n)), "reduced" (Q (..., m, k), R (..., k, n), k = min(m,
        n); torch.linalg.qr's default) or "r" (an empty Q); torch.Tensor.qr's some=True is "reduced". R's
        diagonal may be negative (LAPACK's Householder signs, as PyTorch's). numpy in a host step; no
        gradient; an input with nan or inf raises."""
        if some is not None:
            mode = "reduced" if some else "complete"
        if mode not in ("reduced", "complete", "r"):
            raise ArgumentError(f"qr: unknown mode {mode!r}; expected 'reduced', 'complete' or 'r'")
        _decomposable(self, "qr")
        *batch, m, n = self.shape
        k = m if mode == "complete" else min(m, n)
        outs = [((*batch, m, k), self.dtype), ((*batch, k, n), self.dtype)]

        def run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
            if not np.isfinite(inputs[0]).all():  # LAPACK's results then differ between builds (nan in R
                # where PyTorch's has a number, or the reverse): refused instead
                raise ArgumentError("qr: the input contains nan or inf")
            q, r = np.linalg.qr(inputs[0], mode="complete" if mode == "complete" else "reduced")
            outputs[0][...], outputs[1][...] = q, r

        q, r = type(self).run_host(driver.HostStep("qr", run, outs, self.device, key=("qr", mode)), self)
        return (type(self).empty(0, dtype=self.dtype, device=self.device) if mode == "r" else q), r

    def newton_schulz(self, steps: int, params: tuple[float, ...], eps: float = 1.0e-7) -> Tensor:
        """tinygrad's newton_schulz: `steps` iterations of the odd polynomial
        G <- sum_i params[i] * (G G^T)^i G on the last two axes, from G = self / (its Frobenius norm + eps);
        with coefficients of the sign function ((2, -1.5, 0.5)...) it converges to U @ Vh of self's svd
        (Muon's orthogonalization). A tall matrix is done transposed. Built from matmuls: differentiable."""
        if self.ndim < 2:
            raise ShapeError(f"newton_schulz: the input must have at least 2 dimensions, got {self.shape}")
        if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 0:
            raise ArgumentError(f"newton_schulz: steps must be an int >= 0, got {steps!r}")
        if not params:
            raise ArgumentError("newton_schulz: params must name at least one coefficient")
        norm = self.square().sum(axis=(-2, -1), keepdim=True).sqrt() + eps
        return self._odd_polynomial(steps, params, norm)

    def _odd_polynomial(self, steps: int, params: tuple[float, ...], norm: Tensor) -> Tensor:
        """newton_schulz's iterations from self / norm (Muon divides by the norm clamped at eps instead, as
        torch.optim.Muon): a tall matrix is done transposed."""
        if self.shape[-2] > self.shape[-1]:
            return self.transpose(-2, -1)._odd_polynomial(steps, params, norm).transpose(-2, -1)
        x = self / norm
        for _ in range(steps):
            gram, power, total = x @ x.transpose(-2, -1), x, x * params[0]
            for p in params[1:]:
                power = gram @ power
                total = total + p * power
            x = total
        return x
