"""WGSL, a dialect of the shared C-style lowering (emit_cstyle.py), for the WEBGPU device (runtime/webgpu.py).

The lowering (loops, index decoding, tree reductions in workgroup memory) is the one OpenCL and Metal use;
this module adds the language (`WGSLDialect`): `let`/`var`, `select()`, buffers bound with `@group` /
`@binding`, packed narrow types, and the rules below.

Workgroups: LOCAL invocations for one-per-output kernels, GROUP for tree reductions (the kernel's opts,
tgrad/opt/; runtime/webgpu.py gives the sizes: 64, a multiple of every vendor's SIMD width within WebGPU's
default limit of 256, and 256). The size is written into the shader (`@workgroup_size`). A launch of more
workgroups than the adapter allows per dimension becomes a 2-D dispatch. On Mesa llvmpipe (a loop limit per
invocation) the optimizer picks bigger GROUPs or UNROLL opts (opt/limits.py).

Types. WGSL has 32-bit scalars, `bool`, and no 8-bit storage, so: bool, uint8, int8 are stored 4 per
`u32` word and int16, float16 2 per word, as numpy lays them out (stores change their bytes with atomic
and/or on the word, so neighbouring invocations never lose each other's writes); float16 computes in f32,
rounded after each op; uint32 is `u32` (uint16 and uint64 raise); int64 is held as int32 on the device
(out-of-range uploads and constants raise a DTypeError; results that may pass int32 are checked as the
kernel runs, emit_wgsl_int64.py); float64 is `f64` only
where the adapter has `shader-f64` and `shader-int64`; index expressions are i32. The details and why:
docs/architecture.md, "WGSL's types (emit_wgsl.py)".

Floats: WGSL lets drivers assume there are no NaNs, so NaN tests look at the bits, comparisons are
written so that an ordered compare gives the right answer, and MAX propagates NaN explicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from tgrad import emit_cstyle, emit_wgsl_int64
from tgrad.dtype import DType, dtypes
from tgrad.emit_cstyle import MATH, Dialect
from tgrad.errors import DTypeError, KernelError
from tgrad.fuse import NARROW_ROUNDED, Expr, Kernel, const, is_const, reduce_identity
from tgrad.opt.opts import OptOps, find, upcasts
from tgrad.program import Program

# Vulkan's GLSL.std.450 has these for 16/32-bit floats only: float64 uses the helpers in HELPERS_F64
F64_MATH = {"EXP2": "exp2_64", "LOG2": "log2_64", "SIN": "sin64"}
PACKED = {dtypes.bool: 4, dtypes.uint8: 4, dtypes.int8: 4, dtypes.int16: 2, dtypes.float16: 2}
SMALL_INT_BITS = {dtypes.uint8: 8, dtypes.int8: 8, dtypes.int16: 16}

HELPERS_F32 = """fn nan32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn finite32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) < 0x7f800000u; }
fn max32(a: f32, b: f32) -> f32 { return select(select(max(a, b), b, nan32(b)), a, nan32(a)); }
fn lt32(a: f32, b: f32) -> bool { return !(nan32(a) || nan32(b)) && a < b; }
fn ne32(a: f32, b: f32) -> bool { return nan32(a) || nan32(b) || !(a == b); }
fn idiv32(a: i32, b: i32) -> i32 {
  if (b == 0i) { return 0i; }
  let ua = select(bitcast<u32>(a), 0u - bitcast<u32>(a), a < 0i);
  let ub = select(bitcast<u32>(b), 0u - bitcast<u32>(b), b < 0i);
  let q = ua / ub;
  return bitcast<i32>(select(q, 0u - q, (a < 0i) != (b < 0i)));
}
fn imod32(a: i32, b: i32) -> i32 { return select(a - idiv32(a, b) * b, a, b == 0i); }
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
fn lt64(a: f64, b: f64) -> bool {{ return !(nan64(a) || nan64(b)) && a < b; }}
fn ne64(a: f64, b: f64) -> bool {{ return nan64(a) || nan64(b) || !(a == b); }}
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


HELPERS = {chunk.split("(")[0]: "fn " + chunk
           for chunk in (HELPERS_F32 + HELPERS_F64 + emit_wgsl_int64.HELPERS)[3:].split("\nfn ")}


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
        if dtype in (dtypes.uint16, dtypes.uint64):  # (an intermediate one: tensors of them are refused)
            raise DTypeError(f"{dtype.name} values on WEBGPU: WGSL has no {dtype.itemsize * 8}-bit integers; "
                             "cast to int32 or uint32 first")
        if dtype == dtypes.float64 and not self.float64:
            raise DTypeError(
                "float64 on WEBGPU needs the adapter features shader-f64 and shader-int64 (this adapter "
                "lacks one); cast the tensor to float32: t.cast(dtypes.float32)"
            )

    def type(self, dtype: DType) -> str:
        """The WGSL type a value of `dtype` computes in."""
        if dtype == dtypes.int64:
            return "i64" if self.int64 else "i32"
        if dtype == dtypes.float64:
            return "f64"
        if dtype == dtypes.bool:
            return "bool"
        if dtype in (dtypes.uint8, dtypes.uint32):
            return "u32"
        return "f32" if dtype.is_float else "i32"

    def storage(self, dtype: DType) -> str:
        """The WGSL element type of a buffer of `dtype`."""
        return "u32" if dtype in PACKED else self.type(dtype)

    def itemsize(self, dtype: DType) -> int:
        return 4 if dtype == dtypes.int64 and not self.int64 else dtype.itemsize


def _wrap_small(dtype: DType, text: str) -> str:
    """Wrap a 32-bit result back to the width of a small integer dtype."""
    bits = SMALL_INT_BITS.get(dtype)
    if bits is None:
        return text
    if dtype == dtypes.uint8:
        return f"(({text}) & 0xffu)"
    return f"((({text}) << {32 - bits}u) >> {32 - bits}u)"


def _arith(sym: str, bool_sym: str | None = None):
    def rule(d: Dialect, e: Expr, a: str, b: str) -> str:
        if bool_sym is not None and e.dtype == dtypes.bool:
            return f"({a} {bool_sym} {b})"
        return _wrap_small(e.dtype, f"({a} {sym} {b})")

    return rule


def _max(d: Dialect, e: Expr, a: str, b: str) -> str:
    ty = d.type_name(e.dtype)
    if ty == "bool":
        return f"({a} || {b})"
    if ty in ("f32", "f64"):
        return f"max{ty[1:]}({a}, {b})"
    return f"max({a}, {b})"


def _idiv(d: Dialect, e: Expr, a: str, b: str) -> str:
    """Truncating division, x / 0 = 0. Signed i32 goes through idiv32 (division of magnitudes): WGSL
    over OpenGL inherits GLSL's undefined results for negative operands."""
    if e.dtype.is_float:
        return f"trunc({a} / {b})"
    if d.type_name(e.dtype) == "i32":
        return _wrap_small(e.dtype, f"idiv32({a}, {b})")
    zero = d.const(0, e.dtype)
    return _wrap_small(e.dtype, f"select({a} / {b}, {zero}, {b} == {zero})")


def _mod(d: Dialect, e: Expr, a: str, b: str) -> str:
    """C's remainder (the dividend's sign), x % 0 = x as on every other device (WGSL gives 0)."""
    if e.dtype.is_float:
        return f"({a} % {b})"
    if d.type_name(e.dtype) == "i32":
        return _wrap_small(e.dtype, f"imod32({a}, {b})")
    return _wrap_small(e.dtype, f"select({a} % {b}, {a}, {b} == {d.const(0, e.dtype)})")


def _compare(op: str, sym: str):
    """Float compares test NaN by its bits (lt32 / ne32...): a shader compiler may assume there is none
    (Mesa over OpenGL turned nan < x true). Other types compare plainly."""

    def rule(d: Dialect, e: Expr, a: str, b: str) -> str:
        ty = d.type_name(e.srcs[0].dtype)
        if ty in ("f32", "f64"):
            return f"{op}{ty[1:]}({a}, {b})"
        if ty == "bool" and sym == "<":  # (WGSL orders no bools: false < true)
            return f"(!{a} && {b})"
        return f"({a} {sym} {b})" if sym == "<" else f"!({a} == {b})"

    return rule


def _logic(sym: str, bool_sym: str):
    return lambda d, e, a, b: f"({a} {bool_sym if e.dtype == dtypes.bool else sym} {b})"


def _math(op: str):
    def rule(d: Dialect, e: Expr, a: str) -> str:
        if e.dtype == dtypes.float64:
            return f"{F64_MATH[op]}({a})"
        if op == "EXP2":  # Mesa rewrites exp2(log2(x) * y) as a pow, which gives 0 for a nan x and for
            # x = 0, y < 0 (log2(0) * y = +inf): nan and +inf stay themselves (tested by the bits)
            return f"select(exp2({a}), {a}, nan32({a}) || bitcast<u32>({a}) == 0x7f800000u)"
        return f"{MATH[op]}({a})"

    return rule


def _neg(d: Dialect, e: Expr, a: str) -> str:
    negated = f"(0u - {a})" if d.type_name(e.dtype) == "u32" else f"(-{emit_cstyle.paren(a)})"
    return _wrap_small(e.dtype, negated)


# C's rules (emit_cstyle.code_for_op) with WGSL's where they differ: op -> f(dialect, expr, *sources)
CODE_FOR_OP = {
    **emit_cstyle.code_for_op,
    "ADD": _arith("+", "||"),
    "SUB": _arith("-"),
    "MUL": _arith("*", "&&"),
    "IDIV": _idiv,
    "MOD": _mod,
    "MAX": _max,
    "CMPLT": _compare("lt", "<"),
    "CMPNE": _compare("ne", "!="),
    "AND": _logic("&", "&&"),
    "OR": _logic("|", "||"),
    "XOR": _logic("^", "!="),
    "WHERE": lambda d, e, c, a, b: f"select({b}, {a}, {c})",
    **{op: _math(op) for op in F64_MATH},
    "NEG": _neg,
}


def _bare(e: Expr) -> Expr:
    """e without multiplications by 1 (Mesa drops them before it folds x - x)."""
    while e.op == "MUL" and (is_const(e.srcs[0], 1) or is_const(e.srcs[1], 1)):
        e = e.srcs[0] if is_const(e.srcs[1], 1) else e.srcs[1]
    return e


def _folds_to_zero(e: Expr) -> Expr | None:
    """For x * 0, x - x and x + -x: the x that decides it. Mesa folds these to 0 (drivers may assume no
    NaN or inf), which is wrong for an inf or nan x, so they are written out."""
    if e.op == "MUL":
        return e.srcs[1] if is_const(e.srcs[0], 0) else e.srcs[0] if is_const(e.srcs[1], 0) else None
    if e.op not in ("SUB", "ADD"):
        return None
    a, b = _bare(e.srcs[0]), _bare(e.srcs[1])
    if e.op == "SUB":
        return e.srcs[0] if a == b else None
    if (b.op == "NEG" and _bare(b.srcs[0]) == a) or (a.op == "NEG" and _bare(a.srcs[0]) == b):
        return e.srcs[0]
    return None


@dataclass(frozen=True)
class WGSLDialect(Dialect):
    """WGSL: types from `target`, `let`/`var` declarations, `T(x)` conversions, buffers bound with
    @group/@binding, packed narrow types stored with atomics, and the float rules of the module docstring."""

    target: Target = field(default_factory=Target)
    # int64 ops held as i32 whose result may pass int32 -> the bit their overflow check sets (emit_wgsl_int64)
    checks: dict = field(default_factory=dict, compare=False, hash=False)

    code_for_op: ClassVar = CODE_FOR_OP

    def type_name(self, dtype: DType) -> str:
        return self.target.type(dtype)

    def value_type(self, e: Expr) -> str:
        return self.type_name(e.dtype)

    def acc_type_name(self, dtype: DType) -> str:
        pair = dtype == dtypes.int64 and emit_wgsl_int64.SUM_COMBINE in self.checks  # (a checked sum)
        return emit_wgsl_int64.PAIR if pair else self.type_name(dtype)

    def from_acc(self, type_name: str, acc_type: str, text: str) -> str:
        if acc_type == emit_wgsl_int64.PAIR:  # the total of a 64-bit sum: checked to fit int32
            return f"pair_i32_ck({text}, {self.checks[emit_wgsl_int64.SUM_COMBINE]}u)"
        return super().from_acc(type_name, acc_type, text)

    def apply(self, e: Expr, srcs: list[str]) -> str:
        bit = self.checks.get(e)
        if bit is None:
            return super().apply(e, srcs)
        if e is emit_wgsl_int64.SUM_COMBINE:
            return f"add_pair({srcs[0]}, {srcs[1]})"
        if e.op == "CAST":  # (from a float or from uint32)
            src = self.type_name(e.srcs[0].dtype)
            return f"{src}_i32_ck({srcs[0]}, {bit}u)"
        name = {"ADD": "add", "SUB": "sub", "MUL": "mul", "IDIV": "idiv", "NEG": "sub"}[e.op]
        return f"{name}_ck({', '.join(['0i', *srcs] if e.op == 'NEG' else srcs)}, {bit}u)"

    def storage(self, dtype: DType) -> str:
        return self.target.storage(dtype)

    def const(self, value, dtype: DType) -> str:
        ty = self.type_name(dtype)
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

    def identity(self, op: str, dtype: DType) -> str:
        if self.acc_type_name(dtype) == emit_wgsl_int64.PAIR:
            return "vec2<i32>(0i, 0i)"
        if dtype == dtypes.int64 and self.type_name(dtype) == "i32":  # int64 held as int32: int32's identity
            return self.const(reduce_identity(op, dtypes.int32), dtype)
        return super().identity(op, dtype)

    def index(self, axis: int, dtype: DType) -> str:
        ty = self.type_name(dtype)
        return f"i{axis}" if ty == "i32" else f"{ty}(i{axis})"

    def convert(self, type_name: str, text: str) -> str:
        return f"pair64({text})" if type_name == emit_wgsl_int64.PAIR else f"{type_name}({text})"

    def finite(self, type_name: str, text: str) -> str:
        return f"finite{type_name[1:]}({text})"  # by the bits: Mesa may assume there is no inf or nan

    def cast(self, src: DType, dtype: DType, text: str) -> str:
        src_ty, dst_ty = self.type_name(src), self.type_name(dtype)
        if dst_ty == "bool":
            return text if src_ty == "bool" else f"!({text} == {self.const(0, src)})"
        if src_ty == "bool":
            return f"{dst_ty}({text})"
        if dtype.is_float:
            text = text if src_ty == dst_ty else f"{dst_ty}({text})"
            return f"f16round({text})" if dtype == dtypes.float16 and src != dtypes.float16 else text
        # integer targets: floats truncate through a signed integer, then wrap to the width (uint32: a
        # float past int32 directly)
        if src.is_float and dtype == dtypes.uint32:
            return f"select(u32(i32({text})), u32({text}), {text} >= {self.const(0, src)})"
        if src.is_float:
            src_ty = "i64" if dst_ty == "i64" else "i32"
            text = f"{src_ty}({text})"
        if src_ty == "u32" and dst_ty == "i64":  # (naga sign-extends i64(u32): 2**31 became -2**31)
            return f"i64(u64({text}))"
        if dtype == dtypes.uint8:
            return f"(u32({text if src_ty != 'i64' else f'i32({text})'}) & 0xffu)"
        return _wrap_small(dtype, text if src_ty == dst_ty else f"{dst_ty}({text})")

    def alu(self, e: Expr, srcs: list[str]) -> str:
        text = self.apply(e, srcs)
        ty = self.type_name(e.dtype)
        decides = _folds_to_zero(e) if ty in ("f32", "f64") else None
        if decides is not None:
            x = srcs[list(e.srcs).index(decides)]
            zero, nan = self.const(0, e.dtype), self.const(math.nan, e.dtype)
            text = f"select({zero}, {nan}, !finite{ty[1:]}({x}))"
        elif ty in ("f32", "f64") and e.op in ("ADD", "SUB", "MUL") and any(
            s.op == "CONST" and s.arg != s.arg for s in e.srcs
        ):  # x + nan, x * nan are nan; Mesa folds 0 * nan to 0 (the mean of an empty axis)
            text = self.const(math.nan, e.dtype)
        if e.dtype == dtypes.float16 and e.op in NARROW_ROUNDED:  # f16 computes in f32
            text = f"f16round({text})"
        return text

    def load(self, buf: str, dtype: DType, idx: str) -> str:
        per = PACKED.get(dtype)
        if per is None:
            return f"{buf}[{idx}]"
        bits = 32 // per
        word = f"{buf}[{idx} >> {per.bit_length() - 1}u]"
        shift = f"((u32({idx}) & {per - 1}u) * {bits}u)"
        if dtype == dtypes.float16:
            return f"unpack2x16float({word} >> {shift}).x"
        if dtype in (dtypes.bool, dtypes.uint8):
            text = f"(({word} >> {shift}) & 0xffu)"
            return f"({text} != 0u)" if dtype == dtypes.bool else text
        return f"(bitcast<i32>({word} << ({32 - bits}u - {shift})) >> {32 - bits}u)"

    def masked_load(self, text: str, valid: str, dtype: DType) -> str:
        if valid == "false":  # never read (a view of nothing): WGSL rejects a constant index < 0
            return self.const(0, dtype)
        return f"select({self.const(0, dtype)}, {text}, {valid})"

    def declare(self, type_name: str, name: str, value: str, mutable: bool = False) -> str:
        return f"{'var' if mutable else 'let'} {name} = {value};"

    def store(self, value: str, idx: str, dtype: DType) -> list[str]:
        per = PACKED.get(dtype)
        if per is None:
            return [f"out[{idx}] = {value};"]
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
            f"let ow = {idx} >> {per.bit_length() - 1}u;",
            f"let os = (u32({idx}) & {per - 1}u) * {bits}u;",
            f"atomicAnd(&out[ow], ~({mask:#x}u << os));",
            f"atomicOr(&out[ow], {pattern} << os);",
        ]

    def render_kernel(self, name: str, kernel: Kernel, body: list[str], local: tuple[str, int] | None) -> str:
        out_ty = self.storage(kernel.out_dtype)
        out_ty = f"atomic<{out_ty}>" if kernel.out_dtype in PACKED else out_ty
        lines = [f"@group(0) @binding(0) {self.out_qual} out: array<{out_ty}>;"]
        for i, dt in enumerate(kernel.in_dtypes):
            lines.append(f"@group(0) @binding({i + 1}) {self.in_qual} in{i}: array<{self.storage(dt)}>;")
        if self.checks:  # the word overflow checks set bits in (emit_wgsl_int64)
            lines.append(f"@group(0) @binding({len(kernel.in_dtypes) + 1}) {self.out_qual} ovf: atomic<u32>;")
        if local:
            lines.append(f"{self.local_qual} part: array<{local[0]}, {local[1]}>;")
        lines += [
            "",
            self.kernel_prefix.format(local[1] if local else self.local_size),
            f"fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,",
            "    @builtin(local_invocation_index) lindex: u32) {",
            *body,
            "}",
        ]
        code = "\n".join(lines) + "\n"
        return _helpers_for(code) + code


WGSL = WGSLDialect(
    name="WGSL",
    header="",
    kernel_prefix="@compute @workgroup_size({})",
    out_qual="var<storage, read_write>",
    in_qual="var<storage, read>",
    local_qual="var<workgroup>",
    barrier="workgroupBarrier();",
    # a launch may be split into a 2-D grid of workgroups (dispatch_size): they are numbered row by row
    ids={
        "gid": "i32((wid.y * nwg.x + wid.x) * {local}u + lindex)",  # ({local}: the workgroup size)
        "grp": "i32(wid.y * nwg.x + wid.x)",
        "lid": "i32(lindex)",
    },
    if_stmt="if ({}) {{ {} }}",
    guard_groups=True,
    bind_literals=True,
    # nwg.z is never 0, but the shader compiler cannot know it: the select keeps Mesa from folding the
    # compensation of a Kahan sum to 0
    kahan_total="select({t}, {acc}, nwg.z == 0u)",
)


def _indices_as_int32(kernel: Kernel) -> Kernel:
    """With int64 as WGSL i64, index expressions (a load's index and mask, the store's index) still compute
    in i32: the kernel with int64 replaced by int32 in them (an int64 load used there is converted)."""
    values: dict[Expr, Expr] = {}
    indices: dict[Expr, Expr] = {}

    def value(e: Expr) -> Expr:
        hit = values.get(e)
        if hit is None:
            srcs = tuple(index(s) if e.op == "LOAD" else value(s) for s in e.srcs)
            hit = values[e] = Expr(e.op, srcs, e.arg, e.dtype)
        return hit

    def index(e: Expr) -> Expr:
        hit = indices.get(e)
        if hit is None:
            if e.op == "LOAD":
                hit = value(e)
                if e.dtype == dtypes.int64:
                    hit = Expr("CAST", (hit,), dtypes.int32, dtypes.int32)
            else:
                dt = dtypes.int32 if e.dtype == dtypes.int64 else e.dtype
                hit = Expr(e.op, tuple(index(s) for s in e.srcs), dt if e.op == "CAST" else e.arg, dt)
            indices[e] = hit
        return hit

    red = kernel.reduce_expr
    return replace(kernel, reduce_expr=None if red is None else value(red), expr=value(kernel.expr),
                   out_index=index(kernel.out_index))


OP_TEXT = {"ADD": "+", "SUB": "-", "MUL": "*", "IDIV": "//", "MOD": "%", "OR": "|", "AND": "&", "XOR": "^",
           "CMPLT": "<", "CMPNE": "!=", "MAX": "maximum", "WHERE": "where"}


def _check_int64_constants(kernel: Kernel) -> None:
    """With int64 held as int32: a constant past int32 raises, naming the op that uses it."""
    seen: set[int] = set()
    todo = [e for e in (kernel.expr, kernel.reduce_expr) if e is not None]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        for s in e.srcs:
            if s.op == "CONST" and s.dtype == dtypes.int64 and not -(2**31) <= int(s.arg) < 2**31:
                raise DTypeError(
                    f"`{OP_TEXT.get(e.op, e.op)}` with the int64 constant {s.arg}: this WEBGPU adapter has "
                    "no shader-int64 and holds int64 as int32, which cannot hold it; use values within "
                    "+-2**31, or another device"
                )
            todo.append(s)


def _without_empty_reduce(kernel: Kernel) -> Kernel:
    """A reduce over no elements as its identity, written into the stored value: the accumulator of a loop
    that never runs is a value Mesa knows, and it folds 0 * (1 / 0) to 0 (var over an empty axis)."""
    if kernel.reduce_expr is None or 0 not in kernel.reduce_shape:
        return kernel
    ident = const(reduce_identity(kernel.reduce_op, kernel.acc_dtype), kernel.acc_dtype)
    memo: dict = {}

    def sub(e: Expr) -> Expr:
        if id(e) not in memo:
            memo[id(e)] = ident if e.op == "ACC" else e if not e.srcs else Expr(
                e.op, tuple(sub(s) for s in e.srcs), e.arg, e.dtype)
        return memo[id(e)]

    return replace(kernel, shape=kernel.global_shape, reduce_op=None, reduce_expr=None, expr=sub(kernel.expr),
                   opts=())


def render(kernel: Kernel, target: Target | None = None, max_groups_per_dim: int = 65535) -> Program:
    """One kernel as a WGSL compute shader: an entry point named after the kernel, `out` at binding 0 and
    the inputs `in0, in1, ...` at bindings 1.. (all in group 0), dispatched on `global_size` workgroups
    (x, y, z; each at most `max_groups_per_dim`) of `local_size` invocations."""
    target = target or Target()
    for dt in emit_cstyle.kernel_dtypes(kernel):  # buffers and every value computed in between
        target.check(dt)
    if upcasts(kernel.opts):
        raise KernelError(f"kernel {kernel.name}: WGSL renders no register tiles (UPCAST opts)")
    kernel = _without_empty_reduce(kernel)
    checks = {}
    if not target.int64:
        _check_int64_constants(kernel)
        checks = emit_wgsl_int64.checked_ops(kernel)
    lowered = _indices_as_int32(kernel) if target.int64 else kernel
    tree = find(kernel.opts, OptOps.GROUP)
    local = tree or find(kernel.opts, OptOps.LOCAL, 1)
    ids = {**WGSL.ids, "gid": WGSL.ids["gid"].format(local=local)}
    dialect = replace(WGSL, target=target, local_size=local, ids=ids, checks=checks)
    source = emit_cstyle.render(lowered, dialect)
    n_groups = -(-max(math.prod(kernel.global_shape), 1) // (1 if tree else local))
    groups = dispatch_size(n_groups, max_groups_per_dim)
    # overflow: the kernel binds the word its int64 overflow checks set after its inputs (the runtime
    # raises emit_wgsl_int64.overflow_error when one is set)
    return Program(kernel.name, source, groups, (local,), launch={"overflow": bool(checks)})


def dispatch_size(n_groups: int, max_per_dim: int) -> tuple[int, int, int]:
    """Workgroup counts (x, y, 1) covering n_groups, each within the adapter's per-dimension limit."""
    if n_groups <= max_per_dim:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // max_per_dim)
    if y > max_per_dim:
        raise KernelError(f"a launch of {n_groups} workgroups is larger than this WEBGPU adapter allows")
    return (max_per_dim, y, 1)
