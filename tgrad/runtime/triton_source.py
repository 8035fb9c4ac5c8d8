"""Triton kernels are Python modules: `triton.jit` reads its function's source from a real file, so each
kernel's source is written to a file under the cache folder (once per content hash) and imported."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path

from tgrad import config
from tgrad.cachefiles import write_atomic
from tgrad.device import cache_dir

_tmp_dir: Path | None = None


def _source_dir() -> Path:
    """Where generated kernel modules are written: triton.jit reads its function's source from a file."""
    global _tmp_dir
    cdir = cache_dir()
    if cdir is not None:
        folder = cdir / "triton"
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    if _tmp_dir is None:
        _tmp_dir = Path(tempfile.mkdtemp(prefix="tgrad-triton-"))
    return _tmp_dir


def load_source(source: str, fname: str, interpret: bool):
    """Write a module's source to a real file (once per content hash), import it, return fname from it.
    `interpret` picks what triton.jit makes (it reads TRITON_INTERPRET when the module runs)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    folder = _source_dir()
    path = folder / f"k_{digest}.py"
    if not path.exists():
        write_atomic(path, source.encode())
    name = f"tgrad_triton_{digest}_{'interpret' if interpret else 'gpu'}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        saved = config.get("TRITON_INTERPRET") if config.is_set("TRITON_INTERPRET") else None
        config.put("TRITON_INTERPRET", "1" if interpret else "0")
        try:
            spec.loader.exec_module(module)
        finally:
            config.put("TRITON_INTERPRET", saved)
        sys.modules[name] = module
    return getattr(module, fname)
