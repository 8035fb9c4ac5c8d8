"""The Tensor ops' forms for symbolic shapes (symbolic.py): ops/movement.py, ops/indexing.py,
ops/reduce.py and tensor.py call these when a shape, an index, a padding or a bound holds an extent of
variables (a BoundVariable or an affine Expr of them), or the tensor has a symbolic axis.

An extent e is stored at its max; an op that places elements at positions depending on a variable (a
window `x[:, v:v+2]`, a pad or a cat after an axis of variables) gathers with a one-hot sum over the
axis whose positions compare with e's value read at launch, so its kernels serve every value. Every
cut is checked over the variables' whole ranges: a bound that could leave the axis raises here.
"""

from __future__ import annotations

import weakref

import numpy as np

from tgrad import graph as g
from tgrad import realize as driver
from tgrad.dtype import DType, check_fits, dtypes
from tgrad.errors import ArgumentError, ShapeError
from tgrad.graph import Op
from tgrad.symbolic import Sym, _is_int, _same, concrete, extent, has_var, like, of, physical, release


def _lo(x) -> int:
    return x.min if isinstance(x, Sym) else x


def _hi(x) -> int:
    return x.max if isinstance(x, Sym) else x


def _vars_of(*xs) -> str:
    names = sorted({v.var.name for x in xs if isinstance(x, Sym) for v in x.vars})
    return ", ".join(map(repr, names))


def _along(t, axis: int, n: int):
    """0..n-1 as int32, shaped to broadcast along axis of t."""
    shape = [1] * t.ndim
    shape[axis] = n
    return type(t).arange(n, device=t.device, dtype=dtypes.int32).reshape(shape)


def _value(t, x):
    """An int or an extent's value (a 0-d int32 tensor read at launch) to compare positions with."""
    return type(t)(x, device=t.device) if isinstance(x, Sym) else x


def _window(t, axis: int, start, size: int):
    """out[..., j, ...] = t[..., start + j, ...] for j < size along axis (t's node not symbolic there;
    start an int or an extent; a position outside t gives 0): a one-hot sum over the axis, so the start
    is read at launch. The sum of one element and zeros is that element, but for the sign of a zero
    (a sum's accumulator starts at +0.0): a selected -0.0 is put back (PyTorch's slice keeps it)."""
    T, n = type(t), t.node.shape[axis]
    hit = _along(t, axis, n).unsqueeze(axis) == _along(t, axis, size).unsqueeze(axis + 1) + _value(t, start)
    x = t.unsqueeze(axis)
    if t.dtype == dtypes.bool:
        return hit.where(x, False).max(axis + 1)
    if not t.dtype.is_float:
        return hit.where(x, 0).sum(axis + 1, dtype=t.dtype)
    out = hit.where(x, T(g.const(0.0, t.dtype, t.device))).sum(axis + 1, dtype=t.dtype)
    # (counted as a float sum, as the value: a bool any() there crashed pocl's LLVM on CL)
    negative_zero = (hit & (x == 0) & (x.detach().reciprocal() < 0)).where(1.0, 0.0).sum(axis + 1) > 0
    return negative_zero.where(T(g.const(-0.0, t.dtype, t.device)), out)


# a tensor cut by a window of variable start -> (weakref to it, the tensor cut, the shrink's argument):
# assign() into it writes the window of that tensor (a KV cache's `cache[:, :, pos:pos+n].assign(x)`)
WINDOWS: dict[int, tuple] = {}


def shrink(t, arg):
    """t.shrink(arg) where some bounds are extents of variables (`(0, v)`, `(v, v + 2)`, `(2, 10 - v)`):
    an int start cuts the axis statically to the end's max; a start of variables takes a window (a
    one-hot gather along the axis, its start read at launch); a length of variables is the result's
    extent. The ranges must keep every cut inside the axis."""
    if len(arg) != t.ndim:
        raise ShapeError(f"shrink: {arg} has {len(arg)} entries for a tensor of shape {t.shape}")
    phys, later = [], []
    for i, (a, s) in enumerate(zip(arg, t.shape)):
        if a is None or not has_var(a):
            phys.append(a)
            continue
        b, e = a
        b, e = 0 if b is None else b, s if e is None else e
        if not all(_is_int(x) or isinstance(x, Sym) for x in (b, e)):
            raise ShapeError(f"shrink: the bounds of axis {i} must be ints or extents of variables, got {a}")
        n, room, where = e - b, s - e, f"shrink: axis {i} (size {s}) cut to ({b}, {e})"
        if _lo(b) < 0:
            raise ShapeError(f"{where}: the start can be negative ({_lo(b)}) for variables {_vars_of(b)} in "
                             "their ranges")
        if _lo(n) < 0:
            raise ShapeError(f"{where}: the end can be before the start (by {-_lo(n)}) for variables "
                             f"{_vars_of(b, e)} in their ranges")
        if _lo(room) < 0:
            raise ShapeError(f"{where}: the end can be past the axis' size (by {-_lo(room)}) for variables "
                             f"{_vars_of(e, s)} in their ranges")
        if isinstance(s, Sym) and _is_int(b) and b == 0 and e == s:
            phys.append(None)  # the whole axis
            continue
        phys.append(None)
        later.append((i, b, n))
    x = t.shrink(tuple(phys)) if any(p is not None for p in phys) else t
    windowed = False
    for i, b, n in later:
        node = release(x.node, i)
        if isinstance(b, Sym):
            x = _window(x._from(node, x), i, b, _hi(n))
            windowed = True
        else:
            cut = tuple((b, b + _hi(n)) if j == i else (0, p) for j, p in enumerate(node.shape))
            x = x._from(g.move(node, Op.SHRINK, cut), x)
        if isinstance(n, Sym):
            x = x._from(extent(x.node, i, n), x)
    if windowed:
        x._base = None  # (its own memory: views of it, `w[0]`, write into it, so through assign_window)
        WINDOWS[id(x)] = (weakref.ref(x), t, tuple(arg))
        weakref.finalize(x, _forget, id(x))  # (the entry holds the cut tensor: dropped with the window)
    return x


def _forget(key: int) -> None:
    entry = WINDOWS.get(key)
    if entry is not None and entry[0]() is None:
        del WINDOWS[key]


def window_of(t) -> tuple | None:
    entry = WINDOWS.get(id(t))
    return entry[1:] if entry is not None and entry[0]() is t else None


def assign_window(t, x):
    """t.assign(x) where t is a window of variable start into base (shrink() above): base takes x at
    the window's positions (placed by a one-hot sum, read at launch), its other positions kept."""
    base, arg = window_of(t)
    if x.shape != t.shape:
        raise ShapeError(f"assign: shape {x.shape} does not match the window {t.shape} of {base.shape}")
    x = x.cast(base.dtype)
    for i, a in enumerate(arg):
        if a is None or not has_var(a):
            if a is not None and tuple(a) != (0, base.shape[i]):
                raise ShapeError(f"assign into {t.shape}: a window of variable start with other axes cut "
                                 f"({arg}) is not supported; cut the other axes of the base first")
            continue
    wins = [(i, a) for i, a in enumerate(arg) if a is not None and has_var(a)]
    if len(wins) != 1 or base.shape[wins[0][0]] != base.node.shape[wins[0][0]]:
        raise ShapeError(f"assign into the window {arg} of {base.shape}: only one axis of variable start, "
                         "cut from an axis of a number, is supported")
    i, (b, e) = wins[0]
    n = base.node.shape[i]
    y = x._from(release(x.node, i), x)
    placed = _window(y, i, -b, n)
    pos = _along(base, i, n)
    inside = (pos >= _value(base, b)) & (pos < _value(base, e))
    base.assign(inside.where(placed, base))
    t.node = shrink(base, arg).node
    return t


def pad(t, padding, value, mode: str):
    """t.pad(padding) where a padding is an extent of variables (`(0, 10 - v)`) or an axis with a variable
    is padded: the result's extent is before + extent + after (a number again where the variables cancel,
    as `v + (10 - v)`); the elements are placed at launch (a one-hot sum for a start of variables, else a
    static pad), the positions outside them get value. None: no such axis (the usual pad)."""
    padding = tuple(padding)
    if all(_is_int(p) or isinstance(p, Sym) for p in padding):  # PyTorch's flat form, last axis first
        if len(padding) % 2 or len(padding) // 2 > t.ndim:
            raise ShapeError(f"pad: {padding} needs an even length of at most 2*{t.ndim}")
        pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
        arg = tuple(reversed(pairs + [(0, 0)] * (t.ndim - len(pairs))))
    elif len(padding) != t.ndim:
        raise ShapeError(f"pad: need one (before, after) pair per axis of {t.shape}, got {padding}")
    else:
        arg = tuple((0, 0) if p is None else tuple(p) for p in padding)
    sym = of(t.node) or (None,) * t.ndim
    special = [i for i, p in enumerate(arg) if has_var(p) or sym[i] is not None and p != (0, 0)]
    if not special:
        return None
    if mode != "constant":
        raise ShapeError(f"pad: mode {mode!r} of an axis whose extent or padding has variables "
                         f"{_vars_of(*(x for i in special for x in (*arg[i], t.shape[i])))} is not supported")
    plain = tuple((0, 0) if i in special else p for i, p in enumerate(arg))
    x = t.pad(plain, value) if any(p != (0, 0) for p in plain) else t
    fill = check_fits(value, t.dtype, "pad", strict_float=True, wrap=False)
    for i in special:
        lo, hi = arg[i]
        size = x.shape[i]
        for what, p in (("before", lo), ("after", hi)):
            if not (_is_int(p) or isinstance(p, Sym)):
                raise ShapeError(f"pad: the padding {what} axis {i} must be an int or an extent, got {p!r}")
            if _lo(p) < 0:
                raise ShapeError(f"pad: the padding {p} {what} axis {i} (extent {size}) can be negative "
                                 f"(down to {_lo(p)}) for variables {_vars_of(p, size)}: negative padding of "
                                 "an axis with variables is not supported")
        new = lo + size + hi
        big = _hi(new)
        y = x._from(release(x.node, i), x)
        have = y.node.shape[i]
        if isinstance(lo, Sym):
            placed = _window(y, i, -lo, big)
        else:
            more = big - lo - have
            node = g.move(y.node, Op.PAD, tuple((lo, max(more, 0)) if j == i else (0, 0)
                                                for j in range(t.ndim)))
            if more < 0:
                node = g.move(node, Op.SHRINK, tuple((0, big) if j == i else (0, s) for j, s in
                                                     enumerate(node.shape)))
            placed = y._from(node, y)
        if isinstance(lo, Sym) or isinstance(size, Sym) or fill != 0 or big < lo + have:
            pos = _along(placed, i, big)
            inside = (pos >= _value(placed, lo)) & (pos < _value(placed, lo + size))
            placed = inside.where(placed, type(t)(g.const(fill, t.dtype, t.device)))
        if isinstance(new, Sym):
            placed = placed._from(extent(placed.node, i, new), placed)
        x = placed
    return x


def arange(T, start, stop, step, dtype, device):
    """Tensor.arange(start, stop, step) where start or stop is an extent of variables (`arange(v)`,
    `arange(pos, pos + n)`, `arange(v, 0, -1)`): start + step * (0, 1, ...) (start read at launch), of
    extent (stop - start) / step."""
    if not _is_int(step) or step not in (1, -1):
        raise ArgumentError(f"arange({start}, {stop}, {step}): with variables ({_vars_of(start, stop)}) the "
                            "step must be 1 or -1")
    for x in (start, stop):
        if not (_is_int(x) or isinstance(x, Sym)):
            raise ArgumentError(f"arange({start}, {stop}): with variables the bounds must be ints or extents")
    n = (stop - start) * step
    if _lo(n) < 0:
        raise ShapeError(f"arange({start}, {stop}): the stop can be below the start (by {-_lo(n)}) for "
                         f"variables {_vars_of(start, stop)} in their ranges")
    t = T.arange(_hi(n), dtype=dtype or dtypes.int32, device=device)
    if step == -1:
        t = -t
    if isinstance(start, Sym):
        t = t + T(start, device=t.device).cast(t.dtype)
    elif start:
        t = t + start
    return T(extent(t.node, 0, n)) if isinstance(n, Sym) else t


def bitcast(t, dtype: DType):
    """t.bitcast(dtype) for a tensor with symbolic axes: the bits of its stored (max) extents, the
    variables kept; a last axis of variables takes the bytes (its extent times the ratio) when dtype is
    not wider (a wider one would divide the extent)."""
    sym = of(t.node)
    if sym[-1] is not None and dtype.itemsize > t.dtype.itemsize:
        raise ShapeError(f"bitcast: {t.dtype.name} {t.shape} -> {dtype.name} would divide the last axis' "
                         f"extent {sym[-1]} (variables {_vars_of(sym[-1])}) by "
                         f"{dtype.itemsize // t.dtype.itemsize}: not supported")
    node = t.node
    for i in range(len(sym)):
        node = release(node, i)
    out = type(t)(node).bitcast(dtype)
    last = sym[-1] if sym[-1] is None else sym[-1] * (t.dtype.itemsize // dtype.itemsize)
    return type(t)(like(out.node, sym[:-1] + (last,)))


def reshape(t, shape):
    """t.reshape(shape) for a shape with extents of variables or a tensor with a symbolic axis: each
    extent stays its own axis; a shape of ints cuts the symbolic axes to their values first (outside
    TinyJit)."""
    if not has_var(shape):
        if of(t.node) is None:
            return None
        if driver.RECORDER is not None:
            raise ShapeError(f"reshape of {t.shape} to the numbers {shape} inside a TinyJit function: the "
                             "variables' values would be frozen in the capture; keep the variables in the "
                             "shape")
        return t._from(concrete(t.node), t).reshape(shape)
    phys = physical(shape)
    if -1 in phys or g.prod(phys) != g.prod(t.node.shape) or min(phys, default=0) < 0:
        raise ShapeError(f"reshape: cannot reshape {t.shape} to {tuple(shape)}")
    out = t._from(g.move(t.node, Op.RESHAPE, phys), t)
    got = of(out.node) or (None,) * len(shape)
    for j, s in enumerate(shape):
        want = s if isinstance(s, Sym) else None
        if (want is None) != (got[j] is None) or want is not None and not _same(want, got[j]):
            raise ShapeError(f"reshape: cannot reshape {t.shape} to {tuple(shape)} (axis {j} would be "
                             f"{got[j] if got[j] is not None else out.node.shape[j]})")
    return out


def expand(t, shape):
    """t.expand(shape) where a size-1 axis becomes an extent of variables."""
    phys = physical(shape)
    lead = len(phys) - t.ndim
    if lead < 0 or any(s not in (1, p) for s, p in zip(t.node.shape, phys[lead:])):
        raise ShapeError(f"expand: cannot expand {t.shape} to {tuple(shape)}")
    out = t._expand_to(phys)
    node, got = out.node, of(out.node) or (None,) * len(shape)
    for j, s in enumerate(shape):
        if got[j] is not None and not _same(got[j], s):
            raise ShapeError(f"expand: cannot expand {t.shape} to {tuple(shape)} (axis {j} is {got[j]})")
        if isinstance(s, Sym) and got[j] is None:
            node = extent(node, j, s)
    return out._from(node, out)


def _is_sym_slice(v) -> bool:
    return isinstance(v, slice) and (isinstance(v.start, Sym) or isinstance(v.stop, Sym))


def getitem(t, index: tuple):
    """t[index] where slices have extents of variables as bounds (`cache[:, :, :pos]`, `x[:, v:v+2]`),
    beside ints, slices, None and one Ellipsis: the variables' slices first (a shrink), then the rest as
    usual."""
    allowed = (slice, int, np.integer)
    if not all(v is None or v is Ellipsis or isinstance(v, allowed) and not isinstance(v, bool)
               for v in index):
        raise ShapeError(f"an index with a variable takes only ints, slices, None and ...: got {index}")
    n_real = sum(1 for v in index if v is not None and v is not Ellipsis)
    if sum(v is Ellipsis for v in index) > 1 or n_real > t.ndim:
        raise ShapeError(f"index {index} does not fit shape {t.shape}")
    if any(v is Ellipsis for v in index):
        at = next(i for i, v in enumerate(index) if v is Ellipsis)
        index = index[:at] + (slice(None),) * (t.ndim - n_real) + index[at + 1:]
    index = index + (slice(None),) * (t.ndim - sum(1 for v in index if v is not None))
    plain = tuple(slice(None) if _is_sym_slice(v) else v for v in index)
    if not all(isinstance(v, slice) and v == slice(None) for v in plain):
        if all(isinstance(v, slice) for v in plain):  # the other axes' slices first (a view of t)
            t = t[plain]
            index = tuple(v if _is_sym_slice(v) else slice(None) for v in index)
        elif any(_is_sym_slice(v) and isinstance(v.start, Sym) for v in index):
            raise ShapeError(f"index {index}: a slice of variable start beside ints or None is not "
                             "supported; index in two steps")
    arg = []
    for v in index:
        if v is None:
            continue
        if _is_sym_slice(v):
            if v.step not in (None, 1) or any(_is_int(x) and x < 0 for x in (v.start, v.stop)):
                raise ShapeError(f"a slice with a variable ({_vars_of(v.start, v.stop)}) takes step 1 and no "
                                 f"negative bound, got {v}")
            arg.append((v.start, v.stop))
        else:
            arg.append(None)
    x = shrink(t, tuple(arg))
    plain = tuple(slice(None) if _is_sym_slice(v) else v for v in index)
    return x if all(isinstance(v, slice) and v == slice(None) for v in plain) else x[plain]


def indexable(t, index: tuple):
    """t, where `index` (normalized: one entry per axis, None for new axes) keeps every symbolic axis
    whole (`:`); else t cut to its variables' values (outside TinyJit), which ints and slices then index
    as usual (tinygrad's `out[:3, :i]`)."""
    sym = of(t.node)
    real = [v for v in index if v is not None]
    if all(s is None or isinstance(v, slice) and v == slice(None) for v, s in zip(real, sym)):
        return t
    if driver.RECORDER is not None:
        raise ShapeError(f"indexing {t.shape} with {index} inside a TinyJit function: an axis whose extent "
                         "is a variable takes only ':' there (its value would be frozen in the capture)")
    return t._from(concrete(t.node), t)


def count(t, axes: tuple[int, ...], dtype):
    """The number of elements over axes, some of them variables: a 0-d tensor read at launch."""
    n, known = None, 1
    for a in axes:
        s = t.shape[a]
        if isinstance(s, Sym):
            v = type(t)(s, device=t.device).cast(dtype)
            n = v if n is None else n * v
        else:
            known *= s
    return n * known


def mean(t, axes: tuple[int, ...], keepdim: bool):
    """t.mean(axes) where some reduced axes are variables: the sum divided by the count."""
    total = t.sum(axes, keepdim)
    return total / count(t, axes, total.dtype)


def var(t, axes: tuple[int, ...], keepdim: bool, correction: int):
    """t.var(axes) (t a float tensor) where some reduced axes are variables: shifted by the first element
    (a variable's min is at least 1 here), then sum((x - mean)**2) / max(0, count - correction)."""
    if any(isinstance(t.shape[a], Sym) and t.shape[a].min < 1 for a in axes):
        raise ShapeError(f"var over an axis of {t.shape} whose variable can be 0 is not supported")
    first = tuple((0, 1) if i in axes else None for i in range(t.ndim))
    x = t - t.shrink(first).detach()
    d = x - mean(x, axes, True)
    return d.square().sum(axes, keepdim) / (count(t, axes, t.dtype) - correction).maximum(0)
