"""Device limits the optimizer must respect besides work-group sizes: the loop iterations of one invocation.

Mesa's llvmpipe (WebGPU over OpenGL) and lavapipe (over Vulkan) stop a shader's loops once one invocation
has run 65535 loop iterations in all, and the shader goes on with whatever it had summed: a 2^24-element
sum gave 131070. `loop_iterations` counts what a C-style kernel with its opts runs (each loop counted one
past its trip count, for its last test); `fit_loops` changes the heuristic's opts until that fits the
device's `max_loop`: an UNROLL of the innermost reduce loop (powers of two up to the device's
`max_unroll` steps per iteration; more LANES where it has them), else a GROUP reduction (a strided loop
shared by up to the device's work-group size; a kernel that has a GROUP takes bigger ones first) with an
UNROLL, and raises a KernelError naming the limit when nothing fits.
"""

from __future__ import annotations

import math

from tgrad.dtype import dtypes
from tgrad.errors import KernelError
from tgrad.fuse import Kernel
from tgrad.opt.opts import DeviceProps, Opt, OptOps, find


def loop_iterations(kernel: Kernel, opts: tuple[Opt, ...] | None = None) -> int:
    """Loop iterations one invocation of a C-style kernel runs (its reduce loops, and a GROUP's tree),
    each loop counted once more than it repeats."""
    opts = kernel.opts if opts is None else opts
    if kernel.reduce_expr is None:
        return 0
    unroll = find(opts, OptOps.UNROLL) or find(opts, OptOps.LANES) or 1
    group = find(opts, OptOps.GROUP)
    if group:
        steps = -(-math.prod(kernel.reduce_shape) // (group * unroll))
        return steps + 1 + group.bit_length()  # the tree halves `group` down to 1: log2(group) + 1 tests
    total, outer = 0, 1
    shape = kernel.reduce_shape
    for j, size in enumerate(shape):
        size = -(-size // unroll) if j == len(shape) - 1 else size
        total += outer * (size + 1)
        outer *= size
    return total


def _candidates(kernel: Kernel, props: DeviceProps, opts: tuple[Opt, ...]):
    """Opts that run fewer loop iterations per invocation: a kernel with LANES takes more of them (up to
    64), one without a GROUP first unrolls its innermost reduce loop; then GROUP reductions, bigger
    work-groups before unrolled ones."""
    group, lanes = find(opts, OptOps.GROUP), find(opts, OptOps.LANES)
    unrolls = [1 << b for b in range(1, props.max_unroll.bit_length())]  # 2, 4, ... max_unroll
    if lanes:  # more lanes (up to 64), then groups: each keeps a float sum compensated, as the lanes did
        local = tuple(o for o in opts if o.op is OptOps.LOCAL)
        for b in range(lanes.bit_length(), 7):
            yield (Opt(OptOps.LANES, 1 << b), *local)
    elif not group:
        plain = tuple(o for o in opts if o.op not in (OptOps.UNROLL, OptOps.LANES))
        for u in unrolls:
            yield (*plain, Opt(OptOps.UNROLL, u))
        if kernel.acc_dtype == dtypes.bool and not props.group_bool:
            return
    start = group or min(props.group_size, props.max_local)
    top = props.max_local.bit_length()
    sizes = [1 << b for b in range(start.bit_length() - 1, top) if 1 << b <= props.max_local]
    for u in (1, *unrolls):
        for g in sizes:
            yield (Opt(OptOps.GROUP, g),) + ((Opt(OptOps.UNROLL, u),) if u > 1 else ())


def fit_loops(kernel: Kernel, props: DeviceProps, opts: tuple[Opt, ...]) -> tuple[Opt, ...]:
    """opts, changed where needed so that an invocation runs at most props.max_loop loop iterations."""
    limit = props.max_loop
    if limit is None or loop_iterations(kernel, opts) <= limit:
        return opts
    for cand in _candidates(kernel, props, opts):
        if loop_iterations(kernel, cand) <= limit:
            return cand
    tried = [(loop_iterations(kernel, c), c) for c in _candidates(kernel, props, opts)]
    least = min(tried, key=lambda t: t[0])
    raise KernelError(
        f"kernel {kernel.name} (shape {kernel.shape}, reducing {math.prod(kernel.reduce_shape)} elements "
        f"per output) needs at least {least[0]} loop iterations per invocation (with {least[1]}); "
        f"{props.name} runs at most {limit} (max_loop: Mesa llvmpipe/lavapipe's loop limit) and allows "
        f"work-groups of {props.max_local}: reduce in steps (e.g. sum a reshaped tensor over one axis, "
        "then the result) or use another device"
    )
