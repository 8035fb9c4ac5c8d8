"""A TinyJit capture's replay plan (tgrad/jit.py): which captured buffers share memory (`plan`, at the
first replay) and the steps a replay runs (`batched`: runs of one device's launches batched by its runtime).
`v` is a jit._Variant: the capture's launches and the ids of the buffers each replay replaces."""

from __future__ import annotations

import sys
from typing import Any

from tgrad import realize as driver
from tgrad.device import get_runtime


class _HostCall:
    """A recorded host step (realize.HostStep): a replay runs it over that call's buffers, in the place
    where it ran among the kernels, and its outputs are new buffers each time."""

    def __init__(self, step: driver.HostStep, shapes: list[tuple[int, ...]]):
        self.step, self.shapes = step, shapes
        self.name, self.source = f"host step {step.name}", repr(step.key)


def lives(captured: list[tuple]) -> tuple[dict, dict, dict, dict]:
    """Per buffer id of the launches (host steps' outputs left out): the buffer, its first and last
    launch, and how many references to it the launches hold."""
    found: dict[int, Any] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    uses: dict[int, int] = {}
    for j, (prg, out, inputs) in enumerate(captured):
        for b in ([] if isinstance(prg, _HostCall) else [out]) + list(inputs):
            k = id(b)
            found[k], last[k], uses[k] = b, j, uses.get(k, 0) + 1
            first.setdefault(k, j)
    return found, first, last, uses


def plan(v) -> None:
    """Memory planning, at a variant's first replay: the buffers its kernels compute and read inside the
    call share memory where their lives do not overlap. A buffer the capture's kernels wrote that is not an
    argument, a returned value, a gradient, a random draw or a host step's output, and that nothing but the
    captured launches refers to any more (no live tensor holds it: sys.getrefcount, so a tensor the
    function kept in Python keeps its buffer), lives from the first launch that uses it to the last; each
    takes the buffer of one that died before its first launch, of the same device, dtype and size (the
    one freed last: its memory is the likeliest in the cache), else keeps its own. The replays then write
    into less memory, most of it still in the cache from the kernel before (the GPT step ran faster;
    measured: bench/HISTORY.md), and the buffers not kept are freed."""
    v.planned = True
    fixed = set(v.in_ids) | {k for _, k in v.grad_ins} | {k for k, *_ in v.fresh} | set(v.out_ids)
    fixed |= {k for k, *_ in v.randoms}
    found, first, last, uses = lives(v.captured)
    # refcount: one per use in v.captured, one in `found`, one getrefcount's argument
    mine = [k for k in first if k in v.made and k not in fixed and found[k].size > 0
            and sys.getrefcount(found[k]) == uses[k] + 2]
    free: dict[tuple, list] = {}
    live: list[tuple[int, int, Any]] = []  # (last launch, id, the buffer it got) of the planned ones alive
    given: dict[int, Any] = {}
    for k in sorted(mine, key=first.__getitem__):
        start = first[k]
        for item in sorted(x for x in live if x[0] < start):  # the one freed last ends up on top
            live.remove(item)
            b = item[2]
            free.setdefault((b.device, b.dtype, b.size), []).append(b)
        b = found[k]
        pool = free.get((b.device, b.dtype, b.size))
        given[k] = pool.pop() if pool else b
        live.append((last[k], k, given[k]))
    v.captured = [(prg, out if isinstance(prg, _HostCall) else given.get(id(out), out),
                   [given.get(id(b), b) for b in inputs]) for prg, out, inputs in v.captured]
    v.steps = batched(v)


def batched(v) -> list:
    """The replay's steps: host steps and launches as captured, with each run of one device's launches
    replaced by what its runtime batches them into (Runtime.batch: the CPU makes one native call of a run
    of compiled functions); the placeholders of kernels a row group computes left out."""
    varying = set(v.in_ids) | {k for _, k in v.grad_ins} | {k for k, *_ in v.fresh}
    varying |= {k for k, *_ in v.randoms}
    varying |= {id(b) for prg, outs, _ in v.captured if isinstance(prg, _HostCall) for b in outs}
    steps: list = []
    run: list[tuple] = []

    def flush() -> None:
        batch = get_runtime(run[0][0].device).batch(list(run), varying) if len(run) > 1 else None
        steps.extend(run if batch is None else [batch])
        run.clear()

    for launch in v.captured:
        prg = launch[0]
        if getattr(prg, "placeholder", False):
            continue
        if run and (isinstance(prg, _HostCall) or prg.device != run[0][0].device):
            flush()
        if isinstance(prg, _HostCall):
            steps.append(launch)
        else:
            run.append(launch)
    if run:
        flush()
    return steps
