"""Tensor's movement ops (views; no copies): reshape, permute, pad, shrink, cat, split..., and
the masks and grids built from positions (tril/triu, diagonal, meshgrid)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tgrad import graph as g
from tgrad import inplace, symbolic, symbolic_ops
from tgrad.dtype import check_fits, dtypes, promote
from tgrad.errors import ArgumentError, IndexRangeError, ModeError, PatternError, ShapeError
from tgrad.graph import Op
from tgrad.ops.helpers import _normalize_axis, _position_dtype

_SYM_DATA = g.SYM.data  # (non-empty only while a tensor with a symbolic axis lives)

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


class MovementOps:
    """Tensor's movement ops (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def reshape(self, *shape) -> Tensor:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if None in shape:  # None: keep that dimension
            shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(shape))
        if _SYM_DATA:  # a variable in the shape or a symbolic axis in self (symbolic.py)
            out = symbolic_ops.reshape(self, shape)
            if out is not None:
                return out
        shape = tuple(map(int, shape))
        numel = math.prod(self.node.shape)
        if -1 in shape:
            if shape.count(-1) > 1:
                raise ShapeError(f"reshape: only one dimension can be -1, got {shape}")
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or numel % known:
                raise ShapeError(f"reshape: cannot reshape {self.shape} to {shape}")
            shape = tuple(numel // known if s == -1 else s for s in shape)
        if math.prod(shape) != numel or min(shape, default=0) < 0:
            raise ShapeError(f"reshape: cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
        return self._from(g.move(self.node, Op.RESHAPE, shape), self, view=((Op.RESHAPE, shape),))

    def view(self, *shape) -> Tensor:
        return self.reshape(*shape)

    def permute(self, *order) -> Tensor:
        order = order[0] if len(order) == 1 and isinstance(order[0], (tuple, list)) else order
        order = tuple(_normalize_axis(a, self.ndim, "permute") for a in order)
        if sorted(order) != list(range(self.ndim)):
            raise ShapeError(f"permute: {order} is not a permutation of the {self.ndim} axes of {self.shape}")
        return self._from(g.move(self.node, Op.PERMUTE, order), self, view=((Op.PERMUTE, order),))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        if self.ndim < 2 and dim0 in (0, -1) and dim1 in (0, -1):
            return self
        order = list(range(self.ndim))
        a, b = _normalize_axis(dim0, self.ndim, "transpose"), _normalize_axis(dim1, self.ndim, "transpose")
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s = _normalize_axis(start_dim, self.ndim, "flatten")
        e = _normalize_axis(end_dim, self.ndim, "flatten")
        if s > e:
            raise IndexRangeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        return self.reshape(self.shape[:s] + (math.prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes) -> Tensor:
        d = _normalize_axis(dim, self.ndim, "unflatten")
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def rearrange(self, formula: str, **sizes) -> Tensor:
        """einops' rearrange ("b c (h w) -> b (c h) w", h=2): split the parenthesised input groups (sizes
        give all but one factor), permute, merge the output groups; `...` stands for the axes not named,
        `()` or `1` for a new axis of size 1 (tinygrad's Tensor.rearrange)."""

        def check(ok: bool, why: str) -> None:
            if not ok:
                raise PatternError(f"rearrange: {why} in {formula!r}")

        def side(text: str) -> tuple[list[str], list[tuple[int, int]]]:
            """(axis names, the (start, end) of each parenthesised group in them)."""
            spaced = f" {text} ".replace("…", "...").replace("(", " ( ").replace(")", " ) ")
            tokens = spaced.replace(" ", "  ").replace(" 1 ", " ( ) ").split()
            names, groups, start = [], [], None
            for tok in tokens:
                if tok == "(":
                    check(start is None, "nested or unbalanced brackets")
                    start = len(names)
                elif tok == ")":
                    check(start is not None, "unbalanced brackets")
                    groups.append((start, len(names)))
                    start = None
                else:
                    names.append(tok)
            check(start is None, "unbalanced brackets")
            return names, groups

        check(formula.count("->") == 1, 'need exactly one "->"')
        (lhs, split), (rhs, merge) = (side(part) for part in formula.split("->"))
        check(not (set(sizes) - set(lhs)), f"axes {sorted(set(sizes) - set(lhs))} given sizes but not used")
        check(sorted(lhs) == sorted(rhs) and len(lhs) == len(set(lhs)), "axis names differ between the sides")
        for name in lhs:
            check(name == "..." or (name.isidentifier() and "_" not in (name[0], name[-1])),
                  f"invalid axis name {name!r}")
        check(all("..." not in lhs[a:b] for a, b in split), "a parenthesised ... on the input side")
        if "..." in lhs:  # the ellipsis becomes one name per axis it covers
            n = self.ndim - len(lhs) + 1 + sum(b - a - 1 for a, b in split)
            check(n >= 0, f"{self.ndim} axes are fewer than the pattern names")

            def expand(names: list[str], groups: list[tuple[int, int]]):
                i = names.index("...")
                shift = [(a + (n - 1 if a > i else 0), b + (n - 1 if b > i else 0)) for a, b in groups]
                return names[:i] + [f"...{j}" for j in range(n)] + names[i + 1 :], shift

            (lhs, split), (rhs, merge) = expand(lhs, split), expand(rhs, merge)
        check(len(lhs) - sum(b - a - 1 for a, b in split) == self.ndim,
              f"the input side names {len(lhs)} axes but the tensor has shape {self.shape}")
        t = self
        for a, b in split:  # (left to right: the axes before group a are already one per name)
            t = t.unflatten(a, [sizes.get(lhs[i], -1) for i in range(a, b)])
        for i, name in enumerate(lhs):
            size = t.shape[i]
            check(sizes.get(name, size) == size, f"axis {name} has size {size}, not {sizes.get(name)}")
        t = t.permute([lhs.index(name) for name in rhs])
        for a, b in reversed(merge):
            t = t.flatten(a, b - 1) if a < b else t.unsqueeze(a)
        return t

    def squeeze(self, dim=None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dims = {_normalize_axis(d, self.ndim, "squeeze") for d in ((dim,) if isinstance(dim, int) else dim)}
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in dims or s != 1))

    def unsqueeze(self, dim: int) -> Tensor:
        d = _normalize_axis(dim, self.ndim + 1, "unsqueeze")
        shape = self.shape[:d] + (1,) + self.shape[d:]
        if _SYM_DATA:
            return self.reshape(shape)
        # (reshape's last line: nothing of reshape's to check in this shape)
        return self._from(g.move(self.node, Op.RESHAPE, shape), self, view=((Op.RESHAPE, shape),))

    def expand(self, *shape) -> Tensor:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = tuple(shape)
        lead = len(shape) - self.ndim
        if lead < 0:
            raise ShapeError(f"expand: cannot expand {self.shape} to fewer dimensions {shape}")
        shape = tuple(self.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
        if symbolic.has_var(shape):
            return symbolic_ops.expand(self, shape)
        return self._broadcast_to(shape)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(other.shape)

    def _pad_arg(self, padding) -> tuple[tuple[int, int], ...]:
        padding = tuple(padding)
        if all(isinstance(p, int) for p in padding):  # PyTorch's flat form, last axis first
            if len(padding) % 2 or len(padding) // 2 > self.ndim:
                raise ShapeError(f"pad: {padding} needs an even length of at most 2*{self.ndim}")
            pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
            pairs += [(0, 0)] * (self.ndim - len(pairs))
            return tuple(reversed(pairs))
        if len(padding) != self.ndim:
            raise ShapeError(f"pad: need one (before, after) pair per axis of {self.shape}, got {padding}")
        return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)

    def pad(self, padding, value: float = 0.0, mode: str = "constant") -> Tensor:
        """Pad with value (negative padding crops); padding is one (before, after) pair per axis or
        PyTorch's flat form (last axis first). mode "reflect", "replicate" or "circular" (F.pad's) fill
        from the tensor itself, mapping each new position to a source position (a gather per axis)."""
        if _SYM_DATA and symbolic.of(self.node) is not None or symbolic.has_var(padding) or any(
                isinstance(p, (tuple, list)) and symbolic.has_var(p) for p in padding):
            out = symbolic_ops.pad(self, padding, value, mode)  # extents of variables (symbolic.py)
            if out is not None:
                return out
        arg = self._pad_arg(padding)
        if mode != "constant":
            return self._pad_from_self(arg, mode)
        if any(lo < 0 or hi < 0 for lo, hi in arg):  # negative padding crops
            crop = tuple((-min(lo, 0), s + min(hi, 0)) for (lo, hi), s in zip(arg, self.shape))
            return self.shrink(crop).pad(tuple((max(lo, 0), max(hi, 0)) for lo, hi in arg), value)
        out = self._from(g.move(self.node, Op.PAD, arg), self)
        if value != 0 or isinstance(value, float) and math.copysign(1.0, value) < 0:  # (a PAD fills +0.0)
            inside = g.move(g.const(True, dtypes.bool, self.device, self.node.shape), Op.PAD, arg)
            if _SYM_DATA and out.node in g.SYM:  # (the symbolic axes of the other axes' pad: symbolic.py)
                inside = symbolic.like(inside, g.SYM[out.node])
            inside = type(self)(inside)
            if type(value) in (bool, int, float):  # in self's dtype, as PyTorch's (and checked as there)
                fill = check_fits(value, self.dtype, "pad", strict_float=True, wrap=False)
                value = type(self)(g.const(fill, self.dtype, self.device))
            out = inside.where(out, value)
        return out

    def _pad_from_self(self, arg: tuple[tuple[int, int], ...], mode: str) -> Tensor:
        x = self
        if mode == "circular":  # PyTorch crops first, then wraps around what is left
            x = x.shrink(tuple((max(-lo, 0), s - max(-hi, 0)) for (lo, hi), s in zip(arg, x.shape)))
            arg = tuple((max(lo, 0), max(hi, 0)) for lo, hi in arg)
        for axis, ((lo, hi), n) in enumerate(zip(arg, x.shape)):
            if (lo, hi) == (0, 0):
                continue
            src = np.arange(-lo, n + hi)
            if mode == "reflect":
                if lo >= n or hi >= n:
                    raise ArgumentError(f"pad: reflect padding {(lo, hi)} must be < size {n} of axis {axis}")
                src = np.abs(src)
                src = np.where(src >= n, 2 * (n - 1) - src, src)
            elif mode == "replicate":
                if n == 0:
                    raise ArgumentError(f"pad: replicate cannot pad the empty axis {axis}")
                src = np.clip(src, 0, n - 1)
            elif mode == "circular":
                if lo > n or hi > n:
                    raise ArgumentError(f"pad: circular padding {(lo, hi)} must be <= size {n}, axis {axis}")
                src = src % n
            else:
                raise ModeError(f"pad: mode must be constant, reflect, replicate or circular, not {mode!r}")
            x = x._take(axis, type(self)(src, device=self.device))
        return x

    def shrink(self, arg) -> Tensor:
        if any(a is not None and symbolic.has_var(a) for a in arg):  # a variable's extent (symbolic.py)
            return symbolic_ops.shrink(self, arg)
        arg = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.node.shape))
        if len(arg) != self.ndim or any(not 0 <= b <= e <= s for (b, e), s in zip(arg, self.node.shape)):
            raise ShapeError(f"shrink: {arg} is not inside {self.shape}")
        return self._from(g.move(self.node, Op.SHRINK, arg), self, view=((Op.SHRINK, arg),))

    def _target_shape(self, op: str, shape, args) -> tuple[int | None, ...]:
        """shrink_to / pad_to's sizes: one per axis (None keeps it), as a tuple or as arguments."""
        sizes = tuple(shape) if isinstance(shape, (tuple, list)) and not args else (shape, *args)
        if len(sizes) != self.ndim:
            raise ShapeError(f"{op}: {sizes} names {len(sizes)} sizes for a tensor of shape {self.shape}")
        return sizes

    def shrink_to(self, shape, *args) -> Tensor:
        """tinygrad's shrink_to: the first `size` positions of each axis (None: all of it), a view."""
        sizes = self._target_shape("shrink_to", shape, args)
        return self.shrink(tuple(None if n is None else (0, n) for n in sizes))

    def pad_to(self, shape, *args, value: float = 0.0) -> Tensor:
        """tinygrad's pad_to: each axis padded at its end with `value` up to `size` (None: kept)."""
        sizes = self._target_shape("pad_to", shape, args)
        if any(n is not None and n < s for n, s in zip(sizes, self.shape)):
            raise ShapeError(f"pad_to: {sizes} is smaller than {self.shape} on some axis; use shrink_to")
        arg = tuple((0, 0 if n is None else n - s) for n, s in zip(sizes, self.shape))
        return self if not any(hi for _, hi in arg) else self.pad(arg, value)

    def flip(self, axis) -> Tensor:
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(_normalize_axis(a, self.ndim, "flip") for a in axes)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"flip: axis {axis} repeats an axis")
        return self._from(g.move(self.node, Op.FLIP, axes), self)

    def repeat(self, *repeats) -> Tensor:
        repeats = (
            tuple(repeats[0]) if len(repeats) == 1 and isinstance(repeats[0], (tuple, list)) else repeats
        )
        if len(repeats) < self.ndim:
            raise ShapeError(f"repeat: {len(repeats)} repeats for a tensor with {self.ndim} dims")
        x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
        inter = tuple(v for s in x.shape for v in (1, s))
        big = tuple(v for r, s in zip(repeats, x.shape) for v in (r, s))
        return x.reshape(inter).expand(big).reshape(tuple(r * s for r, s in zip(repeats, x.shape)))

    def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
        tensors = [self, *others]
        d = _normalize_axis(dim, self.ndim, "cat")
        for t in tensors:
            if t.ndim != self.ndim or any(
                a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d
            ):
                raise ShapeError(f"cat: shapes {[t.shape for t in tensors]} differ outside dim {d}")
        dt = tensors[0].dtype
        for t in tensors[1:]:
            dt = promote(dt, t.dtype)
        total = sum(t.shape[d] for t in tensors)
        # each piece padded to the whole and the pieces added: float pieces pad with -0.0, which adds to
        # every value exactly (a 0.0 pad turned a -0.0 element into 0.0: PyTorch's cat keeps it)
        fill = -0.0 if dt.is_float else 0
        out, start = None, 0
        for t in tensors:
            pad = [(0, 0)] * self.ndim
            pad[d] = (start, total - start - t.shape[d])
            piece = t.cast(dt).pad(tuple(pad), fill)
            out = piece if out is None else (out | piece if dt == dtypes.bool else out + piece)
            start += t.shape[d]
        return out

    def stack(self, *others, dim: int = 0) -> Tensor:
        """Join tensors along a new axis: Tensor.stack([a, b]), Tensor.stack(a, b) or a.stack(b, dim=)."""
        if isinstance(self, (list, tuple)):  # Tensor.stack([a, b]) or Tensor.stack([a, b], 1)
            if len(others) > 1 or (others and not isinstance(others[0], int)):
                raise ArgumentError("stack: pass the tensors as one list or as arguments, not both")
            tensors, dim = list(self), others[0] if others else dim
        else:
            tensors = [self, *others]
        if not tensors:
            raise ShapeError("stack: needs at least one tensor")
        for t in tensors[1:]:
            if t.shape != tensors[0].shape:
                raise ShapeError(f"stack: tensors need the same shape, got {[t.shape for t in tensors]}")
        d = _normalize_axis(dim, tensors[0].ndim + 1, "stack")
        return tensors[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in tensors[1:]], dim=d)

    def split(self, sizes, dim: int = 0) -> list[Tensor]:
        d = _normalize_axis(dim, self.ndim, "split")
        n = self.shape[d]
        if isinstance(sizes, int):
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if sizes > 0 else []
        if sum(sizes) != n:
            raise ShapeError(f"split: sizes {list(sizes)} do not add up to {n}")
        out, start = [], 0
        for s in sizes:
            arg = [None] * self.ndim
            arg[d] = (start, start + s)
            out.append(self.shrink(arg))
            start += s
        return out

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        """The `length` elements from `start` along dim (PyTorch's narrow: a view; a negative start counts
        from the end)."""
        d = _normalize_axis(dim, self.ndim, "narrow")
        for name, v in (("start", start), ("length", length)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentError(f"narrow: {name} must be an int, got {type(v).__name__} {v!r}")
        n = self.shape[d]
        if not -n <= start <= n:
            raise IndexRangeError(f"narrow: start {start} is out of range for size {n} ([{-n}, {n}])")
        if length < 0:
            raise ArgumentError(f"narrow: length must be non-negative, got {length}")
        if start < 0:
            start += n
        if start + length > n:
            raise IndexRangeError(f"narrow: start ({start}) + length ({length}) exceeds size {n} of axis {d}")
        arg = [None] * self.ndim
        arg[d] = (start, start + length)
        return self.shrink(arg)

    def select(self, dim: int, index: int) -> Tensor:
        """t.select(dim, i) is t[..., i, ...] with i on axis dim (a view, one axis fewer)."""
        d = _normalize_axis(dim, self.ndim, "select")
        if self.ndim == 0:
            raise IndexRangeError("select: a 0-d tensor has no axis to select from")
        return self[(slice(None),) * d + (index,)]

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """The slices along dim, each without it (views)."""
        d = _normalize_axis(dim, self.ndim, "unbind")
        return tuple(self.select(d, i) for i in range(self.shape[d]))

    def swapaxes(self, axis0: int, axis1: int) -> Tensor:
        return self.transpose(axis0, axis1)

    swapdims = swapaxes

    def roll(self, shifts, dims=None) -> Tensor:
        """Shift elements along dims, wrapping around (PyTorch's roll; dims=None rolls the flat tensor)."""
        if dims is None:
            if not isinstance(shifts, int) and len(shifts) != 1:
                raise ShapeError(f"roll: {len(shifts)} shifts need as many dims")
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise ShapeError(f"roll: shifts {shifts} and dims {dims} differ in length")
        x = self
        for shift, d in zip(shifts, dims):
            d = _normalize_axis(d, self.ndim, "roll")
            n = x.shape[d]
            if n == 0 or shift % n == 0:
                continue
            cut = n - shift % n
            x = x.split([cut, n - cut], d)[1].cat(x.split([cut, n - cut], d)[0], dim=d)
        return x

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        """Each element repeated `repeats` times along dim (the flattened tensor when dim is None)."""
        if not isinstance(repeats, (int, np.integer)) or repeats < 0:
            raise ArgumentError(f"repeat_interleave: repeats must be an int >= 0, got {repeats!r}")
        x = self.flatten() if dim is None else self
        d = 0 if dim is None else _normalize_axis(dim, self.ndim, "repeat_interleave")
        big = x.shape[: d + 1] + (repeats,) + x.shape[d + 1 :]
        return x.unsqueeze(d + 1).expand(big).flatten(d, d + 1)

    def unfold(self, dimension: int, size: int, step: int) -> Tensor:
        """Windows of `size` every `step` along dimension, on a new last axis (PyTorch's Tensor.unfold)."""
        Tensor = type(self)  # (tensor.py, which defines it, cannot be imported here)
        d = _normalize_axis(dimension, self.ndim, "unfold")
        n = self.shape[d] if self.ndim else 1
        if step <= 0 or not 0 <= size <= n:
            raise ShapeError(f"unfold: size {size} and step {step} do not fit dimension {d} of size {n}")
        count = (n - size) // step + 1
        if self.ndim and size:  # view ops: a view of self, as in PyTorch
            arg = (d, size, step)
            return self._from(inplace.windows_node(self.node, *arg), self, view=((inplace.WINDOWS, arg),))
        idx = Tensor.arange(count, device=self.device).reshape(count, 1) * step + Tensor.arange(
            size, device=self.device
        )  # (count, size) positions
        x = self.reshape(1) if self.ndim == 0 else self
        return x._take(d, idx).movedim(d + 1, -1) if self.ndim else x._take(0, idx).reshape(count, size)[0]

    def movedim(self, source: int, destination: int) -> Tensor:
        s = _normalize_axis(source, self.ndim, "movedim")
        e = _normalize_axis(destination, self.ndim, "movedim")
        order = [i for i in range(self.ndim) if i != s]
        order.insert(e, s)
        return self.permute(order)

    def tril(self, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two axes (j - i <= diagonal); the rest 0."""
        return self._triangle(diagonal, upper=False)

    def triu(self, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two axes (j - i >= diagonal); the rest 0."""
        return self._triangle(diagonal, upper=True)

    def _triangle(self, diagonal: int, upper: bool) -> Tensor:
        Tensor = type(self)  # (tensor.py, which defines it, cannot be imported here)
        if self.ndim < 2:
            raise ShapeError(f"tril/triu: needs at least 2 dimensions, got shape {self.shape}")
        r, c = self.shape[-2:]
        if symbolic.has_var((r, c, diagonal)):  # extents of variables (symbolic.py): compared at launch
            dt = dtypes.int32
            if isinstance(diagonal, symbolic.Sym):
                diagonal = Tensor(diagonal, device=self.device)
        else:
            dt = _position_dtype(r, c, diagonal)
        offset = Tensor.arange(c, device=self.device, dtype=dt) - Tensor.arange(r, device=self.device,
                                                                                 dtype=dt).reshape(r, 1)
        keep = offset >= diagonal if upper else offset <= diagonal
        return keep.where(self, False if self.dtype == dtypes.bool else 0)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of the (dim1, dim2) planes on a new last axis (PyTorch's)."""
        a, b = _normalize_axis(dim1, self.ndim, "diagonal"), _normalize_axis(dim2, self.ndim, "diagonal")
        if a == b:
            raise ShapeError(f"diagonal: dim1 and dim2 are the same axis {a}")
        x = self.permute([i for i in range(self.ndim) if i not in (a, b)] + [a, b])
        rows, cols = x.shape[-2:]
        # every (cols + 1)-th element of the flattened planes from the first one on the diagonal: view ops
        # only, so when the planes are the last two axes this is a view of self, as in PyTorch
        length = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
        start = offset if offset >= 0 else -offset * cols
        flat = x.flatten(-2)
        keep = [None] * flat.ndim
        keep[-1] = (start, start + (length - 1) * (cols + 1) + 1) if length else (0, 0)
        flat = flat.shrink(keep)
        return flat._stride([1] * (flat.ndim - 1) + [cols + 1]) if length > 1 else flat

    def diag(self, diagonal: int = 0) -> Tensor:
        """1-d: a square matrix with self on the diagonal; 2-d: the diagonal (PyTorch's diag)."""
        Tensor = type(self)  # (tensor.py, which defines it, cannot be imported here)
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ShapeError(f"diag: needs a 1-d or 2-d tensor, got shape {self.shape}")
        n = self.shape[0] + abs(diagonal)
        x = self.pad(((0, abs(diagonal)),))
        x = x.reshape(n, 1) if diagonal >= 0 else x.reshape(1, n)  # above the diagonal by row, else by column
        offset = Tensor.arange(n, device=self.device) - Tensor.arange(n, device=self.device).reshape(n, 1)
        return (offset == diagonal).where(x.expand(n, n), 0)

    def meshgrid(self, *others: Tensor, indexing: str = "ij") -> list[Tensor]:
        """Coordinate grids from 1-d tensors (PyTorch's meshgrid; indexing "ij" or "xy")."""
        if indexing not in ("ij", "xy"):
            raise ArgumentError(f"meshgrid: indexing must be 'ij' or 'xy', not {indexing!r}")
        ts = [self, *others]
        if indexing == "xy" and len(ts) >= 2:
            ts[0], ts[1] = ts[1], ts[0]
        shape = tuple(t.numel() for t in ts)
        grids = [t.reshape(tuple(-1 if j == i else 1 for j in range(len(ts)))) for i, t in enumerate(ts)]
        grids = [t.expand(shape) for t in grids]
        if indexing == "xy" and len(ts) >= 2:
            grids[0], grids[1] = grids[1], grids[0]
        return grids

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        if not isinstance(chunks, (int, np.integer)) or chunks <= 0:
            raise ArgumentError(f"chunk: chunks must be an int > 0, got {chunks!r}")
        n = self.shape[_normalize_axis(dim, self.ndim, "chunk")]
        return self.split(math.ceil(n / chunks) if n else 1, dim) if n else [self]
