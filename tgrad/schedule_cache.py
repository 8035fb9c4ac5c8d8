"""Schedules keyed by graph structure: an eager step that builds the same graph again (new input buffers,
the same ops) reuses the kernels fuse.schedule chose last time instead of scheduling and lowering again.

The key is the graph reachable from the outputs as fuse.schedule sees it: every unrealized node as
(op, arg, shape, dtype, device, its sources' positions), every realized node as a leaf (shape, dtype,
device, and which buffer it is, numbered by first appearance, so aliasing between leaves is part of the
key), and the outputs' positions. Nodes are numbered in one deterministic walk. A schedule is kept as
positions in that walk (kernel, output, inputs, assign target), so it holds no node and no buffer; a hit
maps the positions to the nodes of the new graph. Two graphs with equal keys are the same graph up to
which buffers their leaves hold, which is all fuse.schedule depends on.
"""

from __future__ import annotations

from collections import OrderedDict

from tgrad import fuse
from tgrad.graph import Node, Op

MAX_ENTRIES = 256  # schedules kept (least recently used first out)


class Stats:
    hits = 0
    misses = 0


_cache: OrderedDict[tuple, tuple[list[tuple], dict]] = OrderedDict()


class Cached(list):
    """A schedule from this cache: its items, and `memo`, a dict kept with the cached schedule for what
    the driver derives from the items' structure alone (realize.py keeps its row groups there)."""

    memo: dict


def _walk(outputs: list[Node]) -> tuple[tuple, list[Node], dict[Node, int]]:
    """(structure key, nodes in walk order, node -> its position) of the graph fuse.schedule sees."""
    try:
        return _walk_recursive(outputs)
    except RecursionError:  # a graph deeper than the interpreter's recursion limit allows from here
        return _walk_iterative(outputs)


_LEAF, _SCALAR = "leaf", (float, int, bool)


def _walk_recursive(outputs: list[Node]) -> tuple[tuple, list[Node], dict[Node, int]]:
    """_walk as a recursive function: twice as fast as the loop over a stack below (each node is seen once,
    not once to push its sources and once more to number it); the nodes, their order and the key are the
    same."""
    position: dict[Node, int] = {}  # (keyed by the node: Node hashes by identity, in C)
    buffers: dict[int, int] = {}
    nodes: list[Node] = []
    entries: list[tuple] = []
    buffer_op, getpos = Op.BUFFER, position.__getitem__

    def visit(node: Node) -> None:  # post-order: a node is numbered once its sources are
        buf = node.buffer
        if buf is None:
            srcs = node.srcs
            for s in srcs:
                if s not in position:
                    visit(s)
            # names, not Op and DType objects: a str caches its hash (Enums, dataclasses hash in Python)
            arg = node.arg
            if node.op is buffer_op:
                arg = None
            elif isinstance(arg, _SCALAR):  # (_arg_key, inline)
                arg = (type(arg), repr(arg))
            entries.append((node.op._value_, arg, node.shape, node.dtype.name, node.device,
                            tuple(map(getpos, srcs))))
        else:
            entries.append((_LEAF, buffers.setdefault(id(buf), len(buffers)), node.shape, node.dtype.name,
                            node.device))
        position[node] = len(nodes)
        nodes.append(node)

    try:
        for root in outputs:
            if root not in position:
                visit(root)
    finally:
        visit = None  # noqa: F841  (visit's closure holds visit: a cycle that kept the graph and its buffers
        # alive until the next garbage collection, so freed blocks were not reused)
    return (tuple(entries), tuple(position[n] for n in outputs)), nodes, position


def _walk_iterative(outputs: list[Node]) -> tuple[tuple, list[Node], dict[Node, int]]:
    """_walk over a stack of its own, for graphs of any depth."""
    position: dict[Node, int] = {}
    buffers: dict[int, int] = {}
    nodes: list[Node] = []
    entries: list[tuple] = []
    buffer_op = Op.BUFFER
    for root in outputs:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in position:
                stack.pop()
                continue
            if node.buffer is None:
                pending = [s for s in node.srcs if s not in position]
                if pending:
                    stack.extend(reversed(pending))
                    continue
            stack.pop()
            position[node] = len(nodes)
            nodes.append(node)
            if node.buffer is not None:
                buf = buffers.setdefault(id(node.buffer), len(buffers))
                entries.append((_LEAF, buf, node.shape, node.dtype.name, node.device))
            else:
                arg = None if node.op is buffer_op else node.arg
                if isinstance(arg, _SCALAR):
                    arg = (type(arg), repr(arg))
                entries.append((node.op._value_, arg, node.shape, node.dtype.name, node.device,
                                tuple(map(position.__getitem__, node.srcs))))
    outs = tuple(position[n] for n in outputs)
    return (tuple(entries), outs), nodes, position


def schedule(outputs: list[Node]) -> list[fuse.ScheduleItem]:
    """fuse.schedule(outputs), from the cache when a graph of the same structure was scheduled before."""
    key, nodes, index = _walk(outputs)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        Stats.hits += 1
        template, memo = hit
        items = Cached(fuse.ScheduleItem(k, nodes[out], [nodes[i] for i in ins], None if tgt is None
                                         else nodes[tgt]) for k, out, ins, tgt in template)
        items.memo = memo
        return items
    Stats.misses += 1
    items = Cached(fuse.schedule(outputs))
    items.memo = {}
    try:
        _cache[key] = ([(it.kernel, index[it.out], [index[n] for n in it.inputs],
                         None if it.target is None else index[it.target]) for it in items], items.memo)
    except KeyError:  # a node the walk did not see (not expected): schedule such graphs every time
        return list(items)
    if len(_cache) > MAX_ENTRIES:
        _cache.popitem(last=False)
    return items
