"""The NUMPY reference device: evaluates the graph one node at a time with numpy.

No fusion and no generated code, so it checks fuse.py and every emitter independently. Each primitive
op's numpy form (graph.REFERENCE) has the semantics the emitters implement (C-style integer division,
float16 and bfloat16 reductions accumulated in float32, nan propagating through MAX). bfloat16 values are
float32 arrays; every bfloat16 (fp8) node's result is rounded to its dtype (`round_to`).
"""

from __future__ import annotations

import numpy as np

from tgrad.device import Buffer, Runtime, check_memory
from tgrad.dtype import dtypes, round_to
from tgrad.fuse import reduce_identity
from tgrad.graph import MOVEMENT, REFERENCE, Node, Op


def _cast(x: np.ndarray, dtype) -> np.ndarray:
    if dtype == dtypes.bool:
        return x != 0
    with np.errstate(invalid="ignore"):
        if dtype.is_int and x.dtype.kind == "f" and dtype.itemsize < 4:
            # through int32, then wrapped: what numpy and PyTorch do on x86 (inf and nan give INT_MIN)
            return np.trunc(x).astype(np.int32).astype(dtype.np)
        return x.astype(dtype.np)


def _reduce(op: str, x: np.ndarray, axes: tuple[int, ...], dtype) -> np.ndarray:
    acc = np.float32 if dtype in (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s) else dtype.np
    if op == "SUM":
        out = (
            np.sum(x, axis=axes, keepdims=True, dtype=acc)
            if dtype != dtypes.bool
            else np.any(x, axes, keepdims=True)
        )
    elif op == "PROD":
        out = (
            np.prod(x, axis=axes, keepdims=True, dtype=acc)
            if dtype != dtypes.bool
            else np.all(x, axes, keepdims=True)
        )
    else:
        out = np.max(x, axis=axes, keepdims=True, initial=reduce_identity("MAX", dtype))
    return out.astype(dtype.np)


def movement(op: Op, arg, x: np.ndarray) -> np.ndarray:
    """A movement op applied to an array (a view where numpy can make one)."""
    if op is Op.RESHAPE:
        return x.reshape(arg)
    if op is Op.PERMUTE:
        return x.transpose(arg)
    if op is Op.EXPAND:
        return np.broadcast_to(x, arg)
    if op is Op.PAD:
        return np.pad(x, arg)
    if op is Op.SHRINK:
        return x[tuple(slice(b, e) for b, e in arg)]
    if op is Op.FLIP:
        return np.flip(x, arg) if arg else x
    raise ValueError(op)


_SAVED = "saved buffers"  # memo key: id(buffer) -> its data before this realize's assigns wrote it
_USES = "uses"  # memo key: node -> how many nodes not evaluated yet read it
_KEEP = "keep"  # memo key: the nodes whose arrays stay (the requested ones, the assign targets' copies)


def _widened_sum(node: Node) -> bool:
    """A SUM of a cast that only widens (uint8 -> int64: PyTorch's integer sums): numpy sums the narrow
    values into the wide dtype directly, the same numbers without a wide copy of every element."""
    if node.op is not Op.REDUCE or node.arg[0] != "SUM" or node.srcs[0].op is not Op.CAST:
        return False
    src, wide = node.srcs[0].srcs[0].dtype, node.srcs[0].dtype
    return (wide == node.dtype and src.is_int == wide.is_int and src != dtypes.bool and wide not in
            (dtypes.float16, dtypes.bfloat16) and np.can_cast(src.np, wide.np, "safe"))


def evaluate(node: Node, memo: dict) -> np.ndarray:
    hit = memo.get(node)
    if hit is not None:
        return hit
    read = node.srcs  # the nodes this one's value is computed from (none for a buffer or a constant)
    if node.realized:
        saved = memo.get(_SAVED, {}).get(id(node.buffer))
        out = (node.buffer.data if saved is None else saved).reshape(node.shape)
        read = ()
    elif node.op is Op.CONST:
        with np.errstate(over="ignore"):  # a float past float16's range is inf, as on the other devices
            out = np.broadcast_to(np.array(node.arg, dtype=node.dtype.np), node.shape)
    elif node.op in MOVEMENT:
        out = movement(node.op, node.arg, evaluate(node.srcs[0], memo))
    elif node.op is Op.DETACH:
        out = evaluate(node.srcs[0], memo)
    elif _widened_sum(node) and node.srcs[0] not in memo:  # no array of the widened values
        out = _reduce("SUM", evaluate(node.srcs[0].srcs[0], memo), node.arg[1], node.dtype)
        read = node.srcs[0].srcs
    else:
        srcs = [evaluate(s, memo) for s in node.srcs]
        with np.errstate(all="ignore"):
            if node.op is Op.CAST:
                out = _cast(srcs[0], node.dtype)
            elif node.op in REFERENCE:
                out = REFERENCE[node.op](*srcs)
            elif node.op is Op.WHERE:
                out = np.where(*srcs)
            elif node.op is Op.REDUCE:
                out = _reduce(node.arg[0], srcs[0], node.arg[1], node.dtype)
            elif node.op is Op.ASSIGN:
                node.srcs[0].buffer.data[:] = srcs[1].reshape(-1)
                node.written(node.srcs[0].buffer)  # done: a later realize must not write it again
                out = srcs[1]
            else:
                raise NotImplementedError(f"NUMPY device: no rule for {node.op}")
        out = np.asarray(out)
        if out.dtype != node.dtype.np:
            out = out.astype(node.dtype.np)
        out = round_to(out, node.dtype)  # bfloat16 and fp8: float32 values rounded
    memo[node] = out
    uses = memo.get(_USES)
    if uses is not None:  # sources no other node will read: their arrays go (else all live to the end)
        for src in read:
            left = uses.get(src, 0) - 1
            uses[src] = left
            if left == 0 and src not in memo[_KEEP]:
                memo.pop(src, None)
    return out


class NumpyRuntime(Runtime):
    """The reference device: no kernels; the driver hands it the nodes to compute (`evaluate`)."""

    name = "NUMPY"
    evaluates_graphs = True

    def evaluate(self, nodes: list[Node]) -> None:
        # an ASSIGN overwrites its target's buffer: everything else in this realize reads the old value,
        # through the target or any other node realized before on that buffer (an earlier assign's)
        for node in nodes:  # each requested node becomes an array of its own (a constant's too)
            if not node.base.realized:
                _check_fits(self, node.base)
        targets = _assign_targets(nodes, lambda n: _check_fits(self, n))
        memo: dict = {t: t.buffer.data.reshape(t.shape).copy() for t in targets}
        memo[_SAVED] = {id(t.buffer): memo[t] for t in targets}
        memo[_USES] = _uses(nodes)
        memo[_KEEP] = set(targets) | {n.base for n in nodes}
        for node in nodes:
            base = node.base
            if base.realized:
                continue
            value = np.ascontiguousarray(evaluate(base, memo)).reshape(-1)
            if base.op is Op.ASSIGN:
                base.written(base.srcs[0].buffer)
            else:
                base.buffer = Buffer(self.name, value.size, base.dtype, value.copy())
                base.buffer.computed = True  # (see Buffer.computed)


def _uses(nodes: list[Node]) -> dict[Node, int]:
    """For each node under `nodes` not realized: how many of the nodes there read it."""
    uses: dict[Node, int] = {}
    seen, stack = set(), [n.base for n in nodes]
    while stack:
        n = stack.pop()
        if n in seen or n.realized:
            continue
        seen.add(n)
        for s in n.srcs:
            uses[s] = uses.get(s, 0) + 1
            stack.append(s)
    return uses


def _check_fits(rt, node: Node) -> None:
    check_memory(rt, node.shape, node.dtype, f"realize ({node.op.name})")


def _assign_targets(nodes: list[Node], check) -> set[Node]:
    """The nodes the graph's ASSIGNs write; `check(node)` is called on each node evaluate() will compute into
    an array of its own (before any is computed: an ASSIGN writes as soon as it is evaluated)."""
    targets, seen, stack = set(), set(), [n.base for n in nodes]
    while stack:
        n = stack.pop()
        if n in seen or n.realized:
            continue
        seen.add(n)
        if n.op not in MOVEMENT and n.op is not Op.CONST and n.op is not Op.DETACH:
            check(n)
        if n.op is Op.ASSIGN:
            targets.add(n.srcs[0])
        stack.extend(n.srcs)
    return targets
