"""tinygrad.dtype: tgrad's dtypes, and the dtype helpers tinygrad's tests import from here."""

import torch

from tgrad.dtype import DType, dtypes, float_to_fp8, fp8_to_float, promote, round_bf16, round_fp8
from tinygrad._internal import module_getattr

# tinygrad's table of dtype names, in its order (aliases included); a name tgrad lacks fails here
DTYPES_DICT = {k: getattr(dtypes, k) for k in (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "fp8e4m3", "fp8e5m2",
    "fp8e4m3fnuz", "fp8e5m2fnuz", "float16", "bfloat16", "float32", "float64", "half", "float", "double",
    "uchar", "ushort", "uint", "ulong", "char", "short", "int", "long")}

# the value a Python float has once rounded to the dtype (tinygrad's `truncate` table, floats only here)
truncate = {
    dtypes.bfloat16: lambda x: float(round_bf16(x)),
    **{dt: (lambda x, dt=dt: float(round_fp8(x, dt))) for dt in dtypes.fp8s},
}


def strong_dtype(dtype: DType) -> DType:
    """tgrad has no weak (Python-scalar) dtypes: every dtype is already strong."""
    return dtype


def least_upper_dtype(*ds: DType) -> DType:
    """tgrad's promotion (PyTorch's rules), not tinygrad's lattice: they differ where tgrad raises as
    PyTorch does (uint16/32/64 or fp8 with another dtype)."""
    out = ds[0]
    for d in ds[1:]:
        out = promote(out, d)
    return out


def _to_np_dtype(dtype):
    return dtypes.from_any(dtype).np


def _to_torch_dtype(dtype):
    """As tinygrad's: fp8 dtypes are their codes, torch.uint8."""
    name = dtypes.from_any(dtype).name
    return torch.uint8 if name.startswith("fp8") else getattr(torch, name)


def _fp8_scalar(fn):
    return lambda x, dtype: fn(x, dtype).item()


__all__ = ["DType", "dtypes", "DTYPES_DICT", "truncate", "strong_dtype", "least_upper_dtype", "float_to_fp8",
           "fp8_to_float", "_to_np_dtype", "_to_torch_dtype"]

# tinygrad's float_to_fp8 / fp8_to_float take and give Python scalars
float_to_fp8, fp8_to_float = _fp8_scalar(float_to_fp8), _fp8_scalar(fp8_to_float)
__getattr__ = module_getattr(__name__)
