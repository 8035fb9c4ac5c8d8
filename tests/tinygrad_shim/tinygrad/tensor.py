"""tinygrad.tensor: tgrad's Tensor, and the numpy-dtype helper tinygrad's tests import from here."""

import numpy as np

from tgrad import Tensor, dtypes


def _to_np_dtype(dtype) -> np.dtype:
    return dtypes.from_any(dtype).np


__all__ = ["Tensor", "_to_np_dtype"]


from tinygrad._internal import module_getattr  # noqa: E402

__getattr__ = module_getattr(__name__)
