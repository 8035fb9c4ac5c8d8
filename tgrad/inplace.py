"""Laziness and in-place writes: a tensor keeps the value it had when it was made, as in PyTorch's eager
mode, except views, which share their base's memory and so see its later writes.

tgrad computes lazily, and `assign()` writes a buffer in place when it is realized, so without care a
tensor made before an assign and first computed after it would read the new value (PyTorch computed it
at once: the old). Two rules make the lazy result PyTorch's:

- Views follow their base. A tensor made from another by view ops (reshape, permute, expand, shrink,
  step slices, negative ones too as numpy's (not flip(), a copy in PyTorch), detach, a bitcast between
  dtypes of one size, and only where the result is strided memory, as in PyTorch: not `repeat`'s reshape
  of an expand) is recorded on its base.
  `assign()` to the base rebuilds each view's ops on the base's new node, so a view reads the new value,
  and so does anything computed from it afterwards. An `assign()` to a view writes through to its base
  (`Tensor._assign_view`, the view ops undone by `undo`; refused where elements of the view overlap, an
  expand, as in PyTorch).
- Before a realize (or a TinyJit replay) overwrites buffers (the assigns of its nodes, or ones their
  graphs read), every live tensor not computed yet whose value reads one of those buffers, other than
  through a view of it, is computed in the same schedule, before the writes (`with_writes`,
  `computed_before`). That is the snapshot PyTorch would have taken. An assign nothing reads runs when
  its tensor is realized (or an optimizer step, a TinyJit call, realizes it).

The bookkeeping: `LAZY` holds every tensor made with an unrealized node (by weak reference; purged as
it grows), `ASSIGNS` the assigns made, a tensor's `_views` its views (weak references), a view's `_base`
(its base tensor, the view ops from it).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from tgrad import realize as driver
from tgrad.errors import ArgumentError, OutOfMemoryError, ValueOverflowError
from tgrad.graph import MOVEMENT, Node, Op, View, move

# ops whose result is a view of their source's memory when the whole chain stays strided (PyTorch's view);
# a DETACH only without a name (a named one is a custom gradient over a computed value)
VIEW_OPS = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.DETACH})
# id(tensor) -> weakref.ref(tensor), for tensors made with a node not computed yet
LAZY: dict[int, weakref.ref] = {}
# while a TinyJit function runs: LAZY as it was before the call (tensors made outside it)
OUTSIDE: dict[int, weakref.ref] | None = None
# ASSIGN nodes made by assign() and still alive (a realized one until the next realize drops it)
ASSIGNS: weakref.WeakSet = weakref.WeakSet()
# each of those ASSIGN nodes -> the node its tensor had before (a failed realize puts it back)
_BEFORE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_purge_at = 4096

Steps = tuple[tuple[Op | str, object], ...]  # view ops (op, arg), first first; (DETACH, None): detach()
# a step slice x[::k] along one axis, arg (axis, k): a pad, reshape, shrink and reshape in the graph (no
# single movement op says it), so views record it as one op
STRIDE = "STRIDE"
# x.unfold(axis, size, step), arg (axis, size, step): windows on a new last axis (view ops in the graph
# that strides express only as one op: strides (step * s, s))
WINDOWS = "WINDOWS"
# x.bitcast(dtype), arg (from dtype, to dtype, rebuild): a host step's copy in the graph, a view in PyTorch
# (x.view(dtype)); rebuild(node) makes it again on a new base node (a host step that reads the base's value:
# an assign to a base with such a view is computed at once)
BITCAST = "BITCAST"


def track(t) -> None:
    """Note a tensor whose value is not computed yet (dropped again once it is, or once it is a view)."""
    global _purge_at
    LAZY[id(t)] = weakref.ref(t)
    if len(LAZY) > _purge_at:
        for k, r in list(LAZY.items()):
            x = r()
            if x is None or x.node.buffer is not None:
                del LAZY[k]
        _purge_at = max(4096, 2 * len(LAZY))


def viewing(node: Node) -> bool:
    """Whether node is one view op over its source."""
    return node.op in VIEW_OPS and (node.op is not Op.DETACH or node.arg is None)


def view_chain(node: Node) -> tuple[Node, Steps]:
    """The node under node's chain of view ops, and those ops."""
    steps = []
    while viewing(node):
        steps.append((node.op, node.arg))
        node = node.srcs[0]
    return node, tuple(reversed(steps))


def stride_node(node: Node, axis: int, step: int) -> Node:
    """Every step-th element of node along axis (whose length a shrink made (count - 1) * step + 1): a
    pad to count * step, a reshape to (count, step), the first of each row, a reshape back."""
    shape = node.shape
    n = shape[axis]
    count = (n + step - 1) // step
    pad = [(0, 0)] * len(shape)
    pad[axis] = (0, count * step - n)
    x = move(node, Op.PAD, tuple(pad))
    x = move(x, Op.RESHAPE, shape[:axis] + (count, step) + shape[axis + 1 :])
    arg = [(0, s) for s in x.shape]
    arg[axis + 1] = (0, 1)
    x = move(x, Op.SHRINK, tuple(arg))
    return move(x, Op.RESHAPE, shape[:axis] + (count,) + shape[axis + 1 :])


def windows_node(node: Node, axis: int, size: int, step: int) -> Node:
    """Windows of `size` every `step` along axis (whose length n is >= size > 0), on a new last axis, by
    view ops: the axis repeated E times, cut to rows of n + step (so row i starts at i * step), and
    each row's first `size` elements."""
    shape = node.shape
    n = shape[axis]
    count = (n - size) // step + 1
    rows = -(-count * (n + step) // n)  # E
    pre, post = shape[:axis], shape[axis + 1 :]
    x = move(node, Op.RESHAPE, pre + (1, n) + post)
    x = move(x, Op.EXPAND, pre + (rows, n) + post)
    x = move(x, Op.RESHAPE, pre + (rows * n,) + post)
    whole = tuple((0, s) for s in pre), tuple((0, s) for s in post)
    x = move(x, Op.SHRINK, whole[0] + ((0, count * (n + step)),) + whole[1])
    x = move(x, Op.RESHAPE, pre + (count, n + step) + post)
    keep = [(0, s) for s in x.shape]
    keep[axis + 1] = (0, size)
    x = move(x, Op.SHRINK, tuple(keep))
    order = tuple(i for i in range(len(x.shape)) if i != axis + 1)
    return move(x, Op.PERMUTE, order + (axis + 1,))


def shape_after(shape: tuple[int, ...], op, arg) -> tuple[int, ...]:
    """The shape a view op gives."""
    if op is Op.RESHAPE or op is Op.EXPAND:
        return tuple(arg)
    if op is Op.PERMUTE:
        return tuple(shape[i] for i in arg)
    if op is Op.SHRINK:
        return tuple(e - b for b, e in arg)
    if op == STRIDE:
        axis, step = arg
        return shape[:axis] + ((shape[axis] + step - 1) // step,) + shape[axis + 1 :]
    if op == WINDOWS:
        axis, size, step = arg
        return shape[:axis] + ((shape[axis] - size) // step + 1,) + shape[axis + 1 :] + (size,)
    if op == BITCAST and shape:  # (the last axis holds the bytes)
        return shape[:-1] + (shape[-1] * arg[0].itemsize // arg[1].itemsize,)
    return shape


def strided(shape: tuple[int, ...], steps: Steps) -> bool:
    """Whether these view ops over a contiguous tensor of this shape give strided memory (sizes, strides
    and an offset): what PyTorch returns a view for. A reshape that strides cannot express (of an expand,
    of a transpose) copies in PyTorch, and so is not a view here either."""
    moved = False  # (a reshape before any other op keeps memory contiguous: strided without a tracker)
    for op, _ in steps:
        if op is Op.RESHAPE and moved:
            break
        moved = moved or op not in (Op.RESHAPE, Op.DETACH, BITCAST)
    else:
        return True
    return strided_view(shape, steps) is not None


def strided_view(shape: tuple[int, ...], steps: Steps) -> View | None:
    """The View (sizes, strides, offset) these view ops give over a contiguous tensor of this shape; None
    where strides cannot express them."""
    view: View | None = View.contiguous(shape)
    for op, arg in steps:
        if op is Op.RESHAPE:
            view = View.contiguous(arg) if 0 in arg else view.reshape(tuple(arg))
            if view is None:
                return None
        elif op is Op.PERMUTE:
            view = view.permute(arg)
        elif op is Op.EXPAND:
            view = view.expand(arg)
        elif op is Op.SHRINK:
            view = view.shrink(arg)
        elif op is Op.FLIP:  # (x[::-1]: negative strides, as numpy's view)
            view = view.flip(arg)
        elif op == STRIDE:
            axis, step = arg
            strides = tuple(st * step if i == axis else st for i, st in enumerate(view.strides))
            view = View(shape_after(view.shape, op, arg), strides, view.offset, None)
        elif op == WINDOWS:
            axis, _, step = arg
            st = view.strides[axis]
            strides = view.strides[:axis] + (st * step,) + view.strides[axis + 1 :] + (st,)
            view = View(shape_after(view.shape, op, arg), strides, view.offset, None)
        elif op == BITCAST and arg[0].itemsize != arg[1].itemsize:
            view = _bitcast_view(view, arg[0].itemsize, arg[1].itemsize)
            if view is None:
                return None
    return view


def _bitcast_view(view: View, src: int, dst: int) -> View | None:
    """A view's View read as items of dst bytes instead of src: PyTorch's rule, the last axis steps by one
    item and the other strides and the offset are whole numbers of dst items; else None (not a view)."""
    if view.mask is not None or (view.shape[-1] != 1 and view.strides[-1] != 1):
        return None
    steps = [st * src for st in view.strides[:-1]] + [view.offset * src]
    if any(b % dst for b in steps):
        return None
    shape = view.shape[:-1] + (view.shape[-1] * src // dst,)
    return View(shape, tuple(b // dst for b in steps[:-1]) + (1 if shape[-1] != 1 else 0,), steps[-1] // dst)


def undo(ts: list, steps: Steps, shapes: list[tuple[int, ...]]) -> list:
    """An assign() through a view (Tensor._assign_view): each of the view ops `steps` undone, last first, on
    the values written and, where the view covers part of its base, on a bool mask of the elements written
    (ts: [values] or [values, mask]); `shapes`: the shape before each step. An expand or windows that the
    view does not overlap leaves one of each expanded row's elements: that one is kept."""
    for i in reversed(range(len(steps))):
        (op, arg), shape = steps[i], shapes[i]
        if op is Op.RESHAPE:
            ts = [t.reshape(shape) for t in ts]
        elif op is Op.PERMUTE:
            back = tuple(np.argsort(arg))
            ts = [t.permute(back) for t in ts]
        elif op is Op.FLIP:
            ts = [t.flip(arg) for t in ts]
        elif op == WINDOWS:  # windows_node's ops undone; each element is in one window written
            axis, size, step = arg
            n, count = shape[axis], ts[0].shape[axis]
            rows = -(-count * (n + step) // n)
            pre, post = shape[:axis], shape[axis + 1 :]
            back = [t.movedim(-1, axis + 1) for t in ts]  # (..., count, size, ...)
            grow = [(0, 0)] * len(back[0].shape)
            grow[axis + 1] = (0, n + step - size)
            back = [t.pad(tuple(grow)).reshape(pre + (count * (n + step),) + post) for t in back]
            grow = [(0, 0)] * len(shape)
            grow[axis] = (0, rows * n - count * (n + step))
            back = [t.pad(tuple(grow)).reshape(pre + (rows, n) + post) for t in back]
            x_back = back[1].where(back[0], ts[0].dtype.min).max(axis, keepdim=True)
            ts = [t.reshape(shape) for t in (x_back, back[1].any(axis, keepdim=True))]
        elif op is Op.SHRINK:
            pads = tuple((b, n - e) for (b, e), n in zip(arg, shape))
            ts = [t.pad(pads) for t in ts]
        elif op == STRIDE:  # every step-th element: the first in each row of a (count, step)
            axis, step = arg
            grow = [(0, 0)] * (len(shape) + 1)
            grow[axis + 1] = (0, step - 1)
            flat = shape[:axis] + (ts[0].shape[axis] * step,) + shape[axis + 1 :]
            keep = [None] * len(shape)
            keep[axis] = (0, shape[axis])
            ts = [t.unsqueeze(axis + 1).pad(tuple(grow)).reshape(flat).shrink(keep) for t in ts]
        elif op == BITCAST:  # the values' bits as the dtype before it
            values = ts[0].bitcast(arg[0])
            if len(ts) == 1 or arg[0].itemsize == arg[1].itemsize:
                ts = [values, *ts[1:]]
            elif any(o in (Op.SHRINK, Op.EXPAND, STRIDE, WINDOWS) for o, _ in steps[i + 1 :]):
                raise ArgumentError(f"assign: this view writes part of the items of a {arg[0].name} -> "
                                    f"{arg[1].name} bitcast (its elements are smaller or larger than the "
                                    "tensor's it views); write whole items: assign to the bitcast itself")
            else:  # every byte of the bitcast is written
                ts = [values, type(values).ones(*values.shape, dtype=ts[1].dtype, device=values.device)]
        elif op is Op.EXPAND and tuple(arg) != tuple(shape):
            axes = tuple(i for i, (a, b) in enumerate(zip(shape, arg)) if a != b)
            x_back = ts[1].where(ts[0], ts[0].dtype.min).max(axes, keepdim=True)
            ts = [x_back, ts[1].any(axes, keepdim=True)]
    return ts


def overlapping(shape: tuple[int, ...], steps: Steps) -> bool:
    """Whether several elements of these view ops' result may be one element of the base (an expanded
    axis left longer than 1, overlapping windows): in-place writes into it are refused (PyTorch refuses
    the first kind). Each axis, by stride, must step over everything the smaller-strided axes span."""
    if not any(op is Op.EXPAND or op == WINDOWS for op, _ in steps):
        return False
    view = strided_view(shape, steps)
    if view is None:
        return False
    span = 0
    for st, n in sorted((abs(st), n) for st, n in zip(view.strides, view.shape) if n > 1):
        if st <= span:
            return True
        span += st * (n - 1)
    return False


def is_view(node: Node) -> bool:
    """Whether reading node reads a realized buffer as it is now (a PyTorch view of it)."""
    base, steps = view_chain(node)
    return base.buffer is not None and strided(base.shape, steps)


def replay(node: Node, steps: Steps) -> Node:
    """View ops applied to a node."""
    for op, arg in steps:
        if op is Op.DETACH:
            node = Node(Op.DETACH, (node,), None, node.shape, node.dtype, node.device)
        elif op == STRIDE:
            node = stride_node(node, *arg)
        elif op == WINDOWS:
            node = windows_node(node, *arg)
        elif op == BITCAST:
            node = arg[2](node)
        else:
            node = move(node, op, arg)
    return node


def add_view(base, view, steps: Steps) -> None:
    """Record `view`, made from `base` by view ops `steps`, on the tensor whose memory both see (its
    `_base` becomes (that tensor, the ops from it))."""
    root, before = base._base if base._base is not None else (base, ())
    if before and not strided(root.shape, before):  # base is a copy in PyTorch's sense: the root of this
        base._base, root, before = None, base, ()  # view (its own views follow its copy, _to_compute)
    view._base = (root, before + steps)
    if root._views is None:
        root._views = []
    views = root._views
    views.append(weakref.ref(view))
    if len(views) > 64 and len(views) & (len(views) - 1) == 0:  # (at powers of two: dead ones dropped)
        views[:] = [r for r in views if r() is not None]


def rebase(root, new: Node) -> None:
    """root's node is now `new` (an assign): its views are rebuilt on it, where they are views in
    PyTorch's sense (strided); the others were copies there and keep their value."""
    if not root._views:
        return
    live = []
    for ref in root._views:
        v = ref()
        if v is None or v._base is None or v._base[0] is not root:
            continue
        steps = v._base[1]
        if not strided(root.shape, steps):
            v._base = None
            continue
        live.append(ref)
        v.node = replay(new, steps)
        if v.node.buffer is None:
            track(v)
    root._views = live


def reads_written(node: Node, written: set[int], memo: dict) -> bool:
    """Whether node's value, not computed yet, reads one of the buffers in `written` (ids). An unrealized
    ASSIGN is the value after its write: what its own value reads is in the schedule that writes."""
    stack = [node]
    while stack:
        n = stack[-1]
        if n in memo:
            stack.pop()
        elif n.buffer is not None:
            memo[n] = id(n.buffer) in written
            stack.pop()
        elif n.op is Op.ASSIGN:
            memo[n] = False
            stack.pop()
        else:
            before = len(stack)
            for s in n.srcs:
                if s not in memo:
                    stack.append(s)
            if len(stack) == before:
                memo[n] = any(memo[s] for s in n.srcs)
                stack.pop()
    return memo[node]


def computed_before(written: set[int], exclude=()) -> list[Node]:
    """The nodes of live tensors, not computed yet, that read a buffer about to be overwritten (ids in
    `written`) other than as a view of it: they must be computed before the write. `exclude`: nodes the
    same schedule computes anyway. Inside a TinyJit call, those of tensors made before the call are
    computed here and now, unrecorded: a replay computes them before it runs (TinyJit._replay)."""
    if not written:  # (nothing is overwritten: no tensor to walk, e.g. a replayed backward())
        return []
    memo: dict = {}
    out: dict[Node, None] = {}
    before: list[Node] = []
    for k, ref in list(LAZY.items()):
        t = ref()
        if t is None:
            del LAZY[k]
            continue
        n = t.node
        while n.op is Op.DETACH and n.arg is not None:  # (a custom gradient: the value is its source's)
            n = n.srcs[0]
        if n.buffer is not None or is_view(n):
            del LAZY[k]
            continue
        if n in exclude and n.base.buffer is None:  # the schedule computes it, before the writes (view
            continue  # ops over a realized buffer are the exception: realizing them computes nothing)
        if reads_written(n, written, memo):
            n = _to_compute(t)
            if OUTSIDE is not None and OUTSIDE.get(k) is ref:
                before.append(n)
            else:
                out[n] = None
    if before:
        with driver.recording(None):
            driver.realize(before)
    return list(out)


def _to_compute(t) -> Node:
    """The node to realize so that t's value is fixed: its own, or, for a view (realizing view ops
    computes nothing), the node it views, so that it stays a view of that; a copy when there is none."""
    n = t.node
    if n.op not in MOVEMENT and n.op is not Op.DETACH:
        return n
    base, steps = view_chain(n)
    if base.buffer is None and base.op not in MOVEMENT and strided(base.shape, steps):
        return base
    t.node, t._base = Node(Op.CAST, (n,), n.dtype, n.shape, n.dtype, n.device), None
    rebase(t, t.node)
    return t.node


def assigned(node: Node, old: Node) -> None:
    """Note an ASSIGN node made by assign() on a tensor whose node was `old`: realizes that reach it
    overwrite its target's buffer."""
    ASSIGNS.add(node)
    _BEFORE[node] = old


def _drop_assigns(assigns: list[Node]) -> None:
    """Undo assign() for ASSIGN nodes that a failed realize did not run (an OutOfMemoryError: checked before
    anything ran; a ValueOverflowError: WEBGPU puts back the output of the kernel that overflowed), as
    PyTorch never made a write whose op failed: their tensors (and views) take their
    node from before the assign again, and a later realize does not try them again."""
    dropped = {id(a): a for a in assigns}
    for ref in list(LAZY.values()):
        t = ref()
        if t is not None and id(t.node) in dropped and t.node.buffer is None:
            old = _BEFORE.get(t.node)
            if old is not None:
                t.node = old
                rebase(t, old)
    for a in assigns:
        ASSIGNS.discard(a)


def _assigns_reached(nodes: list[Node]) -> list[Node]:
    """The ASSIGN nodes not realized yet that computing `nodes` runs."""
    out, seen, stack = [], set(), list(nodes)
    while stack:
        n = stack.pop()
        if n in seen or n.buffer is not None:
            continue
        seen.add(n)
        if n.op is Op.ASSIGN:
            out.append(n)
        stack.extend(n.srcs)
    return out


def realize(nodes: list[Node]) -> None:
    """Compute the nodes, and first, where that runs assigns, the live tensors that read the old values of
    the buffers they overwrite (with_writes): every realize tgrad's API asks for comes through here."""
    todo = with_writes(nodes)
    try:
        driver.realize(todo)
    except (OutOfMemoryError, ValueOverflowError):
        _drop_assigns(_assigns_reached(todo))
        raise


def to_numpy(node: Node, now: Callable[[], Node] | None = None) -> np.ndarray:
    """The value of a node as a numpy array: realized (as above), then read back. `now`: the node to read
    after the realize (a tensor's: the realize may give it a copy)."""
    driver.note_read(node)
    realize([node])
    return driver.read(now() if now is not None else node)


def with_writes(nodes: list[Node]) -> list[Node]:
    """What a realize of `nodes` computes: the nodes and, when that runs assigns (theirs, or ones their
    graphs read), before those overwrite their buffers, the live tensors that read the old values. An
    assign not run yet whose value reads such a buffer runs with them (before the write, as it would
    have in PyTorch), and so on for what that one overwrites."""
    waiting = []
    for a in list(ASSIGNS):
        if a.buffer is None:
            waiting.append(a)
        else:
            ASSIGNS.discard(a)
    if not waiting:  # (no assign waits: nothing to walk)
        return nodes
    top = set(nodes)  # (an optimizer step names all its assigns: then no walk finds them)
    run = [a for a in waiting if a in top] if all(a in top for a in waiting) else _assigns_reached(nodes)
    if not run:
        return nodes
    written = {id(a.srcs[0].buffer) for a in run}
    ran, extra = set(run), []
    others = [a for a in waiting if a not in ran]
    while others:
        memo: dict = {}
        more = [a for a in others if reads_written(a.srcs[1], written, memo)]
        if not more:
            break
        for a in _assigns_reached(more):
            if a not in ran:
                ran.add(a)
                written.add(id(a.srcs[0].buffer))
        extra += more
        others = [a for a in others if a not in ran]
    return nodes + extra + computed_before(written, top.union(extra))
