"""A conv's matmul pieces (cpu_blas._run_pieces, _run_shifted, piece pairs) as compiled functions over
ranges of pieces, which copy each piece's windows and call BLAS's gemm themselves, without the GIL.

Each piece of a conv is one image or a few: a copy of its windows (~300 KB) and one matmul or a few
(32x160 @ 160x400 per kernel row for MNIST's conv2, each a few tens of microseconds). Run from Python
threads, those ~10 numpy calls a piece held the GIL between them long enough that two threads ran 1.4x
faster than one, not 2x. Here the copies, the matmuls and the sums (gemm's beta, instead of a product added
afterwards) are one native call per range of pieces, which two threads run about twice as fast (measured: see
bench/HISTORY.md, "Figures that were in source comments"). Three functions: shifted_pieces (a stride-1 conv's
shifted copies, one gemm per kernel row), blas_pieces (im2col pieces of rows or of K), pair_pieces (a piece
pair: the gemms, then the second kernel's compiled function on the piece's images).

BLAS is the one numpy uses, found in the process (an ILP64 OpenBLAS: numpy's own wheels); its cblas_sgemm
and cblas_dgemm are given to LLVM under fixed names (SYMBOLS), so the compiled functions are cached on
disk like any kernel. Where no such BLAS is found (`available()` False), cpu_blas keeps its numpy path;
TGRAD_NATIVE_GEMM=0 keeps it too.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math

import numpy as np

from tgrad import config
from tgrad.blas import BlasPlan
from tgrad.dtype import dtypes
from tgrad.emit_numba import _RT_DIGEST
from tgrad.program import Program
from tgrad.runtime.cpu.memory import HostMemory

DIMS = 6  # axes of a piece's copy the function takes (a conv's copy has 4 or 5)
NO_TRANS, TRANS = 111, 112  # CBLAS's flags
SYMBOLS = {"float32": "tgrad_sgemm64", "float64": "tgrad_dgemm64"}  # what numba_rt._gemm calls
KERNEL_ARGS = 12  # int64 arguments numba_rt._call_kernel passes (the kernel reads its own, ignores the rest)


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


def _operands(a_off: str, a_step: str, a_copied: str, b_off: str, b_step: str, b_copied: str) -> str:
    """Source of piece q's two operands (pointer pa / pb, element offset ia / ib): read in place, or
    copied into the slot's buffer (xa / xb, `alen` / `blen` elements a slot) first."""
    lines = f"            pa, ia, pb, ib = a, {a_off} + q * {a_step}, b, {b_off} + q * {b_step}\n"
    for x, off, step, copied in (("a", a_off, a_step, a_copied), ("b", b_off, b_step, b_copied)):
        lines += (f"            if {copied}:\n                i = slot * {x}len\n"
                  + _copy(x, f"{off} + q * {step}", f"x{x}", f"{x}d", f"{x}s", " " * 16)
                  + f"                p{x}, i{x} = x{x}, slot * {x}len\n")
    return lines


HEAD = f"""import numpy as np

from tgrad.runtime.cpu.numba_rt import _gemm, kernel  # runtime {_RT_DIGEST}


"""

# The functions take the pieces in `nslots` slots and run slots [lo, hi) (a thread's share: cpu/runtime.py's
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
{_operands("a_off", "a_step", "ca", "b_off", "b_step", "cb")}            if scatter:
                t0 = slot * tlen
                _gemm(ta, tb, m, n, k, pa, ia, lda, pb, ib, ldb, 0.0, tmp, t0, n)
                i = q * c_step
{_copy("tmp", "t0", "out", "ed", "f", " " * 16)}            else:
                _gemm(ta, tb, m, n, k, pa, ia, lda, pb, ib, ldb, 0.0 if q == first else 1.0 * beta, out,
                      q * c_step + slot * acc, n)
"""


# gemm_batch: a whole matmul (cpu_blas.BlasCall.bind: operands read in place, the result in the output's
# order) as a record of TinyJit's batched replay (cpu_batch): matrices [lo, hi) of the batch, each one gemm
# (BLAS's own threads split it)
BATCH = HEAD + """@kernel()
def gemm_batch(a, b, c, m, n, k, ta, lda, a_off, a_bs, tb, ldb, b_off, b_bs, c_bs, ldc, lo, hi):
    for bi in range(lo, hi):
        _gemm(ta, tb, m, n, k, a, a_off + bi * a_bs, lda, b, b_off + bi * b_bs, ldb, 0.0, c, bi * c_bs, ldc)
"""

# pair_pieces: a piece pair (runtime.py _pair_runner: a conv's col2im matmul, then the kernel that shifts its
# shares into place) with everything but the arrays in `words` (layout: the W* offsets below). Per piece q,
# for each of its nb batch matrices, rows = A @ B (operands read in place or copied, as in blas_pieces, each
# with a batch stride), into the result (q * c_step) or the slot's rows buffer (kept); then the second
# kernel (its address `fn`) on the piece's images: each of its nk arguments is the rows' address, an
# array's address moved by q * bsize * its bytes per image, or an int
W_NPIECES, W_NSLOTS, W_M, W_N, W_K, W_NB, W_CSTEP, W_KEPT, W_ROWS, W_FN, W_NK, W_BSIZE, W_STATUS = range(13)
W_ALEN, W_BLEN, W_CBS = 13, 14, 15
W_SIDE = 16  # two sides of SIDE words: copied, offset, offset per piece, sizes, strides, flag, ld, batch step
SIDE = 3 + 2 * DIMS + 3
W_ARGS = W_SIDE + 2 * SIDE  # nk x (kind: 0 an array, 1 the rows, 2 an int; address or int; bytes per image)
W_SLOTS = W_ARGS + 3 * KERNEL_ARGS  # then 4 + KERNEL_ARGS words a slot: Numba's slots, the call's arguments
SLOT = 4 + KERNEL_ARGS
_HEADER = ["npieces", "nslots", "m", "n", "k", "nb", "c_step", "kept", "rows_len", "fn", "nk", "bsize", "",
           "alen", "blen", "cbs"]
_SIDE_NAMES = ["c", "off", "step", *(f"d{j}" for j in range(DIMS)), *(f"s{j}" for j in range(DIMS)), "t",
               "ld", "bst"]


def _locals(names: list[str], at: int) -> str:
    return "".join(f"    {name} = words[{at + j}]\n" for j, name in enumerate(names) if name)


_WORDS = (_locals(_HEADER, 0) + _locals(["a" + x for x in _SIDE_NAMES], W_SIDE)
          + _locals(["b" + x for x in _SIDE_NAMES], W_SIDE + SIDE))


_PAIR_OPERANDS = _operands("aoff", "astep", "ac", "boff", "bstep", "bc")
PAIR = HEAD.replace("import _gemm, kernel", "import _addr, _call_kernel, _gemm, kernel") + f"""@kernel()
def pair_pieces(a, b, xa, xb, out, words, lo, hi):
{_WORDS}    for slot in range(lo, hi):
        w = {W_SLOTS} + slot * {SLOT}
        for q in range(slot * npieces // nslots, (slot + 1) * npieces // nslots):
{_PAIR_OPERANDS}            c0 = slot * rows_len if kept else q * c_step
            for bi in range(nb):
                _gemm(at, bt, m, n, k, pa, ia + bi * abst, ald, pb, ib + bi * bbst, bld, 0.0, out,
                      c0 + bi * cbs, n)
            for j in range(nk):
                kind, value = words[{W_ARGS} + 3 * j], words[{W_ARGS} + 3 * j + 1]
                if kind == 0:
                    value += q * bsize * words[{W_ARGS} + 3 * j + 2]
                elif kind == 1:
                    value = _addr(out, c0)
                words[w + 4 + j] = value
            status = _call_kernel(fn, words, w)
            if status != 0 and status != -2:
                words[{W_STATUS}] = status
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
    return config.on("TGRAD_NATIVE_GEMM") and available()


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


PROGRAMS = ("shifted_pieces", "blas_pieces", "pair_pieces")  # (gemm_batch: compiled at a replay)


@functools.cache
def program(dtype: np.dtype, name: str = "shifted_pieces") -> Program:
    """cpu_gemm's function `name` (shifted_pieces, blas_pieces, pair_pieces, gemm_batch) for arrays of
    `dtype`: its int arguments are passed at each call (the Program's `args` only count them; "split" adds
    lo and hi)."""
    source = {"shifted_pieces": SHIFTED, "blas_pieces": PIECES, "pair_pieces": PAIR, "gemm_batch": BATCH}
    source = source[name]
    params = source[source.index(f"def {name}(") :].split("(", 1)[1].split(")", 1)[0].split(",")
    dt = dtypes.from_any(dtype)
    storage = {"shifted_pieces": (dt,) * 4, "blas_pieces": (dt,) * 6, "gemm_batch": (dt,) * 3,
               "pair_pieces": (dt,) * 5 + (dtypes.int64,)}
    return Program(name, source, args=(0,) * (len(params) - len(storage[name]) - 2),
                   launch={"storage": storage[name], "split": 1})


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
    """blas_pieces' arguments for one operand (a cpu_blas._Side without batch axes): side_words' but the
    batch step; None where the function cannot read it (a batch axis too)."""
    words = None if (side.lead if side.copy else side.shape[:-2]) else side_words(side, size, transpose)
    return None if words is None else tuple(words[:-1])


def side_words(side, size: int, transpose: bool) -> list[int] | None:
    """pair_pieces' SIDE words for one operand (a cpu_blas._Side with at most one batch axis), pieces of
    `size` indices of its chunk axis, read transposed with `transpose`; None where it cannot read it."""
    lead = side.shape[:-2] if not side.copy else side.lead
    if len(lead) > 1:
        return None
    if side.copy:
        if len(side.shape) > DIMS or any(s % side.item for s in side.strides):
            return None
        flags = (TRANS, side.nr) if side.transposed else (NO_TRANS, side.nc)
        pad = DIMS - len(side.shape)
        dims = (1,) * pad + tuple(side.shape)
        strides = (0,) * pad + tuple(s // side.item for s in side.strides)
        batch = side.nr * side.nc
    else:
        matrix = np.lib.stride_tricks.as_strided(np.empty(1, side.dtype), side.shape[-2:], side.strides[-2:])
        flags = matrix_flags(matrix)
        dims, strides = (1,) * DIMS, (0,) * DIMS
        batch = side.strides[0] // side.item if lead else 0
    if flags is None:
        return None
    flag, ld = flags
    if transpose:
        flag = TRANS if flag == NO_TRANS else NO_TRANS
    return [int(bool(side.copy)), side.offset, size * side.step, *dims, *strides, flag, ld, batch]


def pair_words(plan: BlasPlan, sub: tuple, ng: int, sides: list, operands: tuple, dtype, c_step: int,
                 n_pieces: int, size: int, per: int, kept: bool, pair: tuple, workers: int) -> tuple | None:
    """(words, order) of pair_pieces for a piece pair (cpu_blas._run_pieces with `after`, whose
    `native` is (address of the second kernel, its arguments as (kind, value, bytes per image))), or None
    where it does not apply (another dtype, a product out of the output's order, an operand it cannot
    read, more arguments than numba_rt._call_kernel passes). order: which side is the call's A, B."""
    address, args = pair
    if not (dtype in (np.float32, np.float64) and all(x.dtype == dtype for x in operands)) \
            or len(args) > KERNEL_ARGS or len(plan.batch) > 1:
        return None
    natural = list(range(ng))
    if [*plan.batch, *plan.m, *plan.n] == natural:
        swap = False
    elif [*plan.batch, *plan.n, *plan.m] == natural:
        swap = True
    else:
        return None
    m, n = (plan.n, plan.m) if swap else (plan.m, plan.n)
    order = (1, 0) if swap else (0, 1)
    descs = [side_words(sides[i], size, swap) for i in order]
    if None in descs:
        return None
    nslots = slots(n_pieces, workers)
    dims = (math.prod(sub[x] for x in m), math.prod(sub[x] for x in n))
    nb = math.prod(sub[x] for x in plan.batch)
    words = np.zeros(W_SLOTS + nslots * SLOT, np.int64)
    head = [n_pieces, nslots, *dims, math.prod(sub[x] for x in range(ng, len(sub))), nb, c_step, int(kept),
            per if kept else 0, address, len(args), size, 0, *(sides[i].copy or 0 for i in order),
            dims[0] * dims[1]]
    words[: len(head)] = head
    words[W_SIDE : W_ARGS] = descs[0] + descs[1]
    words[W_ARGS : W_ARGS + 3 * len(args)] = [v for arg in args for v in arg]
    return words, order


def slots(n_pieces: int, workers: int) -> int:
    """Slots of the functions here (each its own buffers and sums): 4 for each of `workers` threads, at
    least 8 (so that sums come out the same on 1 or 2 threads), at most one a piece."""
    return max(1, min(n_pieces, max(8, 4 * workers)))


def slot_sum(acc: np.ndarray, slots: int, memory: HostMemory) -> np.ndarray:
    """The sum of the slots' sums (`acc`: slots of equal length), in slot order, in an array from memory."""
    size = acc.size // slots
    total = memory.array(size, acc.dtype)
    np.copyto(total, acc[:size])
    for j in range(1, slots):
        total += acc[j * size : (j + 1) * size]
    return total


@dataclasses.dataclass
class NativeShifted:
    """How cpu_blas._run_shifted's pieces run as shifted_pieces: the other operand's array (its matrices
    from its start), the function's int arguments (those before the slots'), and its slots."""

    o: np.ndarray
    ints: tuple[int, ...]
    slots: int


@dataclasses.dataclass
class NativePieces:
    """How cpu_blas._run_pieces' pieces run as blas_pieces: which side is the call's A and which its
    B (swapped: c.T = b.T @ a.T), the function's int arguments (those before the slots'), its slots, and
    the elements of a product put in order from a buffer (0: none, the product is in the output's order)."""

    order: tuple[int, int]
    ints: tuple[int, ...]
    slots: int
    scatter: int


def pieces_spec(plan: BlasPlan, sub: tuple, ng: int, sides: list, operands: tuple, dtype, rows: bool,
                c_step: int, n_pieces: int, workers: int) -> NativePieces | None:
    """cpu_blas._run_pieces' pieces (no batch axes) as calls of blas_pieces, or None where it does not
    apply (another dtype, an operand it cannot read, pieces of K whose sum is not in the output's order).
    Pieces of rows write theirs `c_step` elements apart, put in order from a buffer where the matmul
    gives them in another (a forward conv's (image, y, x) x channels); pieces of K add to one sum."""
    if not (dtype in (np.float32, np.float64) and all(x.dtype == dtype for x in operands)):
        return None
    natural = list(range(ng))
    swap = [*plan.m, *plan.n] != natural
    scatter = swap and [*plan.n, *plan.m] != natural
    if scatter:  # the product as it comes out (not swapped), put in order per piece
        if not rows or ng > DIMS:
            return None
        swap = False
    m, n = (plan.n, plan.m) if swap else (plan.m, plan.n)
    order = (1, 0) if swap else (0, 1)
    args = [side_ints(sides[i], plan.chunk.size, swap) for i in order]
    if None in args:
        return None
    dims = (math.prod(sub[x] for x in m), math.prod(sub[x] for x in n))
    k = math.prod(sub[x] for x in range(ng, len(sub)))
    pos = [*m, *n]  # the product's axes; each one's stride in it
    stride = [math.prod(sub[x] for x in pos[j + 1 :]) for j in range(len(pos))]
    pad = DIMS - ng
    e = (1,) * pad + tuple(sub[:ng]) if scatter else (1,) * DIMS
    f = (0,) * pad + tuple(stride[pos.index(x)] for x in natural) if scatter else (0,) * DIMS
    beta = 0 if rows else 1
    ints = (*args[0], *args[1], *dims, k, beta, c_step if rows else 0, int(scatter), *e, *f)
    return NativePieces(order, ints, slots(n_pieces, workers), math.prod(dims) if scatter else 0)


def shifted_spec(xside, c_arr: np.ndarray, o_arr: np.ndarray, o_sides: list, o_fixed: list, fixed: bool,
                 dtype, l_in_k: bool, nl: int, m: int, ncols: int, step: int, rows_per: int, n_pieces: int,
                 memory: HostMemory, scratch: list, workers: int) -> NativeShifted | None:
    """cpu_blas._run_shifted's pieces as calls of shifted_pieces, or None where it does not apply
    (another dtype, a copy of more than DIMS axes, a windows operand read in place, another
    operand copied per piece or with neither rows nor columns along memory)."""
    if not (dtype in (np.float32, np.float64) and c_arr.dtype == o_arr.dtype == dtype and xside.copy
            and len(xside.shape) <= DIMS and not any(s % xside.item for s in xside.strides)):
        return None
    nr = xside.nr
    if l_in_k:  # o_l for each kernel row l: stacked into one array (the weights: small)
        if not fixed:
            return None
        o = memory.array(nl * m * nr, dtype)
        scratch.append(o)
        for l in range(nl):
            o[l * m * nr : (l + 1) * m * nr].reshape(m, nr)[...] = o_fixed[min(l, len(o_fixed) - 1)]
        ta, ld, o_step, o_ls = NO_TRANS, nr, 0, m * nr
    else:  # one matrix per piece (the output's gradient of one image), read in place
        if fixed:
            o = o_fixed[0]
            o_step = 0
        elif o_sides[0].copy is None:
            o = o_sides[0].matrix(o_arr, 0, None)
            o_step = o_sides[0].step
        else:
            return None
        flags = matrix_flags(o)
        if flags is None:
            return None
        (ta, ld), o_ls = flags, 0
    pad = DIMS - len(xside.shape)
    dims = (1,) * pad + tuple(xside.shape)
    strides = (0,) * pad + tuple(s // xside.item for s in xside.strides)
    ints = (xside.offset, xside.step, *dims, *strides, nr, xside.nc, m, ncols, step, nl, int(l_in_k), 0,
            o_step, o_ls, ta, ld, rows_per)
    return NativeShifted(o, ints, slots(n_pieces, workers))
