"""Reverse-mode autodiff over primitive nodes: a table with one gradient rule per op, then a reverse
topological walk.

A rule takes the node and the gradient g of its output and returns one gradient per source (None: no
gradient flows to that source). Ops whose gradient is zero or undefined by definition are listed in
NON_DIFFERENTIABLE; backward() through an op in neither raises AutogradError.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

from tgrad.errors import AutogradError
from tgrad.graph import Node, Op, alu, cast, const_like, move, reduce

Rule = Callable[[Node, Node], tuple[Node | None, ...]]

# ---------------------------------------------------------------------------------------------------
# graph helpers, so that each rule reads like its formula


def _mul(a: Node, b: Node) -> Node:
    return alu(Op.MUL, a, b)


def _sub(a: Node, b: Node) -> Node:
    return alu(Op.SUB, a, b)


def _neg(x: Node) -> Node:
    return alu(Op.NEG, x)


def _recip(x: Node) -> Node:
    return alu(Op.RECIP, x)


def _cos(x: Node) -> Node:
    return alu(Op.SIN, _sub(const_like(x, math.pi / 2), x))


def _where(cond: Node, a: Node, b: Node) -> Node:
    return alu(Op.WHERE, cond, a, b)


def _eq(a: Node, b: Node) -> Node:
    ne = alu(Op.CMPNE, a, b)
    return alu(Op.XOR, ne, const_like(ne, True))


def _expand(x: Node, shape: tuple[int, ...]) -> Node:
    return move(x, Op.EXPAND, shape)


# ---------------------------------------------------------------------------------------------------
# rules too long for one line


def _max_grad(node: Node, g: Node) -> tuple[Node, Node]:
    """d max(a, b), as PyTorch's maximum: g to the larger side, half to each on a tie, and all of it to
    both sides where either is NaN (neither is smaller)."""
    a, b = node.srcs
    half, one, zero = const_like(g, 0.5), const_like(g, 1.0), const_like(g, 0.0)
    share = _where(_eq(a, b), half, one)
    to_a = _where(alu(Op.CMPLT, a, b), zero, share)
    to_b = _where(alu(Op.CMPLT, b, a), zero, share)
    return _mul(g, to_a), _mul(g, to_b)


def _where_grad(node: Node, g: Node) -> tuple[None, Node, Node]:
    """The condition gets none; each branch gets g where it was chosen."""
    cond = node.srcs[0]
    zero = const_like(g, 0)
    return None, _where(cond, g, zero), _where(cond, zero, g)


def _cast_grad(node: Node, g: Node) -> tuple[Node | None]:
    """Back to the source's float dtype; nothing flows into an integer or bool source."""
    src = node.srcs[0]
    return (cast(g, src.dtype) if src.dtype.is_float else None,)


def _is_nan(x: Node) -> Node:
    return alu(Op.CMPNE, x, x)


def _reduce_max_grad(node: Node, g: Node) -> Node:
    """The gradient of a max reduce goes to every maximal element, shared evenly among ties; a NaN
    maximum is the NaN elements' (as torch.max: not nan everywhere)."""
    x = node.srcs[0]
    m = _expand(node, x.shape)
    hit = _eq(x, m)
    if x.dtype.is_float:
        hit = alu(Op.OR, hit, alu(Op.AND, _is_nan(x), _is_nan(m)))
    hit = cast(hit, g.dtype)
    count = reduce(hit, "SUM", node.arg[1])
    share = _mul(g, _recip(count))
    return _mul(hit, _expand(share, x.shape))


def _reduce_prod_grad(node: Node, g: Node) -> Node:
    """d/dx_i prod(x) = the product of the others, as PyTorch computes it: prod(x) / x_i in a slice
    without zeros; with one zero, the zero's is the product of the non-zeros, and the others' is 0 (nan
    where another non-zero is inf or nan); with more zeros, 0."""
    x, axes = node.srcs[0], node.arg[1]
    one, zero = const_like(x, 1.0), const_like(x, 0.0)

    def count(flags: Node) -> Node:  # per slice, expanded back to x's shape
        return _expand(reduce(cast(flags, x.dtype), "SUM", axes), x.shape)

    is_zero, not_finite = _eq(x, zero), _is_nan(_sub(x, x))
    nonzero_prod = _expand(reduce(_where(is_zero, one, x), "PROD", axes), x.shape)
    others_not_finite = _sub(count(not_finite), cast(not_finite, x.dtype))
    times_zero = _where(alu(Op.CMPLT, const_like(x, 0.5), others_not_finite), const_like(x, math.nan), zero)
    one_zero = _where(is_zero, nonzero_prod, times_zero)
    zeros = count(is_zero)
    several = _where(alu(Op.CMPLT, zeros, const_like(x, 1.5)), one_zero, zero)
    ratio = _mul(_expand(node, x.shape), _recip(x))
    return _mul(_expand(g, x.shape), _where(alu(Op.CMPLT, zeros, const_like(x, 0.5)), ratio, several))


# REDUCE's arg is (kind, axes): one rule per kind
REDUCE_GRADIENTS: dict[str, Callable[[Node, Node], Node]] = {
    "SUM": lambda node, g: _expand(g, node.srcs[0].shape),
    "MAX": _reduce_max_grad,
    "PROD": _reduce_prod_grad,
}


def _no_rule(what: str, node: Node, fix: str) -> AutogradError:
    return AutogradError(
        f"backward() reached a {what} node (shape {node.shape}, {node.dtype.name}) that has no gradient "
        f"rule: {fix}"
    )


def _reduce_grad(node: Node, g: Node) -> tuple[Node]:
    kind = node.arg[0]
    rule = REDUCE_GRADIENTS.get(kind)
    if rule is None:
        raise _no_rule(f"REDUCE {kind}", node, "add one to REDUCE_GRADIENTS in tgrad/autodiff.py")
    return (rule(node, g),)


def _permute_grad(node: Node, g: Node) -> tuple[Node]:
    inverse = tuple(sorted(range(len(node.arg)), key=lambda i: node.arg[i]))
    return (move(g, Op.PERMUTE, inverse),)


def _expand_grad(node: Node, g: Node) -> tuple[Node]:
    """Sum g over the axes the expand broadcast (size 1 in the source, larger in g)."""
    shape = node.srcs[0].shape
    axes = tuple(i for i, (s, n) in enumerate(zip(shape, g.shape)) if s == 1 and n != 1)
    return (reduce(g, "SUM", axes),)


def _pad_grad(node: Node, g: Node) -> tuple[Node]:
    """Shrink the padding away again."""
    inside = tuple((lo, lo + s) for (lo, _), s in zip(node.arg, node.srcs[0].shape))
    return (move(g, Op.SHRINK, inside),)


def _shrink_grad(node: Node, g: Node) -> tuple[Node]:
    """Pad with zeros back to the source's shape."""
    around = tuple((b, s - e) for (b, e), s in zip(node.arg, node.srcs[0].shape))
    return (move(g, Op.PAD, around),)


# ---------------------------------------------------------------------------------------------------
# the table

GRADIENTS: dict[Op, Rule] = {
    # unary
    Op.EXP2: lambda node, g: (_mul(g, _mul(node, const_like(node, math.log(2)))),),
    Op.LOG2: lambda node, g: (_mul(g, _recip(_mul(node.srcs[0], const_like(node, math.log(2))))),),
    Op.SIN: lambda node, g: (_mul(g, _cos(node.srcs[0])),),
    Op.SQRT: lambda node, g: (_mul(g, _recip(_mul(node, const_like(node, 2)))),),
    Op.RECIP: lambda node, g: (_neg(_mul(g, _mul(node, node))),),
    Op.NEG: lambda node, g: (_neg(g),),
    Op.CAST: _cast_grad,
    # binary
    Op.ADD: lambda node, g: (g, g),
    Op.SUB: lambda node, g: (g, _neg(g)),
    # (the gradient of a contraction's product is a contraction's product of the same kind: node.arg)
    Op.MUL: lambda node, g: (alu(Op.MUL, g, node.srcs[1], arg=node.arg),
                             alu(Op.MUL, g, node.srcs[0], arg=node.arg)),
    Op.MAX: _max_grad,
    # ternary
    Op.WHERE: _where_grad,
    # reduce
    Op.REDUCE: _reduce_grad,
    # movement
    Op.RESHAPE: lambda node, g: (move(g, Op.RESHAPE, node.srcs[0].shape),),
    Op.PERMUTE: _permute_grad,
    Op.EXPAND: _expand_grad,
    Op.PAD: _pad_grad,
    Op.SHRINK: _shrink_grad,
    Op.FLIP: lambda node, g: (move(g, Op.FLIP, node.arg),),
}

# ops whose gradient is zero or undefined by definition: nothing flows back through them
NON_DIFFERENTIABLE: frozenset[Op] = frozenset(
    {
        Op.BUFFER,  # a leaf (no sources); its gradient is what backward() collects
        Op.CONST,  # a leaf (no sources)
        Op.TRUNC,  # piecewise constant
        Op.CMPLT,  # bool result
        Op.CMPNE,  # bool result
        Op.IDIV,  # integer only
        Op.MOD,  # integer only
        Op.AND,  # bool and integer only
        Op.OR,  # bool and integer only
        Op.XOR,  # bool and integer only
        Op.DETACH,  # Tensor.detach(): stops the gradient on purpose
        Op.ASSIGN,  # a write into a buffer (optimizer updates), not part of a differentiated expression
    }
)


# ---------------------------------------------------------------------------------------------------
# custom gradients: an op built from primitives whose composed gradient is slow (conv2d: the gradient
# of its sliding-window view is a col2im reduce) says how its gradient is computed instead

# identity node -> (the inputs the gradient flows to, rule(g) -> one gradient per input)
CUSTOM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def custom_gradient(value: Node, inputs: tuple[Node, ...], rule: Callable[..., tuple[Node | None, ...]],
                    name: str, reads_output: bool = False, needs: bool = False) -> Node:
    """The value of `value`, with its gradient given by rule(g) for `inputs` (instead of the gradient of
    the graph that computed `value`). The result is a DETACH node named `name`, which fusion looks
    through; the same (value, name) pair gives the same node, so the latest rule wins, and it computes
    the same value from the same inputs, so any of them is right. reads_output: rule(g, out) also gets
    that result node (softmax's and layernorm's gradients read the output the forward realized). A rule
    must not hold the result itself: the table is keyed weakly by it, and a rule holding its key keeps
    the output alive for ever (every softmax output leaked so once). needs: the rule also gets `needed`,
    whether each input's gradient is wanted (a conv's input gradient is not built for a first layer's
    data: graph building was a visible share of an eager conv step; measured: bench/HISTORY.md)."""
    out = Node(Op.DETACH, (value,), name, value.shape, value.dtype, value.device)
    CUSTOM[out] = (inputs, rule, reads_output, needs)
    return out


def _sources(node: Node) -> tuple[Node, ...]:
    custom = CUSTOM.get(node) if node.op is Op.DETACH else None  # (custom_gradient makes DETACH nodes)
    return custom[0] if custom is not None else node.srcs


def grad_rule(node: Node, g: Node, needed: tuple[bool, ...] | None = None) -> tuple[Node | None, ...]:
    """Gradients of node's sources given the gradient g of node (None: no gradient to that source); for a
    node with a custom gradient, of its custom inputs. needed: which of them are wanted (None: all); a rule
    may leave the others out."""
    custom = CUSTOM.get(node) if node.op is Op.DETACH else None
    if custom is not None:
        inputs, rule, reads_output, needs = custom
        args = (g, node) if reads_output else (g,)
        if needs:
            return rule(*args, needed=needed if needed is not None else (True,) * len(inputs))
        return rule(*args)
    if node.op in NON_DIFFERENTIABLE:
        return (None,) * len(node.srcs)
    rule = GRADIENTS.get(node.op)
    if rule is None:
        fix = "add one to GRADIENTS in tgrad/autodiff.py, or list the op in NON_DIFFERENTIABLE if it has none"
        raise _no_rule(node.op.name, node, fix)
    return rule(node, g)


def gradients(root: Node, seed: Node, targets: set[Node],
              constants: frozenset = frozenset()) -> dict[Node, Node]:
    """d root / d t for every t in targets reachable from root (as lazy nodes). Nodes in `constants` count
    as inputs: no gradient flows past them (a custom rule differentiating only its own op uses it)."""
    # nodes on a path from root to a target, in topological order (sources first)
    try:
        order, on_path, sources = _paths_recursive(root, targets, constants)
    except RecursionError:  # a graph deeper than the interpreter's recursion limit allows from here
        order, on_path, sources = _paths_iterative(root, targets, constants)
    grads: dict[Node, Node] = {root: seed}
    for node in reversed(order):
        g = grads.get(node)
        srcs = sources[node]
        if g is None or not on_path[node] or not srcs or node in constants:
            continue
        for src, sg in zip(srcs, grad_rule(node, g, tuple(on_path.get(s, False) for s in srcs))):
            if sg is None or not on_path.get(src, False):
                continue
            grads[src] = alu(Op.ADD, grads[src], sg) if src in grads else sg
    return {t: grads[t] for t in targets if t in grads}


def _paths_recursive(root: Node, targets: set[Node], constants: frozenset):
    """(the nodes reachable from root in post-order, node -> whether a target is reachable from it, node ->
    its sources) by a recursive walk: faster than the stack loop of _paths_iterative (each node is seen
    once; measured: bench/HISTORY.md), in the same order (sources visited last first, as that loop pops
    them)."""
    order: list[Node] = []
    on_path: dict[Node, bool] = {}
    sources: dict[Node, tuple[Node, ...]] = {}

    def visit(node: Node) -> None:
        on_path[node] = False
        srcs = sources[node] = _sources(node)
        if node not in constants:
            for s in reversed(srcs):
                if s not in on_path:
                    visit(s)
        reach = node in targets
        if not reach:
            for s in srcs:
                if on_path.get(s, False):
                    reach = True
                    break
        on_path[node] = reach
        order.append(node)

    try:
        visit(root)
    finally:
        visit = None  # noqa: F841  (break the cycle visit -> its closure -> visit: see schedule_cache._walk)
    return order, on_path, sources


def _paths_iterative(root: Node, targets: set[Node], constants: frozenset):
    """_paths_recursive over a stack of its own, for graphs of any depth."""
    order: list[Node] = []
    on_path: dict[Node, bool] = {}
    sources: dict[Node, tuple[Node, ...]] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            on_path[node] = node in targets or any(on_path.get(s, False) for s in sources[node])
            order.append(node)
            continue
        if node in on_path:
            continue
        on_path[node] = False
        sources[node] = _sources(node)
        stack.append((node, True))
        if node not in constants:
            stack.extend((s, False) for s in sources[node] if s not in on_path)
    return order, on_path, sources
