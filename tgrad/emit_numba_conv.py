"""A 2-d convolution's forward product as a generated loop nest for the CPU (a direct convolution), instead
of BLAS over copied windows (tgrad/blas.py, runtime/cpu_blas.py).

The kernel is the one `blas.blas_plan` recognises as a matmul: out[n, o, y, x] = sum over (c, kh, kw) of
windows[n, y, x, c, kh, kw] * weight[o, c, kh, kw], the windows read in place from the input (strides for
stride and dilation). Per image (the images split over threads), for each input channel, for each output
row and tile of 4 (or 3) pixels: a loop over the output channels, innermost so that LLVM vectorizes it
(each accumulator a vector of output channels), whose body is every kernel tap times every pixel of the
tile written out as a `_fma` statement (the taps are constants: nothing else is in the loop), accumulating
into a per-image buffer laid out (pixel, channel); for 3x3 kernels two input channels a pass (fewer loads
and stores of the accumulators: conv4 1.83 -> 1.62 ms). The weight comes packed (c, kh, kw, o) (the runtime
packs it at each call: a few thousand elements). At the end of each image, the (pixel, channel) sums are
put in the kernel's order (o, y, x), where the BLAS path's epilogue (bias, relu...) takes them as from BLAS.

Measured on 2 cores (batch 128, forward + bias + relu, TinyJit, against the BLAS path in the same
process): MNIST conv2 (32->32 5x5, 24x24) 14.2 -> 10.7 ms (PyTorch's oneDNN 9.2), conv4 (64->64 3x3,
8x8) 2.16 -> 1.66 (1.3), conv3 (32->64 3x3, 10x10) 1.39 -> 1.25 (1.2); bench/README.md has more shapes.
Tiles of 2 pixels, two rows of pixels, or two channels a pass for 5x5 were slower; four channels a pass,
or every tap of every channel written out, do not vectorize (the latter also took 306 s to compile).
"""

from __future__ import annotations

import math

from tgrad.blas import BlasPlan
from tgrad.dtype import dtypes
from tgrad.emit_numba import HEADER, render_const, storage_dtype
from tgrad.fuse import Kernel
from tgrad.program import Program

DIRECT_MAX_TAPS = 49  # kernel taps (kh * kw) up to which the taps are written out (a 7x7 kernel)
# output channels from which the loop over them pays (a vector of 16 floats; 8 output channels, 16 or 32
# input channels, 3x3: 1.07 -> 2.94 and 3.09 -> 11.07 ms against BLAS), and multiply-adds per output
# value (c * kh * kw) from which it does (16 -> 32 channels 3x3, 144: 4.1 -> 4.4 ms; 32 -> 16, 288:
# 5.1 -> 3.6)
DIRECT_MIN_CHANNELS = 16
DIRECT_MIN_DEPTH = 256
DIRECT_MIN_WORK = 1 << 20  # multiply-adds below which the BLAS path's overheads are no matter


def direct_conv(kernel: Kernel, plan: BlasPlan) -> bool:
    """Whether a BLAS-planned kernel is a 2-d convolution's forward product that `render_direct` renders:
    global axes (n, o, y, x), reduce axes (c, kh, kw), the windows (A) read in place from one input and
    the weight (B) from another, one float dtype, no groups (no batch axes)."""
    k = kernel
    if plan.prologues or plan.batch or plan.m != (0, 2, 3) or plan.n != (1,) or k.n_global != 4:
        return False
    if len(k.reduce_shape) != 3 or plan.a.input == plan.b.input:
        return False
    dt = k.reduce_expr.dtype
    if dt not in (dtypes.float32, dtypes.float64):
        return False
    if k.in_dtypes[plan.a.input] != dt or k.in_dtypes[plan.b.input] != dt:
        return False
    _, channels, _, _ = k.global_shape
    cin, kh, kw = k.reduce_shape
    big = math.prod(k.shape) >= DIRECT_MIN_WORK and cin * kh * kw >= DIRECT_MIN_DEPTH
    return kh * kw <= DIRECT_MAX_TAPS and channels >= DIRECT_MIN_CHANNELS and big


# the kernel axes (c, kh, kw, o) in the order the runtime packs the weight for `render_direct`'s function
PACKED_AXES = [4, 5, 6, 1]


def render_direct(kernel: Kernel, plan: BlasPlan) -> Program:
    """The direct convolution's function: (out, windows' input, packed weight, scratch, lo, hi) over images
    [lo, hi); `out` gets the sums row-major over the kernel's global axes (n, o, y, x)."""
    k = kernel
    images, chans, rows, cols = k.global_shape
    cin, kh, kw = k.reduce_shape
    sa = plan.a.strides  # over (n, o, y, x, c, kh, kw); o's is 0
    dt = k.reduce_expr.dtype
    pixels, taps = rows * cols, kh * kw
    tile = 4 if cols % 4 == 0 or cols % 3 else 3
    tail = cols % tile
    group = 2 if taps <= 9 and cin % 2 == 0 else 1  # input channels per pass over the accumulators

    def block(x: str, width: int) -> list[str]:
        lines = [f"ai = ay + {x} * {sa[3]}", f"ti = ty + {x} * {chans}", f"for o in range({chans}):"]
        lines += [f"    a{p} = tmp[ti + {p * chans} + o]" for p in range(width)]
        for g in range(group):
            for t in range(taps):
                dy, dx = divmod(t, kw)
                lines.append(f"    w = wp[wc + {(g * taps + t) * chans} + o]")
                at = g * sa[4] + dy * sa[5] + dx * sa[6]
                lines += [f"    a{p} = _fma(inp[ai + {at + p * sa[3]}], w, a{p})" for p in range(width)]
        return lines + [f"    tmp[ti + {p * chans} + o] = a{p}" for p in range(width)]

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
    if cols >= tile:
        body.append(f"            for x in range(0, {cols - tail}, {tile}):")
        body += ["                " + line for line in block("x", tile)]
    if tail:
        body += ["            " + line for line in block(str(cols - tail), tail)]
    body += [f"    ob = n * {chans * pixels}",
             f"    for o in range({chans}):",
             f"        for i in range({pixels}):",
             f"            out[ob + o * {pixels} + i] = tmp[tb + i * {chans} + o]"]
    name = f"{k.name}_direct"
    lines = ["@kernel()", f"def {name}(out, inp, wp, tmp, lo, hi):", *("    " + line for line in body)]
    st = storage_dtype(dt)
    return Program(name, HEADER + "\n\n" + "\n".join(lines) + "\n", reads=(0, 1),
                   scratch=((images * pixels * chans, st),),
                   launch={"storage": (st, st, st, st), "split": images, "combine": False})
