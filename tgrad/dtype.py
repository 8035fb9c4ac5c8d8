"""Data types and PyTorch-style type promotion."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tgrad.errors import DTypeError, ValueOverflowError


@dataclass(frozen=True, eq=False)
class DType:
    name: str
    itemsize: int
    kind: str  # "b" bool, "i" signed int, "u" unsigned int, "f" float
    rank: int  # position on the promotion ladder

    def __eq__(self, other) -> bool:  # dtypes are singletons: identity first (a dataclass's == builds tuples)
        return self is other or (isinstance(other, DType) and self.name == other.name)

    def __hash__(self) -> int:  # every graph node's key holds a dtype: the name alone tells them apart
        return hash(self.name)

    @property
    def np(self) -> np.dtype:
        """The numpy dtype of this dtype's values on the host (bfloat16 and fp8, which numpy lacks:
        float32)."""
        if self.name == "bfloat16" or self.name.startswith("fp8"):
            return np.dtype(np.float32)
        return np.dtype(self.name if self.name != "bool" else np.bool_)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def min(self):
        """The smallest value (-inf for floats), as a Python scalar."""
        kind = self.kind
        if kind == "f":
            return -float("inf")
        if kind == "b":
            return False
        return -(1 << 8 * self.itemsize - 1) if kind == "i" else 0  # (np.iinfo's, without its cost)

    @property
    def max(self):
        """The largest value (inf for floats), as a Python scalar."""
        kind = self.kind
        if kind == "f":
            return float("inf")
        if kind == "b":
            return True
        return (1 << 8 * self.itemsize - (kind == "i")) - 1

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"


class dtypes:
    bool = DType("bool", 1, "b", 0)
    uint8 = DType("uint8", 1, "u", 1)
    int8 = DType("int8", 1, "i", 2)
    int16 = DType("int16", 2, "i", 3)
    int32 = DType("int32", 4, "i", 4)
    int64 = DType("int64", 8, "i", 5)
    float16 = DType("float16", 2, "f", 6)
    # PyTorch's: float32's exponent with 8 significand bits. Held as float32 values rounded to bfloat16
    # (numpy has no bfloat16); every op computes in float32 and rounds; CPU and NUMPY devices only
    bfloat16 = DType("bfloat16", 2, "f", 6)
    float32 = DType("float32", 4, "f", 7)
    float64 = DType("float64", 8, "f", 8)
    # like PyTorch's: storage and arithmetic among themselves (and with Python scalars), no promotion
    # with other dtypes; only the CPU and NUMPY devices have them
    uint16 = DType("uint16", 2, "u", 9)
    uint32 = DType("uint32", 4, "u", 10)
    uint64 = DType("uint64", 8, "u", 11)
    # the 8-bit float formats (PyTorch's float8_e4m3fn, float8_e5m2 and the AMD "fnuz" ones): names and
    # rounding (round_fp8, float_to_fp8, fp8_to_float) only; a tensor of one is refused (tensor._dtype_on)
    fp8e4m3 = DType("fp8e4m3", 1, "f", 12)
    fp8e5m2 = DType("fp8e5m2", 1, "f", 12)
    fp8e4m3fnuz = DType("fp8e4m3fnuz", 1, "f", 12)
    fp8e5m2fnuz = DType("fp8e5m2fnuz", 1, "f", 12)
    fp8s = (fp8e4m3, fp8e5m2, fp8e4m3fnuz, fp8e5m2fnuz)
    half = float16
    bf16 = bfloat16
    float = float32
    double = float64
    int = int32
    long = int64
    short = int16
    char = int8
    uchar = uint8
    ushort = uint16
    uint = uint32
    ulong = uint64
    default_float = float32
    default_int = int64
    all = (bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64,
           uint16, uint32, uint64)
    # the dtypes only some devices have (HOST_ONLY: no promotion with other dtypes either), and those devices
    HOST_ONLY = (uint16, uint32, uint64)
    HOST_FLOATS = (bfloat16,)
    HOST_DEVICES = ("CPU", "NUMPY")
    # HOST_ONLY's: OpenCL C has ushort, uint and ulong too, Triton uint16/32/64 (CUDA and AMD run Triton)
    UINT_DEVICES = HOST_DEVICES + ("CL", "QCOM", "TRITON", "CUDA", "AMD")
    UINT32_DEVICES = UINT_DEVICES + ("WEBGPU",)  # WGSL's u32 (it has no 16-bit or 64-bit integers)
    FP8_DEVICES = ("NUMPY",)  # fp8 tensors (float32 storage rounded to fp8 after every op)
    # the names of the dtypes every device has (not fp8, HOST_ONLY or HOST_FLOATS), to check a dtype by
    # name (a set of str is read in C; comparing DTypes calls __eq__)
    ON_EVERY_DEVICE = frozenset(d.name for d in all) - {d.name for d in fp8s + HOST_ONLY + HOST_FLOATS}
    floats = (float16, bfloat16, float32, float64)
    sints = (int8, int16, int32, int64)
    uints = (uint8, uint16, uint32, uint64)
    ints = uints + sints

    @staticmethod
    def is_float(dtype) -> bool:
        """Whether dtype (a DType or a name) is a floating-point dtype (tinygrad's `dtypes.is_float`)."""
        return dtypes.from_any(dtype).kind == "f"

    @staticmethod
    def is_int(dtype) -> bool:
        """Whether dtype is a signed or unsigned integer dtype (bool is not)."""
        return dtypes.from_any(dtype).kind in "iu"

    @staticmethod
    def is_unsigned(dtype) -> bool:
        return dtypes.from_any(dtype).kind == "u"

    @staticmethod
    def finfo(dtype) -> tuple[int, int]:
        """(exponent bits, mantissa bits) of a float dtype, as tinygrad's dtypes.finfo."""
        dtype = dtypes.from_any(dtype)
        if dtype.kind != "f":
            raise DTypeError(f"finfo: {dtype.name} is not a floating-point dtype")
        return _FINFO[dtype.name]

    @staticmethod
    def from_any(x) -> DType:
        """A DType from a DType, a name ('float32'), a numpy dtype or a torch-like object with .name."""
        if isinstance(x, DType):
            return x
        if isinstance(x, str):
            name = _ALIASES.get(x, x)
        else:
            try:
                name = np.dtype(x).name
            except TypeError:
                name = str(x).split(".")[-1]
        for dt in dtypes.all + dtypes.fp8s:
            if dt.name == name:
                return dt
        raise DTypeError(f"unsupported dtype {x!r}; tgrad supports {', '.join(d.name for d in dtypes.all)}")

    @staticmethod
    def from_py(x) -> DType:
        """The dtype a Python scalar gets when it becomes a tensor."""
        if isinstance(x, bool):
            return dtypes.bool
        if isinstance(x, int):
            return dtypes.default_int
        return dtypes.default_float


_FINFO = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52), "fp8e4m3": (4, 3),
          "fp8e5m2": (5, 2), "fp8e4m3fnuz": (4, 3), "fp8e5m2fnuz": (5, 2)}

# (low, high) of each dtype's values: for floats the largest finite one (bfloat16's is its own, not float32's)
_LIMITS = {
    d.name: (d.min, d.max) if d.kind in "iub"
    else (None, 3.3895313892515355e38 if d.name == "bfloat16" else float(np.finfo(d.np).max))
    for d in dtypes.all
}

# fp8: the largest finite value (e4m3fn saturates past it, e5m2 gives inf, the fnuz formats NaN)
_LIMITS.update({"fp8e4m3": (None, 448.0), "fp8e5m2": (None, 57344.0), "fp8e4m3fnuz": (None, 240.0),
                "fp8e5m2fnuz": (None, 57344.0)})

# the magnitude from which a value rounds to inf (the largest finite one and half its last step)
_INF_FROM = {"float16": 65520.0, "bfloat16": 2.0**128 - 2.0**119, "float32": 2.0**128 - 2.0**103}

# PyTorch's and C's short names for dtypes (torch.int is int32, torch.long int64, torch.half float16)
_ALIASES = {"int": "int32", "long": "int64", "float": "float32", "double": "float64", "half": "float16",
            "short": "int16", "char": "int8", "uchar": "uint8"}


def check_fits(value, dtype: DType, op: str, strict_float: bool = False, wrap: bool = True):
    """value (a Python or numpy scalar) as dtype holds it, or ValueOverflowError naming op, the value and
    dtype's range where PyTorch refuses it: into an int dtype, an int outside the dtype's range (unsigned
    dtypes also take -max..-1, wrapped as in PyTorch) or a float that is nan, inf, outside the range, or
    negative for an unsigned dtype (else truncated toward zero). Into a float dtype a finite value past its
    largest one is inf, except with strict_float (PyTorch's full, fill_, masked_fill, clamp), which raise.
    wrap=False: negative ints into unsigned dtypes raise too (PyTorch's pad)."""
    kind = dtype.kind
    if kind == "b" or type(value) is bool or isinstance(value, np.bool_):
        return value
    if kind == "f":
        top = _LIMITS[dtype.name][1]
        if -top <= value <= top or value != value or abs(value) == float("inf"):
            return value
        if strict_float:
            _overflow(value, dtype, op, -top, top)
        # past the largest finite value: inf where rounding gives it (said here, so no device's cast warns)
        rounds_to_inf = abs(value) >= _INF_FROM.get(dtype.name, math.inf)
        return math.copysign(math.inf, value) if rounds_to_inf else value
    low, high = _LIMITS[dtype.name]
    if type(value) is int or isinstance(value, (int, np.integer)):
        value = int(value)
        if low <= value <= high:
            return value
        if kind == "u" and wrap and -high <= value < 0:
            return value % (high + 1)
        _overflow(value, dtype, op, -high if kind == "u" and wrap else low, high)
    if not low <= value <= high:  # (nan, inf, and negative floats for unsigned dtypes)
        _overflow(value, dtype, op, low, high)
    return value


def fitted_array(values: np.ndarray, data, dtype: DType, op: str) -> np.ndarray:
    """check_fits for every element of values, the array numpy made from Python values `data` (a list
    given to Tensor()); values, or, where numpy's float64 lost the exact ints (past 2^53), the checked
    Python values again."""
    if not dtype.is_int or values.size == 0 or values.dtype.kind not in "iuf":
        return values
    low, high = dtype.min, dtype.max
    if values.dtype.kind in "iu":
        bad = (values < (-high if dtype.kind == "u" else low)) | (values > high)
    else:
        with np.errstate(invalid="ignore"):
            if np.abs(values).max(initial=0) >= 2.0**53:  # (nan: False) ints numpy rounded: check each
                exact = np.array(data, dtype=object).reshape(-1)
                return np.array([check_fits(v, dtype, op) for v in exact], dtype=object).astype(
                    dtype.np).reshape(values.shape)
            bad = ~((values >= low) & (values <= high))
    if bad.any():
        check_fits(values[bad].flat[0].item(), dtype, op)
    return values


def _overflow(value, dtype: DType, op: str, low, high):
    raise ValueOverflowError(
        f"{op}: the value {value!r} does not fit in {dtype.name} (it holds {low} to {high}); pick a wider "
        f"dtype, or cast a tensor to {dtype.name} to wrap values on purpose"
    )


def promote(a: DType, b: DType) -> DType:
    """PyTorch's promotion of two tensor dtypes (e.g. uint8 + int8 -> int16, int32 + float16 -> float16)."""
    if a is b or a == b:
        return a
    if a in dtypes.fp8s or b in dtypes.fp8s:
        raise DTypeError(f"promoting {a.name} with {b.name} is not supported (PyTorch has no promotion for "
                         "float8 types); cast one first")
    if a in dtypes.HOST_ONLY or b in dtypes.HOST_ONLY:
        raise DTypeError(f"promoting {a.name} with {b.name} is not supported (as in PyTorch); cast one first")
    if a.kind == "f" or b.kind == "f":
        if a.kind != "f":
            return b
        if b.kind != "f":
            return a
        if a.rank == b.rank:  # float16 with bfloat16: neither holds the other (PyTorch: float32)
            return dtypes.float32
        return a if a.rank > b.rank else b
    if {a.kind, b.kind} == {"u", "i"}:
        signed = a if a.kind == "i" else b
        return signed if signed.itemsize > 1 else dtypes.int16
    return a if a.rank > b.rank else b


def promote_dims(a: DType, a_0d: bool, b: DType, b_0d: bool) -> DType:
    """PyTorch's result type of two tensors when one is 0-d and the other is not: the 0-d one's dtype counts
    only where its category (bool < integer < float) is higher than the other's (an int32 tensor + a 0-d
    int64 is int32, float16 + a 0-d float32 is float16, int32 + a 0-d float32 is float32)."""
    if a_0d == b_0d or a is b:
        return promote(a, b)
    dim, zero = (b, a) if a_0d else (a, b)
    return promote(dim, zero) if _CATEGORY[zero.kind] > _CATEGORY[dim.kind] else dim


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}


def promote_scalar(t: DType, x) -> DType:
    """The result dtype of `tensor op python_scalar`: the scalar only matters when its category is higher."""
    if isinstance(x, bool):
        return t
    if isinstance(x, int):
        return t if t.kind != "b" else dtypes.default_int
    return t if t.is_float else dtypes.default_float


def round_bf16(x) -> np.ndarray:
    """Values rounded to the nearest bfloat16 (ties to even), as float32: PyTorch's rounding, on the bits
    (x + 0x7FFF + the lowest kept bit, the low 16 bits cleared). Overflow gives inf, subnormals round like
    any other value. A NaN keeps its high 16 bits (with the quiet bit set where low bits are dropped, so
    it stays NaN); a value that already is a bfloat16 is unchanged, NaN payloads included. Other float
    dtypes go through float32 first, as in PyTorch's conversions."""
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.asarray(x).astype(np.float32)
    bits = a.view(np.uint32)
    high, low = bits & np.uint32(0xFFFF0000), bits & np.uint32(0xFFFF)
    kept = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = high | np.where(low != 0, np.uint32(0x00400000), np.uint32(0))
    return np.where(a != a, nan, kept).astype(np.uint32).view(np.float32)


def _fp8_table(dtype: DType) -> np.ndarray:
    """The values of the 256 codes of an fp8 dtype, as float64 (NaN codes: nan)."""
    if dtype.name not in _FP8_TABLES:
        e, m = _FINFO[dtype.name]
        fnuz = dtype.name.endswith("fnuz")
        bias = (1 << (e - 1)) - 1 + fnuz
        code = np.arange(256)
        exp, mant = (code >> m) & ((1 << e) - 1), code & ((1 << m) - 1)
        mag = np.where(exp == 0, mant * 2.0 ** (1 - bias - m), (1 + mant / 2**m) * 2.0 ** (exp - bias))
        val = np.where(code >> 7, -mag, mag)
        if fnuz:  # no negative zero, no infinities: 0x80 is the NaN
            val[0x80] = np.nan
        elif e == 4:  # e4m3fn: no infinities, S.1111.111 is NaN
            val[[0x7F, 0xFF]] = np.nan
        else:  # e5m2: IEEE-like
            val[(exp == 31) & (mant != 0)] = np.nan
            val[[0x7C, 0xFC]] = [np.inf, -np.inf]
        _FP8_TABLES[dtype.name] = val
    return _FP8_TABLES[dtype.name]


_FP8_TABLES: dict[str, np.ndarray] = {}


def float_to_fp8(x, dtype: DType) -> np.ndarray:
    """The fp8 codes (uint8) of values x, as PyTorch's casts make them: through float32, to the nearest
    code (ties to the even code); past the largest finite value e4m3fn saturates, e5m2 gives inf, the fnuz
    formats give their NaN (0x80, as they do for inf); nan is 0x7F with its sign (fnuz: 0x80)."""
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.asarray(x).astype(np.float32).astype(np.float64)
    table, fnuz = _fp8_table(dtype), dtype.name.endswith("fnuz")
    top = 0x7B if dtype.name == "fp8e5m2" else 0x7E if dtype.name == "fp8e4m3" else 0x7F
    pos = table[: top + 1]  # the finite non-negative values, ascending with the code
    step = pos[top] - pos[top - 1]
    ext = np.append(pos, pos[top] + step)  # the code after the largest: where overflow starts
    mag = np.abs(a)
    hi = np.clip(np.searchsorted(ext, mag, side="left"), 1, top + 1)
    lo = hi - 1
    dlo, dhi = mag - ext[lo], ext[hi] - mag
    code = np.where((dlo < dhi) | ((dlo == dhi) & (lo % 2 == 0)), lo, hi)
    code = np.where(mag > ext[-1], top + 1, code)  # beyond the notional next code, inf included
    over = code > top
    neg = np.signbit(a)
    if dtype.name == "fp8e4m3":
        code = np.where(over, top, code)
    elif dtype.name == "fp8e5m2":
        code = np.where(over, 0x7C, code)
    code = code | np.where(neg & ~(fnuz & (code == 0)), 0x80, 0)
    nan_code = np.where(neg, 0xFF, 0x7F) if not fnuz else 0x80
    code = np.where(a != a, nan_code, code)
    if fnuz:
        code = np.where(over, 0x80, code)
    return code.astype(np.uint8)


def fp8_to_float(code, dtype: DType) -> np.ndarray:
    """The float32 values of fp8 codes (ints 0..255)."""
    return _fp8_table(dtype)[np.asarray(code).astype(np.int64) & 0xFF].astype(np.float32)


def round_fp8(x, dtype: DType) -> np.ndarray:
    """Values rounded to an fp8 dtype as PyTorch's cast does (float_to_fp8), as float32."""
    return fp8_to_float(float_to_fp8(x, dtype), dtype)


def to_bytes(values: np.ndarray, dtype: DType) -> np.ndarray:
    """The bytes of dtype's values (host arrays as dtype.np holds them; bfloat16 as its 2 bytes each)."""
    values = np.ascontiguousarray(values)
    if dtype == dtypes.bfloat16:
        values = (values.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    if dtype in dtypes.fp8s:
        values = float_to_fp8(values, dtype)
    return values.reshape(-1).view(np.uint8)


def from_bytes(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Bytes (to_bytes' layout, native order) as a flat array of dtype's host values."""
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if dtype == dtypes.bfloat16:
        return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype == dtypes.bool:
        return raw != 0
    if dtype in dtypes.fp8s:
        return fp8_to_float(raw, dtype)
    return raw.view(dtype.np)


def host_values(x, dtype: DType, copy: bool = True) -> np.ndarray:
    """x as a numpy array of dtype's host values (dtype.np; rounded to bfloat16 for bfloat16); copy=False:
    x itself where it already holds them (no rounding, same numpy dtype)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(x).astype(dtype.np, copy=copy)
    return round_to(out, dtype)


def round_to(x, dtype: DType):
    """float32 values x rounded to dtype where dtype's values are float32 ones rounded (bfloat16, fp8);
    other dtypes: x unchanged."""
    if dtype == dtypes.bfloat16:
        return round_bf16(x)
    return round_fp8(x, dtype) if dtype in dtypes.fp8s else x
