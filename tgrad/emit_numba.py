"""Render a Kernel as Python source for `numba.njit` (the CPU device).

The kernel becomes nested loops: the global axes outermost (the first one a `prange` when the kernel is
big enough to be worth threads), the reduce axes inside with a scalar accumulator. Each Expr node is
one local variable, placed at the shallowest loop level whose indices it uses, so loads that do not
depend on the reduce axes are hoisted out of the reduce loop. float16 is computed in float32 (Numba
has no float16 on the CPU): the runtime widens float16 buffers on the way in and narrows on the way
out, and a CAST to float16 inside a kernel rounds with `_f16`.
"""

from __future__ import annotations

import math

from tgrad.dtype import DType, dtypes
from tgrad.fuse import Expr, Kernel, reduce_identity

PARALLEL_MIN_WORK = 1 << 20  # iterations (global x reduce) below which threads cost more than they save

HEADER = """import math
import numpy as np
from numba import njit, prange


@njit(cache=CACHE, inline="always")
def _idiv(a, b):
    if b == 0:
        return a - a
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@njit(cache=CACHE, inline="always")
def _fmax(a, b):
    return a if (a > b or a != a) else b


@njit(cache=CACHE)
def _f16(x):
    if not math.isfinite(x) or x == 0:
        return x
    ax = abs(x)
    if ax >= 65520.0:
        return x * np.float32(np.inf)
    e = math.frexp(ax)[1] - 1
    q = 2.0 ** max(e - 10, -24)
    return np.float32(np.round(np.float64(x) / q) * q)
"""

NP_NAME = {dtypes.bool: "np.bool_", dtypes.float16: "np.float32"}


def np_type(dtype: DType) -> str:
    """The numpy scalar type used for a dtype inside a kernel (float16 computes as float32)."""
    return NP_NAME.get(dtype, f"np.{dtype.name}")


def storage_dtype(dtype: DType) -> DType:
    return dtypes.float32 if dtype == dtypes.float16 else dtype


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
    return text if dtype == dtypes.bool else f"{np_type(dtype)}({text})"


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
        else _wrap(dt, f"_fmax({a}, {b})" if dt.is_float else f"max({a}, {b})")
    ),
    "CMPLT": lambda dt, a, b: f"({a} < {b})",
    "CMPNE": lambda dt, a, b: f"({a} != {b})",
    "AND": lambda dt, a, b: f"({a} & {b})",
    "OR": lambda dt, a, b: f"({a} | {b})",
    "XOR": lambda dt, a, b: f"({a} ^ {b})",
    "WHERE": lambda dt, c, a, b: f"({a} if {c} else {b})",
    "EXP2": lambda dt, a: _wrap(dt, f"np.exp2({a})"),
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
    if dtype.is_int and src.dtype.is_float:
        return f"{np_type(dtype)}(np.int64({text}))" if dtype.itemsize < 8 else f"{np_type(dtype)}({text})"
    return f"{np_type(dtype)}({text})"


class _Renderer:
    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.names: dict[Expr, str] = {}
        self.levels: list[list[str]] = [[] for _ in range(len(kernel.shape) + 1)]
        self.count = 0

    def level(self, e: Expr) -> int:
        """How many loops deep e must live: one past the innermost index it uses."""
        if e.op == "IDX":
            return e.arg[0] + 1
        return max((self.level(s) for s in e.srcs), default=0)

    def uses_acc(self, e: Expr) -> bool:
        return e.op == "ACC" or any(self.uses_acc(s) for s in e.srcs)

    def ref(self, e: Expr) -> str:
        if e.op == "IDX":
            return f"i{e.arg[0]}"
        if e.op == "CONST":
            return render_const(e.arg, e.dtype)
        if e.op == "ACC":
            return "acc"
        name = self.names.get(e)
        if name is None:
            srcs = [self.ref(s) for s in e.srcs]
            if e.op == "LOAD":
                text = f"in{e.arg}[{srcs[0]}]"
                if srcs[1] != "True":
                    text = f"({text} if {srcs[1]} else {render_const(0, e.dtype)})"
            elif e.op == "CAST":
                text = _cast(e.srcs[0], e.dtype, srcs[0])
            else:
                text = code_for_op[e.op](e.dtype, *srcs)
            name = self.names[e] = f"v{self.count}"
            self.count += 1
            stmt = f"{name} = {text}"
            if self.uses_acc(e):
                self.post.append(stmt)
            else:
                self.levels[self.level(e)].append(stmt)
        return name

    def render(self, fname: str, parallel: bool) -> str:
        k = self.k
        n, ng = len(k.shape), k.n_global
        self.post: list[str] = []
        if k.reduce_expr is not None:
            acc_dt = k.reduce_expr.dtype
            val = self.ref(k.reduce_expr)
            if acc_dt == dtypes.bool:
                update = {"SUM": f"acc or {val}", "PROD": f"acc and {val}", "MAX": f"acc or {val}"}[
                    k.reduce_op
                ]
            else:
                combine = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX"}[k.reduce_op]
                update = code_for_op[combine](acc_dt, "acc", val)
            init = f"acc = {render_const(reduce_identity(k.reduce_op, acc_dt), acc_dt)}"
        store = f"out[{self.ref(k.out_index)}] = {self.ref(k.expr)}"
        args = ", ".join(["out"] + [f"in{i}" for i in range(len(k.in_dtypes))])
        out = [f"@njit(cache=CACHE, error_model='numpy', parallel={parallel})", f"def {fname}({args}):"]

        def emit(depth: int, stmts: list[str]) -> None:
            out.extend("    " * (depth + 1) + s for s in stmts)

        for depth in range(n + 1):
            emit(depth, self.levels[depth])
            if depth == ng and k.reduce_expr is not None:
                emit(depth, [init])
            if depth < n:
                rng = "prange" if (depth == 0 and parallel) else "range"
                emit(depth, [f"for i{depth} in {rng}({k.shape[depth]}):"])
        if k.reduce_expr is not None:
            emit(n, [f"acc = {update}"])
            emit(ng, self.post + [store])
        else:
            emit(n, self.post + [store])
        return "\n".join(out) + "\n"


def render(kernel: Kernel, fname: str | None = None, parallel: bool | None = None) -> str:
    """Python source (without the header) of one kernel as an njit function."""
    if parallel is None:
        parallel = want_parallel(kernel)
    return _Renderer(kernel).render(fname or kernel.name, parallel)


def want_parallel(kernel: Kernel) -> bool:
    if not kernel.global_shape or kernel.global_shape[0] < 2:
        return False
    return math.prod(kernel.shape) >= PARALLEL_MIN_WORK
