"""BLAS for the CPU runtime: the reduce of a matmul-shaped kernel (opt/host.py `plan_for`) as numpy.matmul
on strided views of its operands (`BlasCall`), copying out (im2col) only operands whose axes do not merge;
a plan with a Chunk runs as matmuls over pieces of one axis, on threads each with a one-thread BLAS
(`_run_pieces`). Also the settings of numpy's OpenBLAS that tgrad changes (its idle threads' spinning,
the per-thread thread count), found in the process's loaded libraries."""

from __future__ import annotations

import concurrent.futures
import ctypes
import math
import os
import threading

import numpy as np

from tgrad import config
from tgrad.blas import BlasPlan, Operand
from tgrad.fuse import Kernel
from tgrad.runtime.cpu import gemm as cpu_gemm
from tgrad.runtime.cpu.gemm import openblas as _openblas
from tgrad.runtime.cpu.memory import HostMemory
from tgrad.runtime.cpu.pool import threads


def openblas_idle_timeout(log2_cycles: int) -> bool:
    """Make numpy's OpenBLAS threads sleep soon after they go idle instead of spinning for 2**28 cycles:
    a thread spinning after each matmul took a core from tgrad's threaded kernels that ran next (2 cores,
    3 busy threads), so the MNIST CNN step's generated kernels ran much slower; the GPT and MLP steps,
    whose matmuls come back to back, keep their speed at 2**21 (far lower, each call woke the threads and
    they slowed down; measured: bench/HISTORY.md).
    OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when its threads start: this sets it, re-reads it and restarts
    them (OpenBLAS's own entry points). Skipped when the variable is set (it is the user's choice), with
    TGRAD_OPENBLAS_IDLE=0, or where numpy's BLAS is not an OpenBLAS with those entry points (Linux only).
    Called when the CPU device opens, before any of its threads run a matmul. Returns whether it did."""
    if config.is_set("OPENBLAS_THREAD_TIMEOUT") or not config.on("TGRAD_OPENBLAS_IDLE"):
        return False
    done = False
    for lib in _openblas():
        config.put("OPENBLAS_THREAD_TIMEOUT", str(log2_cycles))
        try:
            lib.openblas_read_env()
        finally:
            config.put("OPENBLAS_THREAD_TIMEOUT", None)  # not passed on to child processes
        if lib.openblas_thread_timeout() == log2_cycles:
            lib.blas_thread_shutdown_()
            lib.blas_thread_init()
            done = True
    return done


def _view(array: np.ndarray, op: Operand, axes: list[int], sizes: tuple[int, ...]) -> np.ndarray:
    item = array.itemsize
    return np.ndarray(
        tuple(sizes[a] for a in axes),
        array.dtype,
        buffer=array,
        offset=op.offset * item,
        strides=tuple(op.strides[a] * item for a in axes),
    )


def _inner_run(v: np.ndarray) -> int:
    """Elements of v's trailing axes that lie next to each other in memory."""
    run = 1
    for n, st in zip(reversed(v.shape), reversed(v.strides)):
        if st != run * v.itemsize:
            break
        run *= n
    return run


def _stored(x: np.ndarray) -> int:
    """Elements a view reads (a batch axis broadcast with stride 0 reads the same matrix again)."""
    return math.prod(d for d, st in zip(x.shape, x.strides) if st)


def _read_transposed(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a @ b runs faster as (b.T @ a.T).T: OpenBLAS reads a big operand slower when it is stored
    column by column (a conv's im2col laid out window-major; measured: bench/HISTORY.md), so the bigger
    one (or both)."""
    return _column_major(a if _stored(a) >= _stored(b) else b) or (_column_major(a) and _column_major(b))


def _column_major(x: np.ndarray) -> bool:
    """Whether a (*batch, rows, cols) matrix is stored column by column (BLAS reads it transposed)."""
    return x.shape[-2] > 1 and x.shape[-1] > 1 and x.strides[-2] == x.itemsize != x.strides[-1]


class BlasCall:
    """A matmul-shaped kernel's reduce result (`plan`, opt/host.py `plan_for`), row-major over its global
    axes, in an array from `memory` (the caller releases it). With `out` (the kernel's flat output) and a
    result already in that order, BLAS writes into it and the call returns None. `after(start, rows)` (a
    plan whose Chunk cuts axis 0 into rows) runs on each piece's thread with that piece's rows of the
    result (a piece pair): rows of `out`, or with `out` None rows in a buffer of the thread, which the
    whole result never reaches. How the operands are viewed, copied and oriented depends only on the plan
    and the arrays' dtypes (every buffer is flat): worked out at the first call with those dtypes
    (`_Matmul`) and kept, a call then costs a little Python instead of the planning again (a GPT step
    makes 46; measured: bench/HISTORY.md)."""

    def __init__(self, plan: BlasPlan, kernel: Kernel, native=None):
        self.plan, self.kernel = plan, kernel
        self.ways: dict[tuple, _Matmul] = {}
        # native(program, arrays, ints, n) runs a compiled function of the split signature on range(n) on
        # the native workers, without the GIL (the CPU runtime's; cpu_gemm's pieces use it)
        self.native = native

    def __call__(self, arrays: list[np.ndarray], memory: HostMemory, out: np.ndarray | None = None,
                 after=None) -> np.ndarray | None:
        plan = self.plan
        with np.errstate(all="ignore"):  # nan and inf propagate as in every kernel, without numpy's warnings
            if plan.chunk is not None:
                return _run_pieces(plan, self.kernel, arrays, memory, out, after, self.native)
            a, b = arrays[plan.a.input], arrays[plan.b.input]
            key = (a.dtype, b.dtype, None if out is None else (out.dtype, out.flags.c_contiguous))
            way = self.ways.get(key)
            if way is None:
                way = self.ways[key] = _Matmul(plan, self.kernel, a, b, out)
            return way(a, b, memory, out)


    def bind(self, arrays: list[np.ndarray], out: np.ndarray) -> tuple | None:
        """(cpu_gemm's gemm_batch arguments after its three arrays, which input each of A and B is), where
        this matmul is one BLAS call per batch matrix reading both operands in place and writing `out` in
        its order (TinyJit's batched replay makes it a record, cpu_batch); else None."""
        plan = self.plan
        if plan.chunk is not None or not cpu_gemm.enabled():
            return None
        a, b = arrays[plan.a.input], arrays[plan.b.input]
        key = (a.dtype, b.dtype, (out.dtype, out.flags.c_contiguous))
        way = self.ways.get(key)
        if way is None:
            way = self.ways[key] = _Matmul(plan, self.kernel, a, b, out)
        if any(side.copy for side in way.sides) or not (way.direct and way.in_order) or way.swap:
            return None
        # a matrix times a vector: numpy's matmul calls gemv, which streams the matrix at memory speed; as a
        # one-row gemm record, GPT-2's decode step took 1.6x as long (bench/HISTORY.md)
        if 1 in way.dims[-2:]:
            return None
        x, y = (side.matrix(array, 0, None) for side, array in zip(way.sides, (a, b)))
        ints = _gemm_ints(x, y, (a, b), out.reshape(way.dims))
        return None if ints is None else (ints, (plan.a.input, plan.b.input))


def _gemm_ints(x: np.ndarray, y: np.ndarray, roots: tuple, c: np.ndarray) -> tuple | None:
    """gemm_batch's int arguments (batch size first) for c = x @ y, x and y views of the flat arrays `roots`
    and c contiguous with at most one batch axis; None where one gemm per matrix cannot read them (another
    dtype, neither rows nor columns of an operand along memory)."""
    if not (x.dtype == y.dtype == c.dtype and c.dtype in (np.float32, np.float64) and c.ndim <= 3
            and x.shape[:-2] == y.shape[:-2] == c.shape[:-2] and c.size and x.shape[-1]):
        return None
    ints = []
    for view, root in zip((x, y), roots):
        flags = cpu_gemm.matrix_flags(view[0] if view.ndim == 3 else view)
        at = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        if flags is None or at % view.itemsize or (view.ndim == 3 and view.strides[0] % view.itemsize):
            return None
        ints += [*flags, at // view.itemsize, view.strides[0] // view.itemsize if view.ndim == 3 else 0]
    (m, n), k = c.shape[-2:], x.shape[-1]
    ta, lda, a_off, a_bs, tb, ldb, b_off, b_bs = ints
    return (c.shape[0] if c.ndim == 3 else 1, m, n, k, ta, lda, a_off, a_bs, tb, ldb, b_off, b_bs, m * n, n)


class _Matmul:
    """BlasCall without a Chunk, for operands of given dtypes: one numpy.matmul over views of the operands
    (copies of those whose axes do not merge, `_Side`), oriented as `_read_transposed` says."""

    def __init__(self, plan: BlasPlan, kernel: Kernel, a: np.ndarray, b: np.ndarray, out: np.ndarray | None):
        shape, ng = kernel.shape, kernel.n_global
        r = list(range(ng, len(shape)))  # the reduce axes: K of the matmul (a conv has three)
        self.sides = (_Side(a, plan.a, plan.batch, plan.m, r, shape),
                      _Side(b, plan.b, plan.batch, r, plan.n, shape))
        x, y = (side.layout for side in self.sides)
        m, n = plan.m, plan.n
        # c.T = b.T @ a.T where a copied operand (im2col) is laid out column by column: operands read in
        # place are passed as they are (BLAS's transposed flag), which ran faster than swapping and
        # putting the result back in order, an extra pass (GPT/MLP weight gradients; measured:
        # bench/HISTORY.md)
        self.swap = any(side.copy for side in self.sides) and _read_transposed(x, y)
        if self.swap:  # compute c.T = b.T @ a.T instead
            m, n = n, m
        order = [*plan.batch, *m, *n]
        size = lambda axes: math.prod(shape[i] for i in axes)  # noqa: E731
        self.dims = (*(shape[i] for i in plan.batch), size(m), size(n))
        self.size = math.prod(self.dims)
        self.dtype = np.result_type(x, y)
        self.in_order = order == list(range(ng))  # the result's rows are the output's
        # the output takes the result itself (in order: BLAS writes it; else the rows are put in order there)
        self.direct = out is not None and out.dtype == self.dtype and out.flags.c_contiguous
        self.ordered = tuple(shape[i] for i in order)
        self.back = tuple(order.index(i) for i in range(ng))
        self.global_shape = tuple(shape[:ng])

    def __call__(self, a: np.ndarray, b: np.ndarray, memory: HostMemory, out: np.ndarray | None):
        bufs = [side.buffer(memory) for side in self.sides]  # im2col copies
        try:
            x, y = (side.matrix(array, 0, buf) for side, array, buf in zip(self.sides, (a, b), bufs))
            if self.swap:
                x, y = y.swapaxes(-1, -2), x.swapaxes(-1, -2)
            if self.direct and self.in_order:
                np.matmul(x, y, out=out.reshape(self.dims))
                return None
            c = np.matmul(x, y, out=memory.array(self.size, self.dtype).reshape(self.dims))
            if self.in_order:
                return c.reshape(-1)
            # rows in another order: put them in the output's (into `out` itself when it takes the result)
            acc = out if self.direct else memory.array(c.size, self.dtype)
            acc.reshape(self.global_shape)[...] = c.reshape(self.ordered).transpose(self.back)
            memory.release(c)
            return None if self.direct else acc
        finally:
            for buf in bufs:
                if buf is not None:
                    memory.release(buf)


class Tiered:
    """A matmul's slower way (BLAS) until `get` gives the function of its faster one, then that (made by
    `make`); see CPURuntime._when_ready."""

    def __init__(self, get, make, slow):
        self.get, self.make, self.slow, self.fast = get, make, slow, None

    def __call__(self, arrays: list[np.ndarray], memory: HostMemory, out: np.ndarray | None = None):
        if self.fast is None:
            fn = self.get()
            if fn is not None:
                self.fast = self.make(fn)
        return (self.slow if self.fast is None else self.fast)(arrays, memory, out=out)


class DirectConv:
    """BlasCall's part for a direct convolution (emit_numba_conv): packs the forward's weight over the kernel
    axes its Program names (launch fact `pack`) from its operand's view (_view, as BLAS reads it;
    a weight gradient reads both operands in place), then runs the generated function over the images on
    the threaded kernels' threads; the sums come out in the kernel's order, into `out` itself when it
    takes them."""

    def __init__(self, function, plan: BlasPlan, kernel: Kernel, pack: list[int] | None):
        self.function, self.plan, self.shape, self.pack = function, plan, kernel.shape, pack
        self.size = math.prod(kernel.global_shape)

    def __call__(self, arrays: list[np.ndarray], memory: HostMemory, out: np.ndarray | None = None):
        a, b = arrays[self.plan.a.input], arrays[self.plan.b.input]
        if self.pack is not None:
            b = np.ascontiguousarray(_view(b, self.plan.b, self.pack, self.shape))
        direct = out is not None and out.dtype == a.dtype
        acc = out if direct else memory.array(self.size, a.dtype)
        self.function(acc, a, b)
        return None if direct else acc

def _run_pieces(plan: BlasPlan, kernel: Kernel, arrays: list[np.ndarray], memory: HostMemory,
                out: np.ndarray | None, after=None, native=None) -> np.ndarray | None:
    """BlasCall of a plan with a Chunk: one matmul per piece of the chunk axis, each copying only its
    piece of the windows (im2col), which BLAS then reads from cache. The pieces run on `threads()` Python
    threads, each calling a one-thread BLAS (numpy releases the GIL in copies and matmuls): a conv's
    images are split between the cores, the way PyTorch's CPU convolutions split them. Pieces of global
    axis 0 write rows of the result; pieces of a reduce axis each give a whole result, summed. How a
    piece's operands are viewed or copied is worked out once per layout (`_side`): a piece costs a little
    Python, not the general path's planning, which two threads would wait on each other for (the GIL).
    With `native` (and numpy's BLAS as cpu_gemm needs it) the pieces run as cpu_gemm's compiled functions
    instead: blas_pieces, or pair_pieces for a piece pair (`after.native`), shifted_pieces for shifts."""
    ch, shape, ng = plan.chunk, kernel.shape, kernel.n_global
    if ch.shift is not None and after is None:
        return _run_shifted(plan, kernel, arrays, memory, out, native)
    sub = (*shape[: ch.axis], ch.size, *shape[ch.axis + 1 :])
    r = list(range(ng, len(shape)))
    operands = (arrays[plan.a.input], arrays[plan.b.input])
    sides = [_side(operands[0], plan.a, plan.batch, plan.m, r, sub, ch.axis),
             _side(operands[1], plan.b, plan.batch, r, plan.n, sub, ch.axis)]
    a, b = sides[0].layout, sides[1].layout
    m, n, swap = plan.m, plan.n, False
    # pieces of rows keep their result in the output's order where either orientation gives it (the
    # col2im matmul of one image, swapped by _Matmul's rule, copied each 1.28 MB result transposed);
    # otherwise, and for pieces of K (whose small results are summed), _Matmul's rule
    natural, rows = [*plan.batch, *m, *n] == list(range(ng)), ch.axis < ng
    if rows and not natural and [*plan.batch, *n, *m] == list(range(ng)):
        m, n, swap = n, m, True  # c.T = b.T @ a.T comes out in the output's order
    elif not (rows and natural) and _read_transposed(a, b):
        m, n, swap = n, m, True  # as _Matmul: c.T = b.T @ a.T
    order = [*plan.batch, *m, *n]
    dims = (*(sub[x] for x in plan.batch), math.prod(sub[x] for x in m), math.prod(sub[x] for x in n))
    dtype = np.result_type(a, b)
    in_order = order == list(range(ng))
    back = tuple(order.index(x) for x in range(ng))
    ordered = tuple(sub[x] for x in order)
    total = math.prod(shape[:ng])
    direct = out is not None and out.dtype == dtype and out.flags.c_contiguous
    if after is not None and not (rows and (direct or out is None)):
        raise ValueError(f"{kernel.name}: a piece pair needs its matmul's pieces as rows of its output")
    kept = after is not None and out is None  # the pieces' rows stay in their threads' buffers
    result = (out if direct else memory.array(total, dtype)) if rows and not kept else None
    per = math.prod(dims)  # elements of a piece's product
    states: list[dict] = []
    spec = None
    pair = getattr(after, "native", None)
    if native is not None and pair is not None and cpu_gemm.enabled():
        found = cpu_gemm.pair_words(plan, sub, ng, sides, operands, dtype, ch.size * (total // shape[0]),
                                    shape[ch.axis] // ch.size, ch.size, per, kept, pair, threads())
        if found is not None:
            _run_pair(native, *found, operands, dtype, result, memory)
            return None if direct or kept else result
    if native is not None and after is None and not plan.batch and cpu_gemm.enabled():
        spec = cpu_gemm.pieces_spec(plan, sub, ng, sides, operands, dtype, rows,
                                    ch.size * (total // shape[0]), shape[ch.axis] // ch.size, threads())

    def piece(start: int, state: dict | None) -> dict:
        if state is None:  # this thread's copy buffers, product and (K pieces) sum
            state = {"bufs": [side.buffer(memory) for side in sides], "tmp": memory.array(per, dtype)}
            if kept:
                state["rows"] = memory.array(per, dtype)
            if not rows:
                state["acc"] = memory.array(total, dtype)
                state["acc"][:] = 0
            states.append(state)
        x, y = (side.matrix(array, start, buf) for side, array, buf in zip(sides, operands, state["bufs"]))
        if swap:
            x, y = y.swapaxes(-1, -2), x.swapaxes(-1, -2)
        if rows:
            target = state["rows"] if kept else result[start * (total // shape[0]) : (start + ch.size) *
                                                            (total // shape[0])]
            if in_order:
                np.matmul(x, y, out=target.reshape(dims))
            else:
                c = np.matmul(x, y, out=state["tmp"].reshape(dims))
                target.reshape(sub[:ng])[...] = c.reshape(ordered).transpose(back)
            if after is not None:
                after(start, target)
        else:
            c = np.matmul(x, y, out=state["tmp"].reshape(dims))
            acc = state["acc"] if in_order else state["acc"].reshape(shape[:ng])
            acc += c.reshape(-1) if in_order else c.reshape(ordered).transpose(back)
        return state

    try:
        if spec is not None:  # the pieces in slots, each with its copy buffers and (pieces of K) its sum
            srcs = [operands[i] for i in spec.order]  # A, B of the call, then their copies (or anything)
            lens = [sides[i].copy or 0 for i in spec.order]
            bufs = [memory.array(spec.slots * n, dtype) if n else src for n, src in zip(lens, srcs)]
            target = result if rows else memory.array(spec.slots * total, dtype)
            tmp = memory.array(spec.slots * spec.scatter, dtype) if spec.scatter else target
            states.append({"bufs": [b for b, n in zip(bufs, lens) if n], "acc": None if rows else target,
                           "tmp": tmp if spec.scatter else None})  # (each slot's first piece sets its sum)
            ints = (*spec.ints, shape[ch.axis] // ch.size, spec.slots, *lens, spec.scatter,
                    0 if rows else total)
            _PIECES.native(native, cpu_gemm.program(dtype, "blas_pieces"), [*srcs, *bufs, target, tmp], ints,
                           spec.slots)
            if rows:
                return None if direct else result
            acc = cpu_gemm.slot_sum(target, spec.slots, memory)
        else:
            _PIECES.run(piece, range(0, shape[ch.axis], ch.size))
            if rows:
                return None if direct or kept else result
            acc = states[0].pop("acc")
            for st in states[1:]:
                acc += st["acc"]
        if direct:
            out[:] = acc
            memory.release(acc)
            return None
        return acc
    finally:
        _release(memory, states)


def _run_shifted(plan: BlasPlan, kernel: Kernel, arrays: list[np.ndarray], memory: HostMemory,
                 out: np.ndarray | None, native=None) -> np.ndarray | None:
    """_run_pieces of a plan whose Chunk has a shift (L, P) (blas._shift_pair: a stride-1 conv's windows,
    one image per piece): each piece copies the windows without L and with P extended (X: rows the side
    that held L, columns P's side), then for each index l of L multiplies the other operand at L = l by
    X's columns shifted by l indices of P. L in K (a forward): the l products are summed into the piece's
    rows of the result; L global (a weight gradient, pieces of K): each l product is the result's L = l
    slice, summed over the pieces per thread. Without L the copy is a fraction of im2col's, and it was most
    of the time saved (MNIST conv2's forward and weight gradient; measured: bench/HISTORY.md)."""
    ch, shape, ng = plan.chunk, kernel.shape, kernel.n_global
    L, P = ch.shift
    r = list(range(ng, len(shape)))
    sub = [1 if x == ch.axis else d for x, d in enumerate(shape)]
    c_is_a = bool(plan.a.strides[L] and plan.a.strides[P])
    c_op, o_op = (plan.a, plan.b) if c_is_a else (plan.b, plan.a)
    c_side, o_side = (list(plan.m), list(plan.n)) if c_is_a else (list(plan.n), list(plan.m))
    l_in_k = L >= ng
    xcols = c_side if l_in_k else r
    xrows = [x for x in (r if l_in_k else c_side) if x != L]
    ext = list(sub)
    ext[P] = sub[P] + sub[L] - 1
    c_arr, o_arr = arrays[c_op.input], arrays[o_op.input]
    xside = _side(c_arr, c_op, [], xrows, xcols, ext, ch.axis, transpose=False)
    step = math.prod(ext[x] for x in xcols[xcols.index(P) + 1 :])  # X's columns per index of P
    ncols = math.prod(sub[x] for x in xcols)
    nl = sub[L]
    # the other operand at each l: (M, K') for L in K, (K, M) for L global (the same for every l)
    o_ops = [Operand(o_op.input, o_op.offset + l * o_op.strides[L], o_op.strides) for l in range(nl)]
    o_dims = (o_side, xrows) if l_in_k else (r, o_side)
    o_sides = [_side(o_arr, o, [], *o_dims, sub, ch.axis) for o in (o_ops if o_op.strides[L] else o_ops[:1])]
    fixed = not o_op.strides[ch.axis]  # the other operand is the same for every piece: made once
    scratch: list[np.ndarray] = []
    o_fixed = []
    if fixed:
        for side in o_sides:
            buf = side.buffer(memory)
            if buf is not None:
                scratch.append(buf)
            o_fixed.append(side.matrix(o_arr, 0, buf))
    dtype = np.result_type(c_arr.dtype, o_arr.dtype)
    total = math.prod(shape[:ng])
    direct = out is not None and out.dtype == dtype and out.flags.c_contiguous
    m_size = math.prod(sub[x] for x in o_side)
    per = m_size * (ncols if l_in_k else math.prod(sub[x] for x in xrows))
    result = out if direct else memory.array(total, dtype)
    rows_per = total // shape[0]
    order = [*xrows, *o_side]  # a weight-gradient-like product's axes (L global): put in the result's order
    back = () if l_in_k else tuple(order.index(x) for x in range(ng) if x != L)
    ordered = tuple(sub[x] for x in order)
    states: list[dict] = []
    spec = None
    if native is not None and cpu_gemm.enabled():
        spec = cpu_gemm.shifted_spec(xside, c_arr, o_arr, o_sides, o_fixed, fixed, dtype, l_in_k, nl, m_size,
                                     ncols, step, rows_per, shape[ch.axis], memory, scratch, threads())

    def piece(start: int, state: dict | None) -> dict:
        if state is None:
            state = {"x": xside.buffer(memory), "tmp": memory.array(per, dtype),
                     "o": [] if fixed else [side.buffer(memory) for side in o_sides]}
            if not l_in_k:  # the thread's sums of the l products, as they come out: (l, X's rows, M)
                state["acc"] = memory.array(nl * per, dtype)
                state["acc"][:] = 0
            states.append(state)
        x = xside.matrix(c_arr, start, state["x"])
        mats = o_fixed or [side.matrix(o_arr, start, buf) for side, buf in zip(o_sides, state["o"])]
        tmp = state["tmp"]
        if l_in_k:
            target = result[start * rows_per : (start + ch.size) * rows_per].reshape(m_size, ncols)
            for l in range(nl):
                o = mats[min(l, len(mats) - 1)]
                if l == 0:
                    np.matmul(o, x[:, :ncols], out=target)
                else:
                    np.matmul(o, x[:, l * step : l * step + ncols], out=tmp.reshape(m_size, ncols))
                    target += tmp.reshape(m_size, ncols)
        else:
            acc, o = state["acc"].reshape(nl, -1, m_size), mats[0]
            for l in range(nl):
                acc[l] += np.matmul(x[:, l * step : l * step + ncols], o, out=tmp.reshape(-1, m_size))
        return state

    try:
        if spec is not None:  # the pieces in slots, each with its copy buffer and (L global) its sums
            x = memory.array(spec.slots * xside.copy, dtype)
            acc = x if l_in_k else memory.array(spec.slots * nl * per, dtype)  # (slots: first piece sets)
            states.append({"x": x, "acc": None if l_in_k else acc})
            ints = (*spec.ints, shape[ch.axis], spec.slots, xside.copy, 0 if l_in_k else nl * per)
            _PIECES.native(native, cpu_gemm.program(dtype), [c_arr, x, spec.o, result if l_in_k else acc],
                           ints, spec.slots)
            sums = None if l_in_k else cpu_gemm.slot_sum(acc, spec.slots, memory)
            states.append({"sum": sums})
        else:
            _PIECES.run(piece, range(0, shape[ch.axis], ch.size))
            sums = None if l_in_k else states[0]["acc"]
            for st in states[1:] if sums is not None else ():
                sums += st["acc"]
        if l_in_k:
            return None if direct else result
        whole = result.reshape(shape[:ng])
        for l, part in enumerate(sums.reshape(nl, *ordered)):  # into the result's L = l slice
            whole[(slice(None),) * L + (l,)] = part.transpose(back)
        return None if direct else result
    finally:
        _release(memory, [{"o": scratch}, *states])


def _run_pair(native, words: np.ndarray, order: tuple, operands: tuple, dtype, result: np.ndarray | None,
              memory: HostMemory) -> None:
    """cpu_gemm's pair_pieces on `words` (`cpu_gemm.pair_words`): each piece's rows into `result` (None: the
    group keeps them, in slot buffers), then the second kernel over them. Raises if that kernel failed."""
    slots = int(words[cpu_gemm.W_NSLOTS])
    srcs = [operands[i] for i in order]
    lens = [int(words[cpu_gemm.W_ALEN]), int(words[cpu_gemm.W_BLEN])]
    bufs = [memory.array(slots * n, dtype) if n else src for n, src in zip(lens, srcs)]
    rows = memory.array(slots * int(words[cpu_gemm.W_ROWS]), dtype) if result is None else result
    try:
        _PIECES.native(native, cpu_gemm.program(dtype, "pair_pieces"), [*srcs, *bufs, rows, words], (), slots)
    finally:
        for buf, n in zip(bufs, lens):
            if n:
                memory.release(buf)
        if result is None:
            memory.release(rows)
    if words[cpu_gemm.W_STATUS]:
        raise RuntimeError(f"a piece pair's second kernel returned error status {words[cpu_gemm.W_STATUS]}")


def _release(memory: HostMemory, states: list[dict]) -> None:
    """Give back every array the pieces' threads took (a state's values: arrays, None, lists of them)."""
    for st in states:
        for value in st.values():
            for array in value if isinstance(value, list) else [value]:
                if array is not None:
                    memory.release(array)


class _Side:
    """One operand of a matmul (`_Matmul`) or of a piece of one (`_run_pieces`, pieces of `axis`): its
    (*batch, rows, cols) matrix, a view of the array at the piece's offset, or (a conv's windows, whose
    axes do not merge) a copy of that view into a buffer, in the order (rows, cols) or (cols, rows)
    whose innermost run of neighbouring elements is longer: numpy copies long runs much faster than short
    ones (a 5x5 window's rows; measured: bench/HISTORY.md); BLAS reads the transposed copy through its
    flags."""

    def __init__(self, array: np.ndarray, op: Operand, batch, rows, cols, sub, axis: int | None = None,
                 transpose: bool = True):
        self.dtype, self.item = array.dtype, array.itemsize
        self.offset, self.step = op.offset, 0 if axis is None else op.strides[axis]
        lead = tuple(sub[x] for x in batch)
        nr, nc = math.prod(sub[x] for x in rows), math.prod(sub[x] for x in cols)
        v = _view(array, op, [*batch, *rows, *cols], sub)
        self.copy = None
        try:
            self.matrix0 = v.reshape(*lead, nr, nc, copy=False)
            self.shape, self.strides = self.matrix0.shape, self.matrix0.strides
            return
        except ValueError:
            pass
        t = _view(array, op, [*batch, *cols, *rows], sub)
        src, self.transposed = (t, True) if transpose and _inner_run(t) > _inner_run(v) else (v, False)
        self.shape, self.strides, self.lead, self.nr, self.nc = src.shape, src.strides, lead, nr, nc
        self.copy = src.size

    @property
    def layout(self) -> np.ndarray:
        """A matrix laid out as every piece's is (an empty buffer of a copy's size where it is a copy):
        what `_read_transposed` looks at."""
        return self.matrix0 if self.copy is None else self._as_matrix(np.empty(self.copy, self.dtype))

    def _as_matrix(self, buf: np.ndarray) -> np.ndarray:
        if self.transposed:
            return buf.reshape(*self.lead, self.nc, self.nr).swapaxes(-1, -2)
        return buf.reshape(*self.lead, self.nr, self.nc)

    def buffer(self, memory: HostMemory) -> np.ndarray | None:
        return None if self.copy is None else memory.array(self.copy, self.dtype)

    def matrix(self, array: np.ndarray, start: int, buf: np.ndarray | None) -> np.ndarray:
        """The piece at `start` of `array` (of the dtype this was made for): a view, or copied into buf."""
        view = np.ndarray(self.shape, self.dtype, buffer=array,
                          offset=(self.offset + start * self.step) * self.item, strides=self.strides)
        if buf is None:
            return view
        np.copyto(buf.reshape(self.shape), view)
        return self._as_matrix(buf)


_SIDES: dict[tuple, _Side] = {}  # _side's: every chunked matmul of a step made them anew (Python, each call)


def _side(array: np.ndarray, op: Operand, batch, rows, cols, sub, axis: int | None = None,
          transpose: bool = True) -> _Side:
    """_Side(...), made once per layout: it depends on the array's dtype and length only. The kept one's
    `matrix0` (an operand read in place) gives the matrix's shape and strides, over no array's memory."""
    key = (array.dtype.str, array.size, op, tuple(batch), tuple(rows), tuple(cols), tuple(sub), axis,
           transpose)
    side = _SIDES.get(key)
    if side is None:
        side = _Side(array, op, batch, rows, cols, sub, axis, transpose)
        if side.copy is None:
            side.matrix0 = np.lib.stride_tricks.as_strided(np.empty(1, side.dtype), side.shape, side.strides)
        if len(_SIDES) > 4096:
            _SIDES.clear()
        _SIDES[key] = side
    return side


class _Pieces:
    """Python threads that run a chunked matmul's pieces (`_run_pieces`), each with a one-thread BLAS
    (`_BlasThreads`). Where numpy's BLAS has no per-thread setting the pieces run one after another on
    the caller, BLAS threading each."""

    def __init__(self):
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.workers, self.pid = 0, os.getpid()
        self.blas: _BlasThreads | None = None
        # one launch at a time: two Python threads' launches would each read the OpenBLAS count the other's
        # pieces had set to 1, and one would set that back (the pieces use every core anyway)
        self.lock = threading.Lock()

    def native(self, native, program, arrays: list[np.ndarray], ints: tuple, n: int) -> None:
        """native(program, arrays, ints, n): cpu_gemm's function on n slots, on the native workers of
        threaded kernels, with numpy's BLAS one-threaded meanwhile (its global count set back after)."""
        if self.blas is None:
            self.blas = _BlasThreads()
        with self.lock:
            saved = self.blas.get()
            self.blas.one()
            try:
                native(program, arrays, ints, n)
            finally:
                self.blas.restore(saved)

    def run(self, piece, starts) -> None:
        """state = piece(start, state) for every start, on up to threads() threads (state None at first
        on each thread)."""
        starts = list(starts)
        if self.blas is None:
            self.blas = _BlasThreads()
        count = min(threads(), len(starts)) if self.blas.local else 1
        if count < 2:
            state = None
            for start in starts:
                state = piece(start, state)
            return
        todo, lock = iter(starts), threading.Lock()

        def worker():
            self.blas.one()
            state = None
            with np.errstate(all="ignore"):  # (numpy's error state is per thread)
                while True:
                    with lock:
                        start = next(todo, None)
                    if start is None:
                        return
                    state = piece(start, state)

        with self.lock:
            if self.executor is None or self.workers < count or self.pid != os.getpid():
                if self.executor is not None and self.pid == os.getpid():
                    self.executor.shutdown(wait=False)
                self.executor = concurrent.futures.ThreadPoolExecutor(count, "tgrad-pieces")
                self.workers, self.pid = count, os.getpid()
            saved = self.blas.get()
            try:
                futures = [self.executor.submit(worker) for _ in range(count)]
                concurrent.futures.wait(futures)
                for f in futures:
                    f.result()
            finally:
                self.blas.restore(saved)


class _BlasThreads:
    """numpy's OpenBLAS, one-threaded for calls from one thread (`openblas_set_num_threads_local`, OpenBLAS
    0.3.27). That call also sets OpenBLAS's global thread count (numpy's 0.3.30 build reports 1 thread
    afterwards, and the main thread's matmuls then ran on one core; measured: bench/HISTORY.md), so the
    count is read before the pieces run and set back after."""

    def __init__(self):
        self.local, self.getters, self.setters = [], [], []
        for lib in _openblas():
            fns = [_symbol(lib, f"openblas_{name}") for name in ("set_num_threads_local", "get_num_threads",
                                                                  "set_num_threads")]
            if all(fns):
                fns[0].argtypes, fns[0].restype = [ctypes.c_int], ctypes.c_int
                fns[1].argtypes, fns[1].restype = [], ctypes.c_int
                fns[2].argtypes, fns[2].restype = [ctypes.c_int], None
                self.local.append(fns[0])
                self.getters.append(fns[1])
                self.setters.append(fns[2])

    def one(self) -> None:
        for fn in self.local:
            fn(1)

    def get(self) -> list[int]:
        return [fn() for fn in self.getters]

    def restore(self, counts: list[int]) -> None:
        for get, put, count in zip(self.getters, self.setters, counts):
            if get() != count:
                put(count)


def _symbol(lib: ctypes.CDLL, name: str):
    """An OpenBLAS entry point by its plain name, or as SciPy's builds (numpy's wheels) rename it
    (scipy_openblas_get_num_threads64_), or None."""
    for full in (name, f"scipy_{name}64_", f"scipy_{name}"):
        fn = getattr(lib, full, None)
        if fn is not None:
            return fn
    return None


_PIECES = _Pieces()
