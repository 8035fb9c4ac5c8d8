"""Tensor's nn ops: convolutions (and their gradients), pooling, interpolation, normalization,
dropout, attention."""

from __future__ import annotations

import itertools
import math
import warnings
import weakref
from typing import TYPE_CHECKING

import numpy as np

from tgrad import autodiff
from tgrad import graph as g
from tgrad.device import get_runtime
from tgrad.dtype import dtypes
from tgrad.errors import ArgumentError, ShapeError, user_stacklevel
from tgrad.graph import Node, Op
from tgrad.ops.helpers import (
    _normalize_axis,
    _position_dtype,
    _spatial_pads,
    _spread_node,
    _tuple,
    conv_padding,
)
from tgrad.opt.host import conv_pieces

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


# kernel positions up to which a conv's input gradient is col2im (that many shifted terms summed in one
# elementwise kernel); larger kernels take the transposed convolution
COL2IM_MAX_TERMS = 64
# elements of a conv's windows above which they are not kept for its weight's gradient (256 MiB of float32)
KEEP_WINDOWS_MAX = 1 << 26


def _uint8_linear_weights(n: int, out: int, align_corners: bool) -> tuple[np.ndarray, int]:
    """(out, n) int32 weights and their fixed-point bits of PyTorch's uint8 linear resize along one axis
    (aten's _compute_index_ranges_int16_weights: a triangle filter around each output's centre,
    normalized, scaled to the most bits that keep the largest weight below 2**15, rounded half away)."""
    delta = 0.5 if align_corners else 0.0
    scale = ((n - 1) / (out - 1) if out > 1 else 0.0) if align_corners else n / out
    w = np.zeros((out, n), np.float64)
    for i in range(out):
        centre = scale * (i + 0.5 - delta)
        lo = max(int(centre - 0.5 + delta), 0)
        taps = np.arange(lo, min(max(int(centre + 1.5 + delta), lo), n, lo + 3))
        tw = np.maximum(1.0 - np.abs(taps - centre + 0.5 - delta), 0.0)
        w[i, taps] = tw / tw.sum() if tw.sum() else tw
    bits = 0
    while bits < 22 and int(0.5 + w.max() * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    return np.trunc(w * (1 << bits) + 0.5).astype(np.int32), bits


class NNOps:
    """Tensor's nn ops (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def _pool(self, kernel: tuple[int, ...], stride, dilation) -> Tensor:
        """Sliding windows over the last len(kernel) axes as views only (tinygrad's trick):
        (..., *in) -> (..., *out, *kernel). No data is copied; the windows index the input."""
        nk = len(kernel)
        if self.ndim < nk:
            raise ShapeError(f"pool: a {nk}-d window needs at least {nk} dims, got shape {self.shape}")
        s_, d_ = _tuple(stride, nk), _tuple(dilation, nk)
        pre, i_ = self.shape[:-nk], self.shape[-nk:]
        o_ = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(i_, d_, kernel, s_)]
        if any(o <= 0 for o in o_):
            raise ShapeError(f"pool: window {kernel} (dilation {d_}) is larger than the input {i_}")
        n = len(pre)
        if all(s == k for s, k in zip(s_, kernel)) and all(d == 1 for d in d_):
            # windows that tile the input: a reshape (cheaper to index, and its gradient is a reshape too)
            x = self.shrink([None] * n + [(0, o * k) for o, k in zip(o_, kernel)])
            x = x.reshape(*pre, *[v for o, k in zip(o_, kernel) for v in (o, k)])
            return x.permute(*range(n), *[n + 2 * j for j in range(nk)], *[n + 2 * j + 1 for j in range(nk)])
        # repeat each axis e times so that a row of length k*(i+d) holds every shifted window
        e_ = [math.ceil(k * (i + d) / i) for k, i, d in zip(kernel, i_, d_)]
        x = self.reshape(*pre, *[v for i in i_ for v in (1, i)])
        x = x.expand(*pre, *[v for e, i in zip(e_, i_) for v in (e, i)])
        x = x.reshape(*pre, *[e * i for e, i in zip(e_, i_)])
        x = x.shrink([None] * len(pre) + [(0, k * (i + d)) for k, i, d in zip(kernel, i_, d_)])
        x = x.reshape(*pre, *[v for k, i, d in zip(kernel, i_, d_) for v in (k, i + d)])
        # a stride longer than the window needs rows of o*s (the padding is never picked)
        grow = [(0, 0)] * len(pre)
        grow += [p for i, d, o, s in zip(i_, d_, o_, s_) for p in ((0, 0), (0, max(0, o * s - i - d)))]
        x = x.pad(grow)
        x = x.shrink([None] * len(pre) + [p for k, o, s in zip(kernel, o_, s_) for p in ((0, k), (0, o * s))])
        x = x.reshape(*pre, *[v for k, o, s in zip(kernel, o_, s_) for v in (k, o, s)])
        x = x.shrink([None] * len(pre) + [p for k, o in zip(kernel, o_) for p in ((0, k), (0, o), (0, 1))])
        x = x.reshape(*pre, *[v for k, o in zip(kernel, o_) for v in (k, o)])
        return x.permute(*range(n), *[n + 2 * j + 1 for j in range(nk)], *[n + 2 * j for j in range(nk)])

    def _pad_spatial(self, padding, nk: int, value: float = 0.0) -> Tensor:
        """Pad the last nk axes: an int, one int per axis (both sides), or 2*nk ints in F.pad order
        (last axis first: left, right, top, bottom, ...); negative values crop."""
        return self.pad(_spatial_pads(padding, nk), value)

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
               groups: int = 1) -> Tensor:
        """PyTorch's F.conv1d/conv2d/conv3d by the weight's rank: x (N, Cin, *spatial), weight
        (Cout, Cin/groups, *kernel); stride, dilation: int or one per axis; padding: also 2 per axis."""
        nk = weight.ndim - 2
        if nk < 1 or self.ndim != nk + 2:
            raise ShapeError(f"conv2d: input {self.shape} and weight {weight.shape} need rank N+2 (N >= 1)")
        (bs, cin_all), (cout, cin), ks = self.shape[:2], weight.shape[:2], weight.shape[2:]
        if cin_all != groups * cin or cout % groups:
            raise ShapeError(
                f"conv2d: input has {cin_all} channels but weight {weight.shape} with groups={groups} "
                f"expects {groups * cin} (and out channels divisible by groups)"
            )
        keep = weight.requires_grad and not type(self).no_grad
        # a computed input is computed once, not once per window position in the copy below (the MNIST
        # CNN's relu(conv1 + bias); measured: bench/HISTORY.md)
        computed = keep and self.node.op is not Op.BUFFER and not self.node.base.realized
        src = self.contiguous() if computed else self
        xp = src._pad_spatial(conv_padding(padding, ks, stride, dilation), nk)
        x = xp._pool(ks, stride, dilation)  # (bs, cin_all, *out, *ks)
        # the CPU runs a conv whose windows are big in pieces of images (blas.Chunk), copying each piece's
        # windows where BLAS reads them from cache, instead of writing them all to memory. The pieces copy
        # windows of a buffer: a padded or computed input is made one first (1/k^2 of the windows' size;
        # as a prologue the whole windows would be computed into memory again)
        pieces = conv_pieces(get_runtime(self.device).props, math.prod(x.shape))
        buffer = src.node.base.realized or src.node.op is Op.BUFFER
        if pieces and (xp.node is not src.node or not buffer):
            xp = xp.contiguous()
            x = xp._pool(ks, stride, dilation)
        if keep and not pieces and math.prod(x.shape) <= KEEP_WINDOWS_MAX:
            # the windows (im2col) are made once, for the forward matmul and again for the weight's
            # gradient: keep them, laid out (cin, *ks, bs, *out) as both matmuls read them (the CPU copied
            # a buffer input's windows in each matmul; the MNIST CNN's conv1, measured: bench/HISTORY.md)
            order = (1, *range(2 + nk, 2 + 2 * nk), 0, *range(2, 2 + nk))
            back = tuple(sorted(range(len(order)), key=order.__getitem__))
            x = x.permute(*order).contiguous().permute(*back)
        out_sp, rcout = x.shape[2 : 2 + nk], cout // groups
        x = x.reshape(bs, groups, 1, cin, *out_sp, *ks).expand(bs, groups, rcout, cin, *out_sp, *ks)
        x = x.permute(0, 1, 2, *range(4, 4 + nk), 3, *range(4 + nk, 4 + 2 * nk))  # cin next to the kernel
        w = weight.reshape(1, groups, rcout, *(1,) * nk, cin, *ks)
        out = x._contract_mul(w, g.CONV).sum(tuple(range(-nk - 1, 0))).reshape(bs, cout, *out_sp)
        out = out._conv_gradient(xp, weight, w, stride, dilation, groups)
        return out if bias is None else out + bias.reshape(1, cout, *(1,) * nk)

    def _conv_gradient(self, xp: Tensor, weight: Tensor, w: Tensor, stride, dilation, groups: int) -> Tensor:
        """self = conv(xp, weight) (xp already padded; w the weight as the product reads it), with the
        gradient of xp computed as a transposed convolution (a convolution, so it reaches the same matmul
        kernels as the forward) instead of the gradient of the sliding-window view (a col2im reduce over
        overlapping windows, far slower on the CPU; measured: bench/HISTORY.md). The weight's gradient is
        the composed one (already a matmul over the windows), taken at w: graph building may fold weight's
        own node away."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        if Tensor.no_grad:
            return self
        nk = weight.ndim - 2
        s_, d_, ks = _tuple(stride, nk), _tuple(dilation, nk), weight.shape[2:]
        out_sp, in_sp = self.shape[2:], xp.shape[2:]
        # the transposed conv gives (o-1)*s + d*(k-1) + 1 positions; the rest of xp (past the last
        # window) gets no gradient: output_padding covers it
        extra = tuple(i - ((o - 1) * s + d * (k - 1) + 1) for i, o, s, d, k in zip(in_sp, out_sp, s_, d_, ks))
        value, x_node, w_node, weight_node = self.node, xp.node, w.node, weight.node

        def rule(grad: Node, needed: tuple[bool, bool]) -> tuple[Node | None, Node | None]:
            gt, gx, gw = Tensor(grad), None, None
            if needed[0] and math.prod(ks) <= COL2IM_MAX_TERMS:
                gx = gt._conv_input_gradient(Tensor(weight_node), in_sp, s_, d_, groups).node
            elif needed[0]:
                gx = gt.conv_transpose2d(Tensor(weight_node), None, s_, 0, extra, d_, groups).node
            if needed[1]:  # this conv's own product only: the input is a constant here (its graph may
                # hold the same weight, as in conv(conv(x, w), w), whose gradient the outer walk adds)
                gw = autodiff.gradients(value, grad, {w_node}, frozenset({x_node})).get(w_node)
            return gx, gw

        node = autodiff.custom_gradient(self.node, (x_node, w_node), rule, "conv", needs=True)
        return self._from(node, xp, w)

    def _spread(self, s_) -> Tensor:
        """(N, C, *spatial) with s-1 zeros after each element but the last along each spatial axis:
        n -> n + (n - 1) * (s - 1) (a transposed convolution's input)."""
        return self._from(_spread_node(self.node, s_))

    def _conv_input_gradient(self, weight: Tensor, in_sp, s_, d_, groups: int) -> Tensor:
        """The gradient of a convolution's (padded) input, self the output's gradient (N, Cout, *out):
        col2im. One matmul over the output channels makes every window's share,
        cols[g, n, c, k, *out] = sum_o weight[g, o, c, k] * self[n, g, o, *out] (both operands as they
        are stored: a BLAS call per image, no window copy), then each kernel position k's share is spread
        by the stride, shifted to where its window starts and summed: one elementwise kernel. The
        transposed convolution (the gather form) reads the padded gradient's windows instead: 1.45x the
        multiply-adds for a 5x5 kernel on 24x24 (s^2 x for stride s) and a window copy 1.45x this one's."""
        n, cout, out_sp = self.shape[0], self.shape[1], self.shape[2:]
        cin, ks = weight.shape[1], weight.shape[2:]
        og, kk, npos = cout // groups, math.prod(ks), math.prod(out_sp)
        w = weight.reshape(groups, og, cin, kk).permute(0, 2, 3, 1).reshape(groups, 1, cin, kk, 1, og)
        gy = self.reshape(n, groups, og, npos).permute(1, 0, 3, 2).reshape(groups, n, 1, 1, npos, og)
        cols = w._contract_mul(gy, g.COL2IM).sum(-1).reshape(groups, n, cin, kk, *out_sp).node
        # each kernel position's share, spread by the stride and padded into place, as nodes (the tensor
        # ops' view bookkeeping made this loop a visible share of an eager 5x5 conv step; measured:
        # bench/HISTORY.md)
        spread = tuple(o + (o - 1) * (s - 1) for o, s in zip(out_sp, s_))
        whole = tuple((0, o) for o in out_sp)
        # the last ADD says what the sum is (the CPU may scatter the products instead: blas.col2im)
        mark = g.Col2ImSum(tuple(ks), tuple(out_sp), tuple(in_sp), tuple(s_), tuple(d_), groups)
        total = None
        for k, pos in enumerate(itertools.product(*map(range, ks))):
            t = g.move(cols, Op.SHRINK, ((0, groups), (0, n), (0, cin), (k, k + 1), *whole))
            t = g.move(t, Op.RESHAPE, (groups, n, cin, *out_sp))
            t = g.move(t, Op.PERMUTE, (1, 0, *range(2, 3 + len(ks))))
            t = _spread_node(g.move(t, Op.RESHAPE, (n, groups * cin, *out_sp)), s_)
            starts = [p * d for p, d in zip(pos, d_)]
            pads = tuple((b, i - b - e) for b, i, e in zip(starts, in_sp, spread))
            t = g.move(t, Op.PAD, ((0, 0), (0, 0), *pads))
            total = t if total is None else g.alu(Op.ADD, total, t, arg=mark if k == kk - 1 else None)
        return type(self)(total)

    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                         output_padding=0, dilation=1, groups: int = 1) -> Tensor:
        """PyTorch's F.conv_transpose1d/2d/3d by the weight's rank: weight (Cin, Cout/groups, *kernel).
        The input is spread out with stride-1 zeros between elements, then convolved with the flipped
        kernel and padding dilation*(k-1)-padding."""
        nk = weight.ndim - 2
        if nk < 1 or self.ndim != nk + 2:
            raise ShapeError(f"conv_transpose2d: input {self.shape} and weight {weight.shape} need rank N+2")
        cin, rcout, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
        if self.shape[1] != cin or cin % groups:
            raise ShapeError(f"conv_transpose2d: input has {self.shape[1]} channels, weight {weight.shape}")
        s_, d_, op_ = _tuple(stride, nk), _tuple(dilation, nk), _tuple(output_padding, nk)
        pads = _spatial_pads(padding, nk)[::-1]  # (axis 0 after, axis 0 before, ...) reversed: pairs by axis
        x = self._spread(s_)
        w = weight.reshape(groups, cin // groups, rcout, *ks).transpose(1, 2).flip(tuple(range(3, 3 + nk)))
        w = w.reshape(groups * rcout, cin // groups, *ks)
        flat = []
        for axis in reversed(range(nk)):  # F.pad order: last axis first
            before, after = pads[2 * axis + 1], pads[2 * axis]
            edge = d_[axis] * (ks[axis] - 1)
            flat += [edge - before, edge - after + op_[axis]]
        return x.conv2d(w, bias, 1, tuple(flat), d_, groups)

    def _pool_windows(self, kernel_size, stride, padding, dilation, ceil_mode: bool, value: float,
                      extra: float | None = None) -> tuple[Tensor, tuple[int, ...]]:
        """Windows (..., *out, *kernel) of the input padded with value (ceil_mode pads more on the right,
        with `extra` (default value), so a last partial window fits, as PyTorch); also the kernel size."""
        k = _tuple(kernel_size, len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2)
        nk = len(k)
        s = _tuple(stride if stride is not None else k, nk)
        d = _tuple(dilation, nk)
        pads = _spatial_pads(padding, nk)
        more = [0] * (2 * nk)
        if ceil_mode:
            for axis in range(nk):
                j = 2 * (nk - 1 - axis)  # F.pad order
                n = self.shape[self.ndim - nk + axis] + pads[j] + pads[j + 1]
                span = d[axis] * (k[axis] - 1) + 1
                out = -(-(n - span) // s[axis]) + 1
                if (out - 1) * s[axis] >= self.shape[self.ndim - nk + axis] + pads[j]:
                    out -= 1  # the last window would start in the right padding
                more[j + 1] = max(0, (out - 1) * s[axis] + span - n)
        x = self.pad(pads, value).pad(tuple(more), value if extra is None else extra)
        return x._pool(k, s, d), k

    def max_pool2d(self, kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                   return_indices: bool = False):
        """PyTorch's F.max_pool1d/2d/3d over the last len(kernel_size) axes (2 for an int); padding counts
        as -inf. As PyTorch, each window's pick is its first maximum (its last NaN, if it has one): the
        gradient goes to that element alone, and return_indices=True gives its flat index in the plane."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        x = self if self.dtype.is_float else self.float()
        win, k = x._pool_windows(kernel_size, stride, padding, dilation, ceil_mode, -math.inf)
        axes = tuple(range(-len(k), 0))
        out = win.max(axes)
        plane = self.shape[-len(k):]
        padded = ceil_mode or any(_spatial_pads(padding, len(k)))
        device = self.device  # (the gradient rule below must not hold a Tensor: inplace.py would keep it)

        def where_in_plane() -> Tensor:  # each window position's flat index in the plane (-1: padding)
            flat = Tensor.arange(math.prod(plane), device=device, dtype=dtypes.default_int)
            flat = flat.reshape(plane)
            return flat._pool_windows(kernel_size, stride, padding, dilation, ceil_mode, -1)[0]

        def pick(win: Tensor, out: Tensor) -> Tensor:  # bool mask of each window's picked element
            n = math.prod(k)
            pos = Tensor.arange(n, device=device, dtype=_position_dtype(n)).reshape(k)
            top = out.reshape(out.shape + (1,) * len(k))
            hit = win == top
            if padded:
                hit = hit & (where_in_plane() >= 0)
            first = hit.where(pos, n).min(axes)
            last_nan = win.isnan().where(pos, -1).max(axes)
            chosen = (last_nan >= 0).where(last_nan, first)
            return pos == chosen.reshape(chosen.shape + (1,) * len(k))

        result = out if self.dtype.is_float else out.cast(self.dtype)
        if self.dtype.is_float and not Tensor.no_grad:
            x_node, win_node = x.node, win.node

            def rule(grad: Node) -> tuple[Node | None]:
                w = Tensor(win_node)
                alt = pick(w, w.max(axes)).where(w, 0).sum(axes)
                return (autodiff.gradients(alt.node, grad, {x_node}, frozenset({x_node})).get(x_node),)

            result = x._from(autodiff.custom_gradient(out.node, (x_node,), rule, "max_pool"))
        if not return_indices:
            return result
        index = pick(win, out).where(where_in_plane(), math.prod(plane)).min(axes)
        return result, index

    def max_unpool2d(self, indices: Tensor, kernel_size=2, stride=None, padding=0, output_size=None
                     ) -> Tensor:
        """PyTorch's F.max_unpool2d: each value put back at its index in a zero plane."""
        k = _tuple(kernel_size, 2)
        s, p = _tuple(stride if stride is not None else k, 2), _tuple(padding, 2)
        if output_size is None:
            output_size = tuple((i - 1) * st - 2 * pp + kk for i, st, pp, kk in zip(self.shape[-2:], s, p, k))
        plane = tuple(output_size)[-2:]
        lead = self.shape[:-2]
        zeros = type(self).zeros(*lead, math.prod(plane), dtype=self.dtype, device=self.device)
        return zeros.scatter(-1, indices.flatten(-2), self.flatten(-2)).reshape(*lead, *plane)

    def avg_pool2d(self, kernel_size=2, stride=None, padding=0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """PyTorch's F.avg_pool1d/2d/3d over the last len(kernel_size) axes (stride defaults to kernel_size).
        With ceil_mode, the part of a window past the padded input is never counted."""
        win, k = self._float()._pool_windows(kernel_size, stride, padding, 1, ceil_mode, 0.0)
        axes = tuple(range(-len(k), 0))
        total = win.sum(axes)
        ones = type(self).ones(*self.shape[-len(k):], device=self.device)
        # count_include_pad: the padding counts, ceil_mode's extra never does
        counted, _ = ones._pool_windows(k, stride, padding, 1, ceil_mode, float(count_include_pad), 0.0)
        return total / counted.sum(axes)

    def interpolate(self, size, mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the last len(size) axes (PyTorch's F.interpolate on (N, C, *spatial)): mode "nearest",
        "nearest-exact" or "linear" (also "bilinear", "trilinear": linear along each axis). Each axis is
        a product with a constant (out, in) weight matrix made on the host. uint8 over two axes is
        PyTorch's fixed-point bilinear, bit for bit; other integer cases (PyTorch refuses them) round the
        float result."""
        size = (size,) if isinstance(size, int) else tuple(size)
        if not 0 < len(size) <= self.ndim:
            raise ShapeError(f"interpolate: size {size} for a tensor of shape {self.shape}")
        if any(n == 0 for n in self.shape[self.ndim - len(size) :]) or any(n <= 0 for n in size):
            raise ShapeError(f"interpolate: input {self.shape} and size {size} must be non-empty")
        if mode not in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear"):
            raise ArgumentError(f"interpolate: mode must be nearest, nearest-exact or linear, not {mode!r}")
        if align_corners and mode.startswith("nearest"):
            raise ArgumentError("interpolate: align_corners needs a linear mode")
        if self.dtype == dtypes.uint8 and len(size) == 2 and not mode.startswith("nearest"):
            return self._bilinear_uint8(size, align_corners)
        x = self._float()
        for axis, out in zip(range(self.ndim - len(size), self.ndim), size):
            n = self.shape[axis]
            w = np.zeros((out, n), np.float64)
            o = np.arange(out, dtype=np.float64)
            if mode.startswith("nearest"):
                src = (o + 0.5) * (n / out) if mode == "nearest-exact" else o * np.float32(n / out)
                w[np.arange(out), np.minimum(np.floor(src).astype(np.int64), n - 1)] = 1.0
            else:
                if align_corners:
                    src = o * ((n - 1) / (out - 1)) if out > 1 else o * 0
                else:
                    src = np.maximum((o + 0.5) * (n / out) - 0.5, 0)
                low = np.minimum(np.floor(src).astype(np.int64), n - 1)
                frac = src - low
                np.add.at(w, (np.arange(out), low), 1 - frac)
                np.add.at(w, (np.arange(out), np.minimum(low + 1, n - 1)), frac)
            wt = type(self)(w.astype(x.dtype.np), device=self.device)
            x = (x.unsqueeze(axis) * wt.reshape((out, n) + (1,) * (self.ndim - axis - 1))).sum(axis + 1)
        if self.dtype.is_float:
            return x
        return (x.round() if mode not in ("nearest", "nearest-exact") else x).cast(self.dtype)

    def _bilinear_uint8(self, size: tuple[int, int], align_corners: bool) -> Tensor:
        """PyTorch's uint8 bilinear resize, bit for bit: the last axis first, then the one before, each
        pass a sum of at most 3 pixels times 16-bit fixed-point weights, rounded and clamped to uint8."""
        x = self
        for axis, out in ((self.ndim - 1, size[1]), (self.ndim - 2, size[0])):
            n = self.shape[axis]
            if n == out:
                continue
            w, bits = _uint8_linear_weights(n, out, align_corners)
            wt = type(self)(w, device=self.device).reshape((out, n) + (1,) * (self.ndim - axis - 1))
            acc = (x.cast(dtypes.int32).unsqueeze(axis) * wt).sum(axis + 1, dtype=dtypes.int32)
            x = ((acc + (1 << (bits - 1))) >> bits).clip(0, 255).cast(dtypes.uint8)
        return x

    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                  axis: int | tuple[int, ...] = 1) -> Tensor:
        """(x - mean) * invstd * weight + bias, with the statistics laid along `axis` (tinygrad's): one axis
        and 1-d statistics, or several axes and statistics shaped like them (axis=(0, 2): (x.shape[0],
        x.shape[2])). An invstd of another rank broadcasts as it is."""
        axes = sorted({_normalize_axis(a, self.ndim, "batchnorm") for a in (axis if isinstance(axis, tuple)
                                                                             else (axis,))})
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        dims = tuple(self.shape[a] for a in axes)

        def lay(stat: Tensor, name: str) -> Tensor:
            if stat.shape not in (dims, shape):
                raise ShapeError(f"batchnorm: {name} has shape {stat.shape}; axis={axis} needs {dims}")
            return stat.reshape(shape)

        x = self - lay(mean, "mean")
        if weight is not None:
            x = x * lay(weight, "weight")
        x = x * (lay(invstd, "invstd") if invstd.ndim == len(axes) else invstd)
        return x + lay(bias, "bias") if bias is not None else x

    def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
        """Normalise to mean 0, variance 1 over `axis` (no affine part; nn.LayerNorm adds it)."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        d = self - self.mean(axis, keepdim=True)
        r = (d * d).mean(axis, keepdim=True).add(eps).rsqrt()
        y = d * r
        if Tensor.no_grad or not self.dtype.is_float:
            return y
        r_node = r.node

        def rule(grad: Node, out: Node) -> tuple[Node]:  # PyTorch's r * (g - mean(g) - y * mean(g * y)),
            g, yy, rr = Tensor(grad), Tensor(out), Tensor(r_node)  # reading the output y
            return ((rr * (g - g.mean(axis, keepdim=True) - yy * (g * yy).mean(axis, keepdim=True))).node,)

        node = autodiff.custom_gradient(y.node, (self.node,), rule, "layernorm", reads_output=True)
        return self._from(node)

    def dropout(self, p: float = 0.5, training: bool | None = None) -> Tensor:
        """Zero each element with probability p and scale the rest by 1/(1-p), only when training (None:
        Tensor.training; F.dropout's training argument)."""
        if not 0 <= p <= 1:
            raise ArgumentError(f"dropout: p must be in [0, 1], got {p}")
        if not (type(self).training if training is None else training) or p == 0:
            if p and training is None and not type(self).no_grad:
                note_eval_mode(self.node, "Dropout")
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                     is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
        """PyTorch's F.scaled_dot_product_attention: softmax(q @ k^T / sqrt(d) + mask) @ v. enable_gqa:
        key and value heads (axis -3) are shared by groups of query heads."""
        if enable_gqa and key.shape[-3] != self.shape[-3]:
            if self.shape[-3] % key.shape[-3]:
                raise ShapeError(f"scaled_dot_product_attention: {self.shape[-3]} query heads do not split "
                                 f"into groups for {key.shape[-3]} key heads")
            group = self.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
        qk = self.matmul(key.transpose(-2, -1)) * (1 / math.sqrt(self.shape[-1]))
        if is_causal:
            if attn_mask is not None:
                raise ArgumentError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
            n, m = qk.shape[-2:]
            dt = _position_dtype(n, m)
            rows = type(self).arange(n, device=self.device, dtype=dt).reshape(n, 1)
            attn_mask = rows >= type(self).arange(m, device=self.device, dtype=dt).reshape(1, m)
        if attn_mask is None:
            return qk.softmax(-1).matmul(value)
        qk = attn_mask.where(qk, -math.inf) if attn_mask.dtype == dtypes.bool else qk + attn_mask
        if is_causal:  # (a causal row always keeps its first key)
            return qk.softmax(-1).matmul(value)
        # a query whose every key is masked attends to nothing: 0 out, 0 gradient (PyTorch's safe softmax;
        # softmax over all -inf is nan, and its gradient would carry the nan into every query and key)
        dead = qk.max(-1, keepdim=True) == -math.inf
        return dead.where(0, dead.where(0, qk).softmax(-1)).matmul(value)


# nodes that BatchNorm (with running statistics) and Dropout made in eval mode (Tensor.training False, the
# default, as tinygrad's): a backward() whose graph reaches one warns, once a process (warn_eval_mode)
EVAL_MODE_NODES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_EVAL_WARNED = [False]


def note_eval_mode(node: Node, layer: str) -> None:
    if not _EVAL_WARNED[0]:
        EVAL_MODE_NODES[node] = layer


def warn_eval_mode(root: Node) -> None:
    """Warn (once) if root's graph holds a node of EVAL_MODE_NODES: a PyTorch user training with
    Tensor.training left False gets BatchNorm's frozen running statistics and no dropout. Called by
    backward() only while Tensor.training is False and such nodes live."""
    seen, stack, layer = set(), [root], None
    while stack and layer is None:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        layer = EVAL_MODE_NODES.get(n)
        if n.buffer is None:
            stack.extend(n.srcs)
    if layer is None:
        return
    _EVAL_WARNED[0] = True
    EVAL_MODE_NODES.clear()
    warnings.warn(
        f"backward() through a {layer} in eval mode: Tensor.training is False (tgrad's default, as "
        "tinygrad's), so BatchNorm uses its running statistics and Dropout does nothing. To train, set "
        "`Tensor.training = True` or use `with Tensor.train():` (this warning is shown once)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
