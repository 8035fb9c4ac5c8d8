"""Program: what an emitter makes of a Kernel, and what a runtime compiles.

The contract between `emit_*.render(kernel) -> Program` and `runtime/<device>.py`: plain data, no device
package, no compiled code. A runtime compiles `source` and launches it with `global_size`/`local_size`,
passing the output buffer, then the inputs listed in `reads` (a kernel may be handed buffers it does not
read), then `scratch` arrays it allocates, then the integers in `args`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tgrad.dtype import DType


@dataclass(frozen=True, eq=False)
class Program:
    name: str  # the entry point's name in `source`
    source: str
    global_size: tuple[int, ...] = ()  # work-items (CL), workgroups (WGSL) or programs (Triton) launched
    local_size: tuple[int, ...] = ()  # work-group size, where the language has one
    reads: tuple[int, ...] | None = None  # the kernel inputs passed, in order (None: all of them)
    scratch: tuple[tuple[int, DType], ...] = ()  # (elements, dtype) of temporary arrays passed after inputs
    args: tuple[int, ...] = ()  # integer arguments passed last
    launch: dict[str, Any] = field(default_factory=dict)  # other facts of one language (see its emitter)
