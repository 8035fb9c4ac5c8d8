"""Render a Kernel as C-style GPU source: OpenCL C (the CL and QCOM devices) and Metal Shading Language.

One renderer, one small `Dialect` table per language (like tinygrad's renderer/cstyle.py): the kernel
prefix, buffer qualifiers, how thread ids are read, the barrier, type names and half/double support.
`render(kernel, dialect)` is pure and testable without a driver.

Launch rule (the same for every dialect): the output elements are numbered 0..N-1 over the global axes.
- element-wise kernels and short reductions: one work-item per output element, reduce axes as nested
  loops; 1-D launch with local size min(LOCAL_SIZE, N, device maximum), global size N rounded up to a
  multiple of it, and a `gid < N` guard;
- matmul-shaped reductions (a load in the reduced value does not depend on a global axis) get register
  tiles: each work-item computes UPCAST outputs along up to two such axes (UPCAST x UPCAST for a
  matmul), so a loaded value is reused from a register instead of loaded again (NOOPT=1: no tiles);
- reductions over GROUP_REDUCE_MIN or more elements into at most GROUP_REDUCE_MAX_OUT outputs: one
  work-group of GROUP_SIZE work-items per output element; each work-item accumulates a strided slice of
  the reduce axes, then a tree in local (threadgroup) memory combines the partial results and
  work-item 0 stores.
Measured on PoCL (2 busy cores): sum over axis 1 of (8, 100000) 3 ms with group reduction, 28 ms with
one work-item per row; a 256x256 matmul 287 ms with group reduction, 53 ms with one work-item per
output, 2.4 ms with 4x4 register tiles.

float16: in the OpenCL dialect buffers hold `half` and values are loaded and stored with
`vload_half`/`vstore_half_rte` and computed in float (no `cl_khr_fp16` needed); a CAST to float16
inside a kernel rounds through `vstore_half_rte`. Metal (and QCOM on a device with `cl_khr_fp16`)
compute in native `half`; half sums accumulate in float. bool buffers are stored as `uchar`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np

from tgrad.dtype import DType, dtypes
from tgrad.errors import DeviceError, DTypeError, KernelError
from tgrad.fuse import IDX_DT, Expr, Kernel, StatementPlacer, const, reduce_identity
from tgrad.program import Program

LOCAL_SIZE = 128  # work-items per work-group for element-wise kernels
GROUP_REDUCE_MIN = 256  # reduce length from which one work-group cooperates on each output...
GROUP_REDUCE_MAX_OUT = 2048  # ...when there are at most this many outputs (else they fill the device)
GROUP_SIZE = 128  # work-items per output in a group reduction (a power of two)
UPCAST = 4  # register tile: outputs per work-item along each tiled axis
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Dialect:
    """Everything that differs between the C-style languages; the renderer reads only this."""

    name: str
    header: str  # first lines of every program (includes, pragmas)
    kernel_prefix: str  # before the kernel's name
    out_qual: str  # qualifier of the output buffer parameter
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


TYPE_NAMES = {
    "bool": "bool",
    "uint8": "uchar",
    "int8": "char",
    "int16": "short",
    "int32": "int",
    "int64": "long",
    "float16": "half",
    "float32": "float",
    "float64": "double",
}
MATH = {"EXP2": "exp2", "LOG2": "log2", "SIN": "sin", "SQRT": "sqrt", "TRUNC": "trunc"}

OPENCL = Dialect(
    name="OpenCL",
    header="",
    kernel_prefix="__kernel void",
    out_qual="__global",
    in_qual="__global const",
    local_qual="__local",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    ids={"gid": "get_global_id(0)", "lid": "get_local_id(0)", "grp": "get_group_id(0)"},
)
QCOM = replace(OPENCL, name="QCOM", native_half=True)  # Adreno: half is fast; used where cl_khr_fp16 exists
METAL = Dialect(
    name="Metal",
    header="#include <metal_stdlib>\nusing namespace metal;",
    kernel_prefix="kernel void",
    out_qual="device",
    in_qual="const device",
    local_qual="threadgroup",
    barrier="threadgroup_barrier(mem_flags::mem_threadgroup);",
    ids={"gid": "gid_", "lid": "lid_", "grp": "grp_"},
    id_params={
        "gid": "uint gid_ [[thread_position_in_grid]]",
        "lid": "uint lid_ [[thread_position_in_threadgroup]]",
        "grp": "uint grp_ [[threadgroup_position_in_grid]]",
    },
    buffer_attr=" [[buffer({})]]",
    native_half=True,
    has_double=False,
    extension_pragmas=False,
)
DIALECTS = {"CL": OPENCL, "QCOM": QCOM, "METAL": METAL}

# round a float to the nearest float16 and back, without cl_khr_fp16 (half is only a pointer type then)
F16_ROUND = """#ifndef TGRAD_F16R
#define TGRAD_F16R
inline float f16r(float x) {
  ushort h;
  vstore_half_rte(x, 0, (__private half*)&h);
  return vload_half(0, (__private const half*)&h);
}
#endif"""


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


def uses_group_reduce(kernel: Kernel) -> bool:
    """The launch rule: long reductions get one work-group per output element."""
    if kernel.reduce_expr is None or kernel.acc_dtype == dtypes.bool:
        return False
    n_out = math.prod(kernel.global_shape)
    return math.prod(kernel.reduce_shape) >= GROUP_REDUCE_MIN and n_out <= GROUP_REDUCE_MAX_OUT


def _axes_used(e: Expr, memo: dict) -> frozenset[int]:
    hit = memo.get(id(e))
    if hit is None:
        own = frozenset([e.arg[0]]) if e.op == "IDX" else frozenset()
        hit = memo[id(e)] = own.union(*(_axes_used(s, memo) for s in e.srcs))
    return hit


def _loads(root: Expr) -> list[Expr]:
    seen, stack, found = set(), [root], []
    while stack:
        e = stack.pop()
        if id(e) not in seen:
            seen.add(id(e))
            found += [e] if e.op == "LOAD" else []
            stack.extend(e.srcs)
    return found


def tiled_axes(kernel: Kernel) -> tuple[int, ...]:
    """Global axes (at most two, the innermost first) that get register tiles of UPCAST outputs."""
    if os.environ.get("NOOPT") == "1" or kernel.reduce_expr is None or uses_group_reduce(kernel):
        return ()
    memo: dict = {}
    loads = _loads(kernel.reduce_expr)
    axes: list[int] = []
    for a in reversed(range(kernel.n_global)):
        shared = any(a not in _axes_used(ld, memo) for ld in loads)
        if kernel.shape[a] % UPCAST == 0 and shared and len(axes) < 2:
            axes.append(a)
    return tuple(axes)


def launch_sizes(kernel: Kernel, max_local: int) -> tuple[int, int]:
    """(global size, local size) of the 1-D launch of a rendered kernel."""
    n = math.prod(kernel.global_shape) // UPCAST ** len(tiled_axes(kernel))
    if uses_group_reduce(kernel):
        if max_local < GROUP_SIZE:
            raise DeviceError(f"kernel {kernel.name} needs work-groups of {GROUP_SIZE}; the device allows "
                              f"{max_local}: lower tgrad.emit_opencl.GROUP_SIZE")
        return n * GROUP_SIZE, GROUP_SIZE
    local = max(1, min(LOCAL_SIZE, n, max_local))
    return -(-n // local) * local, local


def _math(op: str):
    def rule(r: _Renderer, e: Expr, a: str) -> str:
        if op == "TRUNC" and not e.dtype.is_float:
            return a
        return f"{r.d.math.get(op, MATH[op])}({a})"

    return rule


def _div(op: str):
    """IDIV/MOD. C leaves x/0 and INT_MIN/-1 undefined (a CPU driver traps): like the CPU device, x/0 is 0
    and x%0 is x; a constant divisor other than 0 and -1 needs no guard."""
    sym = "/" if op == "IDIV" else "%"

    def rule(r: _Renderer, e: Expr, a: str, b: str) -> str:
        dt, divisor = e.dtype, e.srcs[1]
        if dt.is_float:
            return f"trunc({a} / {b})" if op == "IDIV" else f"fmod({a}, {b})"
        text = f"({a} {sym} {b})"
        if divisor.op == "CONST" and divisor.arg not in (0, -1):
            return text
        if dt.kind == "i":
            text = f"({b} == -1 ? {f'(-{a})' if op == 'IDIV' else r.const(0, dt)} : {text})"
        return f"({b} == 0 ? {r.const(0, dt) if op == 'IDIV' else a} : {text})"

    return rule


def _max(r: _Renderer, e: Expr, a: str, b: str) -> str:
    if e.dtype == dtypes.bool:
        return f"({a} || {b})"
    if e.dtype.is_float:  # fmax would drop a nan
        return f"(({a} > {b} || {a} != {a}) ? {a} : {b})"
    return f"({a} > {b} ? {a} : {b})"


def _is_bool(e: Expr) -> bool:
    return e.dtype == dtypes.bool


# code_for_op: op name -> f(renderer, expr, *rendered sources) -> C expression
code_for_op = {
    **{op: _math(op) for op in MATH},
    "ADD": lambda r, e, a, b: f"({a} || {b})" if _is_bool(e) else f"({a} + {b})",
    "SUB": lambda r, e, a, b: f"({a} - {b})",
    "MUL": lambda r, e, a, b: f"({a} && {b})" if _is_bool(e) else f"({a} * {b})",
    "IDIV": _div("IDIV"),
    "MOD": _div("MOD"),
    "MAX": _max,
    "CMPLT": lambda r, e, a, b: f"({a} < {b})",
    "CMPNE": lambda r, e, a, b: f"({a} != {b})",
    "AND": lambda r, e, a, b: f"({a} & {b})",
    "OR": lambda r, e, a, b: f"({a} | {b})",
    "XOR": lambda r, e, a, b: f"({a} ^ {b})",
    "WHERE": lambda r, e, c, a, b: f"({c} ? {a} : {b})",
    "RECIP": lambda r, e, a: f"({r.const(1, e.dtype)} / {a})",
    "NEG": lambda r, e, a: f"(!{a})" if _is_bool(e) else f"(-{a})",
    "CAST": lambda r, e, a: r.cast(e.srcs[0], e.dtype, a),
}


class _Renderer(StatementPlacer):
    def __init__(self, kernel: Kernel, dialect: Dialect, group: int, tiles: tuple[int, ...] = ()):
        self.k, self.d, self.group = kernel, dialect, group
        self.shape = [s // UPCAST if j in tiles else s for j, s in enumerate(kernel.shape)]
        self.variants = self.tile_variants(tiles)
        self.names: dict[Expr, str] = {}
        ng, n = kernel.n_global, len(kernel.shape)
        # scope level of each axis' index: 0 for global axes, reduce axes nest (or share one strided loop)
        axis_level = [0] * ng + ([1] * (n - ng) if group else list(range(1, n - ng + 1)))
        super().__init__(axis_level, max(axis_level, default=0) + 1)
        self.count = 0
        self.big = math.prod(kernel.shape) > INT32_MAX

    def tile_variants(self, tiles: tuple[int, ...]) -> list[tuple[Expr | None, Expr, Expr, str]]:
        """(reduce value, stored value, store index, accumulator name) of each output of a work-item."""
        k = self.k
        if not tiles:
            return [(k.reduce_expr, k.expr, k.out_index, "acc")]
        out = []
        for u in range(UPCAST ** len(tiles)):
            mapping = {}
            for pos, a in enumerate(tiles):
                idx = Expr("IDX", (), (a, k.shape[a] // UPCAST), IDX_DT)
                offset = (u // UPCAST**pos) % UPCAST
                scaled = Expr("MUL", (idx, const(UPCAST, IDX_DT)), None, IDX_DT)
                mapping[a] = Expr("ADD", (scaled, const(offset, IDX_DT)), None, IDX_DT) if offset else scaled
            acc = Expr("ACC", (), u, k.acc_dtype)
            memo: dict = {}
            out.append(tuple(_substitute(e, mapping, acc, memo) for e in (k.reduce_expr, k.expr, k.out_index))
                       + (f"acc{u}",))
        return out

    # -- types
    def tname(self, dtype: DType) -> str:
        if dtype == dtypes.float16 and not self.d.native_half:
            return "float"
        if dtype == dtypes.float64 and not self.d.has_double:
            raise DTypeError(f"the {self.d.name} dialect has no float64; cast to float32 first")
        return self.d.type_names.get(dtype.name, TYPE_NAMES[dtype.name])

    def storage(self, dtype: DType) -> str:
        if dtype == dtypes.bool:
            return "uchar"
        return self.d.type_names.get(dtype.name, TYPE_NAMES[dtype.name])

    def acc_type(self) -> str:
        return "float" if self.k.acc_dtype == dtypes.float16 else self.tname(self.k.acc_dtype)

    def ctype(self, e: Expr) -> str:
        """int64 index arithmetic whose bounds fit renders as int."""
        if e.dtype == dtypes.int64 and -INT32_MAX <= e.vmin and e.vmax <= INT32_MAX:
            return "int"
        return self.tname(e.dtype)

    def const(self, value, dtype: DType) -> str:
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
                return f"(({self.tname(dtype)}){text})" if self.d.native_half else text
            return text
        value = int(value)
        if dtype == dtypes.int64:
            if value == -(2**63):
                return "(-9223372036854775807L-1)"
            return f"{value}L" if abs(value) > INT32_MAX else str(value)
        if dtype == dtypes.int32:
            return str(value) if value != -(2**31) else "(-2147483647-1)"
        return f"(({self.tname(dtype)}){value})"

    # -- expressions
    def alu(self, e: Expr, srcs: list[str]) -> str:
        rule = code_for_op.get(e.op)
        if rule is None:
            raise KernelError(f"the {self.d.name} renderer has no rule for op {e.op}")
        return rule(self, e, *srcs)

    def cast(self, src: Expr, dtype: DType, text: str) -> str:
        if dtype == dtypes.bool:
            return f"({text} != 0)"
        if dtype == dtypes.float16 and not self.d.native_half:
            return f"f16r((float){text})"
        if dtype.is_int and src.dtype.is_float and dtype.itemsize < 8:
            return f"(({self.tname(dtype)})(long){text})"  # wrap like numpy, not saturate
        return f"(({self.tname(dtype)}){text})"

    def load(self, e: Expr, idx: str) -> str:
        buf = f"in{e.arg}"
        if e.dtype == dtypes.bool:
            return f"({buf}[{idx}] != 0)"
        if e.dtype == dtypes.float16 and not self.d.native_half:
            return f"vload_half({idx}, {buf})"
        return f"{buf}[{idx}]"

    def ref(self, e: Expr) -> str:
        if e.op == "IDX":
            return f"i{e.arg[0]}"
        if e.op == "CONST":
            return self.const(e.arg, e.dtype)
        if e.op == "ACC":
            acc = "acc" if e.arg is None else f"acc{e.arg}"
            return f"(({self.tname(e.dtype)}){acc})" if self.acc_type() != self.tname(e.dtype) else acc
        name = self.names.get(e)
        if name is not None:
            return name
        ctype = self.ctype(e)
        srcs = [self.ref(s) for s in e.srcs]
        if e.op == "LOAD":
            text = self.load(e, srcs[0])
            if srcs[1] != "true":
                text = f"({srcs[1]} ? {text} : {self.const(0, e.dtype)})"
        else:
            if ctype == "long":  # widen int-rendered index operands before arithmetic
                srcs = [f"((long){t})" if self.ctype(s) == "int" else t for s, t in zip(e.srcs, srcs)]
            text = self.alu(e, srcs)
        name = self.names[e] = f"v{self.count}"
        self.count += 1
        self.place(e, f"{ctype} {name} = {text};")
        return name

    def combine(self, a: str, b: str) -> str:
        op = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX"}[self.k.reduce_op]
        return self.alu(Expr(op, (), None, self.k.acc_dtype), [a, b])

    def store(self, value: str, index: Expr) -> str:
        k = self.k
        idx = self.ref(index)
        if k.out_dtype == dtypes.float16 and not self.d.native_half:
            return f"vstore_half_rte({value}, {idx}, out);"
        return f"out[{idx}] = ({self.storage(k.out_dtype)})({value});"

    # -- the kernel
    def render(self, name: str) -> str:
        k, d = self.k, self.d
        ng, n = k.n_global, len(k.shape)
        itype = "long" if self.big else "int"
        red = k.reduce_expr is not None
        vals = [self.ref(r) if red else "" for r, _, _, _ in self.variants]
        stores = [self.store(self.ref(e), idx) for _, e, idx, _ in self.variants]
        accs = [acc for _, _, _, acc in self.variants]
        body: list[str] = []

        def emit(depth: int, lines: list[str]) -> None:
            body.extend("  " * (depth + 1) + s for s in lines)

        # decode the global axes from the output number
        n_out = math.prod(self.shape[:ng])
        if self.group:
            body.append(f"  {d.local_qual} {self.acc_type()} part[{self.group}];")
            emit(0, [f"{itype} gid = {d.ids['grp']};", f"int lid = {d.ids['lid']};"])
        else:
            emit(0, [f"{itype} gid = {d.ids['gid']};", f"if (gid >= {n_out}) return;"])
        emit(0, self.decode("gid", list(range(ng)), itype))
        emit(0, self.levels[0])
        if red:
            acc_t = self.acc_type()
            init = self.const(reduce_identity(k.reduce_op, k.acc_dtype), k.acc_dtype)
            emit(0, [f"{acc_t} {acc} = {init};" for acc in accs])
            updates = [f"{acc} = {self.combine(acc, f'({acc_t}){val}')};" for acc, val in zip(accs, vals)]
            if self.group:
                r = math.prod(k.reduce_shape)
                emit(0, [f"for ({itype} r = lid; r < {r}; r += {self.group}) {{"])
                emit(1, self.decode("r", list(range(ng, n)), itype))
                emit(1, self.levels[1] + updates)
                emit(0, ["}", "part[lid] = acc;", d.barrier])
                emit(0, [f"for (int s = {self.group // 2}; s > 0; s >>= 1) {{"])
                tree = self.combine("part[lid]", "part[lid + s]")
                emit(1, [f"if (lid < s) part[lid] = {tree};", d.barrier])
                emit(0, ["}", "if (lid != 0) return;", "acc = part[0];"])
            else:
                for j in range(ng, n):
                    depth = j - ng
                    emit(depth, [f"for ({itype} i{j} = 0; i{j} < {self.shape[j]}; i{j}++) {{"])
                    emit(depth + 1, self.levels[depth + 1])
                emit(n - ng, updates)
                for j in reversed(range(ng, n)):
                    emit(j - ng, ["}"])
        emit(0, self.post + stores)
        params = [f"{d.out_qual} {self.storage(k.out_dtype)}* out" + d.buffer_attr.format(0)]
        params += [
            f"{d.in_qual} {self.storage(dt)}* in{i}" + d.buffer_attr.format(i + 1)
            for i, dt in enumerate(k.in_dtypes)
        ]
        used_ids = ("grp", "lid") if self.group else ("gid",)
        params += [d.id_params[i] for i in used_ids if i in d.id_params]
        head = [d.header] if d.header else []
        dts = kernel_dtypes(k)
        if d.extension_pragmas and dtypes.float64 in dts:
            head.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if d.extension_pragmas and d.native_half and dtypes.float16 in dts:
            head.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        if not d.native_half and "f16r(" in "\n".join(body):
            head.append(F16_ROUND)
        sig = f"{d.kernel_prefix} {name}({', '.join(params)}) {{"
        return "\n".join(head + [sig] + body + ["}"]) + "\n"

    def decode(self, var: str, axes: list[int], itype: str) -> list[str]:
        """Index of each axis from a flat number over those axes (row-major)."""
        out, stride = [], 1
        for j in reversed(axes):
            size = self.shape[j]
            text = f"{var} / {stride}" if stride > 1 else var
            if j != axes[0]:
                text = f"({text}) % {size}"
            out.append(f"{'int' if size <= INT32_MAX else itype} i{j} = {text};")
            stride *= size
        return out[::-1]


def render(kernel: Kernel, dialect: Dialect = OPENCL, name: str | None = None) -> str:
    """Source text of one kernel in a C-style dialect (OPENCL, QCOM or METAL)."""
    group = GROUP_SIZE if uses_group_reduce(kernel) else 0
    return _Renderer(kernel, dialect, group, tiled_axes(kernel)).render(name or kernel.name)


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


def program(kernel: Kernel, dialect: Dialect = OPENCL, max_local: int = 1024) -> Program:
    """The kernel as a Program in a C-style dialect: its source and 1-D launch (global and local size, for
    a device whose work-groups hold at most `max_local` items)."""
    global_size, local_size = launch_sizes(kernel, max_local)
    return Program(kernel.name, render(kernel, dialect), (global_size,), (local_size,))
