"""The order of a schedule's kernels around assigns (`fuse.schedule`'s last step). An ASSIGN writes its
target's buffer in place, so besides the data dependencies (a kernel runs after the kernels whose results
it reads) every other kernel that reads the target's old value must run before it. Kernels that depend on
no assign keep their order; assigns run as late as they may, and next to the assign that reads them (an
optimizer's m, v and parameter updates side by side: the CPU runs them as one loop)."""

from __future__ import annotations

import heapq

from tgrad.errors import TgradError


def order_assigns(items: list) -> list:
    """An ASSIGN overwrites its target: it runs after every other kernel that reads the target (the old
    value) and before every kernel that reads its result (the new value: an update built on an update not
    yet realized, e.g. a second optimizer step). Among the orders that allow, each assign runs as late as
    it may, just before its first reader: the items in dependency order, an assign taken only when no
    other item is ready."""
    if not any(it.target is not None for it in items):
        return items
    made = {id(it.out): i for i, it in enumerate(items)}
    # the items that read each buffer realized before this schedule, through any node: two realized nodes
    # may hold one buffer (an assign realized earlier, and the buffer node a later assign() targets)
    readers: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        for n in it.inputs:
            if n.buffer is not None:
                readers.setdefault(id(n.buffer), []).append(i)
    before: list[set[int]] = [set() for _ in items]  # the items that must run before each item
    for i, it in enumerate(items):
        before[i].update(made[id(n)] for n in it.inputs if id(n) in made and made[id(n)] != i)
        if it.target is not None and it.target.buffer is not None:  # after every reader of what it overwrites
            before[i].update(j for j in readers.get(id(it.target.buffer), ()) if j != i)
    users: list[list[int]] = [[] for _ in items]
    for i, deps in enumerate(before):
        for j in deps:
            users[j].append(i)
    waiting = [len(deps) for deps in before]
    ready = [(items[i].target is not None, i) for i in range(len(items)) if not waiting[i]]
    heapq.heapify(ready)
    ordered: list = []
    while ready:
        _, i = heapq.heappop(ready)
        ordered.append(items[i])
        for u in users[i]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (items[u].target is not None, u))
    if len(ordered) < len(items):
        raise TgradError(
            "a kernel reads both the old and the assigned value of one buffer; realize() the old value "
            "before assign()"
        )
    assigns = [it for it in ordered if it.target is not None]
    for a in assigns:  # next to the assign that reads it where nothing between forbids (an optimizer's
        pos = ordered.index(a)  # m, v and parameter updates side by side: the CPU runs them as one loop)
        user = next((j for j in range(pos + 1, len(ordered)) if a.out in ordered[j].inputs), None)
        if user is not None and ordered[user].target is not None and all(
                a.out not in x.inputs and x.target not in a.inputs for x in ordered[pos + 1 : user]):
            ordered.insert(user - 1, ordered.pop(pos))
    return ordered
