"""BEAM search (tinygrad's `BEAM=n`): a kernel's opts chosen by timing real launches on the device.

The heuristic's opts (heuristic.py) are the start. Each round changes one choice of each of the `n`
fastest opts found so far (cstyle: GROUP, LOCAL, UPCAST, UNROLL, LANES; Triton: BLOCK_G, BLOCK_R, warps,
SPLIT, the tl.dot tiles; the CPU: the HostTuning variants that change the kernel's opts: threads or not, the
generated loop, BLAS or a direct convolution), compiles and times each new candidate on buffers of the
kernel's sizes (random values; a launch's time is the least of a few), and keeps the `n` fastest; it
stops when a round finds nothing faster or after BEAM_TIMEOUT_SEC. A candidate whose result differs
from the heuristic's (beyond float rounding), or that fails to render, compile or run, is dropped, and
no candidate sums floats less accurately than the heuristic's choice (a compensated GROUP or LANES sum, a
CPU full sum in blocks): a search never trades a right answer, or accuracy, for speed. The choice is kept on
disk per (device, its properties, kernel) in the kernel cache's `beam/` folder, so a kernel is searched
once per machine (IGNORE_BEAM_CACHE=1 searches again). A TinyJit capture compiles through the same path,
so its kernels are searched too. DEBUG=2 prints each search's result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

from tgrad import config
from tgrad.cachefiles import write_atomic
from tgrad.dtype import dtypes
from tgrad.errors import KernelError
from tgrad.fuse import Kernel
from tgrad.loop_axes import nodes
from tgrad.opt.heuristic import float_sum, tiled_axes
from tgrad.opt.host import host_opts
from tgrad.opt.limits import fit_loops
from tgrad.opt.opts import DeviceProps, Opt, OptOps, find, upcasts


def _pow2s(low: int, high: int) -> list[int]:
    return [1 << b for b in range(max(0, low.bit_length() - 1), high.bit_length()) if low <= 1 << b <= high]


def _cstyle(kernel: Kernel, props: DeviceProps, opts: tuple[Opt, ...]) -> list[tuple[Opt, ...]]:
    """One choice changed: a GROUP reduction's size (or none), the work-group size, the register tiles
    (UPCAST on the axes the heuristic would tile), the innermost reduce loop's unroll or its accumulators
    (LANES). A float sum the heuristic compensates (a GROUP's or LANES' work-items: Kahan) keeps a GROUP or
    LANES: a single accumulator's long sum is not compensated (faster on PoCL, and less accurate: not a
    choice the search may make)."""
    group, unroll = find(opts, OptOps.GROUP), find(opts, OptOps.UNROLL, 1)
    lanes = find(opts, OptOps.LANES)
    local, tile = find(opts, OptOps.LOCAL, props.preferred_local), max(upcasts(opts).values(), default=1)
    reduces = kernel.reduce_expr is not None
    keep_group = bool(group or lanes) and float_sum(kernel)
    can_group = reduces and (kernel.acc_dtype != dtypes.bool or props.group_bool)
    groups = ([] if keep_group else [0]) + (_pow2s(16, props.max_local) if can_group else [])
    tiles = [1, 2, 4, 8] if reduces and not group and not lanes else [tile]
    unrolls = _pow2s(1, props.max_unroll) if reduces else [1]

    def build(g: int, lo: int, t: int, u: int, la: int = 0) -> tuple[Opt, ...]:
        if la:
            return (Opt(OptOps.LANES, la), Opt(OptOps.LOCAL, lo))
        out: list[Opt] = [Opt(OptOps.GROUP, g)] if g else \
            [*(Opt(OptOps.UPCAST, t, a) for a in tiled_axes(kernel, t)), Opt(OptOps.LOCAL, lo)]
        return (*out, *([Opt(OptOps.UNROLL, u)] if u > 1 else []))

    out = [build(g, local, 1 if g else tile, unroll) for g in groups if g != group]
    if not group:
        out += [build(0, lo, tile, unroll, lanes) for lo in _pow2s(16, props.max_local) if lo != local]
        out += [build(0, local, t, unroll) for t in tiles if t != tile]
    if reduces:  # (lanes replace a group, tiles or an unroll)
        top = max(props.max_unroll, props.sum_lanes if props.cpu_device else 0)
        out += [build(0, local, 1, 1, la) for la in _pow2s(2, top) if la != lanes]
    if not lanes:
        out += [build(group, local, tile, u) for u in unrolls if u != unroll]
    fitted = []
    for cand in out:
        try:
            fitted.append(fit_loops(kernel, props, cand))
        except KernelError:  # (no opts like these fit the device's loop limit: not a candidate)
            continue
    return fitted


def _triton(kernel: Kernel, props: DeviceProps, opts: tuple[Opt, ...]) -> list[tuple[Opt, ...]]:
    """One of BLOCK_G, BLOCK_R (a tl.dot's BLOCK_M, BLOCK_K), BLOCK_N, warps or SPLIT halved or doubled,
    within the device's tile (tl.dot sides stay 16 or more)."""
    have = {o.op: o.arg for o in opts}
    dot = OptOps.DOT in have
    least = 16 if dot else 1
    out = []
    for op in (OptOps.LOCAL, OptOps.REDUCE, OptOps.DOT, OptOps.WARPS, OptOps.SPLIT):
        if op not in have and not (op is OptOps.SPLIT and kernel.reduce_expr is not None and not dot):
            continue
        if op is OptOps.REDUCE and kernel.reduce_expr is None:
            continue
        for value in (have.get(op, 1) * 2, have.get(op, 1) // 2):
            if op is OptOps.WARPS and not 1 <= value <= 16 or op is not OptOps.WARPS and value < least:
                continue
            if op is OptOps.SPLIT and value < 2:
                value = 0
            new = {**have, op: value}
            tile = new.get(OptOps.LOCAL, 1) * new.get(OptOps.REDUCE, 1) * new.get(OptOps.DOT, 1)
            if tile > props.tile_elements * (16 if dot else 1):
                continue
            out.append(tuple(Opt(o, a) for o, a in new.items() if a or o is not OptOps.SPLIT))
    return out


def _cpu(kernel: Kernel, props: DeviceProps) -> list[tuple[Opt, ...]]:
    """The opts of HostTuning variants (the CPU's search space): threads or not, LLVM O1 or O3 for a
    kernel with gated loads (LEVEL), and for a contraction the generated loop, BLAS, a batched function or
    a direct convolution where each applies. A threaded full float sum stays threaded (its chunks add
    blocks of `sum_block` elements: numpy's accuracy; a serial loop's would be less accurate)."""
    never, always = 1 << 62, 0
    full_sum = float_sum(kernel) and kernel.n_global == 0 and find(host_opts(kernel, props), OptOps.THREADS)
    variants = [dict(parallel_min_work=always), *([] if full_sum else [dict(parallel_min_work=never)]),
                dict(blas_min_work=never, blas_min_matvec_work=never),
                dict(blas_min_work=always, blas_min_matvec_work=always, windows_max_k=0),
                dict(direct_min_work=never, batched_max_work=0),
                dict(direct_min_work=always, direct_min_depth=0, direct_min_channels=0),
                dict(short_loop_max=0), dict(short_loop_max=never)]
    out = []
    for v in variants:
        tuned = dataclasses.replace(props, host=dataclasses.replace(props.host, **v))
        out.append(host_opts(kernel, tuned))
    return out


def neighbours(kernel: Kernel, props: DeviceProps, opts: tuple[Opt, ...]) -> list[tuple[Opt, ...]]:
    """The candidates one step from `opts` on this device (the same opts may come back: callers skip
    what they have timed)."""
    if props.kind == "cstyle":
        return _cstyle(kernel, props, opts)
    if props.kind == "triton":
        return _triton(kernel, props, opts)
    if props.kind == "cpu":
        return _cpu(kernel, props)
    return []


def _sizes(kernel: Kernel) -> tuple[int, list[int]] | None:
    """Elements of the output and of each input buffer the kernel may touch (from its index bounds);
    None where a bound is unknown."""
    reads = [1] * len(kernel.in_dtypes)
    for e in nodes(kernel.expr, kernel.out_index, kernel.reduce_expr):
        if e.op == "LOAD":
            hi = e.srcs[0].vmax
            if not math.isfinite(hi):
                return None
            reads[e.arg] = max(reads[e.arg], int(hi) + 1)
    out = kernel.out_index.vmax
    return (int(out) + 1, reads) if math.isfinite(out) else None


def _random(n: int, dtype, rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(n) < 0.5
    if dtype.is_int:
        return rng.integers(1, 8, n).astype(dtype.np)  # (small, no zero: no overflow, no division by 0)
    return rng.uniform(-1, 1, n).astype(dtype.np)


class _Bench:
    """A kernel's buffers on the device and the timing of candidates on them."""

    def __init__(self, kernel: Kernel, runtime, sizes: tuple[int, list[int]]):
        rng = np.random.default_rng(0)
        self.runtime, self.kernel = runtime, kernel
        self.inputs = [runtime.from_numpy(_random(n, dt, rng)) for n, dt in zip(sizes[1], kernel.in_dtypes)]
        self.size = sizes[0]
        self.reference: np.ndarray | None = None

    def time(self, opts: tuple[Opt, ...]) -> float | None:
        """The least time of a few launches with these opts, or None: it failed, or its result is not the
        reference's (the first candidate timed: the heuristic's)."""
        rt, k = self.runtime, self.kernel.with_opts(opts)
        try:
            runner = rt.compile(rt.render(k), k)
            out = rt.alloc(self.size, k.out_dtype)
            wait = getattr(rt, "wait_for_compiles", None)
            runner(out, *self.inputs)
            if wait is not None:  # (a CPU direct conv runs BLAS until its own function is compiled)
                wait()
            rt.synchronize()
            best = math.inf
            for _ in range(3):
                start = time.perf_counter()
                runner(out, *self.inputs)
                rt.synchronize()
                best = min(best, time.perf_counter() - start)
            got = rt.to_numpy(out)[: self.size]
        except Exception:  # noqa: BLE001  (a candidate the emitter or the driver refuses is not taken)
            return None
        if self.reference is None:
            self.reference = got.copy()
        elif not _same(got, self.reference):
            return None
        return best


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype.kind != "f":
        return np.array_equal(got, want)
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(np.isnan(want), np.isnan(got)):
        return False
    scale = float(np.abs(want[finite]).max(initial=0.0)) or 1.0
    return bool(np.allclose(got[finite], want[finite], rtol=1e-3, atol=1e-4 * scale))


def _key(kernel: Kernel, props: DeviceProps) -> str:
    text = repr((props, dataclasses.replace(kernel, opts=())))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _load(path: Path | None) -> tuple[Opt, ...] | None:
    if path is None or config.get("IGNORE_BEAM_CACHE") != "0":
        return None
    try:
        return tuple(Opt(OptOps[op], arg, axis) for op, arg, axis in json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(path: Path | None, opts: tuple[Opt, ...]) -> None:
    if path is None:
        return
    try:
        write_atomic(path, json.dumps([(o.op.name, int(o.arg), o.axis) for o in opts]).encode())
    except OSError:
        pass


def beam(kernel: Kernel, runtime, width: int, cache: Path | None) -> Kernel:
    """`kernel` (with the heuristic's opts) with the fastest opts a beam of `width` finds on `runtime`."""
    props = runtime.props
    path = None if cache is None else cache / "beam" / f"{runtime.name}-{_key(kernel, props)}.json"
    found = _load(path)
    if found is not None:
        return kernel.with_opts(found)
    sizes = _sizes(kernel)
    if sizes is None or not kernel.shape or math.prod(kernel.shape) == 0 or props.kind not in \
            ("cstyle", "triton", "cpu"):
        return kernel
    budget = float(config.get("BEAM_TIMEOUT_SEC"))
    start = time.perf_counter()
    bench = _Bench(kernel, runtime, sizes)
    first = bench.time(kernel.opts)
    if first is None:  # the heuristic's own opts fail here: nothing to compare candidates with
        return kernel
    timed = {kernel.opts: first}
    kept = [kernel.opts]  # the beam: the `width` fastest opts so far
    while time.perf_counter() - start < budget:
        for opts in kept:
            for cand in neighbours(kernel, props, opts):
                if cand not in timed and time.perf_counter() - start < budget:
                    timed[cand] = bench.time(cand)
        ranked = sorted((o for o, t in timed.items() if t is not None), key=lambda o: timed[o])
        if ranked[:width] == kept:  # nothing faster than the beam, or nothing new: done
            break
        kept = ranked[:width]
    choice = min((o for o, t in timed.items() if t is not None), key=lambda o: timed[o])
    if int(config.get("DEBUG")) >= 2:
        print(f"beam {kernel.name}: {first * 1e6:.0f} us -> {timed[choice] * 1e6:.0f} us, {len(timed)} "
              f"candidates in {time.perf_counter() - start:.1f} s: {list(choice)}")
    _store(path, choice)
    return kernel.with_opts(choice)
