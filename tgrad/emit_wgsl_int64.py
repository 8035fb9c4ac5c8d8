"""Overflow checks for int64 held as WGSL i32 (emit_wgsl, where the adapter lacks shader-int64).

An int64 result past int32 cannot be stored in the i32 that holds it, and would wrap silently. So the ops
that can make one from values inside int32 (+, -, *, negation, // of int32's minimum by -1, casts of
floats and uint32 to int64, and a sum's or prod's accumulation) are rendered through helpers that OR a
bit into the storage word `ovf` (bound after the inputs) when the true result does not fit, and the
runtime raises a ValueOverflowError (`overflow_error`) after a kernel that set one.

Only ops whose result may not fit are checked: `checked_ops` bounds every int value of the kernel from
its dtypes, indices and constants (int64 values in buffers are inside int32), so index arithmetic, counts
(`(x == y).sum()`) and small sums over small types cost nothing, and kernels with no such op get no
`ovf` buffer. A check may fire for a value that a `where` then discards (both sides are computed): an
error, never a wrong number.
"""

from __future__ import annotations

import math

from tgrad.dtype import DType, dtypes
from tgrad.errors import ValueOverflowError
from tgrad.fuse import Expr, Kernel

I32 = (-(2**31), 2**31 - 1)

# the bit each kind of checked op sets, and how the error names it
LABELS = {"ADD": "`+`", "SUB": "`-`", "MUL": "`*`", "NEG": "negation (`-x`, `abs`)",
          "IDIV": "`//` (-2**31 // -1)",
          "CAST_FLOAT": "a float -> int64 cast (of nan, inf or a value past int32)",
          "CAST_UINT32": "a uint32 -> int64 cast", "SUM": "a sum (sum, cumsum, mean, matmul of ints)",
          "PROD": "a prod"}
BITS = {kind: 1 << i for i, kind in enumerate(LABELS)}
# the op emit_cstyle combines a reduction's partial results with (CStyleRenderer.combine), keyed in the
# checks: an int64 sum that may pass int32 accumulates in 64 bits (PAIR: low word, high word), so partial
# sums may pass int32 where the total does not; the total is checked
SUM_COMBINE, PROD_COMBINE = Expr("ADD", (), None, dtypes.int64), Expr("MUL", (), None, dtypes.int64)
PAIR = "vec2<i32>"

HELPERS = """fn add_ck(a: i32, b: i32, bit: u32) -> i32 {
  let r = bitcast<i32>(bitcast<u32>(a) + bitcast<u32>(b));
  if (((a ^ r) & (b ^ r)) < 0i) { atomicOr(&ovf, bit); }
  return r;
}
fn sub_ck(a: i32, b: i32, bit: u32) -> i32 {
  let r = bitcast<i32>(bitcast<u32>(a) - bitcast<u32>(b));
  if (((a ^ b) & (a ^ r)) < 0i) { atomicOr(&ovf, bit); }
  return r;
}
fn mul_ck(a: i32, b: i32, bit: u32) -> i32 {
  let ua = select(bitcast<u32>(a), 0u - bitcast<u32>(a), a < 0i);
  let ub = select(bitcast<u32>(b), 0u - bitcast<u32>(b), b < 0i);
  let most = select(0x7fffffffu, 0x80000000u, (a < 0i) != (b < 0i));
  if (ub != 0u && ua > most / ub) { atomicOr(&ovf, bit); }
  return bitcast<i32>(bitcast<u32>(a) * bitcast<u32>(b));
}
fn pair64(x: i32) -> vec2<i32> { return vec2<i32>(x, x >> 31u); }
fn add_pair(a: vec2<i32>, b: vec2<i32>) -> vec2<i32> {
  let lo = bitcast<u32>(a.x) + bitcast<u32>(b.x);
  return vec2<i32>(bitcast<i32>(lo), a.y + b.y + select(0i, 1i, lo < bitcast<u32>(a.x)));
}
fn pair_i32_ck(p: vec2<i32>, bit: u32) -> i32 {
  if (p.y != (p.x >> 31u)) { atomicOr(&ovf, bit); }
  return p.x;
}
fn idiv_ck(a: i32, b: i32, bit: u32) -> i32 {
  if (a == (-2147483647i - 1i) && b == -1i) { atomicOr(&ovf, bit); }
  return idiv32(a, b);
}
fn f32_i32_ck(x: f32, bit: u32) -> i32 {
  if (nan32(x) || !(x >= -2147483648.0f && x < 2147483648.0f)) { atomicOr(&ovf, bit); return 0i; }
  return i32(x);
}
fn f64_i32_ck(x: f64, bit: u32) -> i32 {
  if (nan64(x) || !(x >= -2147483648.0lf && x < 2147483648.0lf)) { atomicOr(&ovf, bit); return 0i; }
  return i32(x);
}
fn u32_i32_ck(x: u32, bit: u32) -> i32 {
  if (x > 0x7fffffffu) { atomicOr(&ovf, bit); }
  return bitcast<i32>(x);
}
"""
# (the sign tests run on the wrapped u32 result: a compiler may assume signed i32 arithmetic never
# overflows, and fold a test written on it away; nan32 / nan64 test the bits, as Mesa may assume no NaN)


def _dtype_range(dtype: DType) -> tuple[int, int]:
    if dtype == dtypes.int64:  # as held: its buffers and checked results are inside int32
        return I32
    return int(dtype.min), int(dtype.max)


def _fit(lo: int, hi: int, dtype: DType) -> tuple[int, int]:
    """The range of a result whose exact range is lo..hi: itself where the dtype holds it, else the
    dtype's whole range (a narrower type wraps as PyTorch's does; int64, checked, stays inside int32)."""
    dlo, dhi = _dtype_range(dtype)
    return (lo, hi) if dlo <= lo and hi <= dhi else (dlo, dhi)


def _sum_range(r: tuple[int, int], n: int) -> tuple[int, int]:
    return min(r[0], 0) * n, max(r[1], 0) * n


def _prod_range(r: tuple[int, int], n: int) -> tuple[float, float]:
    most = max(abs(r[0]), abs(r[1]))
    if most <= 1 or n * math.log2(most) < 31:
        return -(most**n), most**n
    return -math.inf, math.inf


def checked_ops(kernel: Kernel) -> dict[Expr, int]:
    """The kernel's int64 ops whose result may pass int32 (int64 held as i32), each with the bit its check
    sets; the reduction's combining op (the Expr emit_cstyle combines partial results with) among them
    when a sum's or prod's total may pass int32."""
    checks: dict[Expr, int] = {}
    memo: dict[Expr, tuple[int, int] | None] = {}
    acc: list[tuple[int, int] | None] = [None]

    def need(e: Expr, lo: int, hi: int, kind: str) -> tuple[int, int]:
        if e.dtype == dtypes.int64 and not (I32[0] <= lo and hi <= I32[1]):
            checks[e] = BITS[kind]
        return _fit(lo, hi, e.dtype)

    def rng(e: Expr) -> tuple[int, int] | None:
        if e in memo:
            return memo[e]
        memo[e] = out = None if e.dtype.is_float else _range(e)
        return out

    def _range(e: Expr) -> tuple[int, int]:
        op = e.op
        if op == "IDX":
            return 0, e.arg[1] - 1
        if op == "CONST":
            return int(e.arg), int(e.arg)
        if op == "LOAD":  # (its index is not a value: index arithmetic is i32 and checked elsewhere)
            return _dtype_range(e.dtype)
        if op == "ACC":
            return acc[0] or _dtype_range(e.dtype)
        srcs = [rng(s) for s in e.srcs]
        if op == "CAST":
            if srcs[0] is None:  # from a float: any value (int64's check makes it fit; narrower types wrap)
                return need(e, -math.inf, math.inf, "CAST_FLOAT")
            return need(e, *srcs[0], "CAST_UINT32")  # (of the integer types only uint32 passes int32)
        if e.dtype == dtypes.bool or op in ("CMPLT", "CMPNE"):
            return 0, 1
        if op in ("ADD", "SUB", "MUL"):
            (a0, a1), (b0, b1) = srcs
            if op == "ADD":
                return need(e, a0 + b0, a1 + b1, op)
            if op == "SUB":
                return need(e, a0 - b1, a1 - b0, op)
            corners = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
            return need(e, min(corners), max(corners), op)
        if op == "NEG":
            return need(e, -srcs[0][1], -srcs[0][0], op)
        if op == "IDIV":
            most = max(abs(srcs[0][0]), abs(srcs[0][1]))
            minus_one = srcs[1][0] <= -1 <= srcs[1][1]
            return need(e, -most, most + (1 if minus_one and srcs[0][0] <= I32[0] else 0), op)
        if op == "MOD":
            most = max(abs(srcs[0][0]), abs(srcs[0][1]))  # (x % 0 is x)
            if not srcs[1][0] <= 0 <= srcs[1][1]:
                most = min(most, max(abs(srcs[1][0]), abs(srcs[1][1])))
            return (0 if srcs[0][0] >= 0 else -most), most
        if op == "MAX":
            return max(srcs[0][0], srcs[1][0]), max(srcs[0][1], srcs[1][1])
        if op == "WHERE":
            return min(srcs[1][0], srcs[2][0]), max(srcs[1][1], srcs[2][1])
        if op in ("AND", "OR", "XOR") and srcs[0][0] >= 0 and srcs[1][0] >= 0:
            return 0, (1 << max(srcs[0][1], srcs[1][1]).bit_length()) - 1
        return _dtype_range(e.dtype)  # (bitwise ops of values inside int32 stay inside it)

    if kernel.reduce_expr is not None:
        r, n, op = rng(kernel.reduce_expr), math.prod(kernel.reduce_shape), kernel.reduce_op
        if kernel.acc_dtype == dtypes.int64 and r is not None and op in ("SUM", "PROD"):
            combine = SUM_COMBINE if op == "SUM" else PROD_COMBINE
            lo, hi = _sum_range(r, n) if op == "SUM" else _prod_range(r, n)
            if not (I32[0] <= lo and hi <= I32[1]):
                checks[combine] = BITS[op]
            acc[0] = _fit(lo, hi, dtypes.int64)
        elif r is not None:
            acc[0] = r if op == "MAX" else None
    rng(kernel.expr)
    return checks


def overflow_error(kernel_name: str, bits: int) -> ValueOverflowError:
    """The error for a kernel whose checks set `bits`."""
    ops = ", ".join(label for kind, label in LABELS.items() if bits & BITS[kind])
    return ValueOverflowError(
        f"int64 overflow on WEBGPU (kernel {kernel_name}): {ops} gave a value outside int32; this WEBGPU "
        "adapter has no shader-int64, so tgrad holds int64 as int32 and cannot store it (PyTorch's int64 "
        "would). Compute it on another device (t.to('CPU')), or in floats"
    )
