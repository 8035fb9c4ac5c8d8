"""tinygrad.engine.jit: TinyJit and the error it raises on misuse (tgrad's JitError)."""

from tgrad.errors import JitError
from tgrad.jit import TinyJit
from tinygrad._internal import module_getattr

__all__ = ["JitError", "TinyJit"]
__getattr__ = module_getattr(__name__)
