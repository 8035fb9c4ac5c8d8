"""Tensor's indexing: __getitem__/__setitem__, gather, scatter, masked ops, one_hot; the take
along an axis (one-hot kernels, or numpy's take in a host step on host devices) and the host
steps that check indices."""

from __future__ import annotations

import math
import pathlib
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from tgrad import autodiff, inplace, symbolic, symbolic_ops
from tgrad import realize as driver
from tgrad.device import canonical, is_disk
from tgrad.dtype import DType, check_fits, dtypes, to_bytes
from tgrad.errors import ArgumentError, DiskError, DTypeError, IndexRangeError, ShapeError, user_stacklevel
from tgrad.graph import SYM as g_SYM
from tgrad.graph import Node, Op, move
from tgrad.ops.helpers import _broadcast_shape, _normalize_axis
from tgrad.symbolic import Sym

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


# one-hot work (indices x rows) above which indexing on a host device is numpy's take in a host step
HOST_TAKE_MIN = 1 << 15
# one-hot products (gradient elements x table rows) up to which a host take's gradient is kernels, not a
# host step (which realizes everything before it apart: a GPT step's backward ran as two schedules)
ONEHOT_GRAD_MAX = 1 << 23


def _scatter_add(out: np.ndarray, axis: int, ids: np.ndarray, values: np.ndarray) -> None:
    """out[..., ids[j], ...] += values[..., j, ...] along `axis` (ids in range, negative ones from the end;
    repeated ids add up), as numpy's add.at, but grouped: the ids sorted (stable), each run of one id summed
    by add.reduceat and added to its row once, several times faster than add.at's element-by-element adds
    (GPT's embedding gradient; measured: bench/HISTORY.md). Other dtypes than float32/64 keep add.at."""
    n, flat = out.shape[axis], ids.reshape(-1)
    if flat.size == 0:
        return
    lead = (slice(None),) * axis
    if out.dtype not in (np.float32, np.float64):
        np.add.at(out, lead + (ids,), values)
        return
    flat = np.where(flat < 0, flat + n, flat)
    order = np.argsort(flat, kind="stable")
    rows = flat[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    pre, post = out.shape[:axis], out.shape[axis + 1 :]
    grouped = values.reshape(*pre, flat.size, *post)[lead + (order,)]
    out[lead + (rows[starts],)] += np.add.reduceat(grouped, starts, axis=axis)


_SYM_DATA = g_SYM.data  # (non-empty only while a tensor with a symbolic axis lives)


class IndexingOps:
    """Tensor's indexing ops (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def _index_tensors(self, index: tuple) -> tuple:
        """Index entries that select by data as integer Tensors: lists, tuples and arrays become tensors, a
        bool mask becomes one integer tensor per axis it covers (its nonzero positions, read now)."""
        Tensor = type(self)  # (tensor.py, which defines it, cannot be imported here)
        out, axis = [], 0  # axis: where the entry applies, while no ellipsis came before it
        for v in index:
            if isinstance(v, (list, tuple, np.ndarray)):
                host = np.asarray(v)
                if host.size == 0 and not isinstance(v, np.ndarray):  # [] selects nothing (numpy: float64)
                    host = host.astype(np.int64)
                if host.dtype.kind in "iu" and axis is not None and axis < self.ndim and host.size:
                    n = self.shape[axis]
                    if host.min() < -n or host.max() >= n:  # host data: checked here, unlike tensor indices
                        raise IndexRangeError(f"index {host.max() if host.max() >= n else host.min()} is out "
                                              f"of bounds for axis {axis} with size {n}")
                if host.dtype.kind == "f":  # before it becomes a tensor (a float64 one on some devices)
                    raise IndexRangeError(f"indices must be integer or bool, got {host.dtype.name} values")
                v = Tensor(host, device=self.device)
            if isinstance(v, Tensor) and v.dtype.is_float:
                raise IndexRangeError(f"tensors used as indices must be integer or bool, got {v.dtype.name}")
            if isinstance(v, Tensor) and v.dtype == dtypes.uint8:  # PyTorch reads them as (deprecated) masks
                raise IndexRangeError("a uint8 index tensor is ambiguous (PyTorch reads it as a mask); "
                                      "use .bool() for a mask or .long() for indices")
            if isinstance(v, Tensor) and v.dtype == dtypes.bool:
                if axis is not None and v.shape != self.shape[axis : axis + v.ndim]:
                    raise IndexRangeError(
                        f"the mask shape {v.shape} does not match the indexed shape {self.shape[axis:]}"
                    )
                if v.ndim == 0:
                    raise IndexRangeError("a 0-d bool index is not supported; use where()")
                out.extend(Tensor(c, device=self.device) for c in np.nonzero(v.numpy()))
                axis = None if axis is None else axis + v.ndim
                continue
            out.append(v)
            if v is Ellipsis:
                axis = None
            elif v is not None and axis is not None:
                axis += 1
        return tuple(out)

    def __getitem__(self, index) -> Tensor:
        """Basic indexing (ints, slices with steps, None, ...) is a view; integer tensors, lists and bool
        masks gather (PyTorch's advanced indexing: index tensors broadcast together; their result dims go
        where the first one stood when they are adjacent, else first)."""
        index = _index_tuple(index, type(self))
        if self.device.startswith("DISK:"):
            _basic_only(self, index)
        if any(isinstance(v, slice) and (isinstance(v.start, Sym) or isinstance(v.stop, Sym)) for v in index):
            return symbolic_ops.getitem(self, index)  # cache[:, :, :pos], x[:, v:v+2] (symbolic.py)
        index = self._index_tensors(index)
        n_real = sum(1 for v in index if v is not None and v is not Ellipsis)
        if n_real > self.ndim:
            raise IndexRangeError(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
        if sum(1 for v in index if v is Ellipsis) > 1:
            raise IndexRangeError("an index can only have a single ellipsis (...)")
        if any(v is Ellipsis for v in index):
            pos = next(i for i, v in enumerate(index) if v is Ellipsis)
            index = index[:pos] + (slice(None),) * (self.ndim - n_real) + index[pos + 1 :]
        index = index + (slice(None),) * (self.ndim - sum(1 for v in index if v is not None))
        if _SYM_DATA and symbolic.of(self.node) is not None:  # an index into a symbolic axis (symbolic.py)
            cut = symbolic_ops.indexable(self, index)
            if cut is not self:
                return cut[index]
        x, axis, out_shape, gathers = self, 0, [], []
        shrink, flips, steps = [], [], []
        for v in index:
            if v is None:
                out_shape.append(("new",))
                continue
            n = self.node.shape[axis]
            if isinstance(v, type(self)):
                gathers.append((axis, v))
                shrink.append((0, n))
                steps.append(1)
                out_shape.append(("gather", axis))
            elif isinstance(v, slice):
                start, stop, step = v.indices(n)
                if step < 0:
                    flips.append(axis)
                    start, stop, step = n - 1 - start, n - 1 - stop, -step
                length = max(0, math.ceil((stop - start) / step))
                shrink.append((start, start + length * step - (step - 1)) if length else (0, 0))
                steps.append(step)
                out_shape.append(("keep", axis))
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                i = int(v)
                if not -n <= i < n:
                    raise IndexRangeError(f"index {i} is out of bounds for axis {axis} with size {n}")
                i %= n
                shrink.append((i, i + 1))
                steps.append(1)
                out_shape.append(("drop", axis))
            else:
                raise IndexRangeError(f"unsupported index {v!r} ({type(v).__name__}); use ints, slices, "
                                      "None, ... or an integer tensor (a bool scalar: where())")
            axis += 1
        if flips:  # a view, as numpy's x[::-1] (PyTorch has no negative steps; its flip() copies)
            axes = tuple(flips)
            x = x._from(move(x.node, Op.FLIP, axes), x, view=((Op.FLIP, axes),))
        x = x.shrink(shrink)
        if any(s != 1 for s in steps):
            x = x._stride(steps)
        # reshape: drop int-indexed axes, add None axes
        final = [1 if k[0] == "new" else x.shape[k[1]] for k in out_shape if k[0] != "drop"]
        x = x.reshape(tuple(final))
        if not gathers:
            return x
        kept = [k for k in out_shape if k[0] != "drop"]
        where = [kept.index(("gather", a)) for a, _ in gathers]
        return x._gather_axes(where, [t for _, t in gathers])

    def __delitem__(self, index) -> None:
        raise TypeError("Tensor does not support deleting items (as in PyTorch and tinygrad)")

    def _write_file(self, x: Tensor | Any, squeeze: bool = False) -> Tensor:
        """assign() into a disk tensor: x's value (from any device; host data as Tensor(x) reads it),
        cast to this dtype and broadcast to this shape, written into the file now (`squeeze`: leading
        size-1 axes of x dropped first, as t[...] = value does)."""
        Tensor = type(self)
        if not isinstance(x, Tensor):
            x = Tensor(x, device="NUMPY", dtype=self.dtype)
        elif is_disk(x.device):  # (disk to disk: the bytes, read through the host)
            x = x.to("NUMPY")
        x = x.cast(self.dtype)
        while squeeze and x.ndim > self.ndim and x.shape[0] == 1:
            x = x.reshape(x.shape[1:])
        pairs = zip(x.shape[::-1], self.shape[::-1])
        if x.ndim > self.ndim or any(a not in (1, b) for a, b in pairs):
            raise ShapeError(f"assign: shape {x.shape} does not match {self.shape} nor broadcasts to it")
        values = np.broadcast_to(x.numpy(), self.shape)
        self.node.buffer.write(to_bytes(values, self.dtype))
        return self

    def __setitem__(self, index, value) -> None:
        """t[index] = value (PyTorch's): ints, slices, None and ... write a box (a padded mask); slices
        with steps, integer tensors and masks write through scatter. Done with assign(): the tensor's
        buffer is updated in place, and gradients flow to value and to the elements not written."""
        Tensor = type(self)  # (tensor.py, which defines it, cannot be imported here)
        index = _index_tuple(index, type(self))
        if self.device.startswith("DISK:"):  # a view of the file (one contiguous range), written now
            self[index]._write_file(value, squeeze=True)
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # PyTorch: float16 / bfloat16 take an overflowing float as inf, float32 / float64 raise
            strict = self.dtype in (dtypes.float32, dtypes.float64)
            value = check_fits(value, self.dtype, "t[index] = value", strict_float=strict)
        if self._base is not None and inplace.overlapping(self._base[0].shape, self._base[1]):
            # an expanded view: PyTorch writes the indexed elements (refused only where they overlap)
            target = self[index]
            if target._base is None or target._base[0] is not self._base[0]:  # (an advanced index: a copy)
                raise ArgumentError(
                    f"t[index] = value: this tensor ({self.shape}) is an expanded view, so several of its "
                    "elements are one element in memory (index tensors into it are refused); clone() it first"
                )
            v = value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype)
            while v.ndim > target.ndim and v.shape[0] == 1:
                v = v.reshape(v.shape[1:])
            target.assign(v.cast(self.dtype)._broadcast_to(target.shape))
            return
        box = self._box(index)
        if box is not None:
            region, keep = box
            shape = tuple(e - b for b, e in region)
            v = value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype)
            while v.ndim > len(keep) and v.shape[0] == 1:  # leading 1s broadcast away, as in PyTorch
                v = v.reshape(v.shape[1:])
            v = v.cast(self.dtype)._broadcast_to(tuple(shape[i] for i in keep)).reshape(shape)
            pads = tuple((b, n - e) for (b, e), n in zip(region, self.shape))
            inside = Tensor.ones(*shape, dtype=dtypes.bool, device=self.device).pad(pads)
            self.assign(inside.where(v.pad(pads), self))
            return
        positions = Tensor.arange(self.numel(), device=self.device).reshape(self.shape)[index]
        v = value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype)
        v = v.cast(self.dtype)._broadcast_to(positions.shape)
        grad = not Tensor.no_grad and (self.requires_grad or v.requires_grad)
        if self.device in dtypes.HOST_DEVICES and not grad and self.numel() * v.numel() >= HOST_TAKE_MIN:
            # numpy's put in a host step (TinyJit replays it): scatter's one-hot form costs numel() times
            # as much (a (12M, 360k) mask for numpy's example of advanced indexing)
            def put(inputs, outputs):
                outputs[0][...] = inputs[0]
                outputs[0][inputs[1]] = inputs[2]  # (a position written twice: the last value, as scatter's)

            step = driver.HostStep("setitem", put, [((self.numel(),), self.dtype)], self.device, key=())
            (flat,) = Tensor.run_host(step, self.flatten(), positions.flatten(), v.flatten())
        else:
            flat = self.flatten().scatter(0, positions.flatten(), v.flatten())
        self.assign(flat.reshape(self.shape))

    def _box(self, index: tuple):
        """For an index of ints, step-1 slices, None and ...: the (begin, end) region per axis and which
        axes remain in the indexed result; None for anything else."""
        def basic(v) -> bool:
            integer = isinstance(v, (int, np.integer)) and not isinstance(v, bool)
            return v is None or v is Ellipsis or integer or isinstance(v, slice) and v.step in (None, 1)

        if not all(basic(v) for v in index):
            return None
        real = [v for v in index if v is not None]
        if sum(v is Ellipsis for v in real) > 1 or len(real) - (Ellipsis in real) > self.ndim:
            return None  # __getitem__'s errors
        if Ellipsis in real:
            pos = real.index(Ellipsis)
            real = real[:pos] + [slice(None)] * (self.ndim - len(real) + 1) + real[pos + 1 :]
        real += [slice(None)] * (self.ndim - len(real))
        region, keep = [], []
        for axis, (v, n) in enumerate(zip(real, self.shape)):
            if isinstance(v, slice):
                b, e, _ = v.indices(n)
                region.append((b, max(b, e)))
                keep.append(axis)
            else:
                if not -n <= int(v) < n:
                    raise IndexRangeError(f"index {int(v)} is out of bounds for axis {axis} with size {n}")
                region.append((int(v) % n, int(v) % n + 1))
        return region, keep

    def _gather_axes(self, axes: list[int], indices: list[Tensor]) -> Tensor:
        """Advanced indexing of several axes at once by integer tensors that broadcast together."""
        if len(axes) == 1:
            return self._take(axes[0], indices[0])
        try:
            shape = _broadcast_shape(*(t.shape for t in indices))
        except ShapeError:  # an IndexError, as PyTorch's and numpy's
            shapes = ", ".join(str(t.shape) for t in indices)
            raise IndexRangeError(f"index: shape mismatch: the index tensors' shapes {shapes} do not "
                                  "broadcast together") from None
        sizes = [self.shape[a] for a in axes]
        flat = None
        for t, n in zip(indices, sizes):  # one index into the flattened indexed axes, row-major
            type(self)._check_index(t, -n, n, "index")
            t = (t < 0).where(t + n, t).cast(dtypes.default_int)._broadcast_to(shape)
            flat = t if flat is None else flat * n + t
        rest = [a for a in range(self.ndim) if a not in axes]
        x = self.permute(rest + axes).reshape(tuple(self.shape[a] for a in rest) + (math.prod(sizes),))
        x = x._take(len(rest), flat, checked=True)  # rest dims + index dims
        if axes != list(range(axes[0], axes[0] + len(axes))):
            return x.permute(
                tuple(range(len(rest), x.ndim)) + tuple(range(len(rest)))
            )  # not adjacent: index dims first, as numpy and PyTorch
        first = axes[0]
        nb = len(shape)
        order = list(range(first)) + list(range(len(rest), len(rest) + nb)) + list(range(first, len(rest)))
        return x.permute(order)

    def _stride(self, steps: list[int]) -> Tensor:
        """Every step-th element along each axis (after a shrink that made lengths fit): a view, as
        PyTorch's x[::k]."""
        x = self
        for axis, step in enumerate(steps):
            if step != 1:
                node = inplace.stride_node(x.node, axis, step)
                x = x._from(node, x, view=((inplace.STRIDE, (axis, step)),))
        return x

    @staticmethod
    def _check_index(index: Tensor, low: int, high: int, op: str, ignore: int | None = None) -> None:
        """Raise IndexRangeError, naming op, a bad value and the bounds, if an index (other than `ignore`)
        is outside [low, high). A host step right here reads the indices' min and max (TinyJit replays it,
        so a replayed step checks its indices too): computed by two reduce kernels on a GPU, by numpy over
        the indices themselves on CPU/NUMPY. Without it an out-of-range index would select nothing and
        read 0."""
        if index.numel() == 0:
            return

        def check(values: list[np.ndarray], _outputs: list[np.ndarray]) -> None:
            lo, hi = int(values[0]), int(values[1])
            if lo < low or hi >= high:
                bad = lo if lo < low else hi
                size = high if low == 0 else f"{high} (indices from {low})"
                raise IndexRangeError(f"{op}: index {bad} is out of bounds for size {size}")

        if index.device in dtypes.HOST_DEVICES:  # the indices are in host memory: read them there
            def check_here(values: list[np.ndarray], outputs: list[np.ndarray]) -> None:
                v = values[0]
                # read as unsigned, a negative index is at least 2**(bits - 1), so above a bound up to that:
                # one pass checks both ends
                unsigned = low == 0 and v.dtype.kind in "iu" and high <= 1 << 8 * v.itemsize - 1
                if unsigned and v.view(f"u{v.itemsize}").max() < high:
                    return
                lo, hi = v.min(), v.max()
                if ignore is not None and (lo < low or hi >= high):  # (else no label is out of range)
                    v = v[v != ignore]
                    if not v.size:
                        return
                    lo, hi = v.min(), v.max()
                check([lo, hi], outputs)

            key = (op, low, high, ignore, "host")
            step = driver.HostStep(f"{op} index bounds", check_here, [], index.device, key=key)
            type(index).run_host(step, index)
            return
        x = index if ignore is None else (index == ignore).where(low, index)
        step = driver.HostStep(f"{op} index bounds", check, [], index.device, key=(op, low, high, ignore))
        type(index).run_host(step, x.min(), x.max())

    @staticmethod
    def _check_within(x: Tensor, low: float, high: float, op: str, what: str) -> None:
        """Raise ArgumentError naming op and `what` if a value of x is outside [low, high] or nan (PyTorch's
        binary_cross_entropy checks its inputs so); read by a host step like _check_index's."""
        if x.numel() == 0:
            return

        def check(values: list[np.ndarray], _outputs: list[np.ndarray]) -> None:
            lo, hi, nan = float(values[0]), float(values[1]), bool(values[2])
            if nan or lo < low or hi > high:
                bad = "nan" if nan else lo if lo < low else hi
                raise ArgumentError(f"{op}: every element of {what} must be between {low} and {high}, "
                                    f"found {bad}")

        step = driver.HostStep(f"{op} {what} range", check, [], x.device, key=(op, what, low, high))
        x = x.detach()
        type(x).run_host(step, x.min(), x.max(), x.isnan().any())

    def _take(self, axis: int, index: Tensor, checked: bool = False) -> Tensor:
        """Take along one axis with an integer tensor: shape[:a] + index.shape + shape[a+1:]."""
        if index.dtype.is_float:
            raise DTypeError(f"tensor indices must be integers, got {index.dtype.name}")
        n = self.shape[axis]
        src = self.node.srcs[0] if self.node.op is Op.EXPAND else None
        if src is not None and len(src.shape) == self.ndim and src.shape[axis] == 1 and n > 1:
            # the axis is a broadcast of one value (x.expand(2**31 + 3)[idx]): every index reads it, so no
            # take (the host take would write the whole expanded tensor first: 16 GiB there)
            if not checked:
                type(self)._check_index(index, -n, n, "index")
            pre, post = self.shape[:axis], self.shape[axis + 1 :]
            one = type(self)(src).reshape(src.shape[:axis] + (1,) * index.ndim + src.shape[axis + 1 :])
            return self._from(one.expand(pre + index.shape + post).node)
        if self.device in dtypes.HOST_DEVICES and index.numel() * n >= HOST_TAKE_MIN:
            return self._host_take(axis, index, checked)
        if not checked:
            type(self)._check_index(index, -n, n, "index")
        onehot = type(self)._onehot(index, n, self.device)  # index.shape + (n,)
        # bring to (pre..., index dims..., post..., n)
        pre, post = self.shape[:axis], self.shape[axis + 1 :]
        xe = self.permute(tuple(i for i in range(self.ndim) if i != axis) + (axis,))  # pre + post + (n,)
        xe = xe.reshape(pre + (1,) * index.ndim + post + (n,))
        oh = onehot.reshape((1,) * len(pre) + index.shape + (1,) * len(post) + (n,))
        zero = 0 if self.dtype != dtypes.bool else False
        return oh.where(xe, zero).sum(-1, dtype=self.dtype)

    @staticmethod
    def _onehot(index: Tensor, n: int, device: str) -> Tensor:
        """index.shape + (n,): whether each index (negative ones counted from the end) is each of 0..n-1."""
        idx = (index < 0).where(index + n, index)
        return idx.unsqueeze(-1) == type(index).arange(n, device=device, dtype=idx.dtype)

    def _host_take(self, axis: int, index: Tensor, checked: bool) -> Tensor:
        """_take on a host device (CPU, NUMPY: buffers are host memory) as numpy's take in a host step
        (TinyJit replays it), which checks the bounds as it goes: the one-hot form costs n times as much,
        n the table's rows (an Embedding's; measured: bench/HISTORY.md). The gradient adds rows into zeros
        (`_scatter_add`), also a host step, whose own gradient is this take again."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)
        n, shape = self.shape[axis], self.shape[:axis] + index.shape + self.shape[axis + 1 :]

        def take(inputs, outputs):
            table, ids = inputs
            if not checked and ids.size and (ids.min() < -n or ids.max() >= n):
                bad = int(ids.min()) if ids.min() < -n else int(ids.max())
                raise IndexRangeError(f"index: index {bad} is out of bounds for size {n}")
            outputs[0][...] = np.take(table, ids, axis=axis)

        step = driver.HostStep("take", take, [(shape, self.dtype)], self.device, key=(axis, n, checked))
        node = self.node  # (run_host's realize may drop the graph behind self.node)
        (out,) = Tensor.run_host(step, self, index)
        if Tensor.no_grad or not self.dtype.is_float:
            return out
        table_shape = self.shape

        def rule(grad: Node) -> tuple[Node]:
            g = Tensor(grad)
            if g.numel() * n <= ONEHOT_GRAD_MAX:
                return (g._onehot_put(axis, index, table_shape).node,)
            return (g._host_put(axis, index, table_shape).node,)

        return self._from(autodiff.custom_gradient(out.node, (node,), rule, "take"), self)

    def _onehot_put(self, axis: int, index: Tensor, shape: tuple[int, ...]) -> Tensor:
        """_host_put as kernels: out[..., v, ...] = sum over the index's positions j where index[j] is v of
        self[..., j, ...] (a one-hot reduce over the index; its indices were checked by the take)."""
        n, pre, post = shape[axis], self.shape[:axis], self.shape[axis + index.ndim:]
        oh = type(self)._onehot(index, n, self.device)
        oh = oh.reshape((1,) * len(pre) + index.shape + (n,) + (1,) * len(post))
        g = self.reshape(pre + index.shape + (1,) + post)  # (the table's axis before post: rows stay whole)
        return oh.where(g, 0).sum(tuple(range(axis, axis + index.ndim)), dtype=self.dtype)

    def _host_put(self, axis: int, index: Tensor, shape: tuple[int, ...]) -> Tensor:
        """The gradient of _host_take: self's slices added into zeros of `shape` at `index` along axis."""
        Tensor = type(self)  # (tensor.py cannot be imported here; a gradient rule must not hold self)

        def put(inputs, outputs):
            grad, ids = inputs
            outputs[0][...] = 0
            _scatter_add(outputs[0], axis, ids, grad)

        step = driver.HostStep("take gradient", put, [(shape, self.dtype)], self.device, key=(axis, shape))
        node = self.node
        (out,) = Tensor.run_host(step, self, index)
        if Tensor.no_grad:
            return out

        def rule(grad: Node) -> tuple[Node]:
            return (Tensor(grad)._host_take(axis, index, True).node,)

        return self._from(autodiff.custom_gradient(out.node, (node,), rule, "take gradient"), self)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """out[i][j] = self[i][index[i][j]] for dim=1 (PyTorch's torch.gather)."""
        d = _normalize_axis(dim, self.ndim, "gather")
        if not isinstance(index, type(self)) or not index.dtype.is_int:
            kind = index.dtype.name if isinstance(index, type(self)) else type(index).__name__
            raise DTypeError(f"gather: index must be an integer tensor, got {kind}")
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, tensor has {self.ndim}")
        n = self.shape[d]
        type(self)._check_index(index, 0, n, "gather")
        if n > dtypes.int32.max:  # a one-hot over the axis would be n times the index: take the elements
            return self._gather_take(d, index)
        x = self.shrink(tuple((0, s) if i == d else (0, index.shape[i]) for i, s in enumerate(self.shape)))
        xe = x.unsqueeze(-1).transpose(d, -1)
        oh = index.unsqueeze(-1) == type(self).arange(n, device=self.device, dtype=index.dtype)
        return oh.where(xe, 0).sum(-1, dtype=self.dtype)

    def _gather_take(self, d: int, index: Tensor) -> Tensor:
        """gather along an axis of 2**31 elements or more: each element's int64 position in the flattened
        tensor (the index along d, the element's own position along the other axes), taken as x[positions]."""
        Tensor = type(self)
        strides = [math.prod(self.shape[a + 1 :]) for a in range(self.ndim)]
        pos = index.cast(dtypes.int64) * strides[d]
        for a, size in enumerate(index.shape):
            if a != d:
                place = Tensor.arange(size, device=self.device, dtype=dtypes.int64) * strides[a]
                pos = pos + place.reshape((size,) + (1,) * (index.ndim - a - 1))
        return self.reshape(-1)[pos]

    def _scatter_mask(self, dim: int, index: Tensor, src, op: str) -> tuple[Tensor, Tensor, Tensor, int]:
        """For scatter ops: (mask, values, positions) of shape self.shape + (j,), where mask[..., k, ..., j]
        says that source element j along dim goes to output position k; and the normalized dim."""
        d = _normalize_axis(dim, self.ndim, op)
        if not isinstance(src, type(self)):
            src = type(self).full(index.shape, src, dtype=self.dtype, device=self.device)
        if index.dtype.is_float:
            raise DTypeError(f"{op}: index must be an integer tensor, got {index.dtype.name}")
        if src.dtype != self.dtype:
            raise DTypeError(f"{op}: src is {src.dtype.name} but self is {self.dtype.name}")
        if not index.ndim == self.ndim == src.ndim or any(
            i > s or (a != d and i > t) for a, (i, s, t) in enumerate(zip(index.shape, src.shape, self.shape))
        ):
            raise ShapeError(
                f"{op}: index {index.shape} must not be larger than src {src.shape} in any dimension, nor "
                f"than self {self.shape} outside dim {d}"
            )
        src = src.shrink(tuple((0, i) for i in index.shape))
        n = self.shape[d]
        type(self)._check_index(index, 0, n, op)
        places = type(self).arange(n, device=self.device, dtype=index.dtype)
        mask = (index.unsqueeze(-1) == places).transpose(d, -1)
        values = src.unsqueeze(-1).expand(src.shape + (n,)).transpose(d, -1)
        grow = tuple((0, t - m) for t, m in zip(self.shape, mask.shape)) + ((0, 0),)
        j = index.shape[d]
        pos = type(self).arange(j, device=self.device, dtype=dtypes.int32)
        return mask.pad(grow), values.pad(grow), pos, d

    def scatter(self, dim: int, index: Tensor, src, reduce: str | None = None) -> Tensor:
        """out[..., index[..., j, ...], ...] = src[..., j, ...] along dim (PyTorch's scatter); where two
        sources hit one place the last one wins. reduce="add" / "multiply" accumulate instead."""
        if reduce not in (None, "add", "multiply"):
            raise ArgumentError(f"scatter: reduce must be None, 'add' or 'multiply', not {reduce!r}")
        if reduce is not None:
            if isinstance(src, type(self)):
                raise DTypeError("scatter: reduce= needs a scalar src; use scatter_reduce for a tensor src")
            return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
        mask, values, pos, _ = self._scatter_mask(dim, index, src, "scatter")
        last = mask.where(pos, -1).max(-1, keepdim=True)
        pick = mask & (pos == last)
        zero = False if self.dtype == dtypes.bool else 0
        return mask.any(-1).where(pick.where(values, zero).sum(-1, dtype=self.dtype), self)

    def scatter_reduce(self, dim: int, index: Tensor, src, reduce: str, include_self: bool = True) -> Tensor:
        """PyTorch's scatter_reduce: reduce ("sum", "prod", "mean", "amax", "amin") the src values that
        index sends to each place, together with self's value there unless include_self=False."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ArgumentError(
                f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', not {reduce!r}"
            )
        mask, values, _, _ = self._scatter_mask(dim, index, src, "scatter_reduce")
        hit = mask.any(-1)

        def own(neutral) -> Tensor:  # self's part of the reduction
            return self if include_self else hit.where(neutral, self)

        if reduce == "sum":
            return mask.where(values, 0).sum(-1, dtype=self.dtype) + own(0)
        if reduce == "prod":
            return mask.where(values, 1).prod(-1, dtype=self.dtype) * own(1)
        if reduce == "amax":
            return mask.where(values, self.dtype.min).max(-1).maximum(own(self.dtype.min))
        if reduce == "amin":
            return mask.where(values, self.dtype.max).min(-1).minimum(own(self.dtype.max))
        count = mask.sum(-1) + (1 if include_self else hit.where(0, 1))
        total = mask.where(values, 0).sum(-1, dtype=self.dtype) + own(0)
        return total / count if self.dtype.is_float else total // count

    def masked_fill(self, mask: Tensor, value) -> Tensor:
        """value where mask is True, else self (self's dtype). mask must be bool (PyTorch's rule: a 0/1
        float mask is often an additive or keep-mask mistaken for this one), value a number or 0-d."""
        _check_mask(mask, "masked_fill", type(self))
        if isinstance(value, type(self)) and value.ndim != 0:
            raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
        fill = value.cast(self.dtype) if isinstance(value, type(self)) else type(self).full(
            (), value, dtype=self.dtype, device=self.device)
        return mask.where(fill, self)

    def masked_select(self, mask: Tensor, size: int | None = None, fill_value=0) -> Tensor:
        """The elements where mask is True, as a 1-d tensor. Without size= its length depends on the data,
        so the mask is read now; size= (tinygrad's) fixes the length: the first `size` elements, padded with
        fill_value, computed by kernels with no read (usable inside TinyJit)."""
        _check_mask(mask, "masked_select", type(self))
        shape = _broadcast_shape(self.shape, mask.shape)
        x = self._broadcast_to(shape).flatten()
        if size is not None:
            size = _static_size(size, "masked_select")
            fill = type(self).full((), check_fits(fill_value, self.dtype, "masked_select", strict_float=True),
                                   dtype=self.dtype, device=self.device)
            n = x.shape[0]
            if n == 0:
                return fill.expand(size).contiguous()
            flat = _static_positions(mask._broadcast_to(shape).flatten(), size)
            return (flat < n).where(x._take(0, flat.minimum(n - 1), checked=True), fill)
        where = np.flatnonzero(np.broadcast_to(mask.numpy(), shape))
        return x[type(self)(where, device=self.device)]

    def nonzero(self, size: int | None = None, fill_value: int = -1) -> Tensor:
        """Indices of the nonzero elements, (count, ndim) (PyTorch's); without size= the count depends on
        the data, so it is computed now. size= fixes the count as torch.nonzero_static: the first `size`
        rows, padded with fill_value, computed by kernels with no read (usable inside TinyJit)."""
        if size is not None:
            return self.nonzero_static(size=size, fill_value=fill_value)
        where = np.argwhere(self.numpy())
        where = where.reshape(len(where), self.ndim)  # (a 0-d tensor: (1, 0) or (0, 0), as PyTorch)
        return type(self)(where.astype(dtypes.default_int.np), device=self.device)

    def nonzero_static(self, *, size: int, fill_value: int = -1) -> Tensor:
        """torch.nonzero_static: (size, ndim) indices of the first `size` nonzero elements (row-major),
        the rows past their count fill_value; no data-dependent shape, so nothing is read back."""
        size = _static_size(size, "nonzero_static")
        if isinstance(fill_value, bool) or not isinstance(fill_value, (int, np.integer)):
            raise ArgumentError(f"nonzero_static: fill_value must be an int, got {type(fill_value).__name__} "
                                f"{fill_value!r}")
        fill = check_fits(fill_value, dtypes.default_int, "nonzero_static")
        Tensor, n = type(self), self.numel()
        if self.ndim == 0 or n == 0:  # no coordinates (0-d: PyTorch's (size, 0)) or no element to find
            return Tensor.full((size, self.ndim), fill, dtype=dtypes.default_int, device=self.device)
        flat = _static_positions((self != 0).flatten(), size)
        coords = [flat // math.prod(self.shape[d + 1 :]) % s for d, s in enumerate(self.shape)]
        return (flat < n).unsqueeze(-1).where(Tensor.stack(coords, dim=-1), fill).cast(dtypes.default_int)

    def one_hot(self, num_classes: int) -> Tensor:
        """(..., num_classes) with a 1 at each index (the default integer dtype). num_classes must be given:
        PyTorch's -1 (count from the data) is refused, like tinygrad, so that no value is read back."""
        if num_classes < 0:
            raise ArgumentError(f"one_hot: num_classes must be >= 0, got {num_classes}")
        if self.dtype.is_float:
            raise DTypeError(f"one_hot: needs integer class indices, got {self.dtype.name}")
        type(self)._check_index(self, 0, num_classes, "one_hot")
        classes = type(self).arange(num_classes, device=self.device, dtype=self.dtype)
        return (self.unsqueeze(-1) == classes).cast(dtypes.default_int)


def _static_size(size, op: str) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ArgumentError(f"{op}: size must be an int >= 0, got {type(size).__name__} {size!r}")
    return int(size)


def _static_positions(mask: Tensor, size: int) -> Tensor:
    """(size,): the flat position of the k-th True of a 1-d mask, len(mask) for k past their count. The
    k-th True is where the running count reaches k + 1, so its position is the number of places where the
    count is still <= k: kernels only (a cumsum and a compare-and-count), no value read back."""
    count = mask.cumsum()
    k = type(mask).arange(size, device=mask.device, dtype=count.dtype)
    return (count.unsqueeze(0) <= k.unsqueeze(1)).sum(-1, dtype=dtypes.default_int)


def _index_tuple(index, tensor_class: type) -> tuple:
    """The index as a tuple of entries. A list is one entry (indices), except as PyTorch reads it (numpy's
    old rule, kept there with a deprecation warning, and tinygrad's): shorter than 32 and holding a slice,
    None, ..., a sequence or a tensor, it is a tuple of entries (t[[slice(None), [1, 3]]] is t[:, [1, 3]],
    t[[[0, 1], [2, 3]]] is t[[0, 1], [2, 3]]). PyTorch's warning is given too."""
    if isinstance(index, tuple):
        return index
    entry = (slice, list, tuple, np.ndarray, tensor_class)
    if isinstance(index, list) and len(index) < 32 and any(
            v is None or v is Ellipsis or isinstance(v, entry) for v in index):
        warnings.warn("Using a non-tuple sequence for multidimensional indexing is deprecated (in PyTorch, "
                      "whose reading this is, too); use x[tuple(seq)] instead of x[seq]",
                      UserWarning, stacklevel=user_stacklevel())
        return tuple(index)
    return (index,)


def _check_mask(mask, op: str, tensor_class: type) -> None:
    if not isinstance(mask, tensor_class) or mask.dtype != dtypes.bool:
        kind = mask.dtype.name if isinstance(mask, tensor_class) else type(mask).__name__
        raise DTypeError(f"{op}: mask must be a bool tensor, got {kind}; compare (mask != 0) or use where()")


def _basic_only(t: Tensor, index: tuple) -> None:
    """A disk tensor takes basic indices only (ints, slices, None, ...): an index of data (a tensor, list or
    array) gathers, which a file cannot compute."""
    for v in index:
        if not (v is None or v is Ellipsis or isinstance(v, (slice, int, np.integer))) or isinstance(v, bool):
            raise DiskError(f"advanced indexing ({type(v).__name__} index) of a disk tensor ({t.device}) is "
                            "not supported: it gathers, and a disk device computes nothing; copy it to a "
                            "compute device first: t.to('CPU')[index]")


def file_node(Tensor: type, path: pathlib.PurePath, device: str | None, dtype: DType | str | None) -> Node:
    """Tensor(pathlib.Path(p)): the file's bytes as a 1-d tensor of dtype (uint8 by default) on its disk
    device, or copied to `device` when one is given."""
    dtype = dtypes.from_any(dtype) if dtype is not None else dtypes.uint8
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"Tensor({path!r}): no such file")
    nbytes = pathlib.Path(path).stat().st_size
    if nbytes % dtype.itemsize:
        raise ShapeError(f"Tensor({str(path)!r}, dtype={dtype.name}): the file's {nbytes} bytes are not a "
                         f"whole number of {dtype.name} elements ({dtype.itemsize} bytes each)")
    disk = canonical(f"disk:{path}")
    t = Tensor.empty(nbytes // dtype.itemsize, dtype=dtype, device=disk)
    return t.node if device is None or is_disk(canonical(device)) else t.to(device).node
