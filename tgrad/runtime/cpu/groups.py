"""The CPU's plan over a schedule (CPURuntime.plan): runs of consecutive kernels it runs as one function.

Row groups: kernels over the same rows (a softmax's max, sum of exponentials and normalisation) as one
loop over rows (emit_numba.render_rows), so a row read three times is read from the cache. Piece pairs: a
BLAS kernel and the elementwise kernel after it that reads its result image by image (a conv's col2im
matmul and its sum: opt.host.piece_pair), run piece by piece; where nothing else reads the first
kernel's result, it gets no buffer (`_private_of`). realize.py runs what the plan says and knows none of
this (Runtime.plan); a schedule from schedule_cache keeps its plan in the schedule's memo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tgrad import fuse
from tgrad.device import Runner, get_runtime
from tgrad.graph import Node, prod

if TYPE_CHECKING:
    from tgrad.runtime.cpu.runtime import CPURuntime as Runtime


def plan(rt: Runtime, items: list[fuse.ScheduleItem], requested: list[Node]) -> tuple[dict, set[int]]:
    """The row groups and piece pairs of a schedule's items on this device (Runtime.plan)."""
    groups = _row_groups_of(items, rt)
    return groups, _private_of(items, groups, requested)


def _row_groups(items: list[fuse.ScheduleItem], rt: Runtime) -> dict[int, tuple[Runner, list[Node], int]]:
    """Runs of consecutive kernels over the same rows that a runtime runs as one function
    (the CPU's row groups: a softmax's three kernels in one loop over rows): the index of each run's last
    item -> the run's runner, the nodes it takes after the last item's output (the earlier items'
    outputs, which it writes too, and everyone's inputs) and the index of its first item."""
    out: dict[int, tuple[Runner, list[Node], int]] = {}
    start = 0
    while start < len(items):
        if get_runtime(items[start].out.device) is not rt:
            start += 1
            continue
        best, end = None, start
        while end + 1 < len(items) and _chained(items, end, rt):
            group = _group(items, start, end + 1, rt)
            if group is None:
                break
            best, end = group, end + 1
        if best is None and _paired(items, start, rt):
            best = _group(items, start, start + 1, rt)
            end = start + 1 if best is not None else start
        it = items[start]
        # an assign that reads its target (SGD's update): a group of one reads it through one name (_group)
        if best is None and it.target in it.inputs and fuse.has_work(it.kernel) \
                and rt.row_count(it.kernel) is not None and not fuse.reads_target_elsewhere(it):
            best = _group(items, start, start, rt)
        if best is not None:
            out[end] = (*best, start)
        start = end + 1
    return out


def _row_groups_of(items: list[fuse.ScheduleItem], rt: Runtime) -> dict[int, tuple[Runner, list[Node], int]]:
    """_row_groups(items); for a schedule from schedule_cache, found once per cached schedule: they depend
    on its structure alone, and finding them again was a visible cost of each eager MLP step (measured:
    bench/HISTORY.md). Kept as each group's nodes' places in the items: (item, -1) its output, (item, -2)
    its target, (item, j) input j."""
    memo = getattr(items, "memo", None)
    kept = None if memo is None else memo.get("row_groups")
    if kept is None:
        groups = _row_groups(items, rt)
        if memo is not None:
            memo["row_groups"] = {last: (runner, _places(items, first, last, nodes), first)
                                  for last, (runner, nodes, first) in groups.items()}
        return groups
    return {last: (runner, [items[i].out if j == -1 else items[i].target if j == -2 else items[i].inputs[j]
                            for i, j in places], first) for last, (runner, places, first) in kept.items()}


def _places(items: list[fuse.ScheduleItem], first: int, last: int, nodes: list[Node]) -> list[tuple]:
    where: dict[int, tuple[int, int]] = {}
    for i in range(first, last + 1):
        it = items[i]
        where.setdefault(id(it.out), (i, -1))
        if it.target is not None:
            where.setdefault(id(it.target), (i, -2))
        for j, n in enumerate(it.inputs):
            where.setdefault(id(n), (i, j))
    return [where[id(n)] for n in nodes]


def _group(items: list[fuse.ScheduleItem], start: int, last: int, rt: Runtime) -> tuple | None:
    """items[start..last] as one row group: its runner and the nodes it takes (see _row_groups), or None."""
    nodes: list[Node] = []
    members, sizes = [], {}
    # a node realized before on an assign's target buffer (an earlier assign's) is that target: one name,
    # so the checks below see every read of the buffer the group overwrites
    target_of = {id(it.target.buffer): it.target for it in items[start : last + 1] if it.target is not None}
    for i, it in enumerate(items[start : last + 1]):
        ins = tuple(_position(nodes, target_of.get(id(n.buffer), n) if n.buffer is not None else n)
                    for n in it.inputs)
        at = None if start + i == last else _position(nodes, it.out)
        if at is not None:
            sizes[at] = prod(it.out.shape)
        members.append((it.kernel, ins, at))
    # an assign overwrites its target row by row: every member must read the old value in the row being
    # computed, and reads it through the new value's name (one buffer: LLVM vectorizes one pointer, not two)
    aliases = []  # (the target's position, its assign's output position or -1: the group's out)
    for i, it in enumerate(items[start : last + 1]):
        for at, n in enumerate(nodes):
            if n is it.target:
                sizes[at] = prod(n.shape)
                aliases.append((at, -1 if members[i][2] is None else members[i][2]))
    runner = rt.rows_runner(tuple(members), tuple(sorted(sizes.items())), tuple(aliases))
    return None if runner is None else (runner, nodes)


def _chained(items: list[fuse.ScheduleItem], i: int, rt: Runtime) -> bool:
    """Whether items i and i + 1 could be in one row group: the same rows on one device. (They need not
    read each other: a BatchNorm backward's sums over a channel read the same rows of the same inputs.)"""
    a, b = items[i], items[i + 1]
    return (get_runtime(b.out.device) is rt and fuse.has_work(a.kernel) and fuse.has_work(b.kernel)
            and not fuse.reads_target_elsewhere(a) and not fuse.reads_target_elsewhere(b)
            and rt.row_count(a.kernel) is not None and rt.row_count(a.kernel) == rt.row_count(b.kernel))


def _paired(items: list[fuse.ScheduleItem], i: int, rt: Runtime) -> bool:
    """Whether items i and i + 1 run as the device's pair (Runtime.pairs): on one device, no assigns."""
    if i + 1 >= len(items):
        return False
    a, b = items[i], items[i + 1]
    reads = tuple(j for j, n in enumerate(b.inputs) if n is a.out)
    return (bool(reads) and get_runtime(b.out.device) is rt and a.target is None and b.target is None
            and fuse.has_work(a.kernel) and fuse.has_work(b.kernel) and rt.pairs(a.kernel, b.kernel, reads))


def _position(nodes: list[Node], node: Node) -> int:
    for i, n in enumerate(nodes):
        if n is node:
            return i
    nodes.append(node)
    return len(nodes) - 1


def _private_of(items: list[fuse.ScheduleItem], groups: dict, requested: list[Node]) -> set[int]:
    """The items whose output only their pair group needs (Runtime.pairs: the first kernel of a pair,
    which the group then keeps in its threads' caches instead of writing it): no other item reads it and
    no requested node is it or a view of it. Such an output gets no buffer and its node stays unrealized:
    a graph built on it later computes it again. Remembered with a cached schedule (its structure fixes
    them)."""
    memo = getattr(items, "memo", None)
    if memo is not None and "private" in memo:
        return memo["private"]
    private = set()
    for last, (_, _, first) in groups.items():
        if last != first + 1 or not _paired(items, first, get_runtime(items[first].out.device)):
            continue
        node = items[first].out
        if any(r.base is node for r in requested) or any(
                it.target is node or (j != last and any(n is node for n in it.inputs))
                for j, it in enumerate(items)):
            continue
        private.add(first)
    if memo is not None:
        memo["private"] = private
    return private
