"""tinygrad.nn.optim: tgrad's optimizers."""

from tgrad.nn.optim import *  # noqa: F403
from tinygrad._internal import module_getattr  # noqa: E402

__getattr__ = module_getattr(__name__)
