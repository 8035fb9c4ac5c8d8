"""tinygrad.engine: only the names its user-facing tests catch; the rest are internals (_internal.py)."""

from tinygrad._internal import module_getattr

__getattr__ = module_getattr(__name__)
