"""Matmul-shaped kernels as BLAS calls (the CPU device): `analyse` finds how a kernel whose reduce is
sum_r A[g, r] * B[g, r] over strided (or computed) operands runs as a batched matmul (numpy.matmul on
strided views, tgrad/runtime/cpu/blas.py `BlasCall`), with generated functions around it: prologues that
compute computed operands, an epilogue that computes the stored value from the result. The functions
here measure a plan (its copies, windows, pieces); which plan runs is the optimizer's choice
(opt/host.py), with the sizes it passes in. Pure analysis over the Kernel IR, like the emitters: no
runtime, no device package."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tgrad.dtype import DType, dtypes
from tgrad.fuse import IDX_DT, Expr, Kernel, const, iadd, imul, is_true, linear_terms, same_index
from tgrad.graph import COL2IM, Col2ImSum


@dataclass(frozen=True)
class Operand:
    input: int  # which kernel input
    offset: int
    strides: tuple[int, ...]  # element stride per kernel axis (global axes, then the reduce axes)


@dataclass(frozen=True)
class Chunk:
    """A matmul whose operand must be copied out (a conv's windows, im2col) runs as matmuls over pieces of
    one axis, each copying only its piece's windows (which stay in cache for BLAS) instead of writing the
    whole copy to memory and reading it back (164 MB for the MNIST CNN's second conv). `axis` is global
    axis 0 (each piece is rows 0..size of the result: the images of a conv's forward) or the first reduce
    axis (a piece of K: the pieces' products are summed, as for a conv's weight gradient)."""

    axis: int
    size: int  # indices of `axis` per piece (divides its length)
    # (L, P): the copied operand's axes L and P (on the two sides of its matrix) advance by the same stride,
    # as a conv's kernel row kh and output row y do (it reads row y + kh); see `_shift_pair`
    shift: tuple[int, int] | None = None


@dataclass(frozen=True)
class BlasPlan:
    """sum_r A[g, r] * B[g, r] as a batched matmul: global axes split into batch (both operands),
    M (A only) and N (B only); the reduce axes r (one for a matmul, three for a conv) are K."""

    a: Operand
    b: Operand
    batch: tuple[int, ...]
    m: tuple[int, ...]
    n: tuple[int, ...]
    epilogue: Kernel | None  # the stored value computed from the matmul result, or None if it is ACC
    prologues: tuple[Kernel, ...] = ()  # operands that are computed (e.g. relu'(x) * g) are made first
    chunk: Chunk | None = None  # run in pieces of one axis (an im2col copy per piece)


def _affine(index: Expr, naxes: int) -> tuple[int, tuple[int, ...]] | None:
    strides = [0] * naxes
    offset = 0
    for coef, atom in linear_terms(index):
        if atom is None:
            offset += coef
        elif atom.op == "IDX":
            strides[atom.arg[0]] += coef
        else:
            return None
    return offset, tuple(strides)


def _operand(e: Expr, naxes: int, dtype: DType) -> Operand | None:
    if e.op != "LOAD" or not is_true(e.srcs[1]) or e.dtype != dtype:
        return None
    aff = _affine(e.srcs[0], naxes)
    return None if aff is None else Operand(e.arg, aff[0], aff[1])


def _replace_acc(e: Expr, load: Expr) -> Expr:
    if e.op == "ACC":
        return load
    if not e.srcs:
        return e
    return Expr(e.op, tuple(_replace_acc(s, load) for s in e.srcs), e.arg, e.dtype)


def _row_major(shape: tuple[int, ...], axes: int) -> Expr:
    """The row-major index over the first `axes` axes of `shape`."""
    index, acc = const(0, IDX_DT), 1
    for axis in reversed(range(axes)):
        index = iadd(index, imul(Expr("IDX", (), (axis, shape[axis]), IDX_DT), acc))
        acc *= shape[axis]
    return index


def contraction(kernel: Kernel) -> bool:
    """Whether the kernel's reduce is a float32 or float64 sum of products (what `analyse` may plan)."""
    k = kernel
    return k.reduce_op == "SUM" and k.reduce_expr.op == "MUL" and k.reduce_expr.dtype in (dtypes.float32,
                                                                                          dtypes.float64)


def analyse(kernel: Kernel) -> BlasPlan | None:
    """The kernel's reduce sum_r A[g, r] * B[g, r] as a matmul: its operands (strided loads, or computed
    ones a prologue writes), the global axes split into batch, M (A only) and N (B only), the epilogue; or
    None where it is not one. Structure only: which of these run as BLAS, in which pieces, is the
    optimizer's choice (opt/host.py), applied by `plan_for`."""
    k = kernel
    if not contraction(k):
        return None
    dtype = k.reduce_expr.dtype
    naxes = len(k.shape)
    prologues: list[Kernel] = []

    def operand(e: Expr) -> Operand | None:
        op = _operand(e, naxes, dtype)
        if op is None and e.dtype == dtype and "ACC" not in _ops(e):
            # a computed operand: a prologue kernel writes it row-major over the axes it uses, the
            # output's axes first or the reduce axes first, whichever puts the longer axis innermost
            # (a conv's im2col loops over a row of the image, not over a row of the 5x5 window)
            axes = sorted(_axes(e))
            outer = [a for a in axes if a < k.n_global]
            inner = [a for a in axes if a >= k.n_global]
            if outer and inner and k.shape[outer[-1]] > k.shape[inner[-1]]:
                axes = inner + outer
            sizes = [k.shape[a] for a in axes]
            remap = {a: Expr("IDX", (), (pos, k.shape[a]), IDX_DT) for pos, a in enumerate(axes)}
            strides, acc = [0] * naxes, 1
            for a in reversed(axes):
                strides[a] = acc
                acc *= k.shape[a]
            index = const(0, IDX_DT)
            for a in axes:
                index = iadd(index, imul(remap[a], strides[a]))
            prologues.append(
                Kernel(
                    name=f"{k.name}_operand{len(prologues)}",
                    shape=tuple(sizes),
                    n_global=len(sizes),
                    reduce_op=None,
                    reduce_expr=None,
                    expr=_remap_idx(e, remap),
                    out_index=index,
                    out_dtype=dtype,
                    in_dtypes=k.in_dtypes,
                )
            )
            op = Operand(len(k.in_dtypes) + len(prologues) - 1, 0, tuple(strides))
        return op

    a, b = (operand(s) for s in k.reduce_expr.srcs)
    ng = k.n_global
    if a is None or b is None or not any(a.strides[ng:]) or not any(b.strides[ng:]):
        return None
    batch, m, n = [], [], []
    for axis in range(k.n_global):
        sa, sb = a.strides[axis], b.strides[axis]
        if sa and sb:
            batch.append(axis)
        elif sa:
            m.append(axis)
        elif sb:
            n.append(axis)
        else:
            return None
    if not m and not n:  # dot products: the generated reduce loop streams both operands once
        return None
    if not m and n:  # keep A the operand with the M axes
        a, b, m, n = b, a, n, m
    epilogue = None
    row_major = _row_major(k.shape, k.n_global)
    if not (k.expr.op == "ACC" and same_index(k.out_index, row_major)):
        load = Expr("LOAD", (row_major, const(True, dtypes.bool)), len(k.in_dtypes), dtype)
        epilogue = Kernel(
            name=k.name + "_epilogue",
            shape=k.global_shape,
            n_global=k.n_global,
            reduce_op=None,
            reduce_expr=None,
            expr=_replace_acc(k.expr, load),
            out_index=k.out_index,
            out_dtype=k.out_dtype,
            in_dtypes=(*k.in_dtypes, dtype),
        )
    return BlasPlan(a, b, tuple(batch), tuple(m), tuple(n), epilogue, tuple(prologues))


def matvec(plan: BlasPlan) -> bool:
    """Whether the plan is a matrix times a vector whose rows are read along memory."""
    return not plan.n and plan.a.strides[-1] == 1


def operand_elements(kernel: Kernel, plan: BlasPlan) -> int:
    """Elements of the larger operand as a matrix (batch x rows x K)."""
    rows = max(math.prod(kernel.shape[x] for x in (*plan.batch, *side)) for side in (plan.m, plan.n))
    return rows * math.prod(kernel.reduce_shape)


def copied(kernel: Kernel, plan: BlasPlan) -> list[bool]:
    """Whether A and B must each be copied to be a matrix (im2col), see `_copied`."""
    r = list(range(kernel.n_global, len(kernel.shape)))
    return _copied(plan.a, plan.b, plan.m, plan.n, r, kernel.shape)


def windows(kernel: Kernel, plan: BlasPlan) -> tuple[int, int] | None:
    """(K, the other side's columns) of a plan that copies one operand whose matrix reads its memory more
    than once (a conv's overlapping windows) and has no batch axes; else None."""
    k, (a, b, m, n) = kernel, (plan.a, plan.b, plan.m, plan.n)
    copy = copied(k, plan)
    if sum(copy) != 1 or plan.batch:
        return None
    r = list(range(k.n_global, len(k.shape)))
    win, rows, cols = (a, m, r) if copy[0] else (b, r, n)
    if not _overlaps(win, [*rows, *cols], k.shape):
        return None
    return math.prod(k.reduce_shape), math.prod(k.shape[x] for x in (n if copy[0] else m))


def small_batch(k: Kernel, plan: BlasPlan) -> tuple[int, int] | None:
    """(multiply-adds per matmul, K) of a plan that is a batch of at least two matmuls over one M, one N and
    one K axis, operands read in place and the result stored as it comes (no prologue, epilogue or chunk),
    which emit_numba.render_batched can run; else None."""
    if not plan.batch or plan.prologues or plan.epilogue is not None or plan.chunk is not None:
        return None
    if len(plan.m) != 1 or len(plan.n) != 1 or len(k.reduce_shape) != 1:
        return None
    if math.prod(k.shape[b] for b in plan.batch) < 2:
        return None
    kk = k.reduce_shape[0]
    return k.shape[plan.m[0]] * k.shape[plan.n[0]] * kk, kk


def _overlaps(op: Operand, axes, shape) -> bool:
    """Whether the operand's matrix over these axes has more elements than the memory span it reads: a
    conv's sliding windows, which read each input element several times."""
    span = 1 + sum((shape[x] - 1) * abs(op.strides[x]) for x in axes)
    return math.prod(shape[x] for x in axes) > span


def _copied(a: Operand, b: Operand, m, n, r, shape) -> list[bool]:
    """Whether A (rows m, cols r) and B (rows r, cols n) must each be copied to be a matrix (im2col): their
    axes do not merge into one run of memory per side."""
    return [not (_merges(op, rows, shape) and _merges(op, cols, shape)) for op, rows, cols in
            ((a, m, r), (b, r, n))]


def _merges(op: Operand, axes, shape) -> bool:
    """Whether the operand's axes (in this order) are one run of memory (a matrix side without a copy)."""
    axes = [x for x in axes if shape[x] > 1]
    return all(op.strides[x] == op.strides[y] * shape[y] for x, y in zip(axes, axes[1:]))


def chunk_for(kernel: Kernel, plan: BlasPlan, least: int, elems: int) -> Chunk | None:
    """How to cut a matmul whose operands are copied (im2col) into pieces (`Chunk`, without its shift), or
    None: copies of fewer than `least` elements, or no axis that every copied operand indexes. Global axis
    0 (pieces of the result's rows) where its pieces fit `elems`, else whichever of it and the first
    reduce axis has the smaller pieces (a grouped conv's weight gradient has the groups first, the images
    in K; 5 images of 286K window elements each are cut along the channels instead)."""
    k, (a, b, m, n, batch) = kernel, (plan.a, plan.b, plan.m, plan.n, plan.batch)
    r = list(range(k.n_global, len(k.shape)))
    copies = [(math.prod(k.shape[x] for x in (*batch, *rows, *cols)), op)
              for copy, (op, rows, cols) in zip(copied(k, plan), ((a, m, r), (b, r, n))) if copy]
    total = sum(e for e, _ in copies)
    if total < least:
        return None
    best = None  # (elements a piece copies, Chunk): the smaller pieces win, global axis 0 on a tie
    for axis in (0, k.n_global):
        length = k.shape[axis] if axis < len(k.shape) else 0
        if length > 1 and all(op.strides[axis] for _, op in copies):
            per = total // length  # the copies' elements per index of the axis
            size = piece_size(length, per, elems)
            if best is None or size * per < best[0] and best[0] > elems:
                best = (size * per, Chunk(axis, size))
    return None if best is None else best[1]


def with_chunk(kernel: Kernel, plan: BlasPlan, axis: int, size: int) -> BlasPlan:
    """The plan run in pieces of `size` indices of `axis`, with the shift that allows (`_shift_pair`)."""
    chunk = Chunk(axis, size)
    shift = None if plan.batch else _shift_pair(kernel, plan.a, plan.b, plan.m, plan.n, chunk)
    return replace(plan, chunk=Chunk(axis, size, shift) if shift else chunk)


def _shift_pair(k: Kernel, a: Operand, b: Operand, m, n, chunk: Chunk) -> tuple[int, int] | None:
    """(L, P) where the one copied operand C (a stride-1 conv's windows) reads the same memory along two
    axes of its matrix, L on one side and P on the other (the kernel row kh in K and the output row y in
    the result: row y + kh of the image; or for the weight gradient, kh in the result and y in K). A piece
    then copies C once without L and with P extended by L's length - 1 (each image row once per kernel
    column, not per 5x5 window: 5x fewer elements for a 5x5 conv) and runs one matmul per index l of L on
    the copy's columns shifted by l rows, with the other operand at L = l: products summed (L in K) or
    written to the result's L = l slice (L global). Only for pieces of one index of the chunk axis, where
    P is then the outermost axis of its side (so each shifted window is a plain column range of the
    copy), and where a matmul with L in K leaves the result's rows in the output's order."""
    if chunk.size != 1:
        return None
    ng, shape = k.n_global, k.shape
    sub = tuple(1 if x == chunk.axis else d for x, d in enumerate(shape))  # a piece's shape
    r = list(range(ng, len(shape)))
    copied = _copied(a, b, m, n, r, sub)
    if sum(copied) != 1:
        return None
    c, side = (a, list(m)) if copied[0] else (b, list(n))
    live = lambda axes: [x for x in axes if shape[x] > 1 and x != chunk.axis]  # noqa: E731
    for dim_l, dim_p in ((r, side), (side, r)):
        p_axes = live(dim_p)
        if not p_axes or (dim_l is r) != (chunk.axis < ng):  # L in K for pieces of rows, else in the result
            continue
        p = p_axes[0]
        for lx in live(dim_l):
            if c.strides[lx] != c.strides[p] or not c.strides[p]:
                continue
            if dim_l is r:  # products summed: the rows (the other operand's side, then C's) in order
                other = list(n) if copied[0] else list(m)
                if live([*other, *side]) != live(list(range(ng))):
                    continue
            return lx, p
    return None


def piece_size(length: int, per: int, elems: int) -> int:
    """The most indices of an axis of `length` per piece (a divisor) whose `per` elements each fit `elems`,
    at least 1."""
    return max([d for d in range(1, length) if length % d == 0 and d * per <= elems] or [1])


def lead_axes(k: Kernel, plan: BlasPlan, least: int) -> int:
    """A result whose rows would come out in another order than the output's (it would be copied there,
    transposed) loops over its leading axes as batch axes instead, where that puts it in order and each
    matmul keeps `least` multiply-adds: numpy's matmul broadcasts the operand those axes do not index. A
    conv's col2im matmul cols[n, c, k, p] = sum_o w[o, c, k] * g[n, o, p] runs per image (M = c*k,
    N = p) and writes its output where it belongs (164 MB not copied for the MNIST CNN's conv2): the many
    smaller matmuls ran faster than one with the copy (measured: bench/HISTORY.md). The number of leading
    axes, or 0."""
    ng, (batch, m, n) = k.n_global, (plan.batch, plan.m, plan.n)
    if [*batch, *m, *n] == list(range(ng)):
        return 0
    for lead in range(len(batch) + 1, ng):
        rest_m, rest_n = [x for x in m if x >= lead], [x for x in n if x >= lead]
        in_order = [*range(lead), *rest_m, *rest_n] == list(range(ng))
        work = math.prod(k.shape[x] for x in (*rest_m, *rest_n)) * math.prod(k.reduce_shape)
        if set(batch) <= set(range(lead)) and rest_m and rest_n and in_order and work >= least:
            return lead
    return 0


def with_lead(plan: BlasPlan, lead: int) -> BlasPlan:
    """The plan with its leading `lead` global axes as batch axes (`lead_axes`)."""
    return replace(plan, batch=tuple(range(lead)), m=tuple(x for x in plan.m if x >= lead),
                   n=tuple(x for x in plan.n if x >= lead))


def _ops(e: Expr, seen: set | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if e in seen:
        return set()
    seen.add(e)
    out = {e.op}
    for s in e.srcs:
        out |= _ops(s, seen)
    return out


def _axes(e: Expr, seen: set | None = None) -> set[int]:
    """The kernel axes whose index e uses."""
    seen = set() if seen is None else seen
    if e in seen:
        return set()
    seen.add(e)
    out = {e.arg[0]} if e.op == "IDX" else set()
    for s in e.srcs:
        out |= _axes(s, seen)
    return out


def _remap_idx(e: Expr, remap: dict[int, Expr], memo: dict | None = None) -> Expr:
    memo = {} if memo is None else memo
    hit = memo.get(e)
    if hit is None:
        if e.op == "IDX":
            hit = remap.get(e.arg[0], e)  # (axes not in remap stay)
        elif not e.srcs:
            hit = e
        else:
            hit = Expr(e.op, tuple(_remap_idx(s, remap, memo) for s in e.srcs), e.arg, e.dtype)
        memo[e] = hit
    return hit


# ---------------------------------------------------------------------------------------------------
# piece pairs: a matmul and the elementwise kernel after it that reads its result image by image


@dataclass(frozen=True)
class PiecePair:
    """A BLAS kernel k1 run in pieces of its axis 0 (`chunk`), each piece followed at once by the next
    kernel k2 over the same images (`sub`: k2 over chunk.size images), which reads k1's result while it
    is in cache: a conv's col2im matmul (164 MB of window shares for the MNIST CNN's second conv) and
    the sum that shifts them into place. Where nothing else reads k1's result (runtime/cpu/groups.py) it
    is never written whole, else k1 writes it too; k2's pointers move by `shifts` elements per image (its
    output's by `out_shift`)."""

    chunk: Chunk
    sub: Kernel
    shifts: tuple[int, ...]
    out_shift: int


def piece_pair(k1: Kernel, k2: Kernel, reads: tuple[int, ...], plan: BlasPlan | None, least: int, most: int,
               elems: int) -> PiecePair | None:
    """k1 (a BLAS kernel, `plan` its plan) then k2 (elementwise, reading k1's result as its inputs `reads`)
    as a PiecePair in pieces of `elems` result elements, or None. Only where k1's result has `least`
    elements (below, it stays in the caches between the two kernels, and a matmul cut in two for threads
    is slower than one) and one image of k2 at most `most` points (its reads are checked at each), and
    where it gives the same values: k1's plan writes its result row-major with no copies and no epilogue
    (computed operands are made whole first); k2's axis 0 (images, the length of k1's) appears in its
    indices only as a term n * shift of a load or store index, one shift per input; and k2 reads k1's
    result only within the image it computes (checked at every point of one image, masks applied:
    `_index_range`)."""
    if plan is None or plan.epilogue is not None or plan.chunk is not None:
        return None
    if k2.reduce_expr is not None or not k2.shape or k2.shape[0] != k1.shape[0] or k2.shape[0] < 2:
        return None
    if k1.n_global < 1 or math.prod(k2.shape[1:]) > most or k2.out_dtype == dtypes.float16 or \
            dtypes.float16 in k2.in_dtypes or math.prod(k1.global_shape) < least:
        return None
    shifts: dict[int, int] = {}
    loads: list[Expr] = []
    seen: set = set()
    stack = [k2.expr]
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        if e.op == "LOAD":
            shift = _axis0_shift(e.srcs[0])
            if shift is None or 0 in _axes(e.srcs[1]) or shifts.setdefault(e.arg, shift) != shift:
                return None
            loads.append(e)
            stack.append(e.srcs[1])
        elif e.op == "IDX" and e.arg[0] == 0:
            return None  # the image number used as a value, or in a mask
        else:
            stack.extend(e.srcs)
    out_shift = _axis0_shift(k2.out_index)
    per_image = math.prod(k1.shape[1 : k1.n_global])  # k1's result elements per image
    if out_shift is None or any(shifts.get(p, per_image) != per_image for p in reads):
        return None
    for e in loads:
        if e.arg in reads:
            lo, hi = _index_range(e.srcs[0], e.srcs[1], k2.shape)
            if lo is None or lo < 0 or hi >= per_image:
                return None
    size = piece_size(k1.shape[0], per_image, elems)
    moves = tuple(shifts.get(j, 0) for j in range(len(k2.in_dtypes)))
    return PiecePair(Chunk(0, size), _resize_axis0(k2, size), moves, out_shift)


@dataclass(frozen=True)
class Col2Im:
    """A piece pair that is a convolution's input gradient (`col2im`): k1 (global axes n, c, tap, pixel;
    reduce axis o) multiplies the weight by the output gradient (operands `weight` and `grad` over k1's
    axes), and k2's out[n, c, y * sy + ky * dh, x * sx + kx * dw] is the sum of k1's result
    [n, c, ky * kw + kx, y * ow + x] over every (tap, pixel) landing there, each once: the scatter a
    direct input gradient computes without k1's result (emit_numba_conv.render_input_grad)."""

    kh: int
    kw: int
    oh: int
    ow: int
    ih: int
    iw: int
    sy: int
    sx: int
    dh: int
    dw: int
    weight: Operand
    grad: Operand
    # k2 with the sum replaced by a load of it (a last input, row-major), where k2 computes more than the
    # sum (the previous layer's relu mask); None where k2 is the sum
    epilogue: Kernel | None


def col2im(k1: Kernel, k2: Kernel, reads: tuple[int, ...], plan: BlasPlan) -> Col2Im | None:
    """The Col2Im a piece pair (k1, k2) computes, or None. ops/nn.py marks the sum it builds (the
    graph.Col2ImSum on its last ADD, kept by fusion where k2 evaluates it at k2's own point), so the
    geometry is the mark's; what is checked is that fusion left that sum as the op built it: in k2 one
    marked sum whose terms are loads of k1's result (input `reads`), one per kernel position, and no other
    read of that result; k1 the matmul of that gradient (n, c, tap, pixel; reduce o) with no epilogue, both
    results row-major, no groups. Anything k2 computes around the sum becomes the epilogue."""
    if plan.epilogue is not None or plan.batch != (0,) or k1.contraction != COL2IM:
        return None
    if k1.n_global != 4 or len(k1.reduce_shape) != 1 or len(reads) != 1 or k2.reduce_expr is not None:
        return None
    total = _marked_sum(k2.expr, reads[0])
    if total is None:
        return None
    mark = total.arg
    if mark.groups != 1 or len(mark.kernel) != 2:
        return None
    (kh, kw), (oh, ow), (ih, iw) = mark.kernel, mark.out, mark.input
    images, chans, taps, pixels = k1.global_shape
    if k2.shape != (images, chans, ih, iw) or (taps, pixels) != (kh * kw, oh * ow):
        return None
    row_major = _row_major(k2.shape, 4)
    if not (same_index(k1.out_index, _row_major(k1.shape, 4)) and same_index(k2.out_index, row_major)):
        return None
    a, b = plan.a, plan.b
    if a.strides[0] == a.strides[3] == 0 and b.strides[1] == b.strides[2] == 0:
        weight, grad = a, b
    elif b.strides[0] == b.strides[3] == 0 and a.strides[1] == a.strides[2] == 0:
        weight, grad = b, a
    else:
        return None
    epilogue = None
    if total is not k2.expr:
        load = Expr("LOAD", (row_major, const(True, dtypes.bool)), len(k2.in_dtypes), total.dtype)
        epilogue = replace(k2, name=f"{k2.name}_epilogue", in_dtypes=(*k2.in_dtypes, total.dtype),
                           expr=_replace_expr(k2.expr, total, load))
    # (a stride along an axis of one output position, a dilation along one of one tap, moves nothing: 1)
    (sy, sx), (dh, dw) = mark.stride, mark.dilation
    sy, sx, dh, dw = sy if oh > 1 else 1, sx if ow > 1 else 1, dh if kh > 1 else 1, dw if kw > 1 else 1
    return Col2Im(kh, kw, oh, ow, ih, iw, sy, sx, dh, dw, weight, grad, epilogue)


def _marked_sum(e: Expr, source: int) -> Expr | None:
    """The col2im sum in e (an ADD whose arg is a graph.Col2ImSum) whose terms are loads of input `source`,
    one per kernel position, where e reads `source` nowhere else; else None."""
    sums, seen, stack = [], set(), [e]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if isinstance(x.arg, Col2ImSum):
            sums.append(x)  # (looked into below)
        elif x.op == "LOAD" and x.arg == source:
            return None  # read outside a marked sum
        else:
            stack.extend(x.srcs)
    found = []
    for total in sums:
        terms, stack = [], [total]
        while stack:  # (the sum's ADDs: the marked one, then those ops/nn.py built before it, unmarked)
            x = stack.pop()
            if x.op == "ADD" and (x is total or x.arg is None):
                stack.extend(x.srcs)
            else:
                terms.append(x)
        loads = all(t.op == "LOAD" and t.arg == source for t in terms)
        if loads and len(terms) == math.prod(total.arg.kernel):
            found.append(total)
        elif _reads(total, source):
            return None  # a sum fusion changed
    return found[0] if len(found) == 1 else None


def _reads(e: Expr, source: int) -> bool:
    seen, stack = set(), [e]
    while stack:
        x = stack.pop()
        if x not in seen:
            seen.add(x)
            if x.op == "LOAD" and x.arg == source:
                return True
            stack.extend(x.srcs)
    return False


def _replace_expr(e: Expr, old: Expr, new: Expr) -> Expr:
    if e is old:
        return new
    if not e.srcs:
        return e
    return Expr(e.op, tuple(_replace_expr(s, old, new) for s in e.srcs), e.arg, e.dtype)


def _axis0_shift(index: Expr) -> int | None:
    """c where index = c * i0 + (terms without i0), else None (i0 under a division, a product, ...)."""
    shift = 0
    for coef, atom in linear_terms(index):
        if atom is not None and atom.op == "IDX" and atom.arg[0] == 0:
            shift += coef
        elif atom is not None and 0 in _axes(atom):
            return None
    return shift


def _resize_axis0(k: Kernel, size: int) -> Kernel:
    remap, memo = {0: Expr("IDX", (), (0, size), IDX_DT)}, {}
    return Kernel(name=f"{k.name}_piece", shape=(size, *k.shape[1:]), n_global=k.n_global, reduce_op=None,
                  reduce_expr=None, expr=_remap_idx(k.expr, remap, memo),
                  out_index=_remap_idx(k.out_index, remap, memo), out_dtype=k.out_dtype,
                  in_dtypes=k.in_dtypes)


_INT_OPS = {"ADD": np.add, "MUL": np.multiply, "CMPLT": np.less, "AND": np.logical_and, "OR": np.logical_or,
            "CMPNE": np.not_equal, "MAX": np.maximum}


def _evaluate(e: Expr, grids: np.ndarray, memo: dict) -> np.ndarray:
    """An index or mask expression at every point of `grids` (np.indices of the points, flattened), as
    the kernels compute it; LookupError for an op not understood here."""

    def ev(e: Expr):
        hit = memo.get(e)
        if hit is not None:
            return hit
        if e.op == "IDX":
            hit = grids[e.arg[0]]
        elif e.op == "CONST":
            hit = np.asarray(e.arg)
        elif e.op in _INT_OPS:
            a, b = (ev(s) for s in e.srcs)
            hit = _INT_OPS[e.op](a, b)
        elif e.op in ("IDIV", "MOD"):  # as the kernels compute them: truncated toward zero, x // 0 = 0
            a, b = (ev(s) for s in e.srcs)
            q = np.where(b == 0, 0, np.sign(a) * np.sign(b) * (np.abs(a) // np.maximum(np.abs(b), 1)))
            hit = q if e.op == "IDIV" else a - b * q
        elif e.op == "NOT":
            hit = np.logical_not(ev(e.srcs[0]))
        elif e.op == "WHERE":
            c, a, b = (ev(s) for s in e.srcs)
            hit = np.where(c, a, b)
        else:
            raise LookupError(e.op)
        memo[e] = hit
        return hit

    return np.broadcast_to(ev(e), grids.shape[1:])


def _index_range(index: Expr, mask: Expr, shape: tuple[int, ...]) -> tuple[int | None, int | None]:
    """The least and greatest value of a load's index, without its image term, over the points of one
    image (axis 0 at 0) where its mask holds; (None, None) where an op is not understood here."""
    grids = np.indices((1, *shape[1:]), dtype=np.int64).reshape(len(shape), -1)
    try:
        memo: dict = {}
        values, valid = _evaluate(index, grids, memo), _evaluate(mask, grids, memo).astype(bool)
    except (LookupError, ValueError, TypeError):
        return None, None
    if not valid.any():
        return 0, 0
    picked = values[valid]
    return int(picked.min()), int(picked.max())


# ---------------------------------------------------------------------------------------------------
# convolutions a direct loop nest computes (emit_numba_conv renders them; opt/host.py decides when)


def float_dtype(k: Kernel, plan: BlasPlan, *operands) -> DType | None:
    """The kernel's sum dtype where it is float32 or float64 and every operand (a kernel input, or after
    them a prologue's result) has it too; else None."""
    dt = k.reduce_expr.dtype
    dtypes_of = (*k.in_dtypes, *(p.out_dtype for p in plan.prologues))
    ok = dt in (dtypes.float32, dtypes.float64) and all(dtypes_of[op.input] == dt for op in operands)
    return dt if ok else None


def conv_forward(kernel: Kernel, plan: BlasPlan) -> bool:
    """Whether a plan is a 2-d convolution's forward product that emit_numba_conv.render_direct renders:
    global axes (n, o, y, x), reduce axes (c, kh, kw), the windows (A) read in place from one input and
    the weight (B) from another, one float dtype, no groups (no batch axes)."""
    k = kernel
    if plan.prologues or plan.batch or plan.m != (0, 2, 3) or plan.n != (1,) or k.n_global != 4:
        return False
    if len(k.reduce_shape) != 3 or plan.a.input == plan.b.input:
        return False
    return float_dtype(k, plan, plan.a, plan.b) is not None


def conv_weight_grad(kernel: Kernel, plan: BlasPlan) -> bool:
    """Whether a plan is a 2-d convolution's weight gradient that emit_numba_conv.render_weight_grad
    renders: global axes (o, c, kh, kw), reduce axes (n, y, x), the output gradient (A) read by o and the
    reduce axes, the input's windows (B) by the rest, both in place, one float dtype."""
    k = kernel
    if plan.batch or plan.m != (0,) or plan.n != (1, 2, 3) or k.n_global != 4:
        return False
    if len(k.reduce_shape) != 3 or plan.a.input == plan.b.input:
        return False
    return float_dtype(k, plan, plan.a, plan.b) is not None


def conv_input_grad(k1: Kernel, k2: Kernel, reads: tuple[int, ...], plan: BlasPlan) -> Col2Im | None:
    """The Col2Im of a piece pair (k1, k2) that emit_numba_conv.render_input_grad renders as one function
    (a convolution's input gradient: `col2im`), or None; one float dtype throughout."""
    g = col2im(k1, k2, reads, plan)
    if g is None:
        return None
    summed = k2.out_dtype if g.epilogue is None else g.epilogue.in_dtypes[-1]
    dt = float_dtype(k1, plan, g.weight, g.grad)
    return g if dt is not None and k1.out_dtype == summed == dt else None
