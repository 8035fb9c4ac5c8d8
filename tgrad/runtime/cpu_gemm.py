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

def _copy(src: str, base: str, dst: str, d: str, st: str, indent: str) -> str:
    """Source of a copy of the DIMS-axis view of `src` at element `base` (sizes d0.., element strides s0..)
    into `dst` from element `i`, in C order."""
    lines, at = [], base
    for j in range(DIMS):
        pad = "    " * j
        lines.append(f"{pad}for x{j} in range({d}{j}):")
        if j < DIMS - 1:
            lines.append(f"{pad}    o{j} = {at} + x{j} * {st}{j}")
            at = f"o{j}"
    pad = "    " * DIMS
    lines += [f"{pad}{dst}[i + x{DIMS - 1}] = {src}[{at} + x{DIMS - 1} * {st}{DIMS - 1}]",
              f"{pad[:-4]}i += {d}{DIMS - 1}"]
    return "".join(f"{indent}{line}\n" for line in lines)


def _names(d: str, s: str) -> str:
    return ", ".join([f"{d}{j}" for j in range(DIMS)] + [f"{s}{j}" for j in range(DIMS)])


HEAD = f"""import numpy as np

from tgrad.runtime.numba_rt import _gemm, kernel  # runtime {_RT_DIGEST}


"""

# Both functions take the pieces in `nslots` slots and run slots [lo, hi) (a thread's share: cpu.py's
# native workers call them on ranges of slots): slot j has pieces [j * npieces // nslots, (j + 1) * npieces
# // nslots) and its own copy buffers (`xlen` elements apart) and, where the pieces are summed, its own sum
# (`acc` elements apart; its first piece writes it, the others add), which the caller adds up.
#
# shifted_pieces, one image a piece p: copy its rows into x (the copy's view at c_off + p * c_step, sizes
# d*, element strides s*), then for each kernel row l either (l_in_k, a forward)
#   out[p * out_step:] (m x ncols) (+)= o_l (m x nr) @ x[:, l * step:] (nr x ncols, rows of xcols)
# with o_l at o_off + l * o_ls (flag ta, leading dimension ld), or (a weight gradient)
#   out[l * nr * m:] (nr x m) += x[:, l * step:] (nr x ncols) @ o_p (ncols x m)
# with o_p at o_off + p * o_step (flag ta, leading dimension ld)
SHIFTED = HEAD + f"""@kernel()
def shifted_pieces(c, x, o, out, c_off, c_step, {_names("d", "s")}, nr, xcols, m, ncols, step, nl, l_in_k,
                   o_off, o_step, o_ls, ta, ld, out_step, npieces, nslots, xlen, acc, lo, hi):
    for slot in range(lo, hi):
        xo, ao = slot * xlen, slot * acc
        first = slot * npieces // nslots
        for p in range(first, (slot + 1) * npieces // nslots):
            i = xo
{_copy("c", "c_off + p * c_step", "x", "d", "s", " " * 12)}            for l in range(nl):
                if l_in_k:
                    _gemm(ta, {NO_TRANS}, m, ncols, nr, o, o_off + l * o_ls, ld, x, xo + l * step, xcols,
                          0.0 if l == 0 else 1.0, out, p * out_step, ncols)
                else:
                    _gemm({NO_TRANS}, ta, nr, m, ncols, x, xo + l * step, xcols, o, o_off + p * o_step, ld,
                          0.0 if p == first else 1.0, out, ao + l * nr * m, m)
"""

# blas_pieces, pieces q of a matmul (cpu_blas._run_pieces): out[q * c_step:] (m x n) = A_q @ B_q, or
# (beta 1, pieces of K) the slot's sum += A_q @ B_q; each operand read in place at off + q * step or copied
# first into its buffer (the view at off + q * step, sizes d*, element strides s*), with its flag and
# leading dimension. With `scatter`, the product goes to the slot's tmp and is copied from there into
# out[q * c_step:] in C order of sizes e*, reading tmp with element strides f* (rows that come out of the
# matmul in another order than the output's)
PIECES = HEAD + f"""@kernel()
def blas_pieces(a, b, xa, xb, out, tmp, ca, a_off, a_step, {_names("ad", "as")}, ta, lda, cb, b_off, b_step,
                {_names("bd", "bs")}, tb, ldb, m, n, k, beta, c_step, scatter, {_names("ed", "f")}, npieces,
                nslots, alen, blen, tlen, acc, lo, hi):
    for slot in range(lo, hi):
        first = slot * npieces // nslots
        for q in range(first, (slot + 1) * npieces // nslots):
            pa, ia, pb, ib = a, a_off + q * a_step, b, b_off + q * b_step
            if ca:
                i = slot * alen
{_copy("a", "a_off + q * a_step", "xa", "ad", "as", " " * 16)}                pa, ia = xa, slot * alen
            if cb:
                i = slot * blen
{_copy("b", "b_off + q * b_step", "xb", "bd", "bs", " " * 16)}                pb, ib = xb, slot * blen
            if scatter:
                t0 = slot * tlen
                _gemm(ta, tb, m, n, k, pa, ia, lda, pb, ib, ldb, 0.0, tmp, t0, n)
                i = q * c_step
{_copy("tmp", "t0", "out", "ed", "f", " " * 16)}            else:
                _gemm(ta, tb, m, n, k, pa, ia, lda, pb, ib, ldb, 0.0 if q == first else 1.0 * beta, out,
                      q * c_step + slot * acc, n)
"""


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
    """Whether numpy's BLAS has ILP64 cblas_sgemm and cblas_dgemm (given to LLVM under SYMBOLS' names) and
    a per-thread thread count (cpu_blas sets it to 1 while the functions run on several threads)."""
    for lib in openblas():
        local = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_")
        if not any(hasattr(lib, name) for name in local):
            continue
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
def program(dtype: np.dtype, name: str = "shifted_pieces") -> Program:
    """cpu_gemm's function `name` (shifted_pieces, blas_pieces) for arrays of `dtype`: its int arguments
    are passed at each call (the Program's `args` only count them; "split" adds lo and hi)."""
    source = {"shifted_pieces": SHIFTED, "blas_pieces": PIECES}[name]
    params = source[source.index(f"def {name}(") :].split("(", 1)[1].split(")", 1)[0].split(",")
    pointers = 4 if name == "shifted_pieces" else 6
    return Program(name, source, args=(0,) * (len(params) - pointers - 2),
                   launch={"storage": (dtypes.from_any(dtype),) * pointers, "split": 1})


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


def side_ints(side, size: int, transpose: bool) -> tuple[int, ...] | None:
    """blas_pieces' arguments for one operand (a cpu_blas._Side without batch axes), pieces of `size`
    indices of its chunk axis, read transposed with `transpose`: (copied, offset, offset per piece, sizes,
    element strides, flag, leading dimension); None where the function cannot read it."""
    if side.copy:
        if side.lead or len(side.shape) > DIMS or any(s % side.item for s in side.strides):
            return None
        flags = (TRANS, side.nr) if side.transposed else (NO_TRANS, side.nc)
        pad = DIMS - len(side.shape)
        dims = (1,) * pad + tuple(side.shape)
        strides = (0,) * pad + tuple(s // side.item for s in side.strides)
    else:
        if len(side.shape) != 2:
            return None
        flags = matrix_flags(side.matrix0)
        dims, strides = (1,) * DIMS, (0,) * DIMS
    if flags is None:
        return None
    flag, ld = flags
    if transpose:
        flag = TRANS if flag == NO_TRANS else NO_TRANS
    return (int(bool(side.copy)), side.offset, size * side.step, *dims, *strides, flag, ld)
