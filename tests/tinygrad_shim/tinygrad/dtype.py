"""tinygrad.dtype: tgrad's dtypes."""

from tgrad.dtype import DType, dtypes

__all__ = ["DType", "dtypes"]
