"""tinygrad.nn: tgrad's layers (everything tgrad.nn exports)."""

from tgrad.nn import *  # noqa: F403
from tgrad.nn import __all__  # noqa: F401
