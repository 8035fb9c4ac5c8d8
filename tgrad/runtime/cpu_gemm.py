"""A conv's shifted pieces (cpu_blas._run_shifted) as one compiled function over a range of images, which
copies each image's rows and calls BLAS's gemm itself, without the GIL.

Each piece of a shifted conv is one image: a copy of its rows (~300 KB) and one matmul per kernel row
(32x160 @ 160x400 for MNIST's conv2, ~30 us each). Run from Python threads, those ~10 numpy calls a piece
held the GIL between them long enough that two threads ran 1.4x faster than one, not 2x (conv2's forward
alone: 16.8 ms on two threads against 23.8 on one). Here the copy, the matmuls and the sums (gemm's beta,
instead of a product added afterwards) are one native call per range of images: 11.4 ms on two threads.

BLAS is the one numpy uses, found in the process (an ILP64 OpenBLAS: numpy's own wheels); its cblas_sgemm
and cblas_dgemm are given to LLVM under fixed names (SYMBOLS), so the compiled function is
cached on disk like any kernel. Where no such BLAS is found (`available()` False), cpu_blas keeps its
numpy path; TGRAD_NATIVE_GEMM=0 keeps it too.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from tgrad.dtype import dtypes
from tgrad.emit_numba import _RT_DIGEST
from tgrad.program import Program

DIMS = 6  # axes of a piece's copy the function takes (a conv's copy has 4 or 5)
NO_TRANS, TRANS = 111, 112  # CBLAS's flags
SYMBOLS = {"float32": "tgrad_sgemm64", "float64": "tgrad_dgemm64"}  # what numba_rt._gemm calls

# one piece per image in [lo, hi): copy the image's rows into x (the copy's view: offset c_off + p * c_step,
# sizes d*, element strides s*), then for each kernel row l either (l_in_k, a forward)
#   out[p * out_step:] (m x ncols) (+)= o_l (m x nr) @ x[:, l * step:] (nr x ncols, rows of xcols)
# with o_l at o_off + l * o_ls (flag ta, leading dimension ld), or (a weight gradient)
#   out[l * nr * m:] (nr x m) += x[:, l * step:] (nr x ncols) @ o_p (ncols x m)
# with o_p at o_off + p * o_step (flag ta, leading dimension ld)
SOURCE = '''import numpy as np

from tgrad.runtime.numba_rt import _gemm, kernel  # runtime {digest}


@kernel()
def shifted_pieces(c, x, o, out, c_off, c_step, d0, d1, d2, d3, d4, d5, s0, s1, s2, s3, s4, s5, nr, xcols,
                   m, ncols, step, nl, l_in_k, o_off, o_step, o_ls, ta, ld, out_step, lo, hi):
    for p in range(lo, hi):
        base = c_off + p * c_step
        i = 0
        for a0 in range(d0):
            b0 = base + a0 * s0
            for a1 in range(d1):
                b1 = b0 + a1 * s1
                for a2 in range(d2):
                    b2 = b1 + a2 * s2
                    for a3 in range(d3):
                        b3 = b2 + a3 * s3
                        for a4 in range(d4):
                            b4 = b3 + a4 * s4
                            for a5 in range(d5):
                                x[i + a5] = c[b4 + a5 * s5]
                            i += d5
        for l in range(nl):
            if l_in_k:
                _gemm(ta, {no_trans}, m, ncols, nr, o, o_off + l * o_ls, ld, x, l * step, xcols,
                      0.0 if l == 0 else 1.0, out, p * out_step, ncols)
            else:
                _gemm({no_trans}, ta, nr, m, ncols, x, l * step, xcols, o, o_off + p * o_step, ld, 1.0,
                      out, l * nr * m, m)
'''


def openblas() -> list[ctypes.CDLL]:
    """The OpenBLAS libraries loaded in this process (found in /proc/self/maps: numpy's, and SciPy's when
    it is imported) that export what cpu_blas.openblas_idle_timeout calls."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return []
    libs = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            for name in ("openblas_read_env", "openblas_thread_timeout", "blas_thread_shutdown_",
                         "blas_thread_init"):
                getattr(lib, name).restype = ctypes.c_int
            libs.append(lib)
        except (OSError, AttributeError):
            continue
    return libs


def enabled() -> bool:
    return os.environ.get("TGRAD_NATIVE_GEMM", "1") != "0" and available()


@functools.cache
def available() -> bool:
    """Whether numpy's BLAS has ILP64 cblas_sgemm and cblas_dgemm (given to LLVM under numba_rt's names)."""
    for lib in openblas():
        found = {}
        for short, full in (("s", "sgemm"), ("d", "dgemm")):
            for name in (f"scipy_cblas_{full}64_", f"cblas_{full}64_"):
                fn = getattr(lib, name, None)
                if fn is not None:
                    found[short] = ctypes.cast(fn, ctypes.c_void_p).value
                    break
        if len(found) == 2:
            import llvmlite.binding as llvm

            llvm.add_symbol(SYMBOLS["float32"], found["s"])
            llvm.add_symbol(SYMBOLS["float64"], found["d"])
            return True
    return False


@functools.cache
def program(dtype: np.dtype) -> Program:
    dt = dtypes.from_any(dtype)
    source = SOURCE.format(digest=_RT_DIGEST, no_trans=NO_TRANS)
    # (int arguments: 27 sizes, then lo and hi, which "split" adds; the values are passed at each call)
    return Program("shifted_pieces", source, args=(0,) * 27, launch={"storage": (dt,) * 4, "split": 1})


def matrix_flags(array: np.ndarray) -> tuple[int, int] | None:
    """(CBLAS transpose flag, leading dimension) of a row-major call reading a 2-D array in place, or None
    when neither its rows nor its columns lie along memory."""
    rows, cols = array.shape
    rs, cs = (s // array.itemsize for s in array.strides)
    if cs == 1 or cols == 1:
        if rows == 1 or rs >= max(1, cols):
            return NO_TRANS, max(rs, cols, 1)
    if rs == 1 or rows == 1:
        if cols == 1 or cs >= max(1, rows):
            return TRANS, max(cs, rows, 1)
    return None
