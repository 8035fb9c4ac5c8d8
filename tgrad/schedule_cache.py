"""Schedules keyed by graph structure: an eager step that builds the same graph again (new input buffers,
the same ops) reuses the kernels fuse.schedule chose last time instead of scheduling and lowering again.

The key is graph.structure of the outputs (the graph fuse.schedule sees: realized nodes are leaves,
numbered by buffer so that aliasing is part of the key), the one structure key the replays use too. A
schedule is kept as positions in that walk (kernel, output, inputs, assign target), so it holds no
node and no buffer; a hit maps the positions to the nodes of the new graph. Two graphs with equal keys
are the same graph up to which buffers their leaves hold, which is all fuse.schedule depends on.
"""

from __future__ import annotations

from collections import OrderedDict

from tgrad import fuse
from tgrad.fuse_roots import FuseTuning
from tgrad.graph import Node, structure

MAX_ENTRIES = 256  # schedules kept (least recently used first out)


class Stats:
    hits = 0
    misses = 0


_cache: OrderedDict[tuple, tuple[list[tuple], dict]] = OrderedDict()


class Cached(list):
    """A schedule from this cache: its items, and `memo`, a dict kept with the cached schedule for what
    the driver derives from the items' structure alone (realize.py keeps its row groups there)."""

    memo: dict


def clear() -> None:
    """Forget every schedule (their memos hold a device's plan: the CPU's row groups and pairs, after its
    properties change, Runtime.set_props)."""
    _cache.clear()


def schedule(outputs: list[Node], tuning: FuseTuning | None = None) -> list[fuse.ScheduleItem]:
    """fuse.schedule(outputs, tuning), from the cache when a graph of the same structure was scheduled
    before (the cache is cleared when a device's properties change: Runtime.set_props)."""
    key, nodes, index, _ = structure(outputs)
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
    items = Cached(fuse.schedule(outputs, tuning))
    items.memo = {}
    try:
        _cache[key] = ([(it.kernel, index[it.out], [index[n] for n in it.inputs],
                         None if it.target is None else index[it.target]) for it in items], items.memo)
    except KeyError:  # a node the walk did not see (not expected): schedule such graphs every time
        return list(items)
    if len(_cache) > MAX_ENTRIES:
        _cache.popitem(last=False)
    return items
