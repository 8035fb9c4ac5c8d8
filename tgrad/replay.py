"""Eager steps replayed: backward() and an optimizer's update run the kernels captured for a structure
seen before, without building, scheduling and walking their graphs again (in an eager MLP step those cost
about as much as the kernels: bench/HISTORY.md, "Eager steps ...").

One rule for both: a program is a TinyJit (fallback: a refused capture runs plainly) of the work, keyed
by a structure. backward() keys the graph it differentiates by graph.structure through realized nodes
(gradients flow through them), with a custom gradient's rule keyed by its code and the values it holds
(`_value_key`), plus which tensors receive a gradient (by identity and position); an optimizer keys its
update by its type and attributes (`_frozen`: hyperparameters by value, parameter lists by identity).

backward() behaves the same on every call outside a TinyJit function: the loss, the gradients and the
assigns waiting then (BatchNorm's running statistics) are computed when it returns, as in PyTorch: the
first sight of a structure plainly (one realize), later ones through its program (TinyJit's first call,
capture, then replays). Inside a TinyJit function (the outer capture fuses them with the update), under
JIT=0 or TGRAD_BACKWARD_REPLAY=0, backward() leaves the gradients lazy, to be computed at the next realize
(tinygrad's rule; what a test that inspects the gradient graph needs). Not replayed, but computed at once:
an explicit `gradient=`, a loss that is a view or realized, a rule holding a value the key cannot show,
the NUMPY reference. Two captures, not one for the whole step: user code may run between backward() and
step() (clipping, reading or skipping on the gradients), which a single capture would have to predict.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

from tgrad import autodiff, config
from tgrad import graph as g
from tgrad import realize as driver
from tgrad import tensor as tensor_mod
from tgrad.device import get_runtime
from tgrad.dtype import DType
from tgrad.graph import MOVEMENT, Node, Op
from tgrad.jit import TinyJit, under_reshapes
from tgrad.tensor import Tensor

MAX_PROGRAMS = 4  # backward structures with a TinyJit kept (each holds its capture's buffers), LRU
MAX_SEEN = 64  # backward structures remembered as seen once


class Stats:
    replays = 0  # backward() calls answered by a replay


def _no_programs() -> bool:
    """Whether eager work gets no program here: inside a TinyJit function (the outer capture takes it)
    or under JIT=0."""
    return driver.RECORDER is not None or not config.on("JIT")


def lazy() -> bool:
    """Whether backward() leaves the gradients lazy here (inside a TinyJit function, JIT=0,
    TGRAD_BACKWARD_REPLAY=0) instead of computing them when it returns."""
    return _no_programs() or not config.on("TGRAD_BACKWARD_REPLAY")


def backward(loss: Tensor, gradient: Tensor | None) -> bool:
    """loss.backward(gradient) outside a TinyJit function: computed when it returns, through the program
    of its structure where there is one. False where backward() stays lazy (`lazy()`): nothing done."""
    if lazy() or not loss.requires_grad:  # (the plain path raises the error of a graph without one)
        return False
    if gradient is None and loss.numel() == 1 and _replay(loss):
        return True
    leaves = [t for t in list(tensor_mod._grad_leaves.values()) if t.requires_grad]
    loss._backward(gradient)
    Tensor.realize(loss, *[t.grad for t in leaves if t.grad is not None], *tensor_mod.pending_assigns())
    return True


class _Program:
    """A TinyJit of one backward structure, its targets (weak references, in key order) and the loss to
    run (in `loss[0]` while it runs, with the tensors whose assigns wait in `loss[1]`: a list, not the
    program, is what the TinyJit's function holds, so that a program dropped from _programs, and the
    buffers its capture holds, are freed at once)."""

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
    """Forget every backward structure seen (their captures' buffers are freed); values do not depend on
    it, only whether the next calls replay."""
    _programs.clear()
    _seen.clear()



def _special(assigns: set[Node]) -> Callable:
    """graph.structure's `special` for backward graphs: an assign not run yet is keyable only as one of the
    roots (`assigns`); a custom gradient's node (autodiff.custom_gradient) is keyed with its rule: the
    rule's code, the values its closure holds (nodes by their positions) and its inputs' positions."""
    custom = autodiff.CUSTOM

    def special(node: Node, at) -> object:
        if node.op is Op.ASSIGN:
            if node not in assigns:
                raise g.Unkeyable("an assign not run yet")
            return node.arg
        if node not in custom:
            return node.arg
        inputs, rule, reads_output, needs = custom[node]
        return (node.arg, tuple(map(at, inputs)), _value_key(rule, at), reads_output, needs)

    return special


def _value_key(value, at) -> object:
    """How a value a custom gradient's rule holds (in its closure) enters the key: plain values by value,
    tuples item by item, nodes and tensors by the position of their node (`at` walks it), dtypes by name,
    classes by themselves, functions by their code and closure; anything else raises Unkeyable (a value
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
        raise g.Unkeyable(f"a custom gradient holds a {type(value).__name__}")
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(_value_key(cell.cell_contents, at))
        except ValueError:  # (a cell not filled yet)
            cells.append(None)
    return ("code", code, tuple(cells))


def _replay(loss: Tensor) -> bool:
    """Run loss.backward() (no explicit gradient) through the TinyJit of its structure; False where there
    is none (a first sight, a structure that cannot be keyed or captured): nothing done then."""
    node = loss.node
    base = under_reshapes(node)  # (x.sum(): a reshape of the reduce to ())
    if (base.buffer is not None or base.op in MOVEMENT or base.op in (Op.DETACH, Op.ASSIGN, Op.BUFFER)
            or get_runtime(loss.device).evaluates_graphs):
        return False
    # assigns not run yet (BatchNorm's running statistics): part of the structure, run with the loss and
    # the gradients (in one realize, so that a graph reading a buffer an assign overwrites reads the old
    # value, inplace.py), and written again by every replay
    pending = [t for t in list(tensor_mod.PENDING_ASSIGNS.values())
               if t.node.op is Op.ASSIGN and t.node.buffer is None]
    roots = [node] + [t.node for t in pending]
    try:
        (entries, root_at), _, position, holders = g.structure(roots, through=True,
                                                               special=_special({t.node for t in pending}))
    except g.Unkeyable:
        return False
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
    key = (entries, root_at, tuple((p, i) for p, i, _ in targets), loss.dtype.name)
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
    if program.jit.plain:  # (its capture was refused, e.g. kernels that differed call after call)
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


def _own_buffers(entries: tuple, position: dict[Node, int]) -> None:
    """After a capture: the graph's nodes that its realize computed (the forward's values: the hidden
    layer a caller keeps, the logits) hold copies, not the captured buffers, which every replay overwrites
    (a tensor of the capturing step, read later, would show the last replay's value)."""
    for node, at in position.items():
        buf = node.buffer
        # (computed by this call: its entry has no buffer number; an assign's is its target's, in place)
        if buf is not None and len(entries[at]) == 6 and node.op is not Op.ASSIGN:
            rt = get_runtime(node.device)
            node.buffer = rt.from_numpy(rt.to_numpy(buf))
            node.buffer.computed = True


# ---------------------------------------------------------------------------------------------------
# an optimizer's update


def _frozen(value) -> object:
    """How an optimizer attribute keys its update's program: plain values by value (repr: nan equals nan,
    1 and 1.0 differ), lists by their items' identities, objects (tensors, the constant-node cache) by
    identity."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, repr(value))
    if isinstance(value, (list, tuple)):
        return tuple(map(id, value))
    return id(value)


def update(opt, run: Callable[[object], None]) -> TinyJit | None:
    """The program of an optimizer's update for eager steps (None inside a TinyJit function, whose capture
    takes the update with the rest, and under JIT=0): a TinyJit whose third and later calls replay the
    update's kernels without building, walking and scheduling its graph again. `run(opt)` builds and
    realizes the update. Its key is the optimizer's attributes (`_frozen`): a change to any of them (betas,
    eps, weight decay, the parameter lists) starts a new program. The gradients are its inputs (TinyJit's
    rules: the parameters and the optimizer's state are written in place)."""
    if _no_programs():
        return None
    key = tuple((name, _frozen(v)) for name, v in vars(opt).items() if name not in ("_update", "_key"))
    if key != getattr(opt, "_key", None):
        ref = weakref.ref(opt)  # (weakly: the optimizer holds the TinyJit, and a cycle would keep a dropped
        # optimizer's state buffers until a garbage collection)

        def optimizer_update() -> None:
            run(ref())

        opt._key, opt._update = key, TinyJit(optimizer_update, fallback=True)
    return opt._update

