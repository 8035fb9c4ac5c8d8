"""The C-style lowering shared by OpenCL C, Metal and WGSL: a Kernel becomes one GPU function.

Each language is a `Dialect` (like tinygrad's renderer/cstyle.py): data (kernel prefix, buffer qualifiers,
id expressions, barrier, type names) and a few small methods whose defaults write C (type names, literals,
casts, loads, stores, declarations, the kernel's signature). OpenCL, QCOM and Metal are tables of data
(emit_opencl.py); WGSL overrides the methods where its syntax differs (emit_wgsl.py). `render(kernel,
dialect)` is pure and testable without a driver; it renders the kernel's opts (tgrad/opt/), adding none.

The lowering (the same for every dialect): the output elements are numbered 0..N-1 over the global axes.
- without a GROUP opt: one work-item per output element (`ids["gid"]`), reduce axes as nested loops
  around a scalar accumulator, and a `gid < N` guard; UPCAST opts give register tiles: each work-item
  computes that many outputs along up to two global axes, so a loaded value is reused from a register;
- GROUP(n): one work-group of n work-items per output element (`ids["grp"]`, `ids["lid"]`); each
  work-item accumulates a strided slice of the reduce axes (a float sum with Kahan's compensation, so
  that it is as accurate as numpy's pairwise sum), then a tree in local (work-group) memory combines the
  partial results and work-item 0 stores;
- UNROLL(u): the innermost reduce loop (a GROUP's strided loop) takes u steps per iteration, each a copy
  of its body (opt/limits.py: fewer loop iterations where a driver limits them);
- LANES(l) (no GROUP, no UPCAST): the same l copies, copy k adding into an accumulator of its own
  (`acc_k`; a long float sum's compensated, then the lanes' corrected totals added compensated), the l
  combined after the loops (else in a tree): l independent chains of adds instead of one (a CPU OpenCL
  device: bench/HISTORY.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from tgrad.dtype import DType, dtypes
from tgrad.errors import DTypeError, KernelError
from tgrad.fuse import IDX_DT, NARROW_ROUNDED, Expr, Kernel, StatementPlacer, const, reduce_identity
from tgrad.opt.opts import OptOps, find, upcasts

INT32_MAX = 2**31 - 1
REDUCE_ALU = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX"}  # the op that combines two partial results
KAHAN_MIN_STEPS = 32  # a group reduction's work-items compensate float sums of more steps than this

TYPE_NAMES = {
    "bool": "bool",
    "uint8": "uchar",
    "int8": "char",
    "int16": "short",
    "int32": "int",
    "int64": "long",
    "uint16": "ushort",
    "uint32": "uint",
    "uint64": "ulong",
    "float16": "half",
    "float32": "float",
    "float64": "double",
}
MATH = {"EXP2": "exp2", "LOG2": "log2", "SIN": "sin", "SQRT": "sqrt", "TRUNC": "trunc"}


def _math(op: str):
    def rule(d: Dialect, e: Expr, a: str) -> str:
        if op == "TRUNC" and not e.dtype.is_float:
            return a
        return f"{d.math.get(op, MATH[op])}({a})"

    return rule


def _div(op: str):
    """IDIV/MOD. C leaves x/0 and INT_MIN/-1 undefined (a CPU driver traps): like the CPU device, x/0 is 0
    and x%0 is x; a constant divisor other than 0 and -1 needs no guard."""
    sym = "/" if op == "IDIV" else "%"

    def rule(d: Dialect, e: Expr, a: str, b: str) -> str:
        dt, divisor = e.dtype, e.srcs[1]
        if dt.is_float:
            return f"trunc({a} / {b})" if op == "IDIV" else f"fmod({a}, {b})"
        text = f"({a} {sym} {b})"
        if divisor.op == "CONST" and divisor.arg not in (0, -1):
            return text
        if dt.kind == "i":
            text = f"({b} == -1 ? {f'(-{a})' if op == 'IDIV' else d.const(0, dt)} : {text})"
        return f"({b} == 0 ? {d.const(0, dt) if op == 'IDIV' else a} : {text})"

    return rule


def _max(d: Dialect, e: Expr, a: str, b: str) -> str:
    if e.dtype == dtypes.bool:
        return f"({a} || {b})"
    if e.dtype.is_float:  # fmax would drop a nan
        return f"(({a} > {b} || {a} != {a}) ? {a} : {b})"
    return f"({a} > {b} ? {a} : {b})"


def paren(a: str) -> str:
    """A negative literal in parentheses: -(-0.3f), not --0.3f (C's decrement)."""
    return f"({a})" if a.startswith("-") else a


def _is_bool(e: Expr) -> bool:
    return e.dtype == dtypes.bool


# code_for_op: op name -> f(dialect, expr, *rendered sources) -> C expression
code_for_op: dict[str, Callable[..., str]] = {
    **{op: _math(op) for op in MATH},
    "ADD": lambda d, e, a, b: f"({a} || {b})" if _is_bool(e) else f"({a} + {b})",
    "SUB": lambda d, e, a, b: f"({a} - {b})",
    "MUL": lambda d, e, a, b: f"({a} && {b})" if _is_bool(e) else f"({a} * {b})",
    "IDIV": _div("IDIV"),
    "MOD": _div("MOD"),
    "MAX": _max,
    "CMPLT": lambda d, e, a, b: f"({a} < {b})",
    "CMPNE": lambda d, e, a, b: f"({a} != {b})",
    "AND": lambda d, e, a, b: f"({a} & {b})",
    "OR": lambda d, e, a, b: f"({a} | {b})",
    "XOR": lambda d, e, a, b: f"({a} ^ {b})",
    "WHERE": lambda d, e, c, a, b: f"({c} ? {a} : {b})",
    "RECIP": lambda d, e, a: f"({d.const(1, e.dtype)} / {a})",
    "NEG": lambda d, e, a: f"(!{a})" if _is_bool(e) else f"(-{paren(a)})",
    "CAST": lambda d, e, a: d.cast(e.srcs[0].dtype, e.dtype, a),
}

# round a float to the nearest float16 and back, without cl_khr_fp16 (half is only a pointer type then)
F16_ROUND = """#ifndef TGRAD_F16R
#define TGRAD_F16R
inline float f16r(float x) {
  ushort h;
  vstore_half_rte(x, 0, (__private half*)&h);
  return vload_half(0, (__private const half*)&h);
}
#endif"""


@dataclass(frozen=True)
class Dialect:
    """One C-style language. The fields are data; the methods write C and are what a language whose
    syntax differs overrides (each says what it means). The renderer reads only this."""

    name: str
    header: str  # first lines of every program (includes, pragmas)
    kernel_prefix: str  # before the kernel's name (WGSL: its attributes, formatted with the workgroup size)
    out_qual: str  # qualifier of the output buffer parameter (WGSL: its address space)
    in_qual: str  # qualifier of input buffer parameters
    local_qual: str  # qualifier of a work-group shared array
    barrier: str  # work-group barrier over local memory
    ids: dict[str, str]  # "gid" (global id), "lid" (local id), "grp" (group id) -> expression
    id_params: dict[str, str] = field(default_factory=dict)  # id -> kernel parameter carrying it (Metal)
    buffer_attr: str = ""  # after each buffer parameter, formatted with its index (Metal: [[buffer(i)]])
    native_half: bool = False  # compute float16 as `half` (else float, with vload_half/vstore_half)
    has_double: bool = True
    extension_pragmas: bool = True  # enable cl_khr_fp64 / cl_khr_fp16 with #pragma OPENCL EXTENSION
    type_names: dict[str, str] = field(default_factory=dict)  # overrides of TYPE_NAMES
    math: dict[str, str] = field(default_factory=dict)  # op -> function name overrides
    if_stmt: str = "if ({}) {}"  # a one-statement if, formatted with the condition and the statement
    # work-items per work-group where the language writes it into the source (WGSL's @workgroup_size);
    # the emitter sets it from the kernel's opts
    local_size: int = 1
    guard_groups: bool = False  # group kernels check the group id too (a 2-D dispatch may overshoot)
    bind_literals: bool = False  # see CStyleRenderer.operand
    # a Kahan sum's new total as the compensation reads it ({t}: the total, {acc}: the one before), where a
    # compiler would otherwise simplify (t - acc) - y to 0 (Mesa's NIR, as drivers may reassociate floats)
    kahan_total: str = "{t}"

    code_for_op: ClassVar[dict[str, Callable[..., str]]] = code_for_op

    # -- types and literals
    def type_name(self, dtype: DType) -> str:
        """The type a value of `dtype` computes in."""
        if dtype == dtypes.float16 and not self.native_half:
            return "float"
        if dtype == dtypes.float64 and not self.has_double:
            raise DTypeError(f"the {self.name} dialect has no float64; cast to float32 first")
        return self.type_names.get(dtype.name, TYPE_NAMES[dtype.name])

    def value_type(self, e: Expr) -> str:
        """The type e's statement declares: int64 index arithmetic whose bounds fit renders as int."""
        if e.dtype == dtypes.int64 and -INT32_MAX <= e.vmin and e.vmax <= INT32_MAX:
            return "int"
        return self.type_name(e.dtype)

    def storage(self, dtype: DType) -> str:
        """The element type of a buffer of `dtype`."""
        if dtype == dtypes.bool:
            return "uchar"
        return self.type_names.get(dtype.name, TYPE_NAMES[dtype.name])

    def const(self, value, dtype: DType) -> str:
        """A literal of `dtype` holding `value`."""
        if dtype == dtypes.bool:
            return "true" if value else "false"
        if dtype.is_float:
            value = float(value)
            if math.isnan(value):
                text = "NAN"
            elif math.isinf(value):
                text = "INFINITY" if value > 0 else "(-INFINITY)"
            elif dtype == dtypes.float64:
                text = repr(value) if "e" in repr(value) or "." in repr(value) else repr(value) + ".0"
            else:  # the shortest text that reads back as the same float32
                text = str(np.float32(value))
                text += "f" if "." in text or "e" in text else ".0f"
            if dtype == dtypes.float64:
                return text if text[0] not in "NI(" else f"((double){text})"
            if dtype == dtypes.float16:
                return f"(({self.type_name(dtype)}){text})" if self.native_half else text
            return text
        value = int(value)
        if dtype == dtypes.int64:
            if value == -(2**63):
                return "(-9223372036854775807L-1)"
            return f"{value}L" if abs(value) > INT32_MAX else str(value)
        if dtype == dtypes.int32:
            return str(value) if value != -(2**31) else "(-2147483647-1)"
        if dtype == dtypes.uint64:  # past long's range an unsuffixed literal has no type in C
            return f"{value}UL"
        return f"(({self.type_name(dtype)}){value})"

    def identity(self, op: str, dtype: DType) -> str:
        """The literal a reduction `op` over `dtype` starts from."""
        return self.const(reduce_identity(op, dtype), dtype)

    def acc_type_name(self, dtype: DType) -> str:
        """The type a reduction over `dtype` accumulates in (a dialect may widen it)."""
        return self.type_name(dtype)

    def from_acc(self, type_name: str, acc_type: str, text: str) -> str:
        """The accumulator `text` (of the type named `acc_type`) as a value of the type named `type_name`."""
        return self.convert(type_name, text)

    def index(self, axis: int, dtype: DType) -> str:
        """The value of loop index `axis` (a variable i<axis>) as a value of `dtype`."""
        return f"i{axis}"

    # -- expressions
    def convert(self, type_name: str, text: str) -> str:
        """A value converted to the type named `type_name` (C's cast syntax)."""
        return f"({type_name}){text}"

    def cast(self, src: DType, dtype: DType, text: str) -> str:
        """CAST of a value of dtype `src` to `dtype` (numpy's semantics: ints wrap, bool is != 0)."""
        if dtype == dtypes.bool:
            return f"({text} != 0)"
        if dtype == dtypes.float16 and not self.native_half:
            return f"f16r((float){text})"
        if dtype.is_int and src.is_float and dtype.itemsize < 8:
            return f"(({self.type_name(dtype)})(long){text})"  # wrap like numpy, not saturate
        return f"(({self.type_name(dtype)}){text})"

    def finite(self, type_name: str, text: str) -> str:
        """Whether a float value of the type named `type_name` is finite (not inf, not nan)."""
        return f"isfinite({text})"

    def apply(self, e: Expr, srcs: list[str]) -> str:
        """e's op applied to rendered sources, by the code_for_op table."""
        rule = self.code_for_op.get(e.op)
        if rule is None:
            raise KernelError(f"the {self.name} renderer has no rule for op {e.op}")
        return rule(self, e, *srcs)

    def alu(self, e: Expr, srcs: list[str]) -> str:
        """The expression computing e (an ALU op or CAST) from its rendered sources."""
        if self.value_type(e) == "long":  # widen int-rendered index operands before arithmetic
            srcs = [f"((long){t})" if self.value_type(s) == "int" else t for s, t in zip(e.srcs, srcs)]
        text = self.apply(e, srcs)
        if e.dtype == dtypes.float16 and not self.native_half and e.op in NARROW_ROUNDED:
            return f"f16r({text})"  # computed in float: rounded per op, as op-by-op evaluation is
        return text

    def load(self, buf: str, dtype: DType, idx: str) -> str:
        """Element idx of input buffer `buf`, as a value of its compute type."""
        if dtype == dtypes.bool:
            return f"({buf}[{idx}] != 0)"
        if dtype == dtypes.float16 and not self.native_half:
            return f"vload_half({idx}, {buf})"
        return f"{buf}[{idx}]"

    def masked_load(self, text: str, valid: str, dtype: DType) -> str:
        """A load that gives 0 where `valid` is false (out of a view's bounds)."""
        return f"({valid} ? {text} : {self.const(0, dtype)})"

    # -- statements
    def declare(self, type_name: str, name: str, value: str, mutable: bool = False) -> str:
        """A statement declaring variable `name` (changed later when `mutable`) initialised to `value`."""
        return f"{type_name} {name} = {value};"

    def store(self, value: str, idx: str, dtype: DType) -> list[str]:
        """Statements storing `value` at element idx of the output buffer `out`."""
        if dtype == dtypes.float16 and not self.native_half:
            return [f"vstore_half_rte({value}, {idx}, out);"]
        return [f"out[{idx}] = ({self.storage(dtype)})({value});"]

    def render_kernel(self, name: str, kernel: Kernel, body: list[str], local: tuple[str, int] | None) -> str:
        """The whole program: header, signature and the (indented) body lines of kernel function `name`.
        local: (type, size) of the work-group array `part` of a group reduction, else None."""
        params = [f"{self.out_qual} {self.storage(kernel.out_dtype)}* out" + self.buffer_attr.format(0)]
        params += [
            f"{self.in_qual} {self.storage(dt)}* in{i}" + self.buffer_attr.format(i + 1)
            for i, dt in enumerate(kernel.in_dtypes)
        ]
        used_ids = ("grp", "lid") if local else ("gid",)
        params += [self.id_params[i] for i in used_ids if i in self.id_params]
        if local:
            body = [f"  {self.local_qual} {local[0]} part[{local[1]}];"] + body
        head = [self.header] if self.header else []
        dts = kernel_dtypes(kernel)
        if self.extension_pragmas and dtypes.float64 in dts:
            head.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if self.extension_pragmas and self.native_half and dtypes.float16 in dts:
            head.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        if not self.native_half and "f16r(" in "\n".join(body):
            head.append(F16_ROUND)
        sig = f"{self.kernel_prefix} {name}({', '.join(params)}) {{"
        return "\n".join(head + [sig] + body + ["}"]) + "\n"


def kernel_dtypes(kernel: Kernel) -> set[DType]:
    seen: set[int] = set()
    found = {kernel.out_dtype, *kernel.in_dtypes}
    stack = [e for e in (kernel.expr, kernel.reduce_expr, kernel.out_index) if e is not None]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        found.add(e.dtype)
        stack.extend(e.srcs)
    return found


# ---------------------------------------------------------------------------------------------------
# the lowering


class CStyleRenderer(StatementPlacer):
    """One kernel's function body: names each Expr's value once (`v<n>`), places its statement in the loop
    nest, and writes the loops, index decoding, reduction and stores through the dialect."""

    def __init__(self, kernel: Kernel, dialect: Dialect):
        self.k, self.d = kernel, dialect
        self.group = find(kernel.opts, OptOps.GROUP)  # work-items per output of a group reduction
        self.lanes = find(kernel.opts, OptOps.LANES)  # accumulators of the innermost reduce loop's steps
        if self.lanes and (self.group or upcasts(kernel.opts) or find(kernel.opts, OptOps.UNROLL)):
            raise KernelError(f"kernel {kernel.name}: a LANES opt goes without GROUP, UPCAST and UNROLL "
                              f"(opts {list(kernel.opts)})")
        # steps per iteration of the innermost reduce loop
        self.unroll = self.lanes or find(kernel.opts, OptOps.UNROLL, 1)
        # a work-item's long float sum in a group reduction, or a lane's: compensated (Kahan), numpy's
        # accuracy; a short one (a row of a few thousand) is as accurate plain, and cheaper (PoCL:
        # bench/HISTORY.md)
        steps = -(-math.prod(kernel.reduce_shape) // max(self.group, self.lanes, 1))
        float_sum = kernel.reduce_op == "SUM" and kernel.acc_dtype.is_float
        self.kahan = bool(self.group or self.lanes) and float_sum and steps > KAHAN_MIN_STEPS
        tiles = tuple(upcasts(kernel.opts))  # register-tiled axes, the innermost first
        self.up = max(upcasts(kernel.opts).values(), default=1)
        self.shape = [s // self.up if j in tiles else s for j, s in enumerate(kernel.shape)]
        self.variants = self.tile_variants(tiles)
        self.names: dict[Expr, str] = {}
        self.bound: dict[Expr, str] = {}  # literals bound to a variable (bind_literals)
        ng, n = kernel.n_global, len(kernel.shape)
        # scope level of each axis' index: 0 for global axes, reduce axes nest (or share one strided loop)
        axis_level = [0] * ng + ([1] * (n - ng) if self.group else list(range(1, n - ng + 1)))
        super().__init__(axis_level, max(axis_level, default=0) + 1)
        self.count = 0
        self.big = math.prod(kernel.shape) > INT32_MAX

    def tile_variants(self, tiles: tuple[int, ...]) -> list[tuple[Expr | None, Expr, Expr, str]]:
        """(reduce value, stored value, store index, accumulator name) of each output of a work-item."""
        k, up = self.k, self.up
        if not tiles:
            return [(k.reduce_expr, k.expr, k.out_index, "acc")]
        out = []
        for u in range(up ** len(tiles)):
            mapping = {}
            for pos, a in enumerate(tiles):
                idx = Expr("IDX", (), (a, k.shape[a] // up), IDX_DT)
                offset = (u // up**pos) % up
                scaled = Expr("MUL", (idx, const(up, IDX_DT)), None, IDX_DT)
                mapping[a] = Expr("ADD", (scaled, const(offset, IDX_DT)), None, IDX_DT) if offset else scaled
            acc = Expr("ACC", (), u, k.acc_dtype)
            memo: dict = {}
            out.append(tuple(_substitute(e, mapping, acc, memo) for e in (k.reduce_expr, k.expr, k.out_index))
                       + (f"acc{u}",))
        return out

    def acc_type(self) -> str:
        """Accumulators of float16 reductions are float32."""
        acc_dt = self.k.acc_dtype
        return self.d.acc_type_name(dtypes.float32 if acc_dt == dtypes.float16 else acc_dt)

    # -- expressions
    def ref(self, e: Expr) -> str:
        """The rendered value of e: a literal, a loop index, or the variable its statement declares."""
        d = self.d
        if e.op == "IDX":
            return d.index(e.arg[0], e.dtype)
        if e.op == "CONST":
            return d.const(e.arg, e.dtype)
        if e.op == "ACC":
            acc = "acc" if e.arg is None else f"acc{e.arg}"
            type_name = d.type_name(e.dtype)
            return f"({d.from_acc(type_name, self.acc_type(), acc)})" if self.acc_type() != type_name else acc
        name = self.names.get(e)
        if name is not None:
            return name
        if e.op == "LOAD":
            idx, valid = (self.ref(s) for s in e.srcs)
            text = d.load(f"in{e.arg}", e.dtype, idx)
            if valid != d.const(True, dtypes.bool):
                text = d.masked_load(text, valid, e.dtype)
        else:
            text = d.alu(e, [self.operand(s, e.srcs) for s in e.srcs])
        return self.bind(e, text, self.names)

    def bind(self, e: Expr, text: str, table: dict[Expr, str]) -> str:
        """A new variable v<n> holding `text`, declared where e's statement goes; table[e] remembers it."""
        name = table[e] = f"v{self.count}"
        self.count += 1
        self.place(e, self.d.declare(self.d.value_type(e), name, text))
        return name

    def operand(self, s: Expr, srcs: tuple[Expr, ...]) -> str:
        """s rendered as an operand of an op over `srcs`. With bind_literals, when every src is a literal the
        literal is bound to a variable first: WGSL evaluates an op over literals when the shader is created
        and rejects a result that overflows or is out of a builtin's range (1.0f / 0.0f, log2(-1.0f),
        3e38f * 10.0f); through a variable the op runs with IEEE results like every other device."""
        text = self.ref(s)
        if not self.d.bind_literals or s.op != "CONST" or not all(x.op == "CONST" for x in srcs):
            return text
        name = self.bound.get(s)
        return name if name is not None else self.bind(s, text, self.bound)

    def combine(self, a: str, b: str) -> str:
        """Two partial results of the reduction combined."""
        return self.d.apply(Expr(REDUCE_ALU[self.k.reduce_op], (), None, self.k.acc_dtype), [a, b])

    # -- the kernel
    def render(self, name: str) -> str:
        k, d = self.k, self.d
        ng, n = k.n_global, len(k.shape)
        int_t = d.type_name(dtypes.int32)
        itype = d.type_name(dtypes.int64) if self.big else int_t
        red = k.reduce_expr is not None
        vals = [self.ref(r) if red else "" for r, _, _, _ in self.variants]
        stores = [s for _, e, idx, _ in self.variants for s in self.store(self.ref(e), idx)]
        accs = [acc for _, _, _, acc in self.variants]
        body: list[str] = []

        def emit(depth: int, lines: list[str]) -> None:
            body.extend("  " * (depth + 1) + s for s in lines)

        # decode the global axes from the output number
        n_out = math.prod(self.shape[:ng])
        guard = d.if_stmt.format(f"gid >= {n_out}", "return;")
        if self.group:
            emit(0, [d.declare(itype, "gid", d.ids["grp"]), d.declare(int_t, "lid", d.ids["lid"])])
            emit(0, [guard] if d.guard_groups else [])
        else:
            emit(0, [d.declare(itype, "gid", d.ids["gid"]), guard])
        emit(0, self.decode("gid", list(range(ng)), itype))
        emit(0, self.levels[0])
        if red:
            acc_t = self.acc_type()
            init = d.identity(k.reduce_op, k.acc_dtype)
            emit(0, [d.declare(acc_t, acc, init, mutable=True) for acc in accs])
            vals = [d.convert(acc_t, val) for val in vals]
            if self.lanes:  # (one output per work-item: accs is ["acc"])
                accs = [f"acc_{j}" for j in range(self.lanes)]
                emit(0, [d.declare(acc_t, acc, init, mutable=True) for acc in accs])
                vals = vals * self.lanes
            if self.kahan:
                zero = d.const(0, dtypes.float32 if k.acc_dtype == dtypes.float16 else k.acc_dtype)
                emit(0, [d.declare(acc_t, f"{acc}_c", zero, mutable=True) for acc in accs])
                updates = [self.kahan_add(acc, val) for acc, val in zip(accs, vals)]
            else:
                updates = [[f"{acc} = {self.combine(acc, val)};"] for acc, val in zip(accs, vals)]
            if not self.lanes:  # (every copy of an unrolled loop updates every accumulator)
                updates = [[line for lines in updates for line in lines]]
            if self.group:
                r = math.prod(k.reduce_shape)
                var = "r" if self.unroll == 1 else "r0"
                step = self.group * self.unroll
                first = d.declare(itype, var, "lid", mutable=True)
                emit(0, [f"for ({first} {var} < {r}; {var} += {step}) {{"])
                each = self.decode("r", list(range(ng, n)), itype) + self.levels[1]
                emit(1, self.unrolled(each, updates, "r", "r0", self.group, r, itype))
                emit(0, ["}", "part[lid] = acc;", d.barrier])
                half = d.declare(int_t, "s", str(self.group // 2), mutable=True)
                emit(0, [f"for ({half} s > 0; s >>= 1) {{"])
                tree = self.combine("part[lid]", "part[lid + s]")
                emit(1, [d.if_stmt.format("lid < s", f"part[lid] = {tree};"), d.barrier])
                emit(0, ["}", d.if_stmt.format("lid != 0", "return;"), "acc = part[0];"])
            else:
                start = d.const(0, dtypes.int32)
                for j in range(ng, n):
                    depth = j - ng
                    var = f"i{j}" if j < n - 1 or self.unroll == 1 else f"i{j}u"
                    loop = d.declare(itype, var, start, mutable=True)
                    step = "++" if var == f"i{j}" else f" += {self.unroll}"
                    emit(depth, [f"for ({loop} {var} < {self.shape[j]}; {var}{step}) {{"])
                    if j < n - 1:
                        emit(depth + 1, self.levels[depth + 1])
                if n > ng:
                    last = self.levels[n - ng]
                    emit(n - ng, self.unrolled(last, updates, f"i{n - 1}", f"i{n - 1}u", 1, self.shape[n - 1],
                                               itype))
                else:
                    emit(0, updates[0])
                for j in reversed(range(ng, n)):
                    emit(j - ng, ["}"])
                if self.lanes and self.kahan:  # (each lane's total less its compensation, added compensated)
                    emit(0, [d.declare(acc_t, "acc_c", zero, mutable=True)])
                    for acc in accs:
                        emit(0, ["{", *("  " + x for x in self.kahan_add("acc", f"({acc} - {acc}_c)")), "}"])
                elif self.lanes:
                    emit(0, self.tree(accs))
        emit(0, self.post + stores)
        return d.render_kernel(name, k, body, (self.acc_type(), self.group) if self.group else None)

    def store(self, value: str, index: Expr) -> list[str]:
        return self.d.store(value, self.ref(index), self.k.out_dtype)

    def unrolled(self, body: list[str], updates: list[list[str]], var: str, base: str, stride: int, end: int,
                 itype: str) -> list[str]:
        """The loop body `body` (over index `var`), then the accumulators' `updates`, once, or with an
        UNROLL or LANES opt once per step of the loop over `base`: each copy in a block of its own, `var` =
        base + k * stride, guarded where the loop's end may fall inside an iteration; copy k takes
        updates[k] where there is one per lane, else updates[0]."""
        if self.unroll == 1:
            return body + updates[0]
        d, out = self.d, []
        whole = end % (stride * self.unroll) == 0
        for k in range(self.unroll):
            step = body + updates[k if len(updates) > 1 else 0]
            out += ["{", "  " + d.declare(itype, var, f"{base} + {k * stride}" if k else base)]
            if k and not whole:
                out += [f"  if ({var} < {end}) {{", *("    " + s for s in step), "  }"]
            else:
                out += ["  " + s for s in step]
            out.append("}")
        return out

    def tree(self, accs: list[str]) -> list[str]:
        """Statements combining the partial results `accs` in pairs (a tree, as a GROUP's work-items are)
        into `acc`."""
        out = []
        while len(accs) > 1:
            out += [f"{a} = {self.combine(a, b)};" for a, b in zip(accs[::2], accs[1::2])]
            accs = accs[::2]
        return out + [f"acc = {accs[0]};"]

    def kahan_add(self, acc: str, val: str) -> list[str]:
        """acc += val with Kahan's compensation (acc_c holds the low part lost so far): a long float sum
        per work-item keeps about one rounding's error, as numpy's pairwise sum does."""
        d, t = self.d, self.acc_type()
        low = f"({d.kahan_total.format(t=f'{acc}_t', acc=acc)} - {acc}) - {acc}_y"
        # past an inf or nan the compensation would be nan (inf - inf): it is 0 there, so the sum is
        # inf or nan as a plain sum is
        where = d.code_for_op["WHERE"]
        return [
            d.declare(t, f"{acc}_y", f"{val} - {acc}_c"),
            d.declare(t, f"{acc}_t", f"{acc} + {acc}_y"),
            f"{acc}_c = {where(d, None, d.finite(t, f'{acc}_t'), low, d.convert(t, '0'))};",
            f"{acc} = {acc}_t;",
        ]

    def decode(self, var: str, axes: list[int], itype: str) -> list[str]:
        """Index of each axis from a flat number over those axes (row-major)."""
        out, stride = [], 1
        int_t = self.d.type_name(dtypes.int32)
        for j in reversed(axes):
            size = self.shape[j]
            text = f"{var} / {stride}" if stride > 1 else var
            if j != axes[0]:
                text = f"({text}) % {size}"
            out.append(self.d.declare(int_t if size <= INT32_MAX else itype, f"i{j}", text))
            stride *= size
        return out[::-1]


def render(kernel: Kernel, dialect: Dialect, name: str | None = None) -> str:
    """Source text of one kernel in a C-style dialect, as a function named `name` (default: the kernel's)."""
    return CStyleRenderer(kernel, dialect).render(name or kernel.name)


def _substitute(e: Expr, mapping: dict[int, Expr], acc: Expr, memo: dict) -> Expr:
    """e with the indices of tiled axes replaced and ACC naming one tile's accumulator."""
    hit = memo.get(id(e))
    if hit is None:
        if e.op == "IDX":
            hit = mapping.get(e.arg[0], e)
        elif e.op == "ACC":
            hit = acc
        elif not e.srcs:
            hit = e
        else:
            hit = Expr(e.op, tuple(_substitute(s, mapping, acc, memo) for s in e.srcs), e.arg, e.dtype)
        memo[id(e)] = hit
    return hit
