"""The helpers that generated CPU kernels call (see emit_numba.HEADER), shared by every kernel module.

They live here rather than in each generated file so that a process types and compiles them once, and
so that the two LLVM-level helpers (`_maximum`, `_pow2i`) are written once. A digest of this file is
part of every generated file (emit_numba.HEADER), so kernels cached on disk against an older runtime
are rebuilt instead of loaded.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from tgrad.runtime.cpu.gemm import KERNEL_ARGS, SYMBOLS


def kernel(**options):
    """Marks a generated kernel function with the Numba options it compiles with (`parallel`) and `opt`,
    the LLVM optimization level (a LEVEL opt; else compile.KERNEL_OPT); the CPU runtime compiles it as a
    native function taking raw pointers (see runtime/cpu/runtime.py)."""

    def mark(fn):
        fn.numba_options = options
        return fn

    return mark


def _call_llvm(builder, name: str, *vals):
    """Call the LLVM intrinsic `name` (llvm.maximum, llvm.fma...) overloaded on its operands' type."""
    ty = vals[0].type
    fn = builder.module.declare_intrinsic(name, [ty], ir.FunctionType(ty, [ty] * len(vals)))
    return builder.call(fn, vals)


@intrinsic
def _idiv(typingctx, a, b):
    """Integer division truncating toward zero, x // 0 = 0 (as on every tgrad device), and no trap on
    INT_MIN // -1 (it wraps to INT_MIN). LLVM IR written here: no Numba function to compile."""
    a, b = types.unliteral(a), types.unliteral(b)
    if not (isinstance(a, types.Integer) and a == b):
        return None

    def codegen(context, builder, sig, args):
        x, y = args
        zero, minus1 = ir.Constant(x.type, 0), ir.Constant(x.type, -1)
        by_zero = builder.icmp_unsigned("==", y, zero)
        safe = builder.select(by_zero, ir.Constant(x.type, 1), y)
        if not a.signed:
            q = builder.udiv(x, safe)
        else:
            safe = builder.select(builder.icmp_signed("==", safe, minus1), ir.Constant(x.type, 1), safe)
            q = builder.sdiv(x, safe)
            q = builder.select(builder.icmp_signed("==", y, minus1), builder.sub(zero, x), q)
        return builder.select(by_zero, zero, q)

    return a(a, b), codegen


def _reassociable(op: str):
    def build(typingctx, acc, v):
        """acc (op) v with LLVM's `reassoc` flag on this one instruction: the reduce loop's accumulation
        may be reordered (so it vectorizes), while the values summed are computed exactly as written,
        bit for bit the same as in any other kernel that computes them (a flag on the whole function let
        LLVM reorder those too: a max-gradient mask then compared a recomputed softmax unequal to its max)."""
        acc, v = types.unliteral(acc), types.unliteral(v)
        if not (isinstance(acc, types.Float) and acc == v):
            return None

        def codegen(context, builder, sig, args):
            inst = getattr(builder, op)(*args)
            inst.flags.append("reassoc")
            return inst

        return acc(acc, v), codegen

    return intrinsic(build)


_acc_add = _reassociable("fadd")
_acc_mul = _reassociable("fmul")


@intrinsic
def _maximum(typingctx, a, b):
    """IEEE maximum (llvm.maximum): nan if either is nan, +0 over -0. Unlike a compare-and-select it
    is a reduction LLVM vectorizes, so a max over a row runs at memory speed."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return _call_llvm(builder, "llvm.maximum", *args)

    return a(a, b), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma), as BLAS computes its products' sums: one instruction per product
    instead of two in the generated batched matmuls (emit_numba.render_batched) and direct convolutions
    (emit_numba_conv)."""
    if not (isinstance(a, types.Float) and a == b and b == c):
        return None

    def codegen(context, builder, sig, args):
        return _call_llvm(builder, "llvm.fma", *args)

    return a(a, b, c), codegen


@intrinsic
def _opaque(typingctx, a):
    """`a` unchanged, as a value LLVM cannot see through (llvm.arithmetic.fence): a MAX reduce's infinite
    constants go through it once, before the loops. Knowing one is -inf, LLVM rewrites
    `maximum(acc, where(c, -inf, x))` as `where(c, acc, maximum(acc, x))`, a reduction it no longer
    vectorizes: a causal-masked softmax's row max ran an order of magnitude slower (measured: see
    bench/HISTORY.md)."""
    if not isinstance(a, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return _call_llvm(builder, "llvm.arithmetic.fence", *args)

    return a(a), codegen


# the float32 polynomial of 2**f on [-0.5, 0.5] (minimax, 0.26 ulp), highest power first
_EXP2_POLY = (0.00015345810970757157, 0.0013399930903688073, 0.009618489071726799, 0.05550328642129898,
              0.24022646248340607, 0.6931471824645996, 1.0)


@intrinsic
def _exp2f(typingctx, x):
    """float32 2**x without a libm call, so loops over it vectorize. 2**x = 2**k * 2**f with k = round(x)
    and f in [-0.5, 0.5]; 2**f is a degree-6 minimax polynomial (0.26 ulp) evaluated with fused
    multiply-adds, and 2**k is applied in two halves so results down to the smallest denormal round once
    and overflow gives inf. Measured against the exact value: under 0.95 ulp on every third float32 of
    the range where 2**x is finite and nonzero (numpy's float32 exp2: 2.8 ulp); tests allow 2.
    Written as LLVM IR (an intrinsic), so kernels using it compile no Numba function for it."""
    if types.unliteral(x) != types.float32:
        return None

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        (v,) = args

        def pow2i(k):  # 2**k for k in [-126, 127] from its exponent bits
            bits = builder.shl(builder.add(k, ir.Constant(i32, 127)), ir.Constant(i32, 23))
            return builder.bitcast(bits, f32)

        lo, hi, zero = ir.Constant(f32, -150.0), ir.Constant(f32, 130.0), ir.Constant(f32, 0.0)
        # below -150 the result rounds to 0: such lanes (and nan) compute 2**0 and are replaced by 0 at the
        # end, since a product that underflows costs a microcode assist (a masked softmax's exp(-inf)
        # lanes slowed its kernel markedly; measured: bench/HISTORY.md)
        under = builder.fcmp_ordered("<", v, lo)
        xc = builder.select(builder.fcmp_ordered(">=", v, lo), v, zero)
        xc = builder.select(builder.fcmp_ordered("<", xc, hi), xc, hi)  # above 128 it is inf
        k = _call_llvm(builder, "llvm.floor", builder.fadd(xc, ir.Constant(f32, 0.5)))
        f = builder.fsub(xc, k)
        p = ir.Constant(f32, _EXP2_POLY[0])
        for c in _EXP2_POLY[1:]:
            p = _call_llvm(builder, "llvm.fma", p, f, ir.Constant(f32, c))
        ki = builder.fptosi(k, i32)
        half = builder.ashr(ki, ir.Constant(i32, 1))
        r = builder.fmul(builder.fmul(p, pow2i(half)), pow2i(builder.sub(ki, half)))
        r = builder.select(under, zero, r)
        return builder.select(builder.fcmp_unordered("uno", v, v), v, r)  # nan stays nan

    return types.float32(types.float32), codegen


@intrinsic
def _bf16(typingctx, x):
    """Round a float to the nearest bfloat16 value (ties to even), kept as float32: PyTorch's rounding on
    the bits (bits + 0x7FFF + the lowest kept bit, the low 16 bits cleared; overflow gives inf); a NaN as
    `tgrad.dtype.round_bf16` keeps it. Integer IR only, so loops over it vectorize."""
    x = types.unliteral(x)
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        v = args[0] if x == types.float32 else builder.fptrunc(args[0], f32)
        bits = builder.bitcast(v, i32)
        lowest_kept = builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)), lowest_kept)
        out = builder.bitcast(builder.and_(rounded, ir.Constant(i32, 0xFFFF0000 - (1 << 32))), f32)
        # a NaN keeps its high bits, with the quiet bit set where low bits are dropped (round_bf16's rule)
        high = builder.and_(bits, ir.Constant(i32, 0xFFFF0000 - (1 << 32)))
        low = builder.and_(bits, ir.Constant(i32, 0xFFFF))
        dropped = builder.icmp_unsigned("!=", low, ir.Constant(i32, 0))
        quiet = builder.select(dropped, ir.Constant(i32, 0x00400000), ir.Constant(i32, 0))
        nan = builder.bitcast(builder.or_(high, quiet), f32)
        return builder.select(builder.fcmp_unordered("uno", v, v), nan, out)

    return types.float32(x), codegen


@intrinsic
def _f16(typingctx, x):
    """Round a float32 to the nearest float16 value (ties to even), kept as float32, as numpy's and
    PyTorch's casts do: the mantissa rounded to 10 bits on the integer bits; below float16's smallest
    normal (2**-14) to a multiple of 2**-24, as (|x| + 0.5) - 0.5 does in float32; past 65504 inf; nan and
    inf kept. Integer and plain float IR (no call to a float16 conversion routine), so it vectorizes."""
    x = types.unliteral(x)
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        c = lambda v: ir.Constant(i32, v - (1 << 32) if v >= 1 << 31 else v)  # noqa: E731
        v = args[0] if x == types.float32 else builder.fptrunc(args[0], f32)  # (kernels pass float32)
        bits = builder.bitcast(v, i32)
        sign = builder.and_(bits, c(0x80000000))
        mag = builder.and_(bits, c(0x7FFFFFFF))
        kept = builder.and_(builder.lshr(mag, c(13)), c(1))
        normal = builder.and_(builder.add(builder.add(mag, c(0xFFF)), kept), c(0xFFFFE000))
        small = builder.bitcast(builder.fsub(builder.fadd(builder.bitcast(mag, f32), ir.Constant(f32, 0.5)),
                                             ir.Constant(f32, 0.5)), i32)
        out = builder.select(builder.icmp_signed("<", mag, c(0x38800000)), small, normal)
        out = builder.select(builder.icmp_signed(">", out, c(0x477FE000)), c(0x7F800000), out)  # > 65504
        out = builder.select(builder.icmp_signed(">=", mag, c(0x7F800000)), mag, out)  # inf, nan
        return builder.bitcast(builder.or_(out, sign), f32)

    return types.float32(x), codegen


GEMM_SYMBOLS = {types.float32: SYMBOLS["float32"], types.float64: SYMBOLS["float64"]}


@intrinsic
def _gemm(typingctx, ta, tb, m, n, k, a, ai, lda, b, bi, ldb, beta, c, ci, ldc):
    """c[ci:] = a[ai:] @ b[bi:] + beta * c[ci:] (row major; `ta`, `tb` CBLAS's transpose flags 111 or
    112): BLAS's gemm with 64-bit integers (an ILP64 cblas_sgemm / cblas_dgemm), called by the name
    runtime/cpu/gemm.py gives the one it found in the process (so object code using it can be cached).
    Pointers are the arrays' CPointers plus element offsets."""
    if not (isinstance(a, types.CPointer) and a == b == c and a.dtype in GEMM_SYMBOLS):
        return None
    name = GEMM_SYMBOLS[a.dtype]

    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        scalar = context.get_value_type(a.dtype)
        ptr = args[5].type
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, scalar, ptr, i64, ptr, i64,
                                               scalar, ptr, i64])
        fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name)
        ta_, tb_, m_, n_, k_, a_, ai_, lda_, b_, bi_, ldb_, beta_, c_, ci_, ldc_ = args  # (ints: int64)
        beta_ = builder.fptrunc(beta_, scalar) if scalar == ir.FloatType() else beta_  # (beta: a double)
        builder.call(fn, [ir.Constant(i32, 101), builder.trunc(ta_, i32), builder.trunc(tb_, i32), m_, n_, k_,
                          ir.Constant(scalar, 1.0), builder.gep(a_, [ai_]), lda_, builder.gep(b_, [bi_]),
                          ldb_, beta_, builder.gep(c_, [ci_]), ldc_])
        return context.get_dummy_value()

    ints = [types.int64] * 5
    return types.void(*ints, a, types.int64, types.int64, b, types.int64, types.int64, types.float64, c,
                      types.int64, types.int64), codegen


@intrinsic
def _addr(typingctx, p, i):
    """The address of p[i] as an int64 (a pointer passed on in _call_kernel's arguments)."""
    if not isinstance(p, types.CPointer):
        return None

    def codegen(context, builder, sig, args):
        return builder.ptrtoint(builder.gep(args[0], [args[1]]), ir.IntType(64))

    return types.int64(p, types.int64), codegen


@intrinsic
def _call_kernel(typingctx, fn, words, at):
    """Call the compiled kernel at address `fn` with Numba's return-value and exception slots at
    words[at:at + 2] and words[at + 2:at + 4], and KERNEL_ARGS int64 arguments words[at + 4:...] (its
    pointers and ints, then anything): on x86-64 and AArch64 pointers and int64s go in the same registers
    and stack slots, and arguments a function does not declare are never read (runtime/cpu/threads.py
    calls kernels the same way). Returns the kernel's status (0 or -2: it returned)."""
    if not (isinstance(words, types.CPointer) and words.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        f, w, base = args
        slot = lambda j: builder.gep(w, [builder.add(base, ir.Constant(i64, j))])  # noqa: E731
        vals = [builder.load(slot(4 + j)) for j in range(KERNEL_ARGS)]
        ptr = w.type
        fnty = ir.FunctionType(ir.IntType(32), [ptr, ptr] + [i64] * KERNEL_ARGS)
        callee = builder.inttoptr(f, fnty.as_pointer())
        return builder.call(callee, [slot(0), slot(2), *vals])

    return types.int32(types.int64, words, types.int64), codegen


class _Vectors:
    """What the register-tile intrinsics build with: a vector of `lanes` float32 or float64 (one AVX-512
    register: 16 or 8; one AVX2 register: 8 or 4), the vector fma, vector loads and stores at an element
    offset, a broadcast, an int64 constant."""

    def __init__(self, builder, f64: bool, lanes: int):
        self.builder, self.lanes = builder, lanes
        self.ty = ir.VectorType(ir.DoubleType() if f64 else ir.FloatType(), self.lanes)
        self.align = 8 if f64 else 4
        name = f"llvm.fma.v{self.lanes}{'f64' if f64 else 'f32'}"
        module = builder.module
        self.fma_fn = module.globals.get(name)
        if self.fma_fn is None:
            self.fma_fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * 3), name)
        self.undef = ir.Constant(self.ty, ir.Undefined)
        self.mask = ir.Constant(ir.VectorType(ir.IntType(32), self.lanes), [0] * self.lanes)

    def const(self, x: int):
        return ir.Constant(ir.IntType(64), x)

    def _at(self, ptr, index):
        return self.builder.bitcast(self.builder.gep(ptr, [index]), self.ty.as_pointer())

    def load(self, ptr, index):
        return self.builder.load(self._at(ptr, index), align=self.align)

    def store(self, value, ptr, index) -> None:
        self.builder.store(value, self._at(ptr, index), align=self.align)

    def splat(self, ptr, index):  # the scalar at ptr[index] in every lane
        b = self.builder
        one = b.insert_element(self.undef, b.load(b.gep(ptr, [index])), ir.Constant(ir.IntType(32), 0))
        return b.shuffle_vector(one, self.undef, self.mask)

    def fma(self, a, b, c):
        return self.builder.call(self.fma_fn, [a, b, c])

    def loop(self, name: str, inits: list) -> list:
        """Open a loop block after the current one: a phi per initial value, returned (then `again`)."""
        b = self.builder
        entry, body = b.block, b.append_basic_block(name)
        b.branch(body)
        b.position_at_end(body)
        phis = []
        for value in inits:
            phi = b.phi(value.type)
            phi.add_incoming(value, entry)
            phis.append(phi)
        return phis

    def again(self, phis: list, values: list, more) -> None:
        """Close `loop`'s block: its phis take `values` and it runs again while `more`; then after it."""
        b = self.builder
        end, done = b.block, b.append_basic_block(phis[0].parent.name + "_done")
        for phi, value in zip(phis, values):
            phi.add_incoming(value, end)
        b.cbranch(more, phis[0].parent, done)
        b.position_at_end(done)


def _float_pointers(f64: bool, *args) -> bool:
    """Whether the arguments are pointers to float64 (f64) or float32, all the same type."""
    first = args[0]
    ok = isinstance(first, types.CPointer) and first.dtype == (types.float64 if f64 else types.float32)
    return ok and all(a == first for a in args)


@functools.cache
def conv_tile(cin: int, kh: int, kw: int, chans: int, sc: int, sy: int, sx: int, sp: int, pixels: int,
              blocks: int, f64: bool = False, lanes: int = 16):
    """An intrinsic `tile(tmp, ti, inp, ai, wp, wo)` for render_direct's register-blocked path
    (emit_numba_conv): `pixels` output pixels x `blocks` vectors of output channels, their sums over every
    input channel and tap held in vector registers (LLVM IR: vectors of `lanes`, a loop over the
    input channels with the taps written out, each weight vector loaded once for all the pixels and each
    input value broadcast once for all the vectors), stored once into tmp (pixel p's channels at ti + p *
    chans). inp[ai + c * sc + dy * sy + dx * sx + p * sp] is the input of pixel p at tap (dy, dx) of input
    channel c; wp the weight packed (c, kh, kw, o), the tile's first vector at wp[wo]. The constants make one
    intrinsic per geometry (cached)."""

    @intrinsic
    def tile(typingctx, tmp, ti, inp, ai, wp, wo):
        if not _float_pointers(f64, tmp, inp, wp):
            return None

        def codegen(context, builder, sig, args):
            v = _Vectors(builder, f64, lanes)
            tmp_p, ti_v, inp_p, ai_v, wp_p, wo_v = args
            zero = ir.Constant(v.ty, [0.0] * v.lanes)
            c, *accs = v.loop("tile_loop", [v.const(0)] + [zero] * (pixels * blocks))
            cur = list(accs)
            base_in = builder.add(ai_v, builder.mul(c, v.const(sc)))
            base_w = builder.add(wo_v, builder.mul(c, v.const(kh * kw * chans)))
            for dy in range(kh):
                for dx in range(kw):
                    tap = (dy * kw + dx) * chans
                    wv = [v.load(wp_p, builder.add(base_w, v.const(tap + b * lanes))) for b in range(blocks)]
                    for p in range(pixels):
                        bx = v.splat(inp_p, builder.add(base_in, v.const(dy * sy + dx * sx + p * sp)))
                        for b in range(blocks):
                            cur[p * blocks + b] = v.fma(bx, wv[b], cur[p * blocks + b])
            c1 = builder.add(c, v.const(1))
            v.again([c, *accs], [c1, *cur], builder.icmp_signed("<", c1, v.const(cin)))
            for p in range(pixels):
                for b in range(blocks):
                    v.store(cur[p * blocks + b], tmp_p, builder.add(ti_v, v.const(p * chans + b * lanes)))
            return context.get_dummy_value()

        return types.void(tmp, ti, inp, ai, wp, wo), codegen

    return tile


@functools.cache
def wgrad_tile(rows: int, cols: int, chans: int, sy: int, sx: int, ky: int, kx: int, kw: int, t0: int,
               ntaps: int, blocks: int, f64: bool = False, lanes: int = 16):
    """An intrinsic `tile(part, pt, dyt, dq, inp, bi)` for render_weight_grad's register-blocked path: the
    weight gradient's sums of taps [t0, t0 + ntaps) (row-major over (kh, kw), kw columns) x `blocks`
    vectors of output channels, over every pixel of one image, in vector registers: loaded from part
    (tap t's vectors at part[pt + (t - t0) * chans]), each pixel's output-gradient vectors (dyt[dq + pixel
    * chans]) loaded once for the taps and each input value (inp[bi + y * sy + x * sx + dy * ky + dx * kx])
    broadcast once for the vectors, stored back once. One intrinsic per geometry (cached)."""

    @intrinsic
    def tile(typingctx, part, pt, dyt, dq, inp, bi):
        if not _float_pointers(f64, part, dyt, inp):
            return None

        def codegen(context, builder, sig, args):
            v = _Vectors(builder, f64, lanes)
            part_p, pt_v, dyt_p, dq_v, inp_p, bi_v = args
            n = ntaps * blocks
            start = [v.load(part_p, builder.add(pt_v, v.const(t * chans + b * lanes)))
                     for t in range(ntaps) for b in range(blocks)]
            q, y, x, *accs = v.loop("wtile_loop", [v.const(0)] * 3 + start)
            cur = list(accs)
            row = builder.add(dq_v, builder.mul(q, v.const(chans)))
            dvs = [v.load(dyt_p, builder.add(row, v.const(b * lanes))) for b in range(blocks)]
            px = builder.add(bi_v, builder.add(builder.mul(y, v.const(sy)), builder.mul(x, v.const(sx))))
            for j in range(ntaps):
                dy, dx = divmod(t0 + j, kw)
                bx = v.splat(inp_p, builder.add(px, v.const(dy * ky + dx * kx)))
                for b in range(blocks):
                    cur[j * blocks + b] = v.fma(bx, dvs[b], cur[j * blocks + b])
            q1, x1 = builder.add(q, v.const(1)), builder.add(x, v.const(1))
            wrap = builder.icmp_signed("==", x1, v.const(cols))
            x2 = builder.select(wrap, v.const(0), x1)
            y2 = builder.select(wrap, builder.add(y, v.const(1)), y)
            v.again([q, y, x, *accs], [q1, y2, x2, *cur], builder.icmp_signed("<", q1, v.const(rows * cols)))
            for i in range(n):
                t, b = divmod(i, blocks)
                v.store(cur[i], part_p, builder.add(pt_v, v.const(t * chans + b * lanes)))
            return context.get_dummy_value()

        return types.void(part, pt, dyt, dq, inp, bi), codegen

    return tile
