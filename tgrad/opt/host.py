"""The CPU's opts, chosen from its properties (tinygrad's hand-coded heuristic, for a host device).

For every kernel: whether its outer loop runs on threads (THREADS: at least `parallel_min_work`
iterations); an elementwise kernel with a short innermost loop that gates loads on its index compiles at
LLVM O3 (LEVEL: `short_loop_max`). For a contraction (Kernel.contraction: the reduce of a matmul, conv2d,
einsum or their gradients, marked by the op that built it) that tgrad/blas.py can run as a matmul, how
(CONTRACT):
- the generated loop below `blas_min_work` multiply-adds (a matrix times a vector whose rows are read
  along memory: below `blas_min_matvec_work`), for an operand matrix over `blas_max_operand` elements, and
  for a conv whose small K and few output channels read its windows in place (`windows_max_*`);
- else BLAS: leading axes as batch axes where that writes the result in order (BATCH), and a copied
  operand (im2col) in pieces sized to the core's cache (CHUNK: copies of at most `cache_bytes` / 8
  elements, half the cache in float32, for copies of twice that or more; or one image a piece where
  compiled pieces run and an image has `one_index_min_work`);
- a batch of small matmuls (`batched_max_*`) as one generated function (BATCHED; `batched_rows` rows
  of each result a pass: an UPCAST);
- a 2-d convolution's forward or weight gradient big enough (`direct_*`) as a direct loop nest (DIRECT,
  WGRAD; BLAS runs until its function is compiled): only a kernel conv2d marked (graph.CONV); the input
  gradient's scatter only for a kernel marked graph.COL2IM and a sum after it marked graph.Col2ImSum.
The sizes are the device's HostTuning (opts.py), measured on one machine (bench/HISTORY.md); the cache
size comes from the machine. emit_numba and the CPU runtime render what the opts say
(`plan_for`); the runtime's plans over several kernels (piece pairs, row groups) ask here too.
"""

from __future__ import annotations

import dataclasses
import math

from tgrad import blas
from tgrad.blas import BlasPlan, Col2Im
from tgrad.fuse import Kernel, is_true
from tgrad.graph import COL2IM, CONTRACT, CONV
from tgrad.loop_axes import nodes
from tgrad.opt.contraction import axes_of
from tgrad.opt.opts import Contract, DeviceProps, HostTuning, Opt, OptOps, find


def chunk_elems(props: DeviceProps) -> int:
    """Elements a piece of a copied operand aims at: half the core's cache of float32, so that the copy
    stays there while BLAS reads it."""
    return props.cache_bytes // 8


def pieces_from(props: DeviceProps) -> int:
    """Elements of copies from which a matmul runs in pieces: two pieces' worth."""
    return 2 * chunk_elems(props)


def conv_pieces(props: DeviceProps, elements: int) -> bool:
    """Whether a convolution's windows of `elements` elements run in pieces on this device (the windows of
    a buffer: ops/nn.py makes a padded or computed input one first)."""
    return props.kind == "cpu" and elements >= pieces_from(props)


def threads(work: int, rows: int, t: HostTuning) -> bool:
    """Whether a loop of `rows` iterations doing `work` in all is worth splitting over threads."""
    return rows > 1 and work >= t.parallel_min_work


def _loop_threads(kernel: Kernel, t: HostTuning, axis: int | None = None) -> tuple[Opt, ...]:
    shape = kernel.shape
    wanted = bool(shape) and threads(math.prod(shape), shape[0], t)
    return (Opt(OptOps.THREADS, 1, axis),) if wanted else ()


def _level(kernel: Kernel, t: HostTuning) -> tuple[Opt, ...]:
    """LEVEL(3) for an elementwise kernel whose short innermost loop (`short_loop_max`) gates loads on its
    index: LLVM at O3 writes the loop out and the gates fold (HostTuning.short_loop_max)."""
    shape = kernel.shape
    if kernel.reduce_expr is not None or len(shape) < 2 or shape[-1] > t.short_loop_max:
        return ()
    axis = len(shape) - 1  # (a padded, shifted or concatenated view gates its loads)
    gated = any(e.op == "LOAD" and not is_true(e.srcs[1]) and axis in axes_of(e.srcs[1])
                for e in nodes(kernel.expr))
    return (Opt(OptOps.LEVEL, 3),) if gated else ()


def _blas(kernel: Kernel, t: HostTuning) -> tuple[BlasPlan, int] | None:
    """(the plan, its leading batch axes) where BLAS beats the generated loop, else None."""
    work = math.prod(kernel.shape)
    if not kernel.contraction or not blas.contraction(kernel) or work < t.blas_min_work:
        return None
    plan = blas.analyse(kernel)
    if plan is None or (blas.matvec(plan) and work < t.blas_min_matvec_work):
        return None
    lead = blas.lead_axes(kernel, plan, t.lead_min_work)
    plan = blas.with_lead(plan, lead) if lead else plan
    if blas.operand_elements(kernel, plan) > t.blas_max_operand:
        return None
    win = blas.windows(kernel, plan)
    if win is not None and win[0] <= t.windows_max_k and win[1] <= t.windows_max_n:
        return None
    return plan, lead


def _direct(kernel: Kernel, chans: int, cin: int, kh: int, kw: int, t: HostTuning) -> bool:
    """Whether a conv (`chans` output channels, `cin` input channels, a kh x kw kernel) is big enough for a
    direct loop nest."""
    big = math.prod(kernel.shape) >= t.direct_min_work and cin * kh * kw >= t.direct_min_depth
    return kh * kw <= t.direct_max_taps and chans >= t.direct_min_channels and big


def _batch_pieces(kernel: Kernel, plan: BlasPlan, props: DeviceProps) -> blas.Chunk | None:
    """A batch of small matmuls (global axis 0 a batch axis, at most `split_batch_max_work` multiply-adds
    a matrix, `parallel_min_work` in all) cut into two pieces a core along axis 0, each a one-thread BLAS
    call over its matrices: BLAS's own threads split each small matrix and wait for each other once a
    matrix, which on a core another process also runs costs a time slice each (bench/HISTORY.md)."""
    length = kernel.shape[0] if kernel.shape else 0
    if kernel.contraction != CONTRACT or 0 not in plan.batch or props.compute_units < 2 or length < 2:
        return None  # (a conv's matmuls have their own pieces and pairs)
    if math.prod(kernel.shape) < props.host.parallel_min_work:  # (too little work to hand to threads)
        return None
    if math.prod(kernel.shape[x] for x in (*plan.m, *plan.n)) * math.prod(kernel.reduce_shape) > \
            props.host.split_batch_max_work:
        return None
    pieces = min(length, 2 * props.compute_units)
    return blas.Chunk(0, min(d for d in range(-(-length // pieces), length + 1) if length % d == 0))


def host_opts(kernel: Kernel, props: DeviceProps) -> tuple[Opt, ...]:
    """The CPU's opts for a kernel (see the module's docstring)."""
    t = props.host
    found = _blas(kernel, t)
    if found is None:
        return _loop_threads(kernel, t) + _level(kernel, t)
    plan, lead = found
    chunk = blas.chunk_for(kernel, plan, pieces_from(props), chunk_elems(props))
    if chunk is not None:
        plan = blas.with_chunk(kernel, plan, chunk.axis, chunk.size)
    small = blas.small_batch(kernel, plan)
    if small is not None and small[0] <= t.batched_max_work and small[1] <= t.batched_max_k:
        return (Opt(OptOps.CONTRACT, Contract.BATCHED), Opt(OptOps.BATCH, lead),
                Opt(OptOps.UPCAST, t.batched_rows, plan.m[0]),
                *((Opt(OptOps.THREADS, 1),) if math.prod(kernel.shape) >= t.parallel_min_work else ()))
    conv = kernel.contraction == CONV  # (the op said so: conv_forward / conv_weight_grad read its axes)
    if conv and blas.conv_forward(kernel, plan) and _direct(kernel, kernel.shape[1], *kernel.reduce_shape, t):
        impl = Contract.DIRECT
    elif conv and blas.conv_weight_grad(kernel, plan) and _direct(kernel, *kernel.global_shape, t):
        impl = Contract.WGRAD
    else:
        impl = Contract.BLAS
    if chunk is not None and chunk.size != 1 and props.native_pieces and \
            math.prod(kernel.shape) // kernel.shape[chunk.axis] >= t.one_index_min_work:
        chunk = blas.Chunk(chunk.axis, 1)  # compiled pieces pay a call per piece: smaller copies win
    if chunk is None and impl is Contract.BLAS:
        chunk = _batch_pieces(kernel, plan, props)
    opts = [Opt(OptOps.CONTRACT, impl)]
    opts += [Opt(OptOps.BATCH, lead)] if lead else []
    opts += [Opt(OptOps.CHUNK, chunk.size, chunk.axis)] if chunk is not None else []
    subs = [*plan.prologues, *([plan.epilogue] if plan.epilogue is not None else [])]
    for j, sub in enumerate(subs):
        opts += _loop_threads(sub, t, j)
    return tuple(opts)


def plan_for(kernel: Kernel) -> BlasPlan | None:
    """The BLAS plan of a kernel the optimizer made a contraction (any CONTRACT opt but LOOP): blas.analyse
    with the batch axes (BATCH) and pieces (CHUNK) its opts say; None for any other kernel."""
    if not find(kernel.opts, OptOps.CONTRACT):
        return None
    plan = blas.analyse(kernel)
    lead = find(kernel.opts, OptOps.BATCH)
    plan = blas.with_lead(plan, lead) if lead else plan
    chunk = next((o for o in kernel.opts if o.op is OptOps.CHUNK), None)
    return plan if chunk is None else blas.with_chunk(kernel, plan, chunk.axis, chunk.arg)


def sub_threads(kernel: Kernel, j: int) -> bool:
    """Whether a BLAS plan's sub-kernel j (its computed operands, then its epilogue) runs on threads."""
    return any(o.op is OptOps.THREADS and o.axis == j for o in kernel.opts)


def piece_pair(k1: Kernel, k2: Kernel, reads: tuple[int, ...], props: DeviceProps) -> blas.PiecePair | None:
    """k1 (optimized for this device) and the elementwise k2 after it as a piece pair (blas.piece_pair)."""
    t = props.host
    pair = blas.piece_pair(k1, k2, reads, plan_for(k1), t.pair_min_result, t.pair_max_points,
                           chunk_elems(props))
    level = _level(pair.sub, t) if pair is not None else ()
    return dataclasses.replace(pair, sub=pair.sub.with_opts(pair.sub.opts + level)) if level else pair


def scatter_input_grad(k1: Kernel, k2: Kernel, reads: tuple[int, ...], props: DeviceProps) -> Col2Im | None:
    """A piece pair that is a convolution's input gradient to run as one scatter (emit_numba_conv.
    render_input_grad), or None: at least `direct_min_channels` input channels (the vectorized loop),
    `direct_min_work` multiply-adds, at most `pair_max_points` window shares an image (where the pair's
    sums were checked point by point before the op marked them; past it the scatter is not measured), and
    a shape where the scatter is faster (`scatter_*`)."""
    t, plan = props.host, plan_for(k1)
    if plan is None or k1.n_global != 4 or k1.contraction != COL2IM:
        return None
    _, chans, taps, pixels = k1.global_shape
    if chans < t.direct_min_channels or taps > t.scatter_max_taps or math.prod(k1.shape) < t.direct_min_work:
        return None
    if chans * taps * pixels > t.pair_max_points:
        return None
    cout = k1.reduce_shape[0]
    if cout > 2 * t.scatter_max_k or (cout > t.scatter_max_k and pixels > t.scatter_small_image):
        return None
    return blas.conv_input_grad(k1, k2, reads, plan)
