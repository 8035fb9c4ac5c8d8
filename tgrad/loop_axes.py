"""A kernel's iteration space reshaped for the CPU emitter (emit_numba), before its loops are written:
`flatten` (an elementwise kernel that walks every array row-major: one axis), `merge_axes` (neighbouring
axes every index uses as one: one longer loop), `split_axes` (an axis an index divides by a constant:
two loops, so the quotient and remainder are loop counters instead of a division per element); and
`nodes`, the one walk over a kernel's expressions (emit_triton uses it too). Pure functions over the
Kernel IR, like the emitters."""

from __future__ import annotations

import math
from dataclasses import replace

from tgrad.blas import _affine
from tgrad.fuse import (
    IDX_DT,
    Expr,
    Kernel,
    const,
    from_terms,
    iadd,
    idiv,
    igreater_eq,
    iless,
    imod,
    imul,
    is_const,
    is_true,
    linear_terms,
)


def flatten(kernel: Kernel) -> Kernel | None:
    """An elementwise kernel whose store and loads all walk its iteration space row-major (or read one
    fixed element) as the same kernel over one axis. Such kernels differ only in their length (an Adam
    update of each parameter, the same activation on each layer), so one compiled function serves all."""
    k = kernel
    if k.reduce_expr is not None or not k.shape:
        return None
    naxes, size = len(k.shape), math.prod(k.shape)
    row_major = [0] * naxes
    acc = 1
    for axis in reversed(range(naxes)):
        row_major[axis] = acc
        acc *= k.shape[axis]
    flat_idx = Expr("IDX", (), (0, size), IDX_DT)
    memo: dict[Expr, Expr | None] = {}

    def index(e: Expr) -> Expr | None:
        aff = _affine(e, naxes)
        if aff is None:
            return None
        if aff[0] == 0 and all(st == rm or n == 1 for st, rm, n in zip(aff[1], row_major, k.shape)):
            return flat_idx
        return const(aff[0], IDX_DT) if not any(aff[1]) else None

    def walk(e: Expr) -> Expr | None:
        if e in memo:
            return memo[e]
        if e.op == "IDX":
            out = None  # an index used as a value (arange, masks...): keep the shape
        elif e.op == "LOAD":
            idx = index(e.srcs[0]) if is_true(e.srcs[1]) else None
            out = None if idx is None else Expr("LOAD", (idx, e.srcs[1]), e.arg, e.dtype)
        elif not e.srcs:
            out = e
        else:
            srcs = [walk(s) for s in e.srcs]
            out = None if any(s is None for s in srcs) else Expr(e.op, tuple(srcs), e.arg, e.dtype)
        memo[e] = out
        return out

    expr = walk(k.expr)
    if expr is None or index(k.out_index) is not flat_idx:
        return None
    return Kernel(
        name=k.name, shape=(size,), n_global=1, reduce_op=None, reduce_expr=None, expr=expr,
        out_index=flat_idx, out_dtype=k.out_dtype, in_dtypes=k.in_dtypes,
    )


def merge_axes(kernel: Kernel, rows: bool = False) -> Kernel:
    """Neighbouring axes of one kind (both global or both reduce) that every load and the store index as
    one (coefficient of the outer = that of the inner * the inner's size) and nothing else uses become one
    axis: a reduce over (128, 20, 20) rows of an image is a loop of 400 inside a loop of 128, which
    vectorizes, instead of 2560 loops of 20. rows: a reduce's global axes merge too (in a row group, its
    rows are those of the elementwise kernel after it: LayerNorm's (16, 64) rows are 1024)."""
    k = kernel
    roots, nonlinear, seen = [], set(), set()

    def visit(e: Expr) -> None:  # IDX found here (outside a load or store index's linear terms)
        if e in seen:
            return
        seen.add(e)
        if e.op == "IDX":
            nonlinear.add(e.arg[0])
        elif e.op == "LOAD":
            roots.append(e.srcs[0])
            for _, atom in linear_terms(e.srcs[0]):
                if atom is not None and atom.op != "IDX":
                    visit(atom)
            visit(e.srcs[1])
        for src in e.srcs if e.op != "LOAD" else ():
            visit(src)

    for e in (k.expr, k.reduce_expr):
        if e is not None:
            visit(e)
    roots.append(k.out_index)
    for _, atom in linear_terms(k.out_index):
        if atom is not None and atom.op != "IDX":
            visit(atom)
    coefs = []
    for root in roots:
        c: dict[int, int] = {}
        for coef, atom in linear_terms(root):
            if atom is not None and atom.op == "IDX":
                c[atom.arg[0]] = c.get(atom.arg[0], 0) + coef
        coefs.append(c)
    # a reduce kernel keeps its global axes (threads split the first; an interchanged reduce keeps the
    # last innermost, the first outside it): only its reduce axes merge
    ng = k.n_global if k.reduce_expr is not None and not rows else 0
    merged: list[list[int]] = [[a] for a in range(ng)]  # runs of old axes that become one new axis
    for a in range(ng, len(k.shape)):
        run = merged[-1] if merged and (a - 1 >= k.n_global) == (a >= k.n_global) and a - 1 >= ng else None
        if (run is not None and a not in nonlinear and run[-1] not in nonlinear
                and all(c.get(run[-1], 0) == c.get(a, 0) * k.shape[a] for c in coefs)):
            run.append(a)
        else:
            merged.append([a])
    if len(merged) == len(k.shape):
        return k
    shape = tuple(math.prod(k.shape[a] for a in run) for run in merged)
    new_of = {run[-1]: Expr("IDX", (), (i, shape[i]), IDX_DT) for i, run in enumerate(merged)}
    memo: dict[Expr, Expr] = {}

    def walk(e: Expr) -> Expr:
        hit = memo.get(e)
        if hit is None:
            if e.op == "IDX":  # only the innermost axis of a run is used alone (others are merged)
                hit = new_of[e.arg[0]]
            elif e.op == "LOAD" or e is k.out_index:
                index = e.srcs[0] if e.op == "LOAD" else e
                terms = [(c, walk(t) if t is not None else None) for c, t in linear_terms(index)
                         if t is None or t.op != "IDX" or t.arg[0] in new_of]
                hit = from_terms(terms)
                if e.op == "LOAD":
                    hit = Expr("LOAD", (hit, walk(e.srcs[1])), e.arg, e.dtype)
            else:
                hit = Expr(e.op, tuple(walk(s) for s in e.srcs), e.arg, e.dtype) if e.srcs else e
            memo[e] = hit
        return hit

    return _reshaped(k, shape, sum(1 for run in merged if run[0] < k.n_global), walk)


def split_axes(kernel: Kernel, least_inner: int) -> Kernel:
    """Each axis that indices divide by one constant c (`i // c`, `i % c`; c divides its size and is at
    least `least_inner` for an axis that may be the innermost loop: a vector's worth) as two axes, i // c
    and i % c: the loops count them, the division and remainder per element vanish and the inner loop
    vectorizes. The gradient of attention's q, k, v split out of one (16, 64, 192) buffer read its heads
    as `i2 // 16` and `i2 % 16` per element, several times slower than as two axes (measured:
    bench/HISTORY.md)."""
    k = kernel
    divisors: dict[int, set[int]] = {}
    for e in nodes(k.expr, k.out_index, k.reduce_expr):
        if e.op in ("IDIV", "MOD") and e.srcs[0].op == "IDX" and is_const(e.srcs[1]):
            divisors.setdefault(e.srcs[0].arg[0], set()).add(e.srcs[1].arg)
    splits = {}
    innermost = {len(k.shape) - 1, k.n_global - 1}  # (a reduce may run its last global axis innermost)
    for axis, cs in divisors.items():
        c, size = max(cs), k.shape[axis]
        least = least_inner if axis in innermost else 2
        if least <= c < size and size % c == 0 and all(c % d == 0 for d in cs):
            splits[axis] = c
    if not splits:
        return k
    shape, new_idx, outers = [], {}, {}
    for axis, size in enumerate(k.shape):
        c = splits.get(axis)
        if c is None:
            new_idx[axis] = Expr("IDX", (), (len(shape), size), IDX_DT)
            shape.append(size)
        else:
            outer = outers[axis] = Expr("IDX", (), (len(shape), size // c), IDX_DT)
            inner = Expr("IDX", (), (len(shape) + 1, c), IDX_DT)
            new_idx[axis] = iadd(imul(outer, c), inner)
            shape += [size // c, c]

    def split_compare(a: Expr, b: Expr) -> Expr | None:
        """a < b of a split axis i = c * q + r (0 <= r < c) and a multiple of c as a compare of q alone:
        i < m * c is q < m, m * c - 1 < i is q >= m. The pieces of a concatenation along the axis (the
        heads of q, k and v read back into one operand) then test the outer loop counter only."""
        if a.op == "IDX" and a.arg[0] in splits and is_const(b) and b.arg % splits[a.arg[0]] == 0:
            return iless(outers[a.arg[0]], b.arg // splits[a.arg[0]])
        if b.op == "IDX" and b.arg[0] in splits and is_const(a) and (a.arg + 1) % splits[b.arg[0]] == 0:
            return igreater_eq(outers[b.arg[0]], (a.arg + 1) // splits[b.arg[0]])
        return None
    memo: dict[Expr, Expr] = {}

    def walk(e: Expr) -> Expr:
        hit = memo.get(e)
        if hit is None:
            if e.op == "IDX":
                hit = new_idx[e.arg[0]]
            elif e.op == "CMPLT" and (hit := split_compare(*e.srcs)) is not None:
                pass
            elif not e.srcs:
                hit = e
            else:
                srcs = tuple(walk(s) for s in e.srcs)
                if e.dtype == IDX_DT and e.op in ("ADD", "MUL", "IDIV", "MOD") and (
                        e.op == "ADD" or is_const(srcs[1])):
                    # index arithmetic through fuse's constructors: (16 * i + j) // 16 is i again
                    if e.op == "ADD":
                        hit = iadd(*srcs)
                    else:
                        hit = {"MUL": imul, "IDIV": idiv, "MOD": imod}[e.op](srcs[0], srcs[1].arg)
                else:
                    hit = Expr(e.op, srcs, e.arg, e.dtype)
            memo[e] = hit
        return hit

    return _reshaped(k, tuple(shape), k.n_global + sum(1 for axis in splits if axis < k.n_global), walk)


def _reshaped(k: Kernel, shape: tuple[int, ...], n_global: int, walk) -> Kernel:
    """The kernel over new axes: its expressions and store index rewritten by `walk`."""
    reduce_expr = None if k.reduce_expr is None else walk(k.reduce_expr)
    return replace(k, shape=shape, n_global=n_global, reduce_expr=reduce_expr, expr=walk(k.expr),
                   out_index=walk(k.out_index))


def nodes(*roots: Expr | None) -> set[Expr]:
    """Every Expr under the roots (each once: kernel expressions share subtrees); None roots are skipped."""
    seen: set[Expr] = set()
    stack = [e for e in roots if e is not None]
    while stack:
        e = stack.pop()
        if e not in seen:
            seen.add(e)
            stack.extend(e.srcs)
    return seen
