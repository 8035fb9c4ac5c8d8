"""Helpers the op mixins share: axis, shape and window arguments, broadcasting, and node builders (the nodes
some Tensor ops build directly, without a tensor for each step: a third of their Python time)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tgrad import graph as g
from tgrad.dtype import DType, dtypes
from tgrad.errors import ArgumentError, IndexRangeError, ShapeError
from tgrad.graph import Node, Op

if TYPE_CHECKING:
    pass


Scalar = int | float | bool


def _normalize_axis(axis: int, ndim: int, op: str = "op") -> int:
    n = ndim or 1  # (a 0-d tensor takes axis 0 and -1)
    if not -n <= axis < n:
        raise IndexRangeError(f"{op}: axis {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % n if ndim else 0


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    if len(shapes) == 2 and shapes[0] == shapes[1]:  # (most calls: a binary op of equal shapes)
        return tuple(shapes[0])
    nd = max(map(len, shapes))
    out = [1] * nd
    for s in shapes:
        for i, d in enumerate(s, nd - len(s)):  # (right-aligned)
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    raise ShapeError(f"cannot broadcast {' with '.join(str(tuple(s)) for s in shapes)}")
                out[i] = d
    return tuple(out)


def _tuple(value, n: int) -> tuple[int, ...]:
    """An int or a sequence of n ints as a tuple of n ints (kernel sizes, strides, padding)."""
    out = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    if len(out) != n:
        raise ShapeError(f"expected an int or {n} values, got {value!r}")
    return tuple(int(v) for v in out)


def _spatial_pads(padding, nk: int) -> tuple[int, ...]:
    """Padding of the last nk axes in F.pad order (last axis first, before then after): from an int, nk ints
    (each both sides) or 2*nk ints (already in that order)."""
    if isinstance(padding, int):
        return (padding,) * 2 * nk
    padding = tuple(int(p) for p in padding)
    if len(padding) == nk:
        return tuple(p for q in reversed(padding) for p in (q, q))
    if len(padding) == 2 * nk:
        return padding
    raise ShapeError(f"padding {padding} needs 1, {nk} or {2 * nk} values for {nk} spatial axes")


def conv_padding(padding, kernel: tuple[int, ...], stride, dilation, op: str = "conv2d"):
    """A convolution's padding with PyTorch's strings resolved: 'valid' is none, 'same' pads
    dilation*(k-1) per axis, the odd one on the right (F.pad order, see _spatial_pads); 'same' with a
    stride > 1 and other strings raise an ArgumentError (PyTorch's ValueError). Other paddings: as given."""
    if not isinstance(padding, str):
        return padding
    nk = len(kernel)
    if padding == "valid":
        return 0
    if padding != "same":
        raise ArgumentError(f"{op}: invalid padding string {padding!r}, should be one of 'same', 'valid'")
    if any(s != 1 for s in _tuple(stride, nk)):
        raise ArgumentError(f"{op}: padding='same' is not supported for strided convolutions ({stride=})")
    total = [d * (k - 1) for d, k in zip(_tuple(dilation, nk), kernel)]
    return tuple(p for t in reversed(total) for p in (t // 2, t - t // 2))


def _position_dtype(*extents: int) -> DType:
    """The dtype of positions an op compares internally to make a mask (causal attention, tril/triu):
    int32 where every value fits. A CPU kernel then compares 16 of them per 512-bit vector, as many as the
    float32 values they select; with int64 (8 per vector) a causal softmax's exp pass ran much slower
    (measured: bench/HISTORY.md)."""
    return dtypes.int32 if max(map(abs, extents)) < 2**31 - 1 else dtypes.int64


def _expand_node(node: Node, shape: tuple[int, ...]) -> Node:
    """Tensor._expand_to on a node: broadcast to `shape`, which _broadcast_shape made from node's shape."""
    if node.shape == shape:
        return node
    if len(shape) != len(node.shape):
        node = g.move(node, Op.RESHAPE, (1,) * (len(shape) - len(node.shape)) + node.shape)
    return g.move(node, Op.EXPAND, shape)


def _shift_by_max(x: Node, axes: tuple[int, ...]) -> Node:
    """x - x.max(axes, keepdim=True).detach() for a float node (the nodes those Tensor ops build; no axes:
    a 0-d tensor, whose max is itself)."""
    top = g.reduce(x, "MAX", axes)
    top = Node(Op.DETACH, (top,), None, top.shape, top.dtype, top.device)
    return g.alu(Op.SUB, x, _expand_node(top, x.shape))


def _exp_node(x: Node) -> Node:
    """Tensor.exp of a float node: exp2(x * (1 / ln 2))."""
    return g.alu(Op.EXP2, g.alu(Op.MUL, x, g.const(1 / math.log(2), x.dtype, x.device, x.shape)))


def _log_node(x: Node) -> Node:
    """Tensor.log of a float node: log2(x) * ln 2."""
    return g.alu(Op.MUL, g.alu(Op.LOG2, x), g.const(math.log(2), x.dtype, x.device, x.shape))


def _matmul_node(x: Node, w: Node) -> Node:
    """x @ w for nodes of one dtype, at least 2-d, x's last axis as long as w's second-to-last: x
    (..., n, 1, k) times w transposed (..., 1, m, k), summed over k. Tensor.matmul (and through it linear)
    builds its product here, as nodes: a tensor for each step was a third of the op's Python time."""
    k = x.shape[-1]
    a = g.move(x, Op.RESHAPE, x.shape[:-1] + (1, k))
    order = list(range(len(w.shape)))
    order[-1], order[-2] = order[-2], order[-1]
    b = g.move(w, Op.PERMUTE, tuple(order))
    b = g.move(b, Op.RESHAPE, b.shape[:-2] + (1,) + b.shape[-2:])
    shape = _broadcast_shape(a.shape, b.shape)
    product = g.alu(Op.MUL, _expand_node(a, shape), _expand_node(b, shape), arg=g.CONTRACT)
    total = g.reduce(product, "SUM", (len(shape) - 1,))
    return g.move(total, Op.RESHAPE, shape[:-1])


def _spread_node(x: Node, s_) -> Node:
    """Tensor._spread on a node: (N, C, *spatial) with s-1 zeros after each element but the last along each
    spatial axis."""
    for axis, s in enumerate(s_):
        if s > 1:
            a, shape = 2 + axis, x.shape
            x = g.move(x, Op.RESHAPE, shape[: a + 1] + (1,) + shape[a + 1 :])
            x = g.move(x, Op.PAD, ((0, 0),) * (a + 1) + ((0, s - 1),) + ((0, 0),) * (len(shape) - a - 1))
            x = g.move(x, Op.RESHAPE, shape[:a] + (shape[a] * s,) + shape[a + 1 :])
            x = g.move(x, Op.SHRINK, tuple((0, shape[a] * s - (s - 1)) if i == a else (0, d)
                                            for i, d in enumerate(x.shape)))
    return x
