"""Reverse-mode autodiff over primitive nodes: one gradient rule per op, then a reverse topological walk."""

from __future__ import annotations

import math

from tgrad.graph import Node, Op, alu, cast, const_like, move, reduce


def _mul(a: Node, b: Node) -> Node:
    return alu(Op.MUL, a, b)


def _where(cond: Node, a: Node, b: Node) -> Node:
    return alu(Op.WHERE, cond, a, b)


def _max_grad(node: Node, g: Node) -> tuple[Node, Node]:
    """d max(a, b): all to the larger side, split evenly on ties (as PyTorch's maximum does)."""
    a, b = node.srcs
    half, one, zero = const_like(g, 0.5), const_like(g, 1.0), const_like(g, 0.0)
    to_a = _where(alu(Op.CMPLT, b, a), one, _where(alu(Op.CMPNE, a, b), zero, half))
    to_b = alu(Op.SUB, one, to_a)
    return _mul(g, to_a), _mul(g, to_b)


def _reduce_max_grad(node: Node, g: Node) -> Node:
    """The gradient of a max reduce goes to every maximal element, shared evenly among ties."""
    x = node.srcs[0]
    hit = cast(_eq(x, move(node, Op.EXPAND, x.shape)), g.dtype)
    count = reduce(hit, "SUM", node.arg[1])
    share = alu(Op.MUL, g, alu(Op.RECIP, count))
    return _mul(hit, move(share, Op.EXPAND, x.shape))


def _eq(a: Node, b: Node) -> Node:
    ne = alu(Op.CMPNE, a, b)
    return alu(Op.XOR, ne, const_like(ne, True))


def _expanded_axes_sum(g: Node, shape: tuple[int, ...]) -> Node:
    axes = tuple(i for i, (s, n) in enumerate(zip(shape, g.shape)) if s == 1 and n != 1)
    return reduce(g, "SUM", axes)


def grad_rule(node: Node, g: Node) -> tuple[Node | None, ...]:
    """Gradients of node's sources given the gradient g of node."""
    op, srcs = node.op, node.srcs
    if op is Op.ADD:
        return g, g
    if op is Op.SUB:
        return g, alu(Op.NEG, g)
    if op is Op.MUL:
        return _mul(g, srcs[1]), _mul(g, srcs[0])
    if op is Op.MAX:
        return _max_grad(node, g)
    if op is Op.WHERE:
        zero = const_like(g, 0)
        return None, _where(srcs[0], g, zero), _where(srcs[0], zero, g)
    if op is Op.NEG:
        return (alu(Op.NEG, g),)
    if op is Op.EXP2:
        return (_mul(g, _mul(node, const_like(node, math.log(2)))),)
    if op is Op.LOG2:
        return (_mul(g, alu(Op.RECIP, _mul(srcs[0], const_like(node, math.log(2))))),)
    if op is Op.SIN:
        cos = alu(Op.SIN, alu(Op.SUB, const_like(srcs[0], math.pi / 2), srcs[0]))
        return (_mul(g, cos),)
    if op is Op.SQRT:
        return (_mul(g, alu(Op.RECIP, _mul(node, const_like(node, 2)))),)
    if op is Op.RECIP:
        return (alu(Op.NEG, _mul(g, _mul(node, node))),)
    if op is Op.CAST:
        return (cast(g, srcs[0].dtype) if srcs[0].dtype.is_float else None,)
    if op is Op.REDUCE:
        kind = node.arg[0]
        if kind == "SUM":
            return (move(g, Op.EXPAND, srcs[0].shape),)
        if kind == "MAX":
            return (_reduce_max_grad(node, g),)
        if kind == "PROD":  # d/dx_i prod(x) = prod(x) / x_i
            return (_mul(move(_mul(g, node), Op.EXPAND, srcs[0].shape), alu(Op.RECIP, srcs[0])),)
    if op is Op.RESHAPE:
        return (move(g, Op.RESHAPE, srcs[0].shape),)
    if op is Op.PERMUTE:
        inverse = tuple(sorted(range(len(node.arg)), key=lambda i: node.arg[i]))
        return (move(g, Op.PERMUTE, inverse),)
    if op is Op.EXPAND:
        return (_expanded_axes_sum(g, srcs[0].shape),)
    if op is Op.PAD:
        return (move(g, Op.SHRINK, tuple((lo, lo + s) for (lo, _), s in zip(node.arg, srcs[0].shape))),)
    if op is Op.SHRINK:
        return (move(g, Op.PAD, tuple((b, s - e) for (b, e), s in zip(node.arg, srcs[0].shape))),)
    if op is Op.FLIP:
        return (move(g, Op.FLIP, node.arg),)
    # TRUNC, comparisons, integer and bitwise ops: zero gradient
    return (None,) * len(srcs)


def gradients(root: Node, seed: Node, targets: set[Node]) -> dict[Node, Node]:
    """d root / d t for every t in targets reachable from root (as lazy nodes)."""
    # nodes on a path from root to a target, in topological order (sources first)
    order: list[Node] = []
    on_path: dict[Node, bool] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            on_path[node] = node in targets or any(on_path.get(s, False) for s in node.srcs)
            order.append(node)
            continue
        if node in on_path:
            continue
        on_path[node] = False
        stack.append((node, True))
        stack.extend((s, False) for s in node.srcs if s not in on_path)
    grads: dict[Node, Node] = {root: seed}
    for node in reversed(order):
        g = grads.get(node)
        if g is None or not on_path[node] or not node.srcs:
            continue
        for src, sg in zip(node.srcs, grad_rule(node, g)):
            if sg is None or not on_path.get(src, False):
                continue
            grads[src] = alu(Op.ADD, grads[src], sg) if src in grads else sg
    return {t: grads[t] for t in targets if t in grads}
