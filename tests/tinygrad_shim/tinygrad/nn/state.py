"""tinygrad.nn.state: tgrad's state helpers."""

from tgrad.nn.state import *  # noqa: F403
from tinygrad._internal import module_getattr  # noqa: E402

__getattr__ = module_getattr(__name__)
