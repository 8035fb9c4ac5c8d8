"""Render a Kernel as Python source for Numba (the CPU device).

The source is a plain Python function over raw pointers (`out[i] = in0[j] * in1[j]`), marked with
`@kernel()` (tgrad/runtime/cpu/runtime.py compiles it with Numba as a native function without Python wrappers
and keeps its object code on disk).
The kernel becomes nested loops: the global axes outermost, the reduce axes inside with a scalar
accumulator. A kernel big enough to be worth threads runs its outer loop over [lo, hi) (two more
arguments): the runtime's threads each call it on a range (Numba's own parallel loops cost several times
a serial loop's compile time, and start a threading layer; measured: bench/HISTORY.md). Each Expr node is
one local variable, placed at the shallowest loop level whose indices it uses, so loads that do not
depend on the reduce axes are hoisted out of the reduce loop. float16 is computed in float32 (Numba
has no float16 on the CPU): the runtime widens float16 buffers on the way in and narrows on the way
out, and every inexact op with a float16 result (fuse.NARROW_ROUNDED) and a CAST to float16 round with
`_f16`. bfloat16 buffers hold float32 values already rounded to bfloat16; those ops with a bfloat16
result, a CAST to bfloat16 and a bfloat16 accumulator's value round with `_bf16` (float32 arithmetic,
then rounded: PyTorch's CPU semantics).
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from tgrad.blas import BlasPlan, Operand, _affine  # noqa: F401 (re-exported)
from tgrad.dtype import DType, dtypes
from tgrad.fuse import (
    NARROW_ROUNDED,
    Expr,
    Kernel,
    StatementPlacer,
    const,
    from_terms,
    linear_terms,
    reduce_identity,
)
from tgrad.graph import strides_for
from tgrad.loop_axes import flatten, merge_axes, nodes, split_axes
from tgrad.opt.host import plan_for, sub_threads, threads
from tgrad.opt.opts import Contract, HostTuning, OptOps, find, upcasts
from tgrad.program import Program

DEFAULT = HostTuning()  # (renderers are called with the device's HostTuning; tests may leave it out)

# the helpers kernels call live in tgrad/runtime/cpu/numba_rt.py; a digest of that file is part of every
# kernel's source, so kernels cached on disk are rebuilt when the helpers change (the file is read, not
# imported: rendering needs no Numba)
_RT_PATH = Path(__file__).parent / "runtime" / "cpu" / "numba_rt.py"
_RT_DIGEST = hashlib.sha256(_RT_PATH.read_bytes()).hexdigest()[:12]
HEADER = f"""import numpy as np

from tgrad.runtime.cpu.numba_rt import (  # runtime {_RT_DIGEST}
    _acc_add, _acc_mul, _bf16, _exp2f, _f16, _fma, _idiv, _maximum, _opaque, kernel,
)
"""

NARROW = {dtypes.float16: "_f16", dtypes.bfloat16: "_bf16"}  # their rounding functions (numba_rt)
NP_NAME = {dtypes.bool: "np.bool_", dtypes.float16: "np.float32", dtypes.bfloat16: "np.float32"}


def np_type(dtype: DType) -> str:
    """The numpy scalar type used for a dtype inside a kernel (float16 computes as float32)."""
    return NP_NAME.get(dtype, f"np.{dtype.name}")


def storage_dtype(dtype: DType) -> DType:
    """The element type of a kernel's pointer: float16 buffers are widened to float32 by the runtime,
    bool is read and written as uint8 bytes (Numba cannot store its 1-bit bool through a pointer)."""
    return {dtypes.float16: dtypes.float32, dtypes.bfloat16: dtypes.float32, dtypes.bool: dtypes.uint8}.get(
        dtype, dtype
    )


def _ld(element: str, dtype: DType) -> str:
    """A value read from memory (`in0[i]`) as the kernel's dtype."""
    return f"({element} != 0)" if dtype == dtypes.bool else element


def _st(value: str, dtype: DType) -> str:
    """A value of the kernel's dtype as the element written to memory."""
    return f"np.uint8({value})" if dtype == dtypes.bool else value


def render_const(value, dtype: DType) -> str:
    if dtype == dtypes.bool:
        return "True" if value else "False"
    if dtype.is_float:
        if math.isnan(value):
            text = "np.nan"
        elif math.isinf(value):
            text = "np.inf" if value > 0 else "-np.inf"
        else:
            text = repr(float(value))
        return f"{np_type(dtype)}({text})"
    if dtype == dtypes.int64:
        return repr(int(value))
    return f"{np_type(dtype)}({int(value)})"


def _wrap(dtype: DType, text: str) -> str:
    """The result of an op as its dtype. Numba widens small ints (int8 + int8 is int64), so those get a
    cast; float ops on equal float types stay in that type, and int64 ops stay int64 (every op's sources
    have its dtype), so those need none: one call less to type and lower each, a third of a kernel's
    statements."""
    return text if dtype.is_float or dtype in (dtypes.bool, dtypes.int64) else f"{np_type(dtype)}({text})"


def _binary(sym: str):
    return lambda dt, a, b: _wrap(dt, f"{a} {sym} {b}")


# code_for_op: op name -> f(result dtype, *rendered sources) -> source text
code_for_op = {
    "ADD": _binary("+"),
    "SUB": _binary("-"),
    "MUL": _binary("*"),
    "IDIV": lambda dt, a, b: _wrap(dt, f"_idiv({a}, {b})"),
    "MOD": lambda dt, a, b: _wrap(dt, f"{a} - {b} * _idiv({a}, {b})"),
    "MAX": lambda dt, a, b: (
        f"({a} or {b})"
        if dt == dtypes.bool
        else _wrap(dt, f"_maximum({a}, {b})" if dt.is_float else f"max({a}, {b})")
    ),
    "CMPLT": lambda dt, a, b: f"({a} < {b})",
    "CMPNE": lambda dt, a, b: f"({a} != {b})",
    "AND": lambda dt, a, b: f"({a} & {b})",
    "OR": lambda dt, a, b: f"({a} | {b})",
    "XOR": lambda dt, a, b: f"({a} ^ {b})",
    "WHERE": lambda dt, c, a, b: f"({a} if {c} else {b})",
    "EXP2": lambda dt, a: _wrap(dt, f"np.exp2({a})" if dt == dtypes.float64 else f"_exp2f({a})"),
    "LOG2": lambda dt, a: _wrap(dt, f"np.log2({a})"),
    "SIN": lambda dt, a: _wrap(dt, f"np.sin({a})"),
    "SQRT": lambda dt, a: _wrap(dt, f"np.sqrt({a})"),
    "RECIP": lambda dt, a: _wrap(dt, f"{render_const(1, dt)} / {a}"),
    "NEG": lambda dt, a: _wrap(dt, f"-{a}"),
    "TRUNC": lambda dt, a: _wrap(dt, f"np.trunc({a})"),
}


def _cast(src: Expr, dtype: DType, text: str) -> str:
    if dtype == dtypes.bool:
        return f"({text} != 0)"
    if dtype == dtypes.float16:
        return f"_f16(np.float32({text}))"
    if dtype == dtypes.bfloat16:
        return f"_bf16(np.float32({text}))"
    if dtype.is_int and src.dtype.is_float:
        # float -> int32 (int64 for int64), then wrap to a smaller int: what numpy and PyTorch do on x86,
        # so inf, nan and out-of-range values give their INT_MIN ("integer indefinite") too
        if dtype.itemsize < 4:
            return f"{np_type(dtype)}(np.int32({text}))"
        return f"{np_type(dtype)}({text})"
    return f"{np_type(dtype)}({text})"


def _chunks(kernel: Kernel, tuning: HostTuning) -> int:
    """The chunks a threaded full reduction splits its outer axis into (one partial result each)."""
    return min(tuning.reduce_shares, kernel.shape[0])


def scratch(kernel: Kernel, parallel: bool, tuning: HostTuning = DEFAULT
            ) -> tuple[tuple[str, int, DType], ...]:
    """Scratch arrays a kernel's function takes after its inputs (name, length, dtype), allocated by the
    runtime for each launch: the per-chunk partials of a threaded full reduction, or the row of
    accumulators of an interchanged reduction. `kernel` is the compacted kernel `render` renders."""
    k = kernel
    if k.reduce_expr is not None and k.n_global == 0 and parallel:
        return (("partial", _chunks(k, tuning), k.reduce_expr.dtype),)
    if k.reduce_expr is not None and want_interchange(k):
        g = k.n_global - 1
        rows = k.shape[0] if parallel and g > 0 else 1  # threads split axis 0: one row each iteration
        return (("accs", rows * k.shape[g], k.acc_dtype),)
    return ()


class _Renderer(StatementPlacer):
    def __init__(self, kernel: Kernel, length: str | None = None, tuning: HostTuning = DEFAULT):
        super().__init__([a + 1 for a in range(len(kernel.shape))], len(kernel.shape) + 1)
        self.k = kernel
        self.tuning = tuning
        self.length = length  # the loop bound of a 1-D kernel, when it is an argument rather than a number
        self.names: dict[Expr, str] = {}
        self.count = 0
        self.opaque: dict[str, str] = {}  # infinite constants of a MAX reduce -> their hidden name

    def ref(self, e: Expr) -> str:
        if e.op == "IDX":
            return f"i{e.arg[0]}"
        if e.op == "CONST":
            text = render_const(e.arg, e.dtype)
            if self.k.reduce_op == "MAX" and e.dtype.is_float and math.isinf(e.arg):
                # hidden from LLVM, which would otherwise turn a masked max into a reduction it does not
                # vectorize (numba_rt._opaque); defined once before the loops
                return self.opaque.setdefault(text, f"c{len(self.opaque)}")
            return text
        if e.op == "ACC":  # a bfloat16 sum accumulates in float32; its value is rounded
            return "_bf16(acc)" if e.dtype == dtypes.bfloat16 and self.k.reduce_op != "MAX" else "acc"
        name = self.names.get(e)
        if name is None:
            srcs = [self.ref(s) for s in e.srcs]
            if e.op == "LOAD":
                text = _ld(f"in{e.arg}[{srcs[0]}]", e.dtype)
                if srcs[1] != "True":
                    text = f"({text} if {srcs[1]} else {render_const(0, e.dtype)})"
            elif e.op == "CAST":
                text = _cast(e.srcs[0], e.dtype, srcs[0])
            else:
                text = code_for_op[e.op](e.dtype, *srcs)
                if e.dtype in NARROW and e.op in NARROW_ROUNDED:  # computed in float32: rounded per op
                    text = f"{NARROW[e.dtype]}({text})"
            name = self.names[e] = f"v{self.count}"
            self.count += 1
            self.place(e, f"{name} = {text}")
        return name

    def render(self, fname: str, parallel: bool, share: Expr | None = None) -> str:
        """share: an index where the reduce loop also stores each value it reduces (into `shared`), for
        a row group's later kernel that uses those values (render_rows)."""
        k = self.k
        n, ng = len(k.shape), k.n_global
        interchange = k.reduce_expr is not None and want_interchange(k)
        if interchange:  # the last global axis becomes the innermost loop, inside the reduce loops
            self.axis_level = [1 + (a if a < ng - 1 else (n - 1 if a == ng - 1 else a - 1)) for a in range(n)]
        if k.reduce_expr is not None:
            acc_dt = k.reduce_expr.dtype
            val = self.ref(k.reduce_expr)
            if interchange:  # the epilogue runs in a loop of its own: nothing from the reduce nest is reused
                for e in [e for e in self.names if self.level(e) >= ng]:
                    del self.names[e]
                self.post_from = ng
            init = render_const(reduce_identity(k.reduce_op, acc_dt), acc_dt)

            def update(acc: str, v: str) -> str:
                if acc_dt == dtypes.bool:
                    return f"{acc} and {v}" if k.reduce_op == "PROD" else f"{acc} or {v}"
                if acc_dt.is_float and k.reduce_op in ("SUM", "PROD"):  # reorderable: vectorizes
                    return f"{'_acc_add' if k.reduce_op == 'SUM' else '_acc_mul'}({acc}, {v})"
                combine = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX"}[k.reduce_op]
                return code_for_op[combine](acc_dt, acc, v)

        store = self.store = f"out[{self.ref(k.out_index)}] = {_st(self.ref(k.expr), k.out_dtype)}"
        self.acc_dt = k.acc_dtype
        names = ["out"] + [f"in{i}" for i in range(len(k.in_dtypes))]
        names += [name for name, _, _ in scratch(k, parallel, self.tuning)] + (["n"] if self.length else [])
        names += ["lo", "hi"] if parallel else []  # the range of the outer loop this call runs
        args = ", ".join(names)
        # float sums and products accumulate through _acc_add/_acc_mul, which LLVM may reorder (so the
        # reduce loop vectorizes); nothing else is reordered and no other fast-math flag is on
        level = find(k.opts, OptOps.LEVEL)  # (compile.compile_native reads it from the decorator)
        out = [f"@kernel({f'opt={level}' if level else ''})", f"def {fname}({args}):"]
        out += [f"    {c} = _opaque({v})" for v, c in self.opaque.items()]

        def emit(depth: int, stmts: list[str]) -> None:
            out.extend("    " * (depth + 1) + s for s in stmts)

        if k.reduce_expr is not None and ng == 0 and parallel:
            # a full reduction: threads each reduce chunks [lo, hi) of the outermost axis into `partial`;
            # the call with lo == chunks (after every chunk) combines them
            chunks = _chunks(k, self.tuning)
            size = -(-k.shape[0] // chunks)
            emit(0, self.levels[0])
            emit(0, ["for p in range(lo, hi):"])
            end = f"min({k.shape[0]}, (p + 1) * {size})"
            emit(1, [f"acc = {init}"])
            # a float sum adds blocks of about `sum_block` elements, each summed on its own (in vector lanes),
            # into the chunk's sum: each sum in the chain is short, so the error stays near numpy's
            # pairwise sum's instead of growing with the chunk
            blocked = acc_dt.is_float and k.reduce_op == "SUM"
            block = max(1, self.tuning.sum_block // math.prod(k.shape[1:]))
            if blocked:
                emit(1, [f"for b in range(p * {size}, {end}, {block}):", f"    blk = {init}"])
                emit(2, [f"for i0 in range(b, min(b + {block}, {end})):"])
            else:
                emit(1, [f"for i0 in range(p * {size}, {end}):"])
            shift = 1 if blocked else 0
            for depth in range(1, n + 1):
                emit(depth + 1 + shift, self.levels[depth])
                if depth < n:
                    emit(depth + 1 + shift, [f"for i{depth} in range({k.shape[depth]}):"])
            if blocked:
                emit(n + 2, [f"blk = {update('blk', val)}"])
                emit(2, [f"acc = {code_for_op['ADD'](acc_dt, 'acc', 'blk')}"])
            else:
                emit(n + 1, [f"acc = {update('acc', val)}"])
            emit(1, [f"partial[p] = {_st('acc', acc_dt)}"])
            emit(0, [f"if lo == {chunks}:", f"    acc = {init}", f"    for p in range({chunks}):"])
            emit(2, [f"acc = {update('acc', _ld('partial[p]', acc_dt))}"])
            emit(1, self.post + [store])
            return "\n".join(out) + "\n"
        if k.reduce_expr is not None and want_interchange(k):
            return self._render_interchanged(out, emit, val, init, update, parallel)
        for depth in range(n + 1):
            emit(depth, self.levels[depth])
            if depth == ng and k.reduce_expr is not None:
                emit(depth, [f"acc = {init}"])
            if depth < n:
                bounds = "lo, hi" if (depth == 0 and parallel) else (self.length or k.shape[depth])
                emit(depth, [f"for i{depth} in range({bounds}):"])
        if k.reduce_expr is not None:
            also = [f"shared[{self.ref(share)}] = {val}"] if share else []
            emit(n, [f"acc = {update('acc', val)}", *also])
            emit(ng, self.post + [store])
        else:
            emit(n, self.post + [store])
        return "\n".join(out) + "\n"

    def _render_interchanged(self, out, emit, val, init, update, parallel) -> str:
        """Reduce loops outside, the last global axis (unit stride in memory) innermost over a row of
        accumulators, then the epilogue in a loop of its own."""
        k = self.k
        n, ng = len(k.shape), k.n_global
        g = ng - 1
        threaded = parallel and g > 0  # threads split axis 0: each of its iterations has a row of its own
        cell = f"accs[i0 * {k.shape[g]} + i{g}]" if threaded else f"accs[i{g}]"
        for depth in range(n):  # depth < g: outer global axes; g..n-2: reduce axes; n-1: axis g
            axis = depth if depth < g else (depth + 1 if depth < n - 1 else g)
            emit(depth, self.levels[depth])
            if depth == g:
                first = _st(init, self.acc_dt)
                emit(depth, [f"for i{g} in range({k.shape[g]}):", f"    {cell} = {first}"])
            bounds = "lo, hi" if (depth == 0 and threaded) else k.shape[axis]
            emit(depth, [f"for i{axis} in range({bounds}):"])
        emit(n, self.levels[n])
        acc = _ld(cell, self.acc_dt)
        emit(n, [f"{cell} = {_st(update(acc, val), self.acc_dt)}"])
        emit(g, [f"for i{g} in range({k.shape[g]}):"])
        emit(g + 1, [f"acc = {acc}"] + self.post + [self.store])
        return "\n".join(out) + "\n"


def want_interchange(kernel: Kernel) -> bool:
    """Put the reduce loops outside the last global axis when fewer loads then stride through memory in
    the innermost loop: the last global axis walks memory with unit stride and the innermost reduce axis
    does not (sums over a leading axis, conv and pooling backward, a LayerNorm weight's gradient, whose
    per-row mean and scale are constant along the global axis)."""
    k = kernel
    if k.n_global == 0 or k.shape[k.n_global - 1] < 8 or not k.reduce_shape:
        return False
    g, r = k.n_global - 1, len(k.shape) - 1
    unit_g = strided_g = strided_r = 0
    for load in _loads(k.reduce_expr):
        aff = _affine(load.srcs[0], len(k.shape))
        if aff is None:
            continue
        unit_g += abs(aff[1][g]) == 1
        strided_g += abs(aff[1][g]) > 1
        strided_r += abs(aff[1][r]) > 1
    return unit_g > 0 and strided_g < strided_r


def _loads(e: Expr, seen: set | None = None) -> list[Expr]:
    seen = set() if seen is None else seen
    if e in seen:
        return []
    seen.add(e)
    out = [e] if e.op == "LOAD" else []
    for s in e.srcs:
        out += _loads(s, seen)
    return out


def render(kernel: Kernel, tuning: HostTuning = DEFAULT) -> Program:
    """The kernel as a CPU Program, as its opts say (opt/host.py) and the device's tuning. A contraction
    (CONTRACT BLAS, DIRECT, WGRAD) becomes a BLAS call: its launch facts hold the plan (`blas`,
    opt.host.plan_for) and the generated functions around it (`prologues` computing computed operands,
    `epilogue` the stored value from the matmul result, or None when BLAS writes the output itself);
    emit_numba_conv.render adds a direct convolution's function. CONTRACT BATCHED is one generated
    function over a batch of small matmuls (`render_batched`); any other kernel one generated function
    (`render_loops`)."""
    impl = find(kernel.opts, OptOps.CONTRACT)
    if not impl:
        return render_loops(kernel, None, tuning)
    plan = plan_for(kernel)
    if impl == Contract.BATCHED:
        return render_batched(kernel, plan)
    n = len(plan.prologues)
    prologues = tuple(render_loops(p, sub_threads(kernel, j), tuning) for j, p in enumerate(plan.prologues))
    epilogue = None if plan.epilogue is None else render_loops(plan.epilogue, sub_threads(kernel, n), tuning)
    what = "the reduce is a BLAS matmul" if epilogue is not None else "a BLAS matmul"
    source = f"# {kernel.name}: {what} (see opt/host.py)\n" + (epilogue.source if epilogue else "")
    launch = {"blas": plan, "prologues": prologues, "epilogue": epilogue}
    return Program(kernel.name, source, launch=launch)




def render_batched(kernel: Kernel, plan: BlasPlan) -> Program:
    """A batch of small matmuls (CONTRACT BATCHED, opt/host.py: attention's) as one function, the matmuls
    split over threads. Each matmul copies its B to `pack` row by row where B's rows are not
    contiguous, then computes rows of C a pass (its UPCAST on the M axis, opt/host.py:
    HostTuning.batched_rows) at a time: for each column j an accumulator per row, the K products added
    one statement each (K is a constant, so the loop over j is the innermost loop: LLVM vectorizes it,
    each accumulator a vector of columns, B's row a vector load, A's element broadcast), each product
    added with one rounding (`_fma`), as BLAS does. At attention's sizes that runs faster than a BLAS
    call per matmul, whose fixed cost is most of its time (measured: bench/HISTORY.md); rows 1 or 4 a
    pass were slower (4 no longer vectorizes for K = 64)."""
    k = kernel
    reads = tuple(sorted({plan.a.input, plan.b.input}))
    name = {i: f"in{j}" for j, i in enumerate(reads)}
    a_in, b_in, dt = name[plan.a.input], name[plan.b.input], k.reduce_expr.dtype
    (m,), (n,), r = plan.m, plan.n, k.n_global
    rows_m, cols, depth = k.shape[m], k.shape[n], k.shape[r]
    sa, sb = plan.a.strides, plan.b.strides
    so = strides_for(k.global_shape)  # the output: row-major over the global axes (no epilogue)
    count = math.prod(k.shape[b] for b in plan.batch)
    pack = sb[n] != 1
    body = ["for t in range(lo, hi):"]
    rest = "t"  # t counts the matmuls row-major over the batch axes
    for pos, b in reversed(list(enumerate(plan.batch))):
        if pos == 0:
            body.append(f"    i{b} = {rest}")
        else:
            body += [f"    q{pos} = {rest} // {k.shape[b]}", f"    i{b} = {rest} - q{pos} * {k.shape[b]}"]
            rest = f"q{pos}"

    def at(strides, base: int) -> str:
        return " + ".join([str(base), *(f"i{b} * {strides[b]}" for b in plan.batch)])

    body += [f"    oa = {at(sa, plan.a.offset)}", f"    ob = {at(sb, plan.b.offset)}",
             f"    oo = {at(so, 0)}"]
    if pack:
        body += [f"    pb = t * {depth * cols}", f"    for i{r} in range({depth}):",
                 f"        for i{n} in range({cols}):",
                 f"            pack[pb + i{r} * {cols} + i{n}] = "
                 f"{b_in}[ob + i{r} * {sb[r]} + i{n} * {sb[n]}]"]

    def block(first: str, rows: int) -> list[str]:
        lines = [f"    a0 = oa + {first} * {sa[m]}", f"    o0 = oo + {first} * {so[m]}",
                 f"    for i{n} in range({cols}):"]
        lines += [f"        c{j}_0 = {render_const(0, dt)}" for j in range(rows)]
        for kk in range(depth):  # (a name per value: Numba's SSA pass is quadratic in a name's assignments)
            b_at = f"pack[pb + {kk * cols} + i{n}]" if pack else f"{b_in}[ob + {kk * sb[r]} + i{n}]"
            lines.append(f"        w{kk} = {b_at}")
            lines += [f"        c{j}_{kk + 1} = _fma({a_in}[a0 + {j * sa[m] + kk * sa[r]}], w{kk}, c{j}_{kk})"
                      for j in range(rows)]
        return lines + [f"        out[o0 + {j * so[m]} + i{n}] = c{j}_{depth}" for j in range(rows)]

    per = upcasts(kernel.opts).get(m, 1)  # rows of C a pass
    tail = rows_m % per
    if rows_m >= per:
        body.append(f"    for i{m} in range(0, {rows_m - tail}, {per}):")
        body += ["    " + line for line in block(f"i{m}", per)]
    if tail:
        body += block(str(rows_m - tail), tail)
    args = ", ".join(["out", *name.values(), *(["pack"] if pack else []), "lo", "hi"])
    source = "\n".join(["@kernel()", f"def {k.name}({args}):", *("    " + line for line in body)])
    temps = ((count * depth * cols, storage_dtype(dt)),) if pack else ()
    ins = tuple(storage_dtype(k.in_dtypes[i]) for i in reads)
    parallel = find(kernel.opts, OptOps.THREADS) > 0
    launch = {"storage": (storage_dtype(k.out_dtype), *ins, *(t for _, t in temps)),
              "split": count if parallel else 0, "combine": False}
    return Program(k.name, HEADER + "\n\n" + source + "\n", reads=reads, scratch=temps,
                   args=() if parallel else (0, count), launch=launch)


def render_loops(kernel: Kernel, parallel: bool | None = None, tuning: HostTuning = DEFAULT) -> Program:
    """One kernel as one Numba function over raw pointers (source with HEADER), and how it is called:
    `reads` the inputs it loads (the runtime passes only those), then `scratch` arrays, then `args`: the
    length of a kernel that `flatten` made 1-D (so its source does not depend on its shape). Launch facts:
    `storage`, the pointers' element types (output, inputs read, scratch); `split`, 0 for a serial
    function, else how many iterations its outer loop has (threads by `want_parallel` unless `parallel`
    is given): the function then takes two more ints `lo, hi` and runs iterations [lo, hi), so the
    runtime's threads each run a range (`combine`: a full reduction, whose call with lo == split after
    all the others adds the threads' partial results)."""
    if parallel is None:
        parallel = want_parallel(kernel)
    reads = used_inputs(kernel)
    compacted = compact(kernel, reads)
    flat = flatten(compacted)
    if flat is None:
        # (scratch sizes below follow the new axes)
        compacted = split_axes(merge_axes(compacted), tuning.split_min)
        k = compacted
        # an interchanged reduce over one global axis keeps that axis innermost: nothing to split
        parallel = parallel and not (k.reduce_expr is not None and k.n_global == 1 and want_interchange(k))
    combine = parallel and flat is None and compacted.reduce_expr is not None and compacted.n_global == 0
    if flat is not None:
        fname, body = "E_n", _Renderer(flat, "n", tuning).render("E_n", parallel)
        split = math.prod(kernel.shape) if parallel else 0
    else:
        fname, body = kernel.name, _Renderer(compacted, None, tuning).render(kernel.name, parallel)
        split = (_chunks(compacted, tuning) if combine else compacted.shape[0]) if parallel else 0
    temps = tuple((size, storage_dtype(dt)) for _, size, dt in scratch(compacted, parallel, tuning))
    ins = tuple(storage_dtype(kernel.in_dtypes[i]) for i in reads)
    storage = (storage_dtype(kernel.out_dtype), *ins, *(dt for _, dt in temps))
    args = (math.prod(kernel.shape),) if flat is not None else ()
    launch = {"storage": storage, "split": split, "combine": combine}
    return Program(fname, HEADER + "\n\n" + body, reads=reads, scratch=temps, args=args, launch=launch)


def used_inputs(kernel: Kernel) -> tuple[int, ...]:
    """The inputs the kernel loads from, in order (a kernel may be handed buffers it does not read)."""
    k = kernel
    exprs = [k.expr, k.out_index] + ([k.reduce_expr] if k.reduce_expr is not None else [])
    seen: set = set()
    return tuple(sorted({e.arg for x in exprs for e in _loads(x, seen)}))


def compact(kernel: Kernel, used: tuple[int, ...] | None = None) -> Kernel:
    """The kernel with only the inputs it reads (`used_inputs`), renumbered in order: its source then does
    not depend on buffers it ignores (the runtime passes only those)."""
    k = kernel
    used = used_inputs(k) if used is None else used
    if used == tuple(range(len(k.in_dtypes))):
        return k
    return _relabel(k, {old: new for new, old in enumerate(used)}, tuple(k.in_dtypes[i] for i in used))


def want_parallel(kernel: Kernel) -> bool:
    """Whether the kernel's opts put its outer loop on threads (THREADS, opt/host.py)."""
    return any(o.op is OptOps.THREADS and o.axis is None for o in kernel.opts)


# ---------------------------------------------------------------------------------------------------
# row groups: consecutive kernels that each work row by row, as one function with one loop over rows


def _row_local(index: Expr, row: int) -> bool:
    """Whether `index` (of a kernel whose axis 0 counts rows) stays inside row i0 of a buffer laid out as
    rows of `row` elements: index == row * i0 + r with 0 <= r < row by bounds."""
    terms = linear_terms(index)
    on_rows = sum(c for c, t in terms if t is not None and t.op == "IDX" and t.arg[0] == 0)
    rest = from_terms([(c, t) for c, t in terms if not (t is not None and t.op == "IDX" and t.arg[0] == 0)])
    return on_rows == row and rest.vmin >= 0 and rest.vmax < row


Member = tuple[Kernel, tuple[int, ...], int | None]  # a kernel of a row group (see render_rows)


def render_rows(members: list[Member], sizes: dict[int, int], aliases: dict | None = None,
                tuning: HostTuning = DEFAULT) -> Program | None:
    """Kernels run one after another (a softmax's max, its sum of exponentials, its normalisation) as one
    function whose loop over rows runs each kernel's work for that row in turn, so a row read three times
    is read from the cache, not from memory; where the last kernel recomputes the values an earlier one
    reduced (the softmax's exponentials), that reduce stores them in the output and the last kernel reads
    them back. members: (kernel, the group input each of its inputs is, the group input its output is,
    None for the last kernel's, which is the function's `out`); sizes: the elements of the group inputs
    that members write. None when some member does not work row by row on the same rows, or reads
    another's output outside the row being computed (or is a BLAS call, an interchanged reduce...): the
    kernels then run one by one. aliases: group input -> the group input (-1: `out`) that is the same
    buffer (an assign's target and its new value), read through that one name so that LLVM sees one
    pointer and vectorizes (two names for one buffer fail its overlap checks). tuning: the device's (the
    loop over rows runs on threads as opt.host.threads says)."""
    ks, rows, dtype_at = [], None, {}
    for kernel, inputs, out_at in members:
        k = _row_kernel(kernel)
        if k is None:
            return None
        k = _relabel(k, inputs)  # loads name group inputs
        rows = k.shape[0] if rows is None else rows
        size = math.prod(kernel.global_shape)
        if k.shape[0] != rows or size % rows or not _row_local(k.out_index, size // rows):
            return None
        for at in set(inputs) & set(sizes):
            if not all(_row_local(e.srcs[0], sizes[at] // rows) for e in _loads_of(k, at)):
                return None
        dtype_at.update(zip(inputs, kernel.in_dtypes))
        if out_at is not None:
            dtype_at[out_at] = kernel.out_dtype
        ks.append(k)
    n_in, last, shares = len(dtype_at), ks[-1], [None] * len(ks)
    for j in reversed(range(len(ks) - 1)):  # costly values the last kernel would compute again
        k = ks[j]
        if k.reduce_expr is not None and k.shape == last.shape and last.n_global == len(last.shape) \
                and k.reduce_expr.dtype == last.out_dtype and last.out_dtype.is_float \
                and _occurs(k.reduce_expr, last.expr) and _costly(k.reduce_expr):
            shares[j] = last.out_index
            saved = Expr("LOAD", (last.out_index, const(True, dtypes.bool)), n_in, last.out_dtype)
            last = ks[-1] = _replace(last, k.reduce_expr, saved)
            break  # the output holds one kernel's values
    pre, bodies = [], []
    for j, ((_, _, out_at), k) in enumerate(zip(members, ks)):
        names = {"out": "out" if out_at is None else f"in{out_at}", f"in{n_in}": "out", "shared": "out",
                 **{f"in{a}": "out" if b < 0 else f"in{b}" for a, b in (aliases or {}).items()}}
        lines = _Renderer(k, None, tuning).render("f", True, shares[j]).split("\n")
        loop = lines.index("    for i0 in range(lo, hi):")

        def rename(m: re.Match, names=names, j=j) -> str:
            word = m.group(0)
            return names.get(word) or (word if word.startswith("in") else f"m{j}{word}")

        pre += [_NAMES.sub(rename, line) for line in lines[2:loop]]
        bodies += [_NAMES.sub(rename, line) for line in lines[loop + 1 :] if line.strip()]
    args = ", ".join(["out"] + [f"in{i}" for i in range(n_in)] + ["lo", "hi"])
    # members that are all of one element per row render the same source at every length: one name (so one
    # compiled function, as for E_n: Adam's m, v and parameter updates of every parameter)
    flat = all(k.shape == (rows,) and k.n_global == 1 for k in ks)
    name = "rows_" + "_".join("E_n" if flat else m.name for m, _, _ in members)
    source = "\n".join(["@kernel()", f"def {name}({args}):", *pre, "    for i0 in range(lo, hi):", *bodies])
    storage = tuple(storage_dtype(d) for d in (members[-1][0].out_dtype, *(dtype_at[i] for i in range(n_in))))
    threaded = threads(sum(math.prod(k.shape) for k in ks), rows, tuning)  # else lo, hi = 0, rows
    launch = {"storage": storage, "split": rows if threaded else 0, "combine": False}
    return Program(name, HEADER + "\n\n" + source + "\n", reads=tuple(range(n_in)),
                   args=() if threaded else (0, rows), launch=launch)


def row_count(kernel: Kernel) -> int | None:
    """The rows of a kernel (optimized: opt/host.py) that could be in a row group (its outer loop with
    merge_axes(rows=True); a 1-D elementwise kernel has one element per row), else None: a contraction
    (any CONTRACT opt but LOOP), a full or interchanged reduce, float16 (widened by the runtime)."""
    k = None if find(kernel.opts, OptOps.CONTRACT) else _row_kernel(kernel)
    return None if k is None else k.shape[0]


def _row_kernel(kernel: Kernel) -> Kernel | None:
    """The kernel as a row group renders it (axes merged, rows first), or None where it cannot be in one."""
    if dtypes.float16 in (kernel.out_dtype, *kernel.in_dtypes):
        return None
    k = merge_axes(kernel, rows=True)
    if k.n_global == 0 or (k.reduce_expr is not None and want_interchange(k)):
        return None
    return k


def _relabel(kernel: Kernel, number, in_dtypes: tuple[DType, ...] | None = None) -> Kernel:
    """The kernel with input i loaded as input number[i] (and the input dtypes given, else its own)."""
    memo: dict[Expr, Expr] = {}

    def walk(e: Expr) -> Expr:
        hit = memo.get(e)
        if hit is None:
            srcs = tuple(walk(s) for s in e.srcs)
            hit = memo[e] = Expr(e.op, srcs, number[e.arg] if e.op == "LOAD" else e.arg, e.dtype)
        return hit

    k = kernel
    return Kernel(name=k.name, shape=k.shape, n_global=k.n_global, reduce_op=k.reduce_op,
                  reduce_expr=None if k.reduce_expr is None else walk(k.reduce_expr), expr=walk(k.expr),
                  out_index=walk(k.out_index), out_dtype=k.out_dtype,
                  in_dtypes=k.in_dtypes if in_dtypes is None else in_dtypes)


def _costly(e: Expr) -> bool:
    return any(x.op in ("EXP2", "LOG2", "SIN", "SQRT", "RECIP") for x in nodes(e))


def _occurs(part: Expr, whole: Expr) -> bool:
    return part in nodes(whole)


def _replace(kernel: Kernel, part: Expr, by: Expr) -> Kernel:
    memo: dict[Expr, Expr] = {part: by}

    def walk(e: Expr) -> Expr:
        hit = memo.get(e)
        if hit is None:
            hit = memo[e] = Expr(e.op, tuple(walk(s) for s in e.srcs), e.arg, e.dtype)
        return hit

    return Kernel(name=kernel.name, shape=kernel.shape, n_global=kernel.n_global, reduce_op=None,
                  reduce_expr=None, expr=walk(kernel.expr), out_index=kernel.out_index,
                  out_dtype=kernel.out_dtype, in_dtypes=kernel.in_dtypes)


_NAMES = re.compile(r"\b(?:out|shared|in\d+|acc|v\d+|c\d+)\b")  # a member's names in a row group's function


def _loads_of(kernel: Kernel, number: int) -> list[Expr]:
    k, seen = kernel, set()
    exprs = [k.expr, k.out_index] + ([k.reduce_expr] if k.reduce_expr is not None else [])
    return [e for x in exprs for e in _loads(x, seen) if e.arg == number]
