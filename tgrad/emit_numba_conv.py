"""A 2-d convolution's products as generated loop nests for the CPU (direct convolutions), instead of BLAS
over copied windows (tgrad/blas.py, runtime/cpu/blas.py): the forward (`render_direct`), the weight
gradient (`render_weight_grad`) and the input gradient as one scatter (`render_input_grad`).

Each renders a kernel that the optimizer made DIRECT or WGRAD (opt/host.py: a matmul over (c, kh, kw) of
windows read in place from the input; for the input gradient, the col2im piece pair whose sum ops/nn.py
marked, checked by blas.col2im) as a function over a range of images, which the runtime's threads split.
The rule: the loop over the output channels is innermost, so that LLVM vectorizes it (each accumulator a
vector of output channels) with the kernel taps as constants in its body; where the output channels fill
whole vectors, numba_rt's register tile intrinsics keep the sums in registers over the whole reduction
instead (`_render_tiles`, `_weight_grad_tiles`), since LLVM keeps a vectorized loop's accumulators in
registers only within one pass of it. The optimizer chooses them only on the shapes where they beat the
BLAS path (HostTuning's direct_* and scatter_* sizes, which were measured).

These functions are slow to compile (and every generated value has a name of its own: Numba's SSA pass is
quadratic in the assignments of one name): the CPU runtime compiles them as optional jobs of its compile
workers and runs the BLAS path until they are there (runtime/cpu/runtime.py `_when_ready`), so a first
step does not wait for them. The loop layouts and why: docs/architecture.md, "Direct convolutions on the
CPU"; what each choice measured: bench/HISTORY.md, "Figures that were in source comments".
"""

from __future__ import annotations

import dataclasses

from tgrad import emit_numba
from tgrad.blas import BlasPlan, Col2Im
from tgrad.dtype import dtypes
from tgrad.emit_numba import HEADER, render_const, storage_dtype
from tgrad.fuse import Kernel
from tgrad.opt.opts import Contract, HostTuning, OptOps, find
from tgrad.program import Program


def render(kernel: Kernel, vector_bytes: int, parts: int, tuning: HostTuning = emit_numba.DEFAULT) -> Program:
    """emit_numba's Program for the (optimized) kernel; a convolution's forward product or weight gradient
    that the optimizer made DIRECT or WGRAD also gets its direct convolution (for `vector_bytes` wide
    registers; the weight gradient's partial sums in `parts`, one per thread), which runs instead of BLAS
    (launch fact `direct`). tuning: the device's HostTuning."""
    program = emit_numba.render(kernel, tuning)
    impl, plan = find(kernel.opts, OptOps.CONTRACT), program.launch.get("blas")
    if impl == Contract.DIRECT:
        direct = render_direct(kernel, plan, vector_bytes, tuning)
    elif impl == Contract.WGRAD:
        direct = render_weight_grad(kernel, plan, parts, vector_bytes=vector_bytes, tuning=tuning)
    else:
        return program
    epilogue = program.launch["epilogue"]
    source = f"# {kernel.name}: a direct convolution (see emit_numba_conv), then its epilogue if any\n"
    source += direct.source + ("" if epilogue is None else "\n" + epilogue.source)
    return dataclasses.replace(program, source=source, launch={**program.launch, "direct": direct})


# the kernel axes (c, kh, kw, o) in the order the runtime packs the weight for `render_direct`'s function
PACKED_AXES = [4, 5, 6, 1]


def render_direct(kernel: Kernel, plan: BlasPlan, vector_bytes: int = 64,
                  tuning: HostTuning = emit_numba.DEFAULT) -> Program:
    """The direct convolution's function: (out, windows' input, packed weight, scratch, lo, hi) over images
    [lo, hi); `out` gets the sums row-major over the kernel's global axes (n, o, y, x). vector_bytes: of
    the host's vector registers (64: AVX-512), for the register tiles (`_tile_registers` of `tuning`)."""
    k = kernel
    images, chans, rows, cols = k.global_shape
    cin, kh, kw = k.reduce_shape
    sa = plan.a.strides  # over (n, o, y, x, c, kh, kw); o's is 0
    dt = k.reduce_expr.dtype
    pixels, taps = rows * cols, kh * kw
    lanes = vector_bytes // dt.itemsize  # (one vector register)
    if chans % lanes == 0 and REGISTER_TILES:
        return _render_tiles(k, plan, lanes, _tile_registers(vector_bytes, tuning))
    tile = 4 if cols % 4 == 0 or cols % 3 else 3
    group = 2 if taps <= 9 and cin % 2 == 0 else 1  # input channels per pass over the accumulators
    # output channels a pass of the loop over them takes in two halves, [o] and [span + o]: twice the
    # accumulators, each input value loaded once for both (faster for conv2; for 3x3 kernels, which already
    # take two input channels a pass, it gained nothing)
    halves = 2 if group == 1 and chans % 32 == 0 else 1
    span = chans // halves

    def block(x: str, width: int) -> list[str]:
        # (every value a name of its own: Numba's SSA pass is quadratic in a name's assignments)
        acc = [(p, p * chans + h * span) for p in range(width) for h in range(halves)]  # (pixel, offset)
        lines = [f"ai = ay + {x} * {sa[3]}", f"ti = ty + {x} * {chans}", f"for o in range({span}):"]
        lines += [f"    a{at}_0 = tmp[ti + {at} + o]" for _, at in acc]
        step = 0
        for g in range(group):
            for t in range(taps):
                dy, dx = divmod(t, kw)
                lines += [f"    w{step}_{h} = wp[wc + {(g * taps + t) * chans + h * span} + o]"
                          for h in range(halves)]
                at = g * sa[4] + dy * sa[5] + dx * sa[6]
                lines += [f"    v{step}_{p} = inp[ai + {at + p * sa[3]}]" for p in range(width)]
                lines += [f"    a{a}_{step + 1} = _fma(v{step}_{p}, w{step}_{a % chans // span}, a{a}_{step})"
                          for p, a in acc]
                step += 1
        return lines + [f"    tmp[ti + {at} + o] = a{at}_{step}" for _, at in acc]

    body = ["for n in range(lo, hi):",
            f"    tb = n * {pixels * chans}",
            f"    ab = {plan.a.offset} + n * {sa[0]}",
            f"    for i in range({pixels * chans}):",
            f"        tmp[tb + i] = {render_const(0, dt)}",
            f"    for c in range(0, {cin}, {group}):",
            f"        ac = ab + c * {sa[4]}",
            f"        wc = c * {taps * chans}",
            f"        for y in range({rows}):",
            f"            ay = ac + y * {sa[2]}",
            f"            ty = tb + y * {cols * chans}"]
    body += _columns(block, cols, tile, " " * 12)
    return _per_image(f"{k.name}_direct", "inp, wp", body, images, chans, pixels, dt, PACKED_AXES)


REGISTER_TILES = True  # the direct forward and weight gradient in register tiles (numba_rt) where they apply


def _tile_registers(vector_bytes: int, tuning: HostTuning) -> int:
    """Accumulators of a register tile: `tile_registers` of AVX-512's 32 registers (the weights and a
    broadcast need the others), half as many of AVX2's 16."""
    return tuning.tile_registers if vector_bytes >= 64 else tuning.tile_registers // 2


def _blocks(chans: int, lanes: int) -> int:
    """Vectors of output channels a register tile takes at once: the most, up to 4, that divide them."""
    vectors = chans // lanes
    return max(b for b in range(1, 5) if vectors % b == 0)


def _render_tiles(k: Kernel, plan: BlasPlan, lanes: int, registers: int) -> Program:
    """render_direct where the output channels are whole vectors: per image, output row and tile of P
    pixels, per block of up to 4 vectors of output channels, one numba_rt.conv_tile intrinsic that sums
    every input channel and tap in registers and stores the tile once (the loop above reloads and
    stores its accumulators for each input channel)."""
    images, chans, rows, cols = k.global_shape
    cin, kh, kw = k.reduce_shape
    sa, dt = plan.a.strides, k.reduce_expr.dtype
    blocks = _blocks(chans, lanes)
    most = max(1, min(cols, registers // blocks))
    width = max((p for p in range(1, most + 1) if cols % p == 0), default=most)
    if width < most // 2:  # no divisor near the most: the most, and a tail
        width = most
    tail = cols % width
    f64 = dt == dtypes.float64

    def factory(p: int) -> str:
        geometry = f"{cin}, {kh}, {kw}, {chans}, {sa[4]}, {sa[5]}, {sa[6]}, {sa[3]}"
        return f"conv_tile({geometry}, {p}, {blocks}, {f64}, {lanes})"

    prelude = "from tgrad.runtime.cpu.numba_rt import conv_tile\n\n" + f"_tile = {factory(width)}\n"
    if tail:
        prelude += f"_tail = {factory(tail)}\n"
    step = blocks * lanes
    body = ["for n in range(lo, hi):",
            f"    tb = n * {rows * cols * chans}",
            f"    ab = {plan.a.offset} + n * {sa[0]}",
            f"    for y in range({rows}):",
            f"        ay = ab + y * {sa[2]}",
            f"        ty = tb + y * {cols * chans}"]
    body += [f"        for x in range(0, {cols - tail}, {width}):",  # (width <= cols: at least one)
             f"            for ob in range(0, {chans}, {step}):",
             f"                _tile(tmp, ty + x * {chans} + ob, inp, ay + x * {sa[3]}, wp, ob)"]
    if tail:
        x = cols - tail
        body += [f"        for ob in range(0, {chans}, {step}):",
                 f"            _tail(tmp, ty + {x * chans} + ob, inp, ay + {x * sa[3]}, wp, ob)"]
    return _per_image(f"{k.name}_direct", "inp, wp", body, images, chans, rows * cols, dt, PACKED_AXES,
                      prelude)


def _columns(block, cols: int, width: int, indent: str) -> list[str]:
    """block(x, width) over tiles of `width` of `cols` columns: a loop, then the tail's block."""
    tail = cols % width
    lines = []
    if cols >= width:
        lines.append(f"{indent}for x in range(0, {cols - tail}, {width}):")
        lines += [f"{indent}    {line}" for line in block("x", width)]
    if tail:
        lines += [indent + line for line in block(str(cols - tail), tail)]
    return lines


def _per_image(name: str, args: str, body: list[str], images: int, chans: int, pixels: int, dt,
               pack: list[int], prelude: str = "") -> Program:
    """The function (out, `args`, tmp, lo, hi) over images [lo, hi) whose `body` sums each image into
    tmp laid out (pixel, channel), then put in `out` as (channel, pixel). Its second argument is a weight
    the runtime packs contiguous over the kernel axes `pack` (launch fact `pack`)."""
    body = body + [f"    ob = n * {chans * pixels}",
                   f"    for o in range({chans}):",
                   f"        for i in range({pixels}):",
                   f"            out[ob + o * {pixels} + i] = tmp[tb + i * {chans} + o]"]
    lines = ["@kernel()", f"def {name}(out, {args}, tmp, lo, hi):", *("    " + line for line in body)]
    st = storage_dtype(dt)
    return Program(name, HEADER + prelude + "\n\n" + "\n".join(lines) + "\n", reads=(0, 1),
                   scratch=((images * pixels * chans, st),),
                   launch={"storage": (st, st, st, st), "split": images, "combine": False, "pack": pack})


def render_weight_grad(kernel: Kernel, plan: BlasPlan, parts: int, tile_rows: int | None = None,
                       tile_cols: int | None = None, vector_bytes: int = 64,
                       tuning: HostTuning = emit_numba.DEFAULT) -> Program:
    """The weight gradient's function: (out, output gradient, input, partial sums, scratch, lo, hi) over
    chunks [lo, hi) of the images, each summed into its own partial gradient laid out (c, kh, kw, o); the
    call with lo == hi == chunks adds the partials up into `out`, row-major over (o, c, kh, kw).

    Per image, the output gradient is first copied (pixel, o) so that the loop over the output channels
    reads it along memory; then per input channel and tile of pixels, a loop over the output channels
    (vectorized) whose body is every tap times every pixel of the tile as `_fma` statements."""
    k = kernel
    chans, cin, kh, kw = k.global_shape
    images, rows, cols = k.reduce_shape
    sa, sb = plan.a.strides, plan.b.strides  # over (o, c, kh, kw, n, y, x)
    dt = k.reduce_expr.dtype
    pixels, taps = rows * cols, kh * kw
    parts = max(1, min(images, parts))
    per = -(-images // parts)
    size = cin * taps * chans  # one partial gradient
    explicit = tile_rows is not None or tile_cols is not None
    if tile_cols is None:  # tiles of 2x4 pixels, or 3x3 where 3 divides the columns and 4 does not (no tail
        # block to compile or run: faster and quicker to compile for conv4's 6x6 pixels)
        tile_cols = 3 if cols % 4 and cols % 3 == 0 else 4
    if tile_rows is None:
        tile_rows = 3 if tile_cols == 3 else 2

    def block(y: str, x: str, height: int, width: int) -> list[str]:
        lines = [f"bx = bc + {y} * {sb[5]} + {x} * {sb[6]}", f"dx = db + ({y} * {cols} + {x}) * {chans}",
                 f"for o in range({chans}):"]
        tile = [(r, j) for r in range(height) for j in range(width)]
        lines += [f"    d{r}_{j} = dyt[dx + {(r * cols + j) * chans} + o]" for r, j in tile]
        for t in range(taps):  # (every value a name of its own, as in render_direct)
            dy, dx = divmod(t, kw)
            lines.append(f"    w{t}_0 = part[pc + {t * chans} + o]")
            for i, (r, j) in enumerate(tile):
                at = r * sb[5] + j * sb[6] + dy * sb[2] + dx * sb[3]
                lines.append(f"    w{t}_{i + 1} = _fma(d{r}_{j}, inp[bx + {at}], w{t}_{i})")
            lines.append(f"    part[pc + {t * chans} + o] = w{t}_{len(tile)}")
        return lines

    height = tile_rows if rows >= tile_rows else 1
    width = tile_cols if cols >= tile_cols else cols
    rtail = rows % height

    def row_blocks(y: str, h: int) -> list[str]:
        return _columns(lambda x, w: block(y, x, h, w), cols, width, "")

    inner = [f"for y in range(0, {rows - rtail}, {height}):", *("    " + s for s in row_blocks("y", height))]
    if rtail:
        inner += [f"for y in range({rows - rtail}, {rows}):", *("    " + s for s in row_blocks("y", 1))]
    lanes = vector_bytes // dt.itemsize
    prelude = ""
    if chans % lanes == 0 and REGISTER_TILES and not explicit:  # (explicit tiles: the loop's, for tests)
        prelude, inner = _weight_grad_tiles(plan, k, lanes, _tile_registers(vector_bytes, tuning))
    body = ["for p in range(lo, hi):",
            f"    pb = p * {size}",
            f"    db = p * {pixels * chans}",
            f"    for i in range({size}):",
            f"        part[pb + i] = {render_const(0, dt)}",
            f"    for n in range(p * {per}, min({images}, (p + 1) * {per})):",
            f"        an = {plan.a.offset} + n * {sa[4]}",
            f"        for o in range({chans}):",
            f"            for y in range({rows}):",
            f"                for x in range({cols}):",
            f"                    dyt[db + (y * {cols} + x) * {chans} + o] = "
            f"gy[an + o * {sa[0]} + y * {sa[5]} + x * {sa[6]}]",
            f"        bn = {plan.b.offset} + n * {sb[4]}",
            f"        for c in range({cin}):",
            f"            bc = bn + c * {sb[1]}",
            f"            pc = pb + c * {taps * chans}",
            *("            " + s for s in inner),
            f"if lo == {parts}:",
            f"    for o in range({chans}):",
            f"        for i in range({cin * taps}):",
            f"            s = part[i * {chans} + o]",
            f"            for p in range(1, {parts}):",
            f"                s += part[p * {size} + i * {chans} + o]",
            f"            out[o * {cin * taps} + i] = s"]
    name = f"{k.name}_wgrad"
    lines = ["@kernel()", f"def {name}(out, gy, inp, part, dyt, lo, hi):", *("    " + line for line in body)]
    st = storage_dtype(dt)
    return Program(name, HEADER + prelude + "\n\n" + "\n".join(lines) + "\n", reads=(0, 1),
                   scratch=((parts * size, st), (parts * pixels * chans, st)),
                   launch={"storage": (st, st, st, st, st), "split": parts, "combine": True})


def _weight_grad_tiles(plan: BlasPlan, k: Kernel, lanes: int, registers: int) -> tuple[str, list[str]]:
    """render_weight_grad's loop over one input channel's taps where the output channels are whole vectors:
    per block of up to 4 vectors of them and block of taps (at most 24 accumulators), one
    numba_rt.wgrad_tile intrinsic summing the image's pixels in registers (the loop it replaces loads and
    stores each tap's sums per tile of pixels). Returns (the module's prelude, the loop's lines)."""
    chans, cin, kh, kw = k.global_shape
    _, rows, cols = k.reduce_shape
    sb, f64 = plan.b.strides, k.reduce_expr.dtype == dtypes.float64
    blocks = _blocks(chans, lanes)
    taps = kh * kw
    most = max(1, registers // blocks)  # taps a pass, at most; the passes even (25 taps: 9, 8, 8)
    per = -(-taps // -(-taps // most))
    prelude = "from tgrad.runtime.cpu.numba_rt import wgrad_tile\n\n"
    lines = [f"for ob in range(0, {chans}, {blocks * lanes}):"]
    for j, t0 in enumerate(range(0, taps, per)):
        n = min(per, taps - t0)
        prelude += (f"_wt{j} = wgrad_tile({rows}, {cols}, {chans}, {sb[5]}, {sb[6]}, {sb[2]}, {sb[3]}, {kw}, "
                    f"{t0}, {n}, {blocks}, {f64}, {lanes})\n")
        lines.append(f"    _wt{j}(part, pc + {t0 * chans} + ob, dyt, db + ob, inp, bc)")
    return prelude, lines


def render_input_grad(k1: Kernel, g: Col2Im, tile: int | None = None, rows: int | None = None) -> Program:
    """A convolution's input gradient as a scatter (blas.Col2Im: a piece pair's matmul and col2im sum in
    one function): (out, packed weight (o, tap, c), output gradient, scratch, lo, hi) over images [lo, hi);
    `out` gets (n, c, iy, ix) row-major. Per image and tile of output pixels, per output channel (two for
    3x3 kernels): the weight's taps (vectors of input channels) in registers, then each input spot the
    tile touches loaded once, every product landing there added with `_fma`, stored, in a loop over the
    input channels that LLVM vectorizes; the tile's spots stay in the L1 cache over the output channels.
    Tiles of 4x2 output pixels for 5x5 kernels, one row of 4 (or the whole row up to 6) for 3x3; the tile's
    output gradients are read inside the vectorized loop (LLVM folds them into broadcast operands; read
    before it, they were slower: measured, see bench/HISTORY.md)."""
    images, chans, taps, _ = k1.global_shape
    cout, dt, name = k1.reduce_shape[0], k1.reduce_expr.dtype, k1.name
    ipix = g.ih * g.iw
    sg = g.grad.strides  # over k1's axes (n, c, tap, pixel, o)
    group = 2 if taps <= 9 and cout % 2 == 0 else 1  # output channels per pass
    if tile is None:
        tile = g.ow if taps <= 9 and g.ow <= 6 else 4
    if rows is None:
        rows = 1 if taps <= 9 else 2
    width = min(tile, g.ow)
    height = rows if g.oh % rows == 0 else 1

    def block(x: str, width: int) -> list[str]:
        lines = [f"qb = tb + (y * {g.sy * g.iw} + {x} * {g.sx}) * {chans}",
                 f"for o in range(0, {cout}, {group}):",
                 f"    gp = gn + o * {sg[4]} + (y * {g.ow} + {x}) * {sg[3]}",
                 f"    wo = o * {taps * chans}"]
        pts = [(o, r, i) for o in range(group) for r in range(height) for i in range(width)]
        lines.append(f"    for c in range({chans}):")
        lines += [f"        d{o}_{r}_{i} = gy[gp + {o * sg[4] + (r * g.ow + i) * sg[3]}]" for o, r, i in pts]
        lines += [f"        w{o}_{t} = wp[wo + {(o * taps + t) * chans} + c]" for o in range(group)
                  for t in range(taps)]
        spots: dict[int, list[str]] = {}  # input spot (from qb, in pixels) -> the products landing there
        for o, r, i in pts:
            for t in range(taps):
                ky, kx = divmod(t, g.kw)
                spot = (r * g.sy + ky * g.dh) * g.iw + i * g.sx + kx * g.dw
                spots.setdefault(spot, []).append(f"d{o}_{r}_{i}, w{o}_{t}")
        for s, (spot, products) in enumerate(sorted(spots.items())):  # (a name per value, as above)
            lines.append(f"        a{s}_0 = tmp[qb + {spot * chans} + c]")
            lines += [f"        a{s}_{i + 1} = _fma({p}, a{s}_{i})" for i, p in enumerate(products)]
            lines.append(f"        tmp[qb + {spot * chans} + c] = a{s}_{len(products)}")
        return lines

    body = ["for n in range(lo, hi):",
            f"    tb = n * {ipix * chans}",
            f"    for i in range({ipix * chans}):",
            f"        tmp[tb + i] = {render_const(0, dt)}",
            f"    gn = {g.grad.offset} + n * {sg[0]}",
            f"    for y in range(0, {g.oh}, {height}):"]
    body += _columns(block, g.ow, width, " " * 8)
    # (the weight over k1's axes (n, c, tap, pixel, o), packed (o, tap, c))
    return _per_image(f"{name}_igrad", "wp, gy", body, images, chans, ipix, dt, [4, 2, 1])
