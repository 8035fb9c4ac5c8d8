"""Matmul-shaped kernels: which reduces a tl.dot (or another contraction) can compute, and their M, N axes.

A kernel analysis the optimizer uses to choose a contraction's implementation and the emitters use to
render it, for kernels the op that built them marked as contractions (Kernel.contraction: matmul,
conv2d, einsum and their gradients); a sum of products written out elementwise stays a reduce.
"""

from __future__ import annotations

from tgrad import config
from tgrad.dtype import dtypes
from tgrad.fuse import Expr, Kernel
from tgrad.loop_axes import nodes


def axes_of(e: Expr) -> set[int]:
    """The loop axes an expression (its loads' indices and masks included) depends on."""
    return {s.arg[0] for s in nodes(e) if s.op == "IDX"}


DOT_DTYPES = (dtypes.float32, dtypes.float16)


def implicit_gemm() -> bool:
    """Convolutions (and any SUM of a product whose operands split the axes) as tl.dot kernels; on unless
    TGRAD_TRITON_IMPLICIT_GEMM=0. An operand tile that gathers with masks (padding) is loaded with one
    pipeline stage: with Triton's default three (and with two), an H200 (Triton 3.6) summed dilated or
    strided convs with padding wrongly, while the interpreter was right (bench/HISTORY.md, "Implicit
    GEMM")."""
    return config.on("TGRAD_TRITON_IMPLICIT_GEMM")


def find_dot(kernel: Kernel) -> tuple[Expr, Expr, tuple[int, ...], tuple[int, ...]] | None:
    """(A, B, M axes, N axes) when the kernel is a marked contraction (Kernel.contraction) that is
    matmul-shaped: a SUM over one reduce axis K of
    LOAD_A * LOAD_B (float32 or float16, no masks), where M is the innermost global axis only A uses,
    N the innermost one only B uses, and every other global axis is a batch axis (one per program).
    With implicit_gemm(): a SUM over the reduce axes (K, flattened) of A * B, where A and B are any
    expressions of loads and indices, the M axes are all the global axes only A uses (flattened into
    one), the N axes those only B uses. Convolutions and their gradients are then this shape too:
    implicit GEMMs whose tiles gather the windows (masked loads for the padding)."""
    e = kernel.reduce_expr
    if not kernel.contraction or kernel.reduce_op != "SUM" or e is None or e.op != "MUL" or \
            e.dtype not in DOT_DTYPES:
        return None
    x, y = e.srcs
    implicit = implicit_gemm()
    plain = all(s.op == "LOAD" and not _masked(s) for s in (x, y))
    if not implicit and (len(kernel.reduce_shape) != 1 or not plain):
        return None
    ax, ay = axes_of(x), axes_of(y)
    only_x, only_y = (tuple(sorted(a for a in axes if a < kernel.n_global)) for axes in (ax - ay, ay - ax))
    if not only_x or not only_y:
        return None
    if not implicit:
        k = kernel.n_global
        return (x, y, (only_x[-1],), (only_y[-1],)) if k in ax and k in ay else None
    return x, y, only_x, only_y



def _masked(load: Expr) -> bool:
    """Whether a LOAD has a validity mask (not the constant True)."""
    valid = load.srcs[1]
    return not (valid.op == "CONST" and valid.arg is True)
