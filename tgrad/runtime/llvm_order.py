"""Load triton's LLVM before a driver loads another one (Mesa's for WEBGPU, an OpenCL driver's for CL).

Triton's libtriton.so carries its own copy of LLVM. Once Mesa's libLLVM is in the process (wgpu opening
lavapipe or llvmpipe), loading libtriton afterwards crashes the process with a segmentation fault: a user's
`import triton`, or PyTorch's first optimizer step (torch._dynamo imports triton), after tgrad ran anything
on WEBGPU. Loaded the other way round both work. So the runtimes that open such a driver call
`load_triton_first()` before they do: where triton is installed and not loaded yet, it maps libtriton.so
with ctypes (local symbols, as Python's own import of the extension maps it; a later `import triton` finds
the library already loaded and uses it). The Python package itself is not imported: its import is several
times dearer, and it reads TRITON_INTERPRET and other settings the user may still set.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

_done = False


def load_triton_first() -> None:
    """Map triton's shared library now if triton is installed and not loaded (once per process; a library
    that cannot be loaded is left to triton's own import to report)."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return
    _done = True
    if "triton" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for lib in sorted(Path(folder, "_C").glob("libtriton*.so")):
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_LOCAL)
            except OSError:
                pass
            return
