"""tgrad: a small, fast tensor library with autograd; lazy graphs fused into kernels for many devices."""

from tgrad import replay, tensor
from tgrad.device import Device
from tgrad.dtype import DType, dtypes
from tgrad.jit import TinyJit
from tgrad.symbolic import Variable
from tgrad.tensor import Tensor

# backward() computes its gradients when it returns through replay.py (which needs jit.py, which needs
# tensor.py: tensor.py cannot import it), so the package connects the two here, once
tensor.BACKWARD_REPLAY = replay.backward

__all__ = ["Tensor", "TinyJit", "Device", "dtypes", "DType", "Variable"]
__version__ = "0.1.0"
