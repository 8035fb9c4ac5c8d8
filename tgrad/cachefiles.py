"""Files of tgrad's disk caches (compiled kernels, CL binaries, Triton sources, BEAM choices), written whole
or not at all: another process (an xdist worker, a compile worker) may read one by name at any time."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file of this writer's own, renamed into place (OSError
    where the folder cannot be made or written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
