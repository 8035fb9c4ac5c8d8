"""Eager backward() replayed: the kernels that compute a loss and its gradients, captured for a forward
graph whose structure was seen before, run again without building, scheduling and walking the gradient
graph (in an eager MLP step those cost about as much as its kernels: bench/HISTORY.md, "Eager steps ...").

backward() keys the graph it differentiates by its structure down to the buffers (`_walk`: every node's
op, argument, shape, dtype, device and sources' positions; which nodes hold a buffer, numbered by first
appearance, so that aliasing is part of the key; not stopping at realized nodes, since gradients flow
through them) and by which tensors receive a gradient (the live requires_grad tensors, by identity, and
where their nodes are). The first backward() of a structure runs plainly (lazy gradients, as always); from
the second on it runs through a TinyJit of that structure (fallback: a refused capture runs plainly), whose
function is the plain backward() of the current loss followed by a realize of the loss and the gradients,
and whose arguments are the graph's buffers in key order. TinyJit's rules do the rest: its first call runs
and the second captures; later calls replay the kernels with this graph's buffers, set each parameter's
.grad to a fresh buffer, accumulate into an existing .grad as the plain path would, and return the loss,
whose node takes that buffer. The gradients and the loss are then computed when backward() returns, as in
PyTorch (the plain path computes them at the next realize; the values are the same, by inplace.py's rules).

A custom gradient (autodiff.custom_gradient: conv2d's, softmax's, layernorm's...) is a Python closure:
it is keyed by its code and the values it holds (`_value_key`), and a graph whose rule holds a value the
key cannot show runs plainly. Assigns waiting at backward() (BatchNorm's running statistics in training)
are roots of the structure too: run with the loss and the gradients in one realize (a graph reading a
buffer an assign overwrites reads the old value, inplace.py), written again by every replay (one made
at a single step gives that step a structure of its own). Not replayed: an explicit `gradient=`, a call
inside a TinyJit function (the outer one captures it), JIT=0, the NUMPY reference, a loss that is a view.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

from tgrad import autodiff, config
from tgrad import realize as driver
from tgrad import tensor as tensor_mod
from tgrad.device import get_runtime
from tgrad.dtype import DType
from tgrad.graph import MOVEMENT, Node, Op
from tgrad.jit import TinyJit, under_reshapes
from tgrad.tensor import Tensor

# TGRAD_BACKWARD_REPLAY=0 (or JIT=0) turns replays off: every backward() builds its graph lazily (what a
# test that inspects the gradient graph needs; a replay also keeps the kernels it captured when a setting
# that changes kernels, such as emit_numba_conv.REGISTER_TILES, changes later)
ENABLED = config.on("TGRAD_BACKWARD_REPLAY")
MAX_PROGRAMS = 4  # structures with a TinyJit kept (each holds its capture's buffers), least recent first out
MAX_SEEN = 64  # structures remembered as seen once
_SCALAR = (float, int, bool)


class Stats:
    replays = 0  # backward() calls answered by a replay


class _Program:
    """A TinyJit of one structure, its targets (weak references, in key order) and the loss to run (in
    `loss[0]` while it runs, with the tensors whose assigns wait in `loss[1]`: a list, not the program, is
    what the TinyJit's function holds, so that a program dropped from _programs, and the buffers its
    capture holds, are freed at once)."""

    def __init__(self, targets: list[Tensor]):
        self.targets = [weakref.ref(t) for t in targets]
        self.loss: list = [None, ()]  # (the loss, the tensors whose assigns wait)
        loss = self.loss

        def backward(*_buffers: Tensor) -> Tensor:
            # (the graph was built over the arguments' buffers already: the plain backward of that graph;
            # TinyJit realizes the returned loss with the gradients it set and the waiting assigns, handed
            # back to it here, in one realize)
            loss[0]._backward(None)
            for t in loss[1]:
                tensor_mod.PENDING_ASSIGNS[id(t)] = t
            return loss[0]

        self.jit = TinyJit(backward, fallback=True)


_programs: OrderedDict[tuple, _Program] = OrderedDict()
_seen: OrderedDict[tuple, None] = OrderedDict()


def reset() -> None:
    """Forget every structure seen: the captures' buffers are freed, and backward() starts over."""
    _programs.clear()
    _seen.clear()


class _Refused(Exception):
    """The walk met something it cannot key (an assign not run yet, a custom rule's unknown value)."""


def _walk(roots: list[Node], assigns: set[Node]) -> tuple[list, list[Node], dict[Node, int]] | None:
    """(structure entries, one node per buffer in numbering order, node -> position) of the roots' graph
    down to its buffers; None where the graph is not replayed (an assign not run yet other than the roots
    in `assigns`, a custom gradient whose
    rule holds a value `_value_key` cannot key, a graph deeper than the interpreter's recursion limit
    allows from here). Recursive, like schedule_cache's walk (twice as fast as a loop over a stack of its
    own). A custom gradient's node (autodiff.custom_gradient) is keyed with its rule: the rule's code, the
    values its closure holds (nodes by their positions: they are walked too) and its inputs' positions."""
    position: dict[Node, int] = {}
    buffers: dict[int, int] = {}
    holders: list[Node] = []
    entries: list[tuple] = []
    buffer_op, assign_op, detach_op, custom = Op.BUFFER, Op.ASSIGN, Op.DETACH, autodiff.CUSTOM
    getpos = position.__getitem__

    def at(node: Node) -> int:
        if node not in position:
            visit(node)
        return position[node]

    def visit(node: Node) -> None:  # post-order: a node is numbered once its sources are
        srcs = node.srcs
        for s in srcs:
            if s not in position:
                visit(s)
        op, buf, arg = node.op, node.buffer, node.arg
        if op is assign_op and buf is None and node not in assigns:
            raise _Refused
        if op is buffer_op:
            arg = None
        elif isinstance(arg, _SCALAR):
            arg = (type(arg), repr(arg))
        elif op is detach_op and node in custom:
            inputs, rule, reads_output, needs = custom[node]
            arg = (arg, tuple(map(at, inputs)), _value_key(rule, at), reads_output, needs)
        number = None
        if buf is not None:
            number = buffers.get(id(buf))
            if number is None:
                number = buffers[id(buf)] = len(buffers)
                holders.append(node)
        entries.append((op._value_, arg, node.shape, node.dtype.name, node.device, tuple(map(getpos, srcs)),
                        number))
        position[node] = len(position)

    try:
        for root in roots:
            if root not in position:
                visit(root)
    except (_Refused, RecursionError):
        return None
    finally:
        visit = at = None  # noqa: F841  (the closures hold each other: a cycle that would keep the graph alive)
    return entries, holders, position


def _value_key(value, at) -> object:
    """How a value a custom gradient's rule holds (in its closure) enters the key: plain values by value,
    tuples item by item, nodes and tensors by the position of their node (`at` walks it), dtypes by name,
    classes by themselves, functions by their code and closure; anything else raises _Refused (a value
    whose meaning the key cannot show: the plain path runs)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, repr(value))
    if isinstance(value, tuple):
        return tuple(_value_key(v, at) for v in value)
    if isinstance(value, Node):
        return ("node", at(value))
    if isinstance(value, Tensor):
        return ("tensor", at(value.node))
    if isinstance(value, DType):
        return ("dtype", value.name)
    if isinstance(value, type):  # a class by itself (the rules of the op mixins in tgrad/ops/ hold Tensor)
        return ("class", value)
    code = getattr(value, "__code__", None)
    if code is None:
        raise _Refused
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(_value_key(cell.cell_contents, at))
        except ValueError:  # (a cell not filled yet)
            cells.append(None)
    return ("code", code, tuple(cells))


def replay(loss: Tensor) -> bool:
    """Run loss.backward() (no explicit gradient) as a replay, or through the TinyJit that will capture
    one; False where the plain path must run instead (nothing done then)."""
    node = loss.node
    base = under_reshapes(node)  # (x.sum(): a reshape of the reduce to ())
    if (not ENABLED or driver.RECORDER is not None or not config.on("JIT")
            or base.buffer is not None or base.op in MOVEMENT or base.op in (Op.DETACH, Op.ASSIGN, Op.BUFFER)
            or get_runtime(loss.device).evaluates_graphs):
        return False
    # assigns not run yet (BatchNorm's running statistics): part of the structure, run with the loss and
    # the gradients (in one realize, so that a graph reading a buffer an assign overwrites reads the old
    # value, inplace.py), and written again by every replay
    pending = [t for t in list(tensor_mod.PENDING_ASSIGNS.values())
               if t.node.op is Op.ASSIGN and t.node.buffer is None]
    roots = [node] + [t.node for t in pending]
    walked = _walk(roots, {t.node for t in pending})
    if walked is None:
        return False
    entries, holders, position = walked
    # a loss whose graph reads a buffer a waiting assign overwrites (a tensor built before the assign): the
    # capture computes such tensors before the write, outside what it records (inplace.computed_before),
    # so a replay would read the capturing step's values: the plain path
    written = {id(t.node.srcs[0].buffer) for t in pending}
    if written and _reads(node, written):
        return False
    leaves = [t for t in list(tensor_mod._grad_leaves.values()) if t.requires_grad]
    if any(n in position for t in leaves for n in t._nodes()[1:]):  # (a leaf's value before an assign:
        return False  # Tensor._backward gives its gradient to the leaf; the programs know one node a leaf)
    targets = sorted((position[t.node], id(t), t) for t in leaves if t.node in position)
    key = (tuple(entries), tuple(position[r] for r in roots), tuple((p, i) for p, i, _ in targets),
           loss.dtype.name)
    program = _programs.get(key)
    if program is None or any(ref() is not t for ref, (_, _, t) in zip(program.targets, targets)):
        if key not in _seen:  # a first sight: the plain path
            _seen[key] = None
            if len(_seen) > MAX_SEEN:
                _seen.popitem(last=False)
            return False
        program = _programs[key] = _Program([t for _, _, t in targets])
        if len(_programs) > MAX_PROGRAMS:
            _programs.popitem(last=False)
    _programs.move_to_end(key)
    if program.jit.plain:  # (its capture was refused, e.g. kernels that differed call after call: lazy)
        return False
    args = [Tensor(n) for n in holders]
    computed = [n.buffer.computed for n in holders]  # (TinyJit marks its arguments' buffers as their own)
    program.loss[:] = [loss, pending]
    tensor_mod.pending_assigns()  # (taken: TinyJit would run them before the call; the program runs them)
    try:
        replays, captures = program.jit.replays, program.jit.captures
        out = program.jit(*args)
    finally:
        program.loss[:] = [None, ()]
        for n, c in zip(holders, computed):
            n.buffer.computed = c
        for t in pending:  # (an error before the program ran them: they still wait, as before the call)
            if t.node.op is Op.ASSIGN and t.node.buffer is None:
                tensor_mod.PENDING_ASSIGNS[id(t)] = t
    if program.jit.replays > replays:
        Stats.replays += 1
        for t in pending:  # (the replay wrote their targets: realized, as Tensor.realize leaves them)
            if t.node.buffer is None:
                t.node.written(t.node.srcs[0].buffer)
            t._drop_history()
    if program.jit.captures > captures:
        _own_buffers(entries, position)
    if base.buffer is None and out.node.buffer is not None:  # (a replay: the loss's value is the buffer it
        base.buffer = out.node.buffer  # returned; its reshapes view it)
        out.node.buffer.computed = True
    return True


def _reads(root: Node, buffers: set[int]) -> bool:
    """Whether root's graph (through realized nodes too) holds one of the buffers (ids)."""
    stack, seen = [root], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.buffer is not None and id(n.buffer) in buffers:
            return True
        stack.extend(n.srcs)
    return False


def _own_buffers(entries: list, position: dict[Node, int]) -> None:
    """After a capture: the graph's nodes that its realize computed (the forward's values: the hidden
    layer a caller keeps, the logits) hold copies, not the captured buffers, which every replay overwrites
    (a tensor of the capturing step, read later, would show the last replay's value)."""
    for node, at in position.items():
        buf = node.buffer
        # (computed by this call: it had no buffer; an assign's is its target's, written in place)
        if buf is not None and entries[at][-1] is None and node.op is not Op.ASSIGN:
            rt = get_runtime(node.device)
            node.buffer = rt.from_numpy(rt.to_numpy(buf))
            node.buffer.computed = True


tensor_mod.BACKWARD_REPLAY = replay
