"""Render a Kernel as a `@triton.jit` function (the CUDA / AMD / TRITON devices: tgrad/runtime/triton.py).

The iteration space is flattened into `g`, the position in the global (parallel) axes, and `r`, in the
reduce axes; each program handles BLOCK_G consecutive values of `g`, and the loop indices `i0, i1, ...`
are recovered by division and remainder. Elementwise kernels are one-dimensional blocks. Reduce kernels
work on a [BLOCK_G, BLOCK_R] tile (`g` a column, `r` a row): a loop walks `r` over the reduce axes BLOCK_R
at a time, folding each tile into a tile accumulator, and one `tl.sum` / `tl.max` (PROD: a halving tree
of multiplies) over axis 1 finishes it.

Ragged edges: lanes past the end are clamped to index 0 (a valid element), so loads need no bounds mask;
the store is masked, and in the reduce loop clamped lanes add the identity. A LOAD whose `valid` is not
always true becomes a masked `tl.load(..., other=0)`.

Each Expr is one local variable at the shallowest level it can live at: before the reduce loop, inside
it (it depends on `r`), or after it (it uses ACC). Data constants are typed 0-d tensors so every operation
keeps the Kernel's dtypes. Index arithmetic is int32 when every index bound fits (`index_bits`), else
int64. Triton's math takes fp32/fp64 only: float16 math and sums run in float32 (like the NUMPY reference).

Block sizes are the kernel's opts (opt/heuristic.py), constants in the source: LOCAL is BLOCK_G (a tl.dot's
BLOCK_M), REDUCE BLOCK_R (BLOCK_K), DOT BLOCK_N, WARPS num_warps; no opts: one output a program, BLOCK_R 1.

Split reduces (a SPLIT opt, GPU only: too few programs, each looping long, run far below the memory's
bandwidth) are two functions in one source: `<name>_part`, on a grid (programs, SPLIT), folds its share of
the reduce axes into one partial per output in a scratch array `part` (float32 for float16 sums); `<name>`
loads the SPLIT partials of its outputs, reduces them the same way, and goes on as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgrad import config
from tgrad.dtype import DType, dtypes
from tgrad.errors import KernelError
from tgrad.fuse import NARROW_ROUNDED, Expr, Kernel, reduce_identity
from tgrad.loop_axes import nodes
from tgrad.opt.contraction import _masked, find_dot
from tgrad.opt.opts import OptOps, find
from tgrad.program import Program

# No helper @triton.jit functions: Triton 3.9's interpreter leaves triton.language patched after it
# calls one (and runs tl.reduce combine functions element by element), so everything is inlined.
HEADER = """import triton
import triton.language as tl
"""

TL_NAME = {
    dtypes.bool: "tl.int1",
    dtypes.uint8: "tl.uint8",
    dtypes.int8: "tl.int8",
    dtypes.int16: "tl.int16",
    dtypes.int32: "tl.int32",
    dtypes.int64: "tl.int64",
    dtypes.uint16: "tl.uint16",
    dtypes.uint32: "tl.uint32",
    dtypes.uint64: "tl.uint64",
    dtypes.float16: "tl.float16",
    dtypes.float32: "tl.float32",
    dtypes.float64: "tl.float64",
}
# pointer types for triton.compile signatures (the ahead-of-time mode, runtime/triton_aot.py)
SIG_NAME = {
    dtypes.bool: "*i1",
    dtypes.uint8: "*u8",
    dtypes.int8: "*i8",
    dtypes.int16: "*i16",
    dtypes.int32: "*i32",
    dtypes.int64: "*i64",
    dtypes.uint16: "*u16",
    dtypes.uint32: "*u32",
    dtypes.uint64: "*u64",
    dtypes.float16: "*fp16",
    dtypes.float32: "*fp32",
    dtypes.float64: "*fp64",
}


def tl_type(dtype: DType) -> str:
    return TL_NAME[dtype]


def interpreting() -> bool:
    """True when Triton runs kernels with its CPU interpreter (TRITON_INTERPRET=1)."""
    return config.on("TRITON_INTERPRET")


# ---------------------------------------------------------------------------------------------------
# block sizes


@dataclass(frozen=True)
class Blocks:
    block_g: int  # outputs per program (a power of two); BLOCK_M of a tl.dot kernel
    block_r: int  # reduce elements per loop step (1 for elementwise kernels); BLOCK_K of a tl.dot kernel
    num_warps: int = 4
    block_n: int = 0  # BLOCK_N of a tl.dot kernel; 0 for the other kernels
    split: int = 0  # a split reduce's number of partial results per output (see the module docstring)

    @staticmethod
    def from_opts(opts: tuple) -> Blocks:
        return Blocks(find(opts, OptOps.LOCAL, 1), find(opts, OptOps.REDUCE, 1), find(opts, OptOps.WARPS, 4),
                      find(opts, OptOps.DOT), find(opts, OptOps.SPLIT))

    def grid(self, kernel: Kernel) -> int:
        if self.block_n:
            _, _, m_axes, n_axes = find_dot(kernel)
            m, n = (math.prod(kernel.shape[a] for a in axes) for axes in (m_axes, n_axes))
            batch = math.prod(kernel.global_shape) // (m * n)
            return batch * -(-m // self.block_g) * -(-n // self.block_n)
        return max(1, -(-math.prod(kernel.global_shape) // self.block_g))


# ---------------------------------------------------------------------------------------------------
# rendering

INT32_MAX = 2**31 - 1


def _index_exprs(kernel: Kernel) -> list[Expr]:
    return [kernel.out_index, *(e.srcs[0] for e in nodes(kernel.expr, kernel.reduce_expr) if e.op == "LOAD")]


def index_bits(kernel: Kernel) -> int:
    """32 when the iteration space and every load/store index provably fit an int32, else 64."""
    if math.prod(kernel.shape) > INT32_MAX:
        return 64
    for e in _index_exprs(kernel):
        if not (-INT32_MAX <= e.vmin and e.vmax <= INT32_MAX):
            return 64
    return 32


def _fmt_float(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '-float("inf")'
    return repr(float(value))


def _fmt_value(value, dtype: DType) -> str:
    if dtype == dtypes.bool:
        return "True" if value else "False"
    if dtype.is_float:
        return _fmt_float(value)
    return repr(int(value))


def _float_math(op: str, fn: str):
    """A Triton math function that takes fp32/fp64: float16 goes through float32."""

    def render(dt: DType, a: str) -> str:
        if dt == dtypes.float16:
            return f"{fn}({a}.to(tl.float32)).to(tl.float16)"
        if not dt.is_float:
            raise KernelError(f"Triton emitter: {op} of {dt.name} is not supported (float dtypes only)")
        return f"{fn}({a})"

    return render


def _sqrt(dt: DType, a: str) -> str:
    return f"tl.sqrt_rn({a})" if dt == dtypes.float32 else _float_math("SQRT", "tl.sqrt")(dt, a)


def _recip(dt: DType, a: str) -> str:
    if dt == dtypes.float32:
        return f"tl.div_rn(1.0, {a})"
    if dt.is_float:
        return f"(1.0 / {a})"
    return _idiv(f"tl.full([], 1, {tl_type(dt)})", a)


def _max(dt: DType, a: str, b: str) -> str:
    if dt == dtypes.bool:
        return f"({a} | {b})"
    if dt.is_float:
        return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"
    return f"tl.maximum({a}, {b})"


def _int_only(op: str, fn):
    def render(dt: DType, *srcs: str) -> str:
        if not dt.is_int:
            raise KernelError(f"Triton emitter: {op} of {dt.name} is not supported (integer dtypes only)")
        return fn(*srcs)

    return render


def _literals(a: str, b: str) -> tuple[int, int] | None:
    """Both sources as Python ints, where both are integer literals (index arithmetic of constants)."""
    if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
        return int(a), int(b)
    return None


def _c_div(a: int, b: int) -> int:
    """C's truncating quotient of two Python ints (x / 0 = 0): Python's // on literals floors."""
    return 0 if b == 0 else (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)


def _idiv(a: str, b: str) -> str:
    """C division (truncating); x / 0 is 0 like the reference. A constant divisor needs no guard."""
    lits = _literals(a, b)
    if lits is not None:
        return str(_c_div(*lits))
    if b.lstrip("-").isdigit() and int(b) != 0:
        return f"({a} // {b})"
    return f"tl.where({b} == 0, 0, {a} // tl.where({b} == 0, 1, {b}))"


def _imod(a: str, b: str) -> str:
    """C remainder (sign of the dividend); x % 0 is x like the reference."""
    lits = _literals(a, b)
    if lits is not None:
        return str(lits[0] - lits[1] * _c_div(*lits))
    if b.lstrip("-").isdigit() and int(b) != 0:
        return f"({a} % {b})"
    return f"tl.where({b} == 0, {a}, {a} % tl.where({b} == 0, 1, {b}))"


def _mod(dt: DType, a: str, b: str) -> str:
    if dt.is_float:
        return f"({a} % {b})"  # Triton's float % is C fmod
    return _int_only("MOD", _imod)(dt, a, b)


def _neg(dt: DType, a: str) -> str:
    if dt == dtypes.bool:
        raise KernelError("Triton emitter: NEG of bool is not supported")
    if dt.is_float:  # Triton before 3.9 compiles a float's -x as 0 - x: -(0.0) came out +0.0 on the GPU
        return f"({a} * tl.full([], -1.0, {tl_type(dt)}))"
    return f"(-{a})"


def _trunc(dt: DType, a: str) -> str:
    if not dt.is_float:
        return a
    x = f"{a}.to(tl.float32)" if dt == dtypes.float16 else a
    text = f"tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))"
    return f"{text}.to(tl.float16)" if dt == dtypes.float16 else text


def _bits(sym: str):
    """A bitwise op. On bools through int8: Triton's interpreter cannot combine a 0-d bool (a compare of
    a value loaded once) with a tile of bools (numpy refuses the ufunc)."""

    def render(dt: DType, a: str, b: str) -> str:
        if dt == dtypes.bool:
            return f"((({a}).to(tl.int8) {sym} ({b}).to(tl.int8)) != 0)"
        return f"({a} {sym} {b})"

    return render


# code_for_op: op name -> f(result dtype, *rendered sources) -> source text
code_for_op = {
    "ADD": lambda dt, a, b: _bits("|")(dt, a, b) if dt == dtypes.bool else f"({a} + {b})",
    "SUB": lambda dt, a, b: f"({a} - {b})",
    "MUL": lambda dt, a, b: _bits("&")(dt, a, b) if dt == dtypes.bool else f"({a} * {b})",
    "IDIV": _int_only("IDIV", lambda a, b: _idiv(a, b)),
    "MOD": _mod,
    "MAX": _max,
    "CMPLT": lambda dt, a, b: f"({a} < {b})",
    "CMPNE": lambda dt, a, b: f"({a} != {b})",
    "AND": _bits("&"),
    "OR": _bits("|"),
    "XOR": _bits("^"),
    "WHERE": lambda dt, c, a, b: f"tl.where({c}, {a}, {b})",
    "EXP2": _float_math("EXP2", "tl.exp2"),
    "LOG2": _float_math("LOG2", "tl.log2"),
    "SIN": _float_math("SIN", "tl.sin"),
    "SQRT": _sqrt,
    "RECIP": _recip,
    "NEG": _neg,
    "TRUNC": _trunc,
}


def _op_text(e: Expr, srcs: list[str]) -> str:
    """The source of a computing op (not IDX, ACC, CONST or LOAD) over its sources' texts."""
    if e.op == "CAST":
        return _cast(e.srcs[0].dtype, e.dtype, srcs[0])
    if e.op in code_for_op:
        dt = e.srcs[-1].dtype if e.op in ("CMPLT", "CMPNE") else e.dtype
        text = code_for_op[e.op](dt, *srcs)
        # a float16 result is a float16 value (the interpreter's numpy may hold it wider: 1 / 1e-7 was 8390)
        return f"({text}).to(tl.float16)" if dt == dtypes.float16 and e.op in NARROW_ROUNDED else text
    raise KernelError(f"Triton emitter: no rendering for op {e.op} ({e.dtype.name})")


def _tile_dtype(acc_dt: DType) -> DType:
    """What a reduce accumulates in (and a split reduce's partials are): float16 sums go through float32."""
    return dtypes.float32 if acc_dt == dtypes.float16 else acc_dt


def _cast(src: DType, dst: DType, a: str) -> str:
    if dst == dtypes.bool:
        return f"({a} != 0)"
    if src.is_float and dst.is_int:  # C truncation through int64, then wrap (like the reference)
        wide = f"{a}.to(tl.int64)"
        return wide if dst == dtypes.int64 else f"{wide}.to({tl_type(dst)})"
    return f"{a}.to({tl_type(dst)})"


class _Renderer:
    def __init__(self, kernel: Kernel, blocks: Blocks):
        self.k, self.b = kernel, blocks
        self.ng = kernel.n_global
        self.two_d = kernel.reduce_expr is not None
        self.bits = index_bits(kernel)
        self.names: dict[Expr, str] = {}
        self.index_memo: dict[Expr, bool] = {}
        self.deps_memo: dict[Expr, frozenset] = {}
        self.top: list[str] = []  # before the reduce loop
        self.loop: list[str] = []  # inside it (depends on r)
        self.post: list[str] = []  # after it (uses ACC)
        self.count = 0

    def deps(self, e: Expr) -> frozenset:
        """Which of the block coordinates g, r (and the finished ACC) an expression depends on."""
        hit = self.deps_memo.get(e)
        if hit is None:
            if e.op == "IDX":
                hit = frozenset("g" if e.arg[0] < self.ng else "r")
            elif e.op == "ACC":
                hit = frozenset(("g", "a"))
            else:
                hit = frozenset().union(*(self.deps(s) for s in e.srcs))
            self.deps_memo[e] = hit
        return hit

    def ref(self, e: Expr, bare: bool = False) -> str:
        """The source text of e; `bare` renders an integer constant as a plain (weakly typed) int."""
        if e.op == "IDX":
            return f"i{e.arg[0]}"
        if e.op == "ACC":
            return "acc"
        if e.op == "CONST" and bare and e.dtype.is_int:
            return _fmt_value(e.arg, e.dtype)
        name = self.names.get(e)
        if name is not None:
            return name
        if e.op == "CONST":
            text = f"tl.full([], {_fmt_value(e.arg, e.dtype)}, {tl_type(e.dtype)})"
            if e.dtype.is_float and e.arg == 0 and math.copysign(1.0, e.arg) < 0:
                # Triton before 3.9 makes tl.full of any zero a +0.0: -0.0 is +0.0 times -1
                text = f"(tl.full([], 0.0, {tl_type(e.dtype)}) * tl.full([], -1.0, {tl_type(e.dtype)}))"
        elif e.op == "LOAD":
            text = self.load(e)
        else:
            index = self.is_index(e)
            # a CAST's constant source stays a tensor: `1.to(tl.int64)` is not Python
            text = _op_text(e, [self.ref(s, index and e.op != "CAST") for s in e.srcs])
        name = self.names[e] = f"v{self.count}"
        self.count += 1
        deps = self.deps(e)
        level = self.post if "a" in deps else self.loop if "r" in deps else self.top
        level.append(f"{name} = {text}")
        return name

    def is_index(self, e: Expr) -> bool:
        """Pure index arithmetic: built from IDX and integer constants only (no loads, no ACC)."""
        hit = self.index_memo.get(e)
        if hit is None:
            if e.op in ("IDX", "CONST"):
                hit = e.op == "IDX" or not e.dtype.is_float
            elif e.op in ("LOAD", "ACC"):
                hit = False
            else:
                hit = all(self.is_index(s) for s in e.srcs)
            self.index_memo[e] = hit
        return hit

    def broadcast(self, ptr_deps: frozenset, mask_deps: frozenset) -> str:
        """Zeros added to a pointer so it has the shape of its mask (tl.load needs it)."""
        extra = ""
        if "g" in mask_deps and "g" not in ptr_deps:
            extra += " + g * 0"
        if "r" in mask_deps and "r" not in ptr_deps:
            extra += " + r * 0"
        return extra

    def load(self, e: Expr) -> str:
        index, valid = e.srcs
        if valid.op == "CONST" and not valid.arg:
            return f"tl.full([], {_fmt_value(0, e.dtype)}, {tl_type(e.dtype)})"
        ptr = f"in{e.arg} + {self.ref(index, True)}"
        if valid.op == "CONST":
            return f"tl.load({ptr})"
        ptr += self.broadcast(self.deps(index), self.deps(valid))
        return f"tl.load({ptr}, mask={self.ref(valid, True)}, other=0)"

    def coords(self, flat: str, axes, name=lambda a: f"i{a}") -> list[str]:
        """Statements computing the loop indices i<axis> (or name(axis)) from a flat position over `axes`."""
        shape, axes = self.k.shape, list(axes)
        stmts = []
        for j, a in enumerate(axes):
            stride = math.prod(shape[x] for x in axes[j + 1 :])
            text = flat if stride == 1 else f"{flat} // {stride}"
            if j:
                text = f"{text} % {shape[a]}"
            stmts.append(f"{name(a)} = {text}")
        return stmts

    def render(self, fname: str, stage: str = "") -> str:
        """stage: "" (the whole kernel), or a split reduce's "part" or "final" function (module docstring)."""
        k, b = self.k, self.b
        n = len(k.shape)
        g_total, r_total = math.prod(k.global_shape), math.prod(k.reduce_shape)
        wide = ".to(tl.int64)" if self.bits == 64 else ""
        col = "[:, None]" if self.two_d else ""
        ragged_g = g_total % b.block_g != 0
        body = [f"g = tl.program_id(0){wide} * {b.block_g} + tl.arange(0, {b.block_g}){col}"]
        if ragged_g:
            body += [f"g_ok = g < {g_total}", "g = tl.where(g_ok, g, 0)"]
        body += self.coords("g", range(0, self.ng))

        red_lines: list[str] = []
        if self.two_d:
            red_lines = self.render_reduce(n, r_total, wide, stage)
        mask = ", mask=g_ok" if ragged_g else ""
        if stage == "part":
            body += self.top + red_lines + [f"tl.store(part + g * {b.split} + tl.program_id(1), acc{mask})"]
            return self.function(fname, body)
        store_index = self.ref(k.out_index, True)
        value = self.ref(k.expr)
        if self.deps(k.expr) - {"a"} and k.expr.dtype != k.out_dtype:
            raise KernelError(f"kernel {k.name}: stored dtype {k.expr.dtype.name} != {k.out_dtype.name}")
        ptr = f"out + {store_index}" + self.broadcast(self.deps(k.out_index), frozenset("g"))
        body += self.top + red_lines + self.post + [f"tl.store({ptr}, {value}{mask})"]
        return self.function(fname, body)

    def function(self, fname: str, body: list[str]) -> str:
        lines = ["@triton.jit", f"def {fname}({self.args()}):"] + ["    " + s for s in body]
        return "\n".join(lines) + "\n"

    def args(self) -> str:
        part = ["part"] if self.b.split else []
        return ", ".join(["out"] + [f"in{i}" for i in range(len(self.k.in_dtypes))] + part)

    def render_reduce(self, n: int, r_total: int, wide: str, stage: str = "") -> list[str]:
        k, b = self.k, self.b
        acc_dt = k.reduce_expr.dtype
        tile_dt = _tile_dtype(acc_dt)
        if stage == "final":  # the partials of a split reduce
            lines = [f"acc = tl.load(part + g * {b.split} + tl.arange(0, {b.split})[None, :])"]
            return lines + self.finish(acc_dt, tile_dt, b.split)
        ident = _fmt_value(reduce_identity(k.reduce_op, acc_dt), acc_dt)
        shape = f"[{b.block_g}, {b.block_r}]"
        lines = [f"acc = tl.full({shape}, {ident}, {tl_type(tile_dt)})"]
        if r_total == 0:  # an empty reduce: the identity, and no loads
            return lines + self.finish(acc_dt, tile_dt)
        span, start = r_total, ""
        if stage == "part":  # this program's share: `span` reduce positions from program_id(1) * span
            span = -(-r_total // (b.split * b.block_r)) * b.block_r
            start = f"tl.program_id(1){wide} * {span} + "
        looped = span > b.block_r
        ragged_r = (r_total % b.block_r if stage == "" else b.split * span - r_total) != 0
        start += "r0 + " if looped else ""
        arange = f"tl.arange(0, {b.block_r})[None, :]"
        step = [f"r = ({start}{arange}){wide}" if wide else f"r = {start}{arange}"]
        if ragged_r:
            step += [f"r_ok = r < {r_total}", "r = tl.where(r_ok, r, 0)"]
        step += self.coords("r", range(self.ng, n))
        val = self.ref(k.reduce_expr)
        if tile_dt != acc_dt:
            val = f"{val}.to({tl_type(tile_dt)})"
        if ragged_r:
            val = f"tl.where(r_ok, {val}, {ident})"
        if acc_dt == dtypes.bool:
            update = _bits("&" if k.reduce_op == "PROD" else "|")(acc_dt, "acc", val)  # a 0-d val: via int8
        else:
            combine = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX"}[k.reduce_op]
            update = code_for_op[combine](tile_dt, "acc", val)
        step += self.loop
        if looped and k.reduce_op == "SUM" and tile_dt.is_float:
            # Kahan: each lane's sum over the loop keeps its lost low part in `comp`, so a long reduce (a
            # lane sums span / BLOCK_R values) stays about as accurate as numpy's pairwise sum
            lines.append(f"comp = tl.full({shape}, 0, {tl_type(tile_dt)})")
            # (the compensation is 0 past an inf or nan, where it would be nan: the sum is inf or nan)
            low = 'tl.where(tl.abs(kt) < float("inf"), (kt - acc) - kv, 0.0)'
            step += [f"kv = {val} - comp", "kt = acc + kv", f"comp = {low}", "acc = kt"]
        else:
            step.append(f"acc = {update}")
        if looped:
            lines += [f"for r0 in range(0, {span}, {b.block_r}):"] + ["    " + s for s in step]
        else:
            lines += step
        return lines + self.finish(tile_dt if stage else acc_dt, tile_dt)

    def finish(self, acc_dt: DType, tile_dt: DType, width: int = 0) -> list[str]:
        """Reduce the tile accumulator (`width` wide: BLOCK_R unless given) over its reduce axis to a
        [BLOCK_G, 1] column of acc_dt."""
        op = self.k.reduce_op
        if acc_dt == dtypes.bool:
            fn = "tl.min" if op == "PROD" else "tl.max"
            return [f"acc = {fn}(acc.to(tl.int32), axis=1, keep_dims=True) != 0"]
        lines = []
        if op == "SUM":
            text = "tl.sum(acc, axis=1, keep_dims=True)"
        elif op == "PROD":  # a halving tree: tl.reduce with a custom combine crawls in the interpreter
            width = width or self.b.block_r
            while width > 1:
                width //= 2
                lines += [
                    f"lo, hi = tl.split(tl.reshape(acc, [{self.b.block_g}, {width}, 2]))",
                    "acc = lo * hi",
                ]
            text = f"tl.reshape(acc, [{self.b.block_g}, 1])"
        elif acc_dt.is_float:  # tl.max drops NaNs on the GPU; MAX propagates them
            nan = "tl.max((acc != acc).to(tl.int32), axis=1, keep_dims=True) != 0"
            text = f'tl.where({nan}, float("nan"), tl.max(acc, axis=1, keep_dims=True))'
        else:
            text = "tl.max(acc, axis=1, keep_dims=True)"
        if tile_dt != acc_dt or (op == "SUM" and acc_dt.is_int and acc_dt.itemsize < 4):
            text += f".to({tl_type(acc_dt)})"  # float16 tiles are float32; tl.sum widens small ints
        return lines + [f"acc = {text}"]


class _DotRenderer(_Renderer):
    """A matmul-shaped kernel (see find_dot): each program computes a [BLOCK_M, BLOCK_N] tile of the
    output with tl.dot over [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles of A and B (IEEE float32
    products: no TF32), then the elementwise epilogue on the tile."""

    def render(self, fname: str) -> str:
        k, b = self.k, self.b
        dot = find_dot(k)
        if dot is None:
            raise KernelError(f"kernel {k.name} is not matmul-shaped; it cannot take tl.dot blocks {b}")
        a_load, b_load, m_axes, n_axes = dot
        m, n = (math.prod(k.shape[a] for a in axes) for axes in (m_axes, n_axes))
        r = math.prod(k.reduce_shape)
        tiles_m, tiles_n = -(-m // b.block_g), -(-n // b.block_n)
        batch = [a for a in range(self.ng) if a not in m_axes + n_axes]
        wide = ".to(tl.int64)" if self.bits == 64 else ""
        body = [f"pid = tl.program_id(0){wide}"]
        body.append(f"pid_m = pid // {tiles_n} % {tiles_m}" if tiles_m > 1 else "pid_m = 0")
        body.append(f"pid_n = pid % {tiles_n}" if tiles_n > 1 else "pid_n = 0")
        if batch:  # the batch axes, from the flat batch number
            body.append(f"bat = pid // {tiles_m * tiles_n}")
            sizes = [k.shape[a] for a in batch]
            for j, a in enumerate(batch):
                stride = math.prod(sizes[j + 1 :])
                text = "bat" if stride == 1 else f"bat // {stride}"
                body.append(f"i{a} = {text} % {sizes[j]}" if j else f"i{a} = {text}")
        oks = []
        sides = (("m", m, b.block_g, "[:, None]", m_axes), ("n", n, b.block_n, "[None, :]", n_axes))
        for name, size, block, shape, axes in sides:
            body.append(f"{name} = pid_{name} * {block} + tl.arange(0, {block}){shape}")
            if size % block:
                body += [f"{name}_ok = {name} < {size}", f"{name} = tl.where({name}_ok, {name}, 0)"]
                oks.append(f"{name}_ok")
            body += self.coords(name, axes, lambda a: f"i{a}")
        body.append("g = m * 0 + n * 0  # zeros shaped like the output tile")
        if oks:
            body.append(f"g_ok = {' & '.join(oks)}")
        looped = r > b.block_r
        ragged = r % b.block_r != 0
        red = range(self.ng, len(k.shape))
        step = [f"kk = {'k0 + ' if looped else ''}tl.arange(0, {b.block_r})"]
        step += self.coords("kk", red, lambda a: f"k{a}")  # the K coordinates, then as A's row, B's column
        step += [f"ka{a} = k{a}[None, :]" for a in red] + [f"kb{a} = k{a}[:, None]" for a in red]
        for operand, side, tag in ((a_load, m_axes, "a"), (b_load, n_axes, "b")):
            names = {**{a: f"i{a}" for a in side}, **{a: f"k{tag}{a}" for a in red}}
            shape = f"[{b.block_g}, {b.block_r}]" if tag == "a" else f"[{b.block_r}, {b.block_n}]"
            kmask = f"kk[{'None, :' if tag == 'a' else ':, None'}] < {r}" if ragged else ""
            value = self.operand(operand, names, tag, shape, kmask, step)
            if ragged:  # past the end of K both operands are 0 (not f(0): 0 * inf would be nan)
                value = f"tl.where({kmask}, {value}, 0)"
            step.append(f"{tag} = tl.broadcast_to({value}, {shape})")
        step.append('acc = tl.dot(a, b, acc, input_precision="ieee")')
        lines = [f"acc = tl.zeros([{b.block_g}, {b.block_n}], tl.float32)"]
        if looped:
            lines += [f"for k0 in range(0, {r}, {b.block_r}):"] + ["    " + s for s in step]
        else:
            lines += step
        if k.reduce_expr.dtype != dtypes.float32:
            lines.append(f"acc = acc.to({tl_type(k.reduce_expr.dtype)})")
        store_index = self.ref(k.out_index, True)
        value = self.ref(k.expr)
        ptr = f"out + {store_index}" + self.broadcast(self.deps(k.out_index), frozenset("g"))
        mask = ", mask=g_ok" if oks else ""
        body += self.top + lines + self.post + [f"tl.store({ptr}, {value}{mask})"]
        return self.function(fname, body)

    def operand(self, root: Expr, names: dict[int, str], tag: str, shape: str, kmask: str, out: list) -> str:
        """Statements (appended to `out`) computing a dot operand's tile; its last value's name. Loads
        are masked by their `valid` and by `kmask` (a ragged K); pointers get the whole tile's shape."""
        memo: dict[Expr, str] = {}

        def go(e: Expr) -> str:
            hit = memo.get(e)
            if hit is not None:
                return hit
            if e.op == "IDX":
                return names.get(e.arg[0], f"i{e.arg[0]}")
            if e.op == "CONST":  # plain ints for index arithmetic; typed data constants, before the loop
                return _fmt_value(e.arg, e.dtype) if e.dtype.is_int else self.ref(e)
            if e.op == "LOAD":
                index, valid = e.srcs
                masks, offset = [kmask] if kmask else [], go(index)
                if _masked(e):
                    masks.append(go(valid))
                mask = " & ".join(f"({t})" for t in masks)
                if _masked(e):  # a gather with padding: masked-out lanes read offset 0 (on the H200 this
                    # alone fixed one of two convs that pipelining broke; with one stage (render) both are
                    # right)
                    offset = f"tl.where({mask}, {offset}, 0)"
                mask = f", mask={mask}, other=0" if mask else ""
                text = f"tl.load(in{e.arg} + {offset} + tl.zeros({shape}, tl.int32){mask})"
            else:
                text = _op_text(e, [go(s) for s in e.srcs])
            name = memo[e] = f"{tag}{len(memo)}"
            out.append(f"{name} = {text}")
            return name

        return go(root)


def render(kernel: Kernel, blocks: Blocks | None = None) -> Program:
    """The kernel as a Program: Triton source (HEADER and one `@triton.jit` function named after the
    kernel), launched on a 1-D grid of `global_size` programs with `launch["num_warps"]` warps each.
    Block sizes from the kernel's opts unless given."""
    blocks = blocks or Blocks.from_opts(kernel.opts)
    check_grid(kernel, blocks)
    if blocks.split:
        part = _Renderer(kernel, blocks).render(kernel.name + "_part", "part")
        source = HEADER + "\n\n" + part + "\n\n" + _Renderer(kernel, blocks).render(kernel.name, "final")
        scratch = ((math.prod(kernel.global_shape) * blocks.split, _tile_dtype(kernel.reduce_expr.dtype)),)
        return Program(kernel.name, source, (blocks.grid(kernel),), scratch=scratch,
                       launch={"num_warps": blocks.num_warps, "split": blocks.split})
    renderer = _DotRenderer if blocks.block_n else _Renderer
    source = HEADER + "\n\n" + renderer(kernel, blocks).render(kernel.name)
    launch = {"num_warps": blocks.num_warps}
    if blocks.block_n and _gathers(kernel.reduce_expr):
        # an implicit GEMM whose operand tiles gather with masks (padding, the zeros of a stride): on an H200
        # (Triton 3.6) Triton's software pipelining of those loads over the K loop gave wrong sums for
        # dilated / strided convs with padding (with 2 and 3 stages; see implicit_gemm): one stage
        launch["num_stages"] = 1
    return Program(kernel.name, source, (blocks.grid(kernel),), launch=launch)


GRID_X_MAX = 2**31 - 1  # programs along a launch's first grid axis (CUDA; AMD allows more)
GRID_YZ_MAX = 65535  # along its second and third (CUDA): a split reduce's shares


def check_grid(kernel: Kernel, blocks: Blocks) -> None:
    """A KernelError naming the limit when the launch needs more programs than a GPU's grid holds (the
    interpreter is held to the same limits, so that what runs here runs on a GPU)."""
    programs = blocks.grid(kernel)
    if programs > GRID_X_MAX or blocks.split > GRID_YZ_MAX:
        raise KernelError(
            f"kernel {kernel.name} (shape {kernel.shape}) needs a grid of {programs} x {blocks.split or 1} "
            f"programs; a Triton launch allows at most {GRID_X_MAX} x {GRID_YZ_MAX} (CUDA's grid limits): "
            "split the tensor or compute it in parts"
        )


def launch_options(program: Program) -> dict:
    """The keyword arguments Triton's launch (and compile) takes from a Program's launch facts."""
    return {k: v for k, v in program.launch.items() if k in ("num_warps", "num_stages")}


def _gathers(e: Expr) -> bool:
    """Whether a load under e has a validity mask (a masked gather)."""
    return any(s.op == "LOAD" and _masked(s) for s in nodes(e))
