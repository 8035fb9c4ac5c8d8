"""Triton kernels are Python modules: `triton.jit` reads its function's source from a real file, so each
kernel's source is written to a file under the cache folder (once per content hash) and imported.

Under Triton's interpreter each jitted function is rewritten before its first launch in a process
(interpreter.FunctionRewriter: the source read back with `inspect`, parsed, assignments and chained
comparisons wrapped, compiled), a large part of a TRITON test run (measured: bench/HISTORY.md). tgrad
does that rewrite itself from the source it wrote, with Triton's own AST transformer, and keeps the compiled
code next to the source, so a kernel loaded again (another process, another test) only executes it."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import marshal
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
        if interpret:
            _rewrite_for_interpreter(module, source, path)
    return getattr(module, fname)


def _rewrite_for_interpreter(module, source: str, path: Path) -> None:
    """Give Triton's interpreter each jitted function of `module` already rewritten (its cache,
    InterpretedFunction.rewritten_fn), compiled from `source` by Triton's AST transformer as its rewriter
    would, the code kept in a file beside `path` (keyed by the Triton and Python versions). A Triton whose
    interpreter lacks these names rewrites them itself, as before."""
    try:
        import triton
        from triton.runtime import interpreter
        from triton.runtime.interpreter import ASTTransformer, InterpretedFunction
    except ImportError:
        return
    cache = getattr(InterpretedFunction, "rewritten_fn", None)
    jitted = {n: f for n, f in vars(module).items() if isinstance(f, InterpretedFunction)}
    if not isinstance(cache, dict) or not jitted:
        return
    tag = hashlib.sha256(f"{triton.__version__} {sys.version}".encode()).hexdigest()[:8]
    code_path = path.with_name(f"{path.stem}.interp-{tag}.marshal")
    try:
        codes = marshal.loads(code_path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        codes = None
    if not isinstance(codes, dict) or set(codes) != set(jitted):
        tree = ast.parse(source)
        codes = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in jitted:
                node.decorator_list = []  # (the rewriter compiles from the `def` line on)
                one = ASTTransformer().visit(ast.Module(body=[node], type_ignores=[]))
                ast.fix_missing_locations(one)
                codes[node.name] = compile(one, str(path), "exec")
        if set(codes) != set(jitted):
            return
        write_atomic(code_path, marshal.dumps(codes))
    fn_globals = vars(module)  # (every jitted function's globals: it was defined in the module)
    for key, value in vars(interpreter).items():  # (what FunctionRewriter._compile_and_exec adds)
        fn_globals.setdefault(key, value)
    for name, ifn in jitted.items():
        local = dict(ifn.rewriter.kwargs)
        exec(codes[name], fn_globals, local)
        cache[ifn.fn] = local[name]
