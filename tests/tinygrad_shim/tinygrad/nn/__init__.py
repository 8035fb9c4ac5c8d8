"""tinygrad.nn: tgrad's layers (everything tgrad.nn exports)."""

from tgrad.nn import *  # noqa: F403
from tgrad.nn import __all__  # noqa: F401
from tinygrad._internal import module_getattr  # noqa: E402
from tinygrad.nn import optim, state  # noqa: F401  (tinygrad.nn.state, tinygrad.nn.optim)

__getattr__ = module_getattr(__name__)
