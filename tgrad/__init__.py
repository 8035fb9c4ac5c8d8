"""tgrad: a small, fast tensor library with autograd; lazy graphs fused into kernels for many devices."""

from tgrad import replay  # noqa: F401  (backward() computes and replays through it: registers itself)
from tgrad.device import Device
from tgrad.dtype import DType, dtypes
from tgrad.jit import TinyJit
from tgrad.tensor import Tensor

__all__ = ["Tensor", "TinyJit", "Device", "dtypes", "DType"]
__version__ = "0.1.0"
