"""The default opts of a kernel, chosen from the device's properties (tinygrad's hand-coded heuristic;
the CPU's: host.py).

C-style devices (OpenCL, Metal, WGSL):
- a reduction of at least `group_min_reduce` elements into at most `group_max_outputs` outputs (not bool,
  unless the device's renderer reduces bools in groups): GROUP, a work-group of `group_size` work-items
  per output, cut to the device's work-group limit (one work-item per row leaves a few long rows to a
  few work-items; measured on PoCL: bench/HISTORY.md);
- other reductions: register tiles (UPCAST by `register_tiles`) on up to two global axes, innermost
  first, whose length it divides and that some load does not use (a matmul's M and N: each value loaded
  serves a tile of outputs; measured on PoCL: bench/HISTORY.md); none with NOOPT=1;
- a CPU OpenCL device (`cpu_device`, PoCL): LANES where they give a GROUP or untiled contiguous loops;
- LOCAL: `preferred_local` work-items per work-group, within the device's limit;
- then, on a device with a loop limit (`max_loop`), limits.fit_loops: an UNROLL, bigger or new GROUPs.

Triton: a tile holds at most TILE = props.tile_elements elements (GPU: 4096; interpreter: 65536, as its
cost grows with the programs launched). An elementwise program takes min(next_pow2(G), TILE / 4 on a GPU,
TILE in the interpreter) outputs. A reduce steps BLOCK_R = min(next_pow2(R), TILE / 4) elements (the
whole TILE for a single output) over BLOCK_G = min(next_pow2(G), TILE / BLOCK_R) outputs; 8 warps for
tiles of 4096 or more, else 4. NOOPT=1: one output per program, BLOCK_R = min(next_pow2(R), TILE / 16). A
matmul-shaped kernel gets tl.dot tiles (sides 16-64 on a GPU, 128 in the interpreter), unless it is an
implicit GEMM with few programs over a long K, which runs better as a split reduce. A reduce that would
use fewer programs than four per compute unit while each loops over 8+ tiles is SPLIT into shares of 4+
tiles (a 16M-float sum as one program used a small part of the GPU's bandwidth; measured:
bench/HISTORY.md).
"""

from __future__ import annotations

import math

from tgrad import config
from tgrad.dtype import dtypes
from tgrad.fuse import Kernel, linear_terms
from tgrad.loop_axes import nodes
from tgrad.opt.contraction import axes_of, find_dot, implicit_gemm
from tgrad.opt.host import host_opts
from tgrad.opt.limits import fit_loops
from tgrad.opt.opts import DeviceProps, Opt, OptOps


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def optimize(kernel: Kernel, props: DeviceProps, noopt: bool | None = None) -> Kernel:
    """The kernel with the opts the heuristic picks for a device (a kernel that has opts keeps them)."""
    if kernel.opts:
        return kernel
    noopt = config.on("NOOPT") if noopt is None else noopt
    if props.kind == "cstyle":
        opts = fit_loops(kernel, props, cstyle_opts(kernel, props, noopt))
    elif props.kind == "triton":
        opts = triton_opts(kernel, props, noopt)
    elif props.kind == "cpu":
        opts = host_opts(kernel, props)
    else:  # a device that evaluates graphs itself (NUMPY) has nothing to choose
        return kernel
    return kernel.with_opts(opts)


# ---------------------------------------------------------------------------------------------------
# C-style devices


def float_sum(kernel: Kernel) -> bool:
    return kernel.reduce_op == "SUM" and kernel.acc_dtype.is_float


def group_reduces(kernel: Kernel, props: DeviceProps) -> bool:
    if kernel.reduce_expr is None or (kernel.acc_dtype == dtypes.bool and not props.group_bool):
        return False
    n_out = math.prod(kernel.global_shape)
    if math.prod(kernel.reduce_shape) < props.group_min_reduce or n_out > props.group_max_outputs:
        return False
    # (on a cpu_backed device, reductions other than float sums cooperate only where the outputs are few)
    return not props.cpu_backed or float_sum(kernel) or n_out * props.group_size < props.group_items


def tiled_axes(kernel: Kernel, upcast: int) -> tuple[int, ...]:
    """Global axes (at most two, the innermost first) that get register tiles of `upcast` outputs: the
    ones `upcast` divides that some load of the reduction does not use (its value is reused)."""
    if upcast <= 1 or kernel.reduce_expr is None:
        return ()
    loads = [e for e in nodes(kernel.reduce_expr) if e.op == "LOAD"]
    used = [axes_of(ld) for ld in loads]
    axes: list[int] = []
    for a in reversed(range(kernel.n_global)):
        if kernel.shape[a] % upcast == 0 and any(a not in u for u in used) and len(axes) < 2:
            axes.append(a)
    return tuple(axes)


def contiguous_reduce(kernel: Kernel) -> bool:
    """Some load of the reduction reads consecutive elements along the innermost reduce axis."""
    axis = len(kernel.shape) - 1
    for e in nodes(kernel.reduce_expr):
        if e.op == "LOAD" and any(c == 1 and a is not None and a.op == "IDX" and a.arg[0] == axis
                                  for c, a in linear_terms(e.srcs[0])):
            return True
    return False


def cpu_lanes(kernel: Kernel, props: DeviceProps) -> tuple[Opt, ...]:
    """A CPU OpenCL device's reduction: one work-item per output with `sum_lanes` / `reduce_lanes`
    accumulators (fewer on a short reduce loop), in work-groups small enough for every compute unit."""
    inner = max(1, kernel.reduce_shape[-1]) if kernel.reduce_shape else 1
    most = max(1, inner // props.lane_steps)
    lanes = props.sum_lanes if float_sum(kernel) else props.reduce_lanes
    lanes = min(lanes, 1 << (most.bit_length() - 1))
    per_unit = max(1, math.prod(kernel.global_shape) // max(1, props.compute_units))
    local = Opt(OptOps.LOCAL, min(props.preferred_local, props.max_local, 1 << (per_unit.bit_length() - 1)))
    return (Opt(OptOps.LANES, lanes), local) if lanes > 1 else (local,)


def cstyle_opts(kernel: Kernel, props: DeviceProps, noopt: bool) -> tuple[Opt, ...]:
    grouped = group_reduces(kernel, props)
    tiles = () if noopt else tiled_axes(kernel, props.register_tiles)
    # (lanes where a group would cooperate, or where a load reads the reduce loop's steps one after another:
    # on a strided reduce their loads land in 8 places at once and measured up to 20% slower)
    if props.cpu_device and kernel.reduce_expr is not None and \
            (grouped or not (noopt or tiles) and contiguous_reduce(kernel)):
        return cpu_lanes(kernel, props)
    if grouped:
        size = min(props.group_size, 1 << (props.max_local.bit_length() - 1))  # a power of two that fits
        if props.cpu_backed:  # (enough work-items for the cores' lanes, no more: see DeviceProps)
            want = max(1, props.group_items // max(1, math.prod(kernel.global_shape)))
            size = min(size, max(16, 1 << (want.bit_length() - 1)))
        return (Opt(OptOps.GROUP, size),)
    local = max(1, min(props.preferred_local, props.max_local))
    return (*(Opt(OptOps.UPCAST, props.register_tiles, a) for a in tiles), Opt(OptOps.LOCAL, local))


# ---------------------------------------------------------------------------------------------------
# Triton


def _blocks(block_g: int, block_r: int, warps: int, dot: int = 0, split: int = 0) -> tuple[Opt, ...]:
    opts = [Opt(OptOps.LOCAL, block_g), Opt(OptOps.REDUCE, block_r), Opt(OptOps.WARPS, warps)]
    opts += [Opt(OptOps.DOT, dot)] if dot else []
    opts += [Opt(OptOps.SPLIT, split)] if split else []
    return tuple(opts)


def triton_opts(kernel: Kernel, props: DeviceProps, noopt: bool) -> tuple[Opt, ...]:
    interpret = props.interpreted
    tile = props.tile_elements
    g, r = math.prod(kernel.global_shape), math.prod(kernel.reduce_shape)
    if kernel.reduce_expr is None:
        block_g = min(next_pow2(g), tile if interpret else tile // 4)
        return _blocks(block_g, 1, 8 if block_g >= 4096 else 4)
    if noopt:
        return _blocks(1, min(next_pow2(r), tile // 16), 4)
    dot = find_dot(kernel)
    if dot is not None:  # tl.dot needs every tile side >= 16
        side = 128 if interpret else 64
        sizes = [math.prod(kernel.shape[a] for a in axes) for axes in dot[2:]]
        m, n = (max(16, min(side, next_pow2(s))) for s in sizes)
        block_k = max(16, min(side if interpret else 32, next_pow2(r)))
        programs = g // (sizes[0] * sizes[1]) * -(-sizes[0] // m) * -(-sizes[1] // n)
        # an implicit GEMM with few programs over a long K (a conv's weight gradient) leaves the GPU idle;
        # the reduce below splits it (conv2's weight gradient on the H200; measured: bench/HISTORY.md)
        if interpret or not implicit_gemm() or programs >= 64 or r <= 16 * block_k:
            return _blocks(m, block_k, 4, n)
    block_r = min(next_pow2(r), tile if g == 1 else tile // 4)
    block_g = min(next_pow2(g), tile // block_r)
    warps = 8 if block_g * block_r >= 4096 else 4
    programs = -(-g // block_g)
    enough = 4 * props.compute_units  # programs that keep every compute unit busy
    if not interpret and programs < enough and r >= 8 * block_r:
        most = 1 << (r // (4 * block_r)).bit_length() - 1  # shares of at least 4 tiles
        split = min(next_pow2(-(-enough // programs)), most, 1024)
        return _blocks(block_g, block_r, warps, split=split)
    return _blocks(block_g, block_r, warps)
