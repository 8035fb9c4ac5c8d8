"""Render a Kernel as a WGSL compute shader (the WEBGPU device; its runtime is tgrad/runtime/webgpu.py).

One invocation computes one output element: the invocation number is split into the global indices,
the reduce axes are loops inside it with a scalar accumulator. When the reduce is long and the outputs
are few, one workgroup computes one output instead: its invocations stride over the flattened reduce
axes and combine their partial results as a tree in workgroup memory (`TREE_*` below).

Workgroup size rule: `WORKGROUP` (64) invocations for one-per-output kernels (a multiple of every
vendor's SIMD width, within WebGPU's default limit of 256); `TREE_WORKGROUP` (256) for tree reductions.
A launch of more workgroups than the adapter allows per dimension becomes a 2-D dispatch.

Types. WGSL has 32-bit scalars, `bool`, and no 8-bit storage:
- bool, uint8, int8 are stored 4 per `u32` word, int16 and float16 2 per word (their bytes, little
  endian, exactly as numpy lays them out). Loads extract and sign-extend; stores write one byte or half
  word with `atomicAnd` + `atomicOr` on the word, so neighbouring invocations never lose each other's
  writes. Small integers compute in 32 bits and wrap back to their width after every arithmetic op.
- float16 computes in f32, rounded to half precision after each arithmetic op, by CAST and by the store
  (helpers f16round / f16bits; no adapter feature needed, so `shader-f16` is not used).
- int64 is held as int32 on the device (the rule): uploads outside the int32 range raise a DTypeError,
  constants outside it too, and arithmetic wraps at 32 bits; downloads widen back to int64. WGSL has
  no 64-bit integers; wgpu-native's `shader-int64` offers `i64` (WEBGPU_INT64=1 uses it), but Mesa
  22.3's lavapipe miscompiles `i64(x) < 5li`, so it is off by default.
- float64 is `f64` where the adapter has `shader-f64` and `shader-int64` (lavapipe has both; exp2, log2
  and sin are WGSL functions here, as Vulkan has them for 32-bit floats only). Elsewhere a float64
  tensor raises a DTypeError asking for a cast to float32.
- Index expressions (int64 in the Kernel) are rendered as i32: buffers are far below 2**31 elements.

Floats: WGSL lets drivers assume there are no NaNs, so NaN tests look at the bits, comparisons are
written so that an ordered compare gives the right answer, and MAX propagates NaN explicitly.
"""

from __future__ import annotations

import math

import numpy as np

from tgrad.dtype import DType, dtypes
from tgrad.errors import DTypeError, KernelError
from tgrad.fuse import Expr, Kernel, StatementPlacer, is_const, reduce_identity
from tgrad.program import Program

WORKGROUP = 64
TREE_WORKGROUP = 256
TREE_MIN_REDUCE = 256  # reduce length from which a tree reduction is used ...
TREE_MAX_OUTPUTS = 8192  # ... when there are at most this many outputs

# float16 computes in f32 and is rounded to half precision after each of these ops (as numpy does)
F16_ROUNDED = {"ADD", "SUB", "MUL", "MAX", "EXP2", "LOG2", "SIN", "SQRT", "RECIP", "IDIV", "MOD"}
# Vulkan's GLSL.std.450 has these for 16/32-bit floats only: float64 uses the helpers in HELPERS_F64
F64_MATH = {"EXP2": "exp2_64", "LOG2": "log2_64", "SIN": "sin64"}
PACKED = {dtypes.bool: 4, dtypes.uint8: 4, dtypes.int8: 4, dtypes.int16: 2, dtypes.float16: 2}
SMALL_INT_BITS = {dtypes.uint8: 8, dtypes.int8: 8, dtypes.int16: 16}

HELPERS_F32 = """fn nan32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn finite32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) < 0x7f800000u; }
fn max32(a: f32, b: f32) -> f32 { return select(select(max(a, b), b, nan32(b)), a, nan32(a)); }
fn f16bits(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let s = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return s | 0x7e00u; }
  if (a >= 0x477ff000u) { return s | 0x7c00u; }
  return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}
fn f16round(x: f32) -> f32 { return unpack2x16float(f16bits(x)).x; }
"""


def _horner(coefs: list[float], var: str) -> str:
    """c0 + var * (c1 + var * (c2 + ...)) as f64 WGSL."""
    text = f"{coefs[-1]!r}lf"
    for c in reversed(coefs[:-1]):
        text = f"{c!r}lf + {var} * ({text})"
    return text


# Taylor series: exp on |t| <= ln(2)/2, sin and cos on |r| <= pi/4, log(m) = 2 atanh(s) on |s| <= 0.172
EXP_POLY = _horner([1 / math.factorial(k) for k in range(14)], "t")
SIN_POLY = _horner([(-1) ** k / math.factorial(2 * k + 1) for k in range(10)], "r2")
COS_POLY = _horner([(-1) ** k / math.factorial(2 * k) for k in range(10)], "r2")
LOG_POLY = _horner([1 / (2 * k + 1) for k in range(12)], "s2")

# float64 helpers; exp2_64, log2_64 and sin64 are accurate to a few ulp (sin64 for |x| < 1e15)
HELPERS_F64 = f"""fn nan64(x: f64) -> bool {{
  return (bitcast<u64>(x) & 0x7ffffffffffffffflu) > 0x7ff0000000000000lu;
}}
fn finite64(x: f64) -> bool {{ return (bitcast<u64>(x) & 0x7ffffffffffffffflu) < 0x7ff0000000000000lu; }}
fn max64(a: f64, b: f64) -> f64 {{ return select(select(max(a, b), b, nan64(b)), a, nan64(a)); }}
fn pow2_64(n: i32) -> f64 {{ return bitcast<f64>(u64(n + 1023) << 52u); }}
fn exp2_64(x: f64) -> f64 {{
  if (nan64(x)) {{ return x; }}
  if (x >= 1024.0lf) {{ return bitcast<f64>(0x7ff0000000000000lu); }}
  if (x < -1080.0lf) {{ return 0.0lf; }}
  let n = floor(x + 0.5lf);
  let t = (x - n) * 0.6931471805599453lf;
  let p = {EXP_POLY};
  let k = i32(n);
  return p * pow2_64(k / 2) * pow2_64(k - k / 2);
}}
fn log2_64(x0: f64) -> f64 {{
  if (nan64(x0) || x0 < 0.0lf) {{ return bitcast<f64>(0x7ff8000000000000lu); }}
  if (x0 == 0.0lf) {{ return bitcast<f64>(0xfff0000000000000lu); }}
  if (bitcast<u64>(x0) == 0x7ff0000000000000lu) {{ return x0; }}
  var x = x0;
  var e = 0;
  if (bitcast<u64>(x) < 0x0010000000000000lu) {{ x = x * 18014398509481984.0lf; e = -54; }}
  let b = bitcast<u64>(x);
  e = e + i32((b >> 52u) & 0x7fflu) - 1023;
  var m = bitcast<f64>((b & 0x000fffffffffffffflu) | 0x3ff0000000000000lu);
  if (m > 1.4142135623730951lf) {{ m = m * 0.5lf; e = e + 1; }}
  let s = (m - 1.0lf) / (m + 1.0lf);
  let s2 = s * s;
  let ln = 2.0lf * s * ({LOG_POLY});
  return f64(e) + ln * 1.4426950408889634lf;
}}
fn sin64(x: f64) -> f64 {{
  if (nan64(x) || (bitcast<u64>(x) & 0x7ffffffffffffffflu) == 0x7ff0000000000000lu) {{
    return bitcast<f64>(0x7ff8000000000000lu);
  }}
  let k = floor(x * 0.6366197723675814lf + 0.5lf);
  let r = ((x - k * 1.5707963267341256lf) - k * 6.077100506303966e-11lf) - k * 2.0222662487111665e-21lf;
  let r2 = r * r;
  let q = i32(k - 4.0lf * floor(k * 0.25lf));
  let sn = r * ({SIN_POLY});
  let cs = {COS_POLY};
  let v = select(sn, cs, (q & 1) == 1);
  return select(v, -v, q >= 2);
}}
"""


HELPERS = {chunk.split("(")[0]: "fn " + chunk for chunk in (HELPERS_F32 + HELPERS_F64)[3:].split("\nfn ")}


def _helpers_for(code: str) -> str:
    """The helper functions `code` calls (and the ones they call), in definition order."""
    used: set[str] = set()
    pending = code
    while True:
        new = {name for name in HELPERS if name not in used and f"{name}(" in pending}
        if not new:
            break
        used |= new
        pending = "".join(HELPERS[name] for name in new)
    return "".join(HELPERS[name].rstrip("\n") + "\n" for name in HELPERS if name in used) + (
        "\n" if used else ""
    )


class Target:
    """How 64-bit types are rendered. int64: as WGSL i64 (else as i32); float64: as f64 (needs the
    adapter's shader-f64, and shader-int64 for the u64 bit tests in HELPERS_F64)."""

    def __init__(self, int64: bool = False, float64: bool = True):
        self.int64, self.float64 = int64, float64

    def check(self, dtype: DType) -> None:
        if dtype == dtypes.float64 and not self.float64:
            raise DTypeError(
                "float64 on WEBGPU needs the adapter features shader-f64 and shader-int64 (this adapter "
                "lacks one); cast the tensor to float32: t.cast(dtypes.float32)"
            )

    def type(self, dtype: DType, idx: bool = False) -> str:
        """The WGSL type a value of `dtype` computes in (index expressions: always i32)."""
        if dtype == dtypes.int64:
            return "i64" if self.int64 and not idx else "i32"
        if dtype == dtypes.float64:
            return "f64"
        if dtype == dtypes.bool:
            return "bool"
        if dtype == dtypes.uint8:
            return "u32"
        return "f32" if dtype.is_float else "i32"

    def storage(self, dtype: DType) -> str:
        """The WGSL element type of a buffer of `dtype`."""
        return "u32" if dtype in PACKED else self.type(dtype)

    def itemsize(self, dtype: DType) -> int:
        return 4 if dtype == dtypes.int64 and not self.int64 else dtype.itemsize


def render_const(value, dtype: DType, ty: str) -> str:
    """A WGSL literal of type `ty` holding `value` (a value of `dtype`)."""
    if ty == "bool":
        return "true" if value else "false"
    if ty in ("f32", "f64"):
        v = float(value)
        if dtype == dtypes.float16:
            v = float(np.float16(v))
        elif ty == "f32":
            v = float(np.float32(v))
        if math.isnan(v) or math.isinf(v):
            bits = 0x7FC00000 if math.isnan(v) else (0x7F800000 if v > 0 else 0xFF800000)
            text = f"bitcast<f32>({bits:#010x}u)"
            return text if ty == "f32" else f"f64({text})"
        return f"{v!r}f" if ty == "f32" else f"{v!r}lf"
    v = int(value)
    if ty == "u32":
        return f"{v & 0xFFFFFFFF}u"
    bits = 64 if ty == "i64" else 32
    if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
        raise DTypeError(
            f"the int64 constant {v} does not fit the int32 that holds int64 on WEBGPU; use values "
            "within +-2**31, or another device"
        )
    suffix = "li" if bits == 64 else "i"
    if v == -(1 << (bits - 1)):
        return f"({v + 1}{suffix} - 1{suffix})"
    return f"{v}{suffix}"


def _wrap_small(dtype: DType, text: str) -> str:
    """Wrap a 32-bit result back to the width of a small integer dtype."""
    bits = SMALL_INT_BITS.get(dtype)
    if bits is None:
        return text
    if dtype == dtypes.uint8:
        return f"(({text}) & 0xffu)"
    return f"((({text}) << {32 - bits}u) >> {32 - bits}u)"


def _binary(sym: str):
    return lambda dt, ty, a, b: _wrap_small(dt, f"({a} {sym} {b})")


def _max(dt: DType, ty: str, a: str, b: str) -> str:
    if ty == "bool":
        return f"({a} || {b})"
    if ty in ("f32", "f64"):
        return f"max{ty[1:]}({a}, {b})"
    return f"max({a}, {b})"


def _idiv(dt: DType, ty: str, a: str, b: str) -> str:
    if ty in ("f32", "f64"):
        return f"trunc({a} / {b})"
    return _wrap_small(dt, f"select({a} / {b}, {render_const(0, dt, ty)}, {b} == {render_const(0, dt, ty)})")


def _mod(dt: DType, ty: str, a: str, b: str) -> str:
    if ty in ("f32", "f64"):
        return f"({a} % {b})"
    # x % 0 is x, as on every other device (WGSL gives 0)
    return _wrap_small(dt, f"select({a} % {b}, {a}, {b} == {render_const(0, dt, ty)})")


def _logic(sym: str, bool_sym: str):
    return lambda dt, ty, a, b: f"({a} {bool_sym if ty == 'bool' else sym} {b})"


# code_for_op: op name -> f(result dtype, WGSL type of the operands, *rendered sources) -> source text
code_for_op = {
    "ADD": _binary("+"),
    "SUB": _binary("-"),
    "MUL": _binary("*"),
    "IDIV": _idiv,
    # x % 0 is x, as on every other device (WGSL gives 0)
    "MOD": _mod,
    "MAX": _max,
    "CMPLT": lambda dt, ty, a, b: f"({a} < {b})",
    "CMPNE": lambda dt, ty, a, b: f"!({a} == {b})",
    "AND": _logic("&", "&&"),
    "OR": _logic("|", "||"),
    "XOR": _logic("^", "!="),
    "WHERE": lambda dt, ty, c, a, b: f"select({b}, {a}, {c})",
    "EXP2": lambda dt, ty, a: f"exp2({a})",
    "LOG2": lambda dt, ty, a: f"log2({a})",
    "SIN": lambda dt, ty, a: f"sin({a})",
    "SQRT": lambda dt, ty, a: f"sqrt({a})",
    "RECIP": lambda dt, ty, a: f"({render_const(1, dt, ty)} / {a})",
    "NEG": lambda dt, ty, a: _wrap_small(dt, f"(0u - {a})" if ty == "u32" else f"(-{a})"),
    "TRUNC": lambda dt, ty, a: f"trunc({a})",
}


def _cast(src: DType, src_ty: str, dst: DType, dst_ty: str, x: str) -> str:
    if dst_ty == "bool":
        return x if src_ty == "bool" else f"!({x} == {render_const(0, src, src_ty)})"
    if src_ty == "bool":
        return f"{dst_ty}({x})"
    if dst.is_float:
        text = x if src_ty == dst_ty else f"{dst_ty}({x})"
        return f"f16round({text})" if dst == dtypes.float16 and src != dtypes.float16 else text
    # integer targets: floats truncate through a signed integer, then wrap to the width
    if src.is_float:
        x = f"{'i64' if dst_ty == 'i64' else 'i32'}({x})"
        src_ty = "i64" if dst_ty == "i64" else "i32"
    if dst == dtypes.uint8:
        return f"(u32({x if src_ty != 'i64' else f'i32({x})'}) & 0xffu)"
    text = x if src_ty == dst_ty else f"{dst_ty}({x})"
    return _wrap_small(dst, text)


def _load(dtype: DType, buf: str, j: str) -> str:
    """Element j (an i32 expression) of input buffer `buf` as a value of its compute type."""
    per = PACKED.get(dtype)
    if per is None:
        return f"{buf}[{j}]"
    bits = 32 // per
    word = f"{buf}[{j} >> {per.bit_length() - 1}u]"
    shift = f"((u32({j}) & {per - 1}u) * {bits}u)"
    if dtype == dtypes.float16:
        return f"unpack2x16float({word} >> {shift}).x"
    if dtype in (dtypes.bool, dtypes.uint8):
        text = f"(({word} >> {shift}) & 0xffu)"
        return f"({text} != 0u)" if dtype == dtypes.bool else text
    return f"(bitcast<i32>({word} << ({32 - bits}u - {shift})) >> {32 - bits}u)"


def _store(dtype: DType, j: str, value: str) -> list[str]:
    """Statements storing `value` at element j of the output buffer."""
    per = PACKED.get(dtype)
    if per is None:
        return [f"out[{j}] = {value};"]
    bits = 32 // per
    mask = (1 << bits) - 1
    if dtype == dtypes.float16:
        pattern = f"f16bits({value})"
    elif dtype == dtypes.bool:
        pattern = f"select(0u, 1u, {value})"
    elif dtype == dtypes.uint8:
        pattern = f"({value} & 0xffu)"
    else:
        pattern = f"(bitcast<u32>({value}) & {mask:#x}u)"
    return [
        f"let ow = {j} >> {per.bit_length() - 1}u;",
        f"let os = (u32({j}) & {per - 1}u) * {bits}u;",
        f"atomicAnd(&out[ow], ~({mask:#x}u << os));",
        f"atomicOr(&out[ow], {pattern} << os);",
    ]


def _folds_to_zero(e: Expr) -> bool:
    """x * 0 and x - x: Mesa folds these to 0 (drivers may assume no NaN or inf), so they are written out."""
    if e.op == "MUL":
        return is_const(e.srcs[0], 0) or is_const(e.srcs[1], 0)
    return e.op == "SUB" and e.srcs[0] == e.srcs[1]


def use_tree(kernel: Kernel) -> bool:
    """The rule for a workgroup-memory tree reduction: a long reduce and few outputs."""
    if kernel.reduce_expr is None:
        return False
    return math.prod(kernel.reduce_shape) >= TREE_MIN_REDUCE and math.prod(kernel.global_shape) <= (
        TREE_MAX_OUTPUTS
    )


def _split(names: list[str], shape: tuple[int, ...], flat: str) -> list[str]:
    """`let` statements splitting the flat i32 index `flat` into row-major indices over `shape`."""
    out, stride = [], math.prod(shape)
    for name, size in zip(names, shape):
        stride //= size
        text = flat if stride == 1 else f"({flat} / {stride})"
        if stride * size != math.prod(shape):
            text = f"({text} % {size})"
        out.append(f"let {name} = {text};")
    return out


class _Renderer(StatementPlacer):
    def __init__(self, kernel: Kernel, target: Target):
        super().__init__([a + 1 for a in range(len(kernel.shape))], len(kernel.shape) + 1)
        self.k, self.t = kernel, target
        self.names: dict[tuple, str] = {}
        self.count = 0

    def ref(self, e: Expr, idx: bool = False) -> str:
        """The rendered value of e; idx: e is part of an index (int64 renders as i32 there)."""
        idx = idx and self.t.int64  # with int64 held as i32 an index renders like any value
        ty = self.t.type(e.dtype, idx)
        if e.op == "IDX":
            return f"i{e.arg[0]}" if ty == "i32" else f"{ty}(i{e.arg[0]})"
        if e.op == "CONST":
            return render_const(e.arg, e.dtype, ty)
        if e.op == "ACC":
            return "acc"
        if e.op == "LOAD" and idx and ty != self.t.type(e.dtype):
            return f"{ty}({self.ref(e, False)})"
        name = self.names.get((e, idx))
        if name is not None:
            return name
        if e.op == "LOAD":
            j, valid = self.ref(e.srcs[0], True), self.ref(e.srcs[1], True)
            text = _load(e.dtype, f"in{e.arg}", j)
            if valid == "false":  # never read (a view of nothing): WGSL rejects a constant index < 0
                text = render_const(0, e.dtype, ty)
            elif valid != "true":
                text = f"select({render_const(0, e.dtype, ty)}, {text}, {valid})"
        elif e.op == "CAST":
            s = e.srcs[0]
            src_ty = self.t.type(s.dtype, idx)
            text = _cast(s.dtype, src_ty, e.dtype, ty, self.operand(s, idx, [s]))
        else:
            srcs = [self.operand(s, idx, e.srcs) for s in e.srcs]
            operand_ty = self.t.type(e.srcs[-1].dtype, idx)
            text = code_for_op[e.op](e.dtype, operand_ty, *srcs)
            if operand_ty in ("f32", "f64") and _folds_to_zero(e):
                x = srcs[1] if e.op == "MUL" and is_const(e.srcs[0], 0) else srcs[0]
                zero, nan = render_const(0, e.dtype, ty), render_const(math.nan, e.dtype, ty)
                text = f"select({zero}, {nan}, !finite{operand_ty[1:]}({x}))"
            elif operand_ty in ("f32", "f64") and e.op in ("ADD", "SUB", "MUL") and any(
                s.op == "CONST" and s.arg != s.arg for s in e.srcs
            ):  # x + nan, x * nan are nan; Mesa folds 0 * nan to 0 (the mean of an empty axis)
                text = render_const(math.nan, e.dtype, ty)
            if e.dtype == dtypes.float16 and e.op in F16_ROUNDED:
                text = f"f16round({text})"
            elif e.dtype == dtypes.float64 and e.op in F64_MATH:
                text = f"{F64_MATH[e.op]}({srcs[0]})"
        name = self.names[(e, idx)] = f"v{self.count}"
        self.count += 1
        self.place(e, f"let {name} = {text};")
        return name

    def operand(self, s: Expr, idx: bool, srcs) -> str:
        """s rendered as an operand of an op over `srcs`. When every src is a literal, WGSL evaluates
        the op when the shader is created and rejects a result that overflows or is out of a builtin's
        range (1.0f / 0.0f, log2(-1.0f), 3e38f * 10.0f): the literal is bound to a `let` first, which
        makes the op a runtime one with IEEE results like every other device."""
        text = self.ref(s, idx)
        if s.op != "CONST" or not all(x.op == "CONST" for x in srcs):
            return text
        key = (s, idx, "let")
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"v{self.count}"
            self.count += 1
            self.place(s, f"let {name} = {text};")
        return name

    def combine(self, a: str, b: str) -> str:
        k = self.k
        acc_dt = k.reduce_expr.dtype
        ty = self.t.type(acc_dt)
        if ty == "bool":
            return f"({a} && {b})" if k.reduce_op == "PROD" else f"({a} || {b})"
        op = {"SUM": "ADD", "PROD": "MUL", "MAX": "MAX"}[k.reduce_op]
        return code_for_op[op](acc_dt, ty, a, b)

    def identity(self) -> str:
        acc_dt = self.k.reduce_expr.dtype
        ty = self.t.type(acc_dt)
        value = reduce_identity(self.k.reduce_op, acc_dt)
        if ty == "i32" and acc_dt == dtypes.int64:  # int64 held as int32: int32's identity
            value = reduce_identity(self.k.reduce_op, dtypes.int32)
        return render_const(value, acc_dt, ty)

    def render(self) -> str:
        k, t = self.k, self.t
        for dt in (k.out_dtype, *k.in_dtypes):
            t.check(dt)
        n, ng = len(k.shape), k.n_global
        tree = use_tree(k)
        val = self.ref(k.reduce_expr) if k.reduce_expr is not None else None
        store = _store(k.out_dtype, self.ref(k.out_index, True), self.ref(k.expr))
        n_out = math.prod(k.global_shape)
        wg = TREE_WORKGROUP if tree else WORKGROUP
        lines: list[str] = []
        out_ty = t.storage(k.out_dtype)
        out_ty = f"atomic<{out_ty}>" if k.out_dtype in PACKED else out_ty
        lines.append(f"@group(0) @binding(0) var<storage, read_write> out: array<{out_ty}>;")
        for i, dt in enumerate(k.in_dtypes):
            lines.append(f"@group(0) @binding({i + 1}) var<storage, read> in{i}: array<{t.storage(dt)}>;")
        if tree:
            lines.append(f"var<workgroup> partial: array<{t.type(k.reduce_expr.dtype)}, {wg}>;")
        lines += [
            "",
            f"@compute @workgroup_size({wg})",
            f"fn {k.name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,",
            "    @builtin(local_invocation_index) lid: u32) {",
        ]
        body: list[str] = []
        if tree:
            body += ["let gid = i32(wid.y * nwg.x + wid.x);", f"if (gid >= {max(n_out, 1)}) {{ return; }}"]
        else:
            body += [f"let gid = i32((wid.y * nwg.x + wid.x) * {wg}u + lid);"]
            body += [f"if (gid >= {max(n_out, 1)}) {{ return; }}"]
        body += _split([f"i{a}" for a in range(ng)], k.global_shape, "gid")
        for depth in range(ng + 1):
            body += self.levels[depth]
        if val is None:
            body += self.post + store
        elif tree:
            body += [f"var acc = {self.identity()};"]
            body += [f"for (var r = i32(lid); r < {math.prod(k.reduce_shape)}; r = r + {wg}) {{"]
            inner = _split([f"i{a}" for a in range(ng, n)], k.reduce_shape, "r")
            for depth in range(ng + 1, n + 1):
                inner += self.levels[depth]
            inner += [f"acc = {self.combine('acc', val)};"]
            body += ["  " + s for s in inner] + ["}"]
            body += ["partial[lid] = acc;", "workgroupBarrier();"]
            body += [f"for (var s = {wg // 2}u; s > 0u; s = s >> 1u) {{"]
            body += [
                "  if (lid < s) {",
                f"    partial[lid] = {self.combine('partial[lid]', 'partial[lid + s]')};",
            ]
            body += ["  }", "  workgroupBarrier();", "}"]
            body += ["if (lid == 0u) {", "  let acc = partial[0];"] + ["  " + s for s in self.post + store]
            body += ["}"]
        else:
            body += [f"var acc = {self.identity()};"]
            indent = ""
            for depth in range(ng, n):
                body += [f"{indent}for (var i{depth} = 0i; i{depth} < {k.shape[depth]}; i{depth}++) {{"]
                indent += "  "
                body += [indent + s for s in self.levels[depth + 1]]
            body += [f"{indent}acc = {self.combine('acc', val)};"]
            for _ in range(ng, n):
                indent = indent[:-2]
                body += [f"{indent}}}"]
            body += self.post + store
        lines += ["  " + s for s in body] + ["}"]
        code = "\n".join(lines) + "\n"
        return _helpers_for(code) + code


def render(kernel: Kernel, target: Target | None = None) -> str:
    """WGSL source of one kernel: a compute entry point named after it, `out` at binding 0 and the
    inputs `in0, in1, ...` at bindings 1.. (all in group 0)."""
    return _Renderer(kernel, target or Target()).render()


def dispatch_size(n_groups: int, max_per_dim: int) -> tuple[int, int, int]:
    """Workgroup counts (x, y, 1) covering n_groups, each within the adapter's per-dimension limit."""
    if n_groups <= max_per_dim:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // max_per_dim)
    if y > max_per_dim:
        raise KernelError(f"a launch of {n_groups} workgroups is larger than this WEBGPU adapter allows")
    return (max_per_dim, y, 1)


def program(kernel: Kernel, target: Target | None = None, max_groups_per_dim: int = 65535) -> Program:
    """The kernel as a Program: WGSL source and its dispatch (workgroups in x, y, z, each dimension at most
    `max_groups_per_dim`; `local_size` is the workgroup size)."""
    n_out = math.prod(kernel.global_shape)
    tree = use_tree(kernel)
    per_group = 1 if tree else WORKGROUP
    groups = dispatch_size(-(-max(n_out, 1) // per_group), max_groups_per_dim)
    return Program(kernel.name, render(kernel, target), groups, (TREE_WORKGROUP if tree else WORKGROUP,))
