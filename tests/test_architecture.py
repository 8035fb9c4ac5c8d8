"""The layout docs/architecture.md describes: no import cycles inside tgrad, pure emitters (no device
package or runtime imported), one list of devices, one runtime module per device."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tgrad import config, device

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tgrad"
DEVICE_PACKAGES = ("numba", "llvmlite", "pyopencl", "wgpu", "triton", "torch")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, modules: dict[str, Path], top_level: bool = True) -> set[str]:
    """The tgrad modules a file imports (at module level, or only inside functions)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level else [n for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                                          for n in ast.walk(f)]
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tgrad"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
            found |= subs or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tgrad")}
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items() if m != "tgrad"}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            pytest.fail(f"import cycle: {' -> '.join(path[path.index(m):] + [m])}")
        if m in done or m not in graph:
            return
        for dep in sorted(graph[m]):
            visit(dep, path + [m])
        done.add(m)

    for m in graph:
        visit(m, [])


def test_no_function_local_tgrad_imports():
    modules = _modules()
    local = {m: _imports(p, modules, top_level=False) for m, p in modules.items()}
    assert not {m: deps for m, deps in local.items() if deps}


def test_emitters_import_no_runtime_and_no_device_package():
    modules = _modules()
    emitters = [m for m in modules if m.startswith("tgrad.emit_")]
    assert {"tgrad.emit_numba", "tgrad.emit_triton", "tgrad.emit_opencl", "tgrad.emit_wgsl"} <= set(emitters)
    for m in emitters:
        deps = _imports(modules[m], modules)
        assert not {d for d in deps if d.startswith(("tgrad.runtime", "tgrad.device", "tgrad.realize"))}, m
    code = (f"import sys\nimport {', '.join(emitters)}\n"
            f"print(sorted(p for p in {DEVICE_PACKAGES!r} if p in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_device_has_a_runtime_module_and_class():
    for name, where in device.RUNTIMES.items():
        module, cls = where.split(":")
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.is_file(), name
        assert f"class {cls}(" in path.read_text(), name
    assert set(device.VARIANT_OF) <= set(device.RUNTIMES)
    assert set(device.VARIANT_OF.values()) <= set(device.RUNTIMES)


def test_modules_stay_small():
    """One job per module: ~700 lines at most; tensor.py, the Tensor core (its op groups are mixins in
    tgrad/ops/), 1,200."""
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    assert not {m: n for m, n in sizes.items() if n > (1200 if m == "tgrad.tensor" else 720)}


def test_the_cpu_runtime_is_one_package():
    """Every CPU runtime module lives in tgrad/runtime/cpu/, and nothing outside it imports them (the
    device registry names the runtime by string): a device's code is found by its folder."""
    modules = _modules()
    assert not [p for p in (PACKAGE / "runtime").glob("*.py") if p.stem.startswith(("cpu", "numba", "host"))]
    assert "tgrad.runtime.cpu.runtime" in modules
    outside = {m: _imports(p, modules) | _imports(p, modules, top_level=False) for m, p in modules.items()
               if not m.startswith("tgrad.runtime.cpu")}
    reaching = {m: [d for d in deps if d.startswith("tgrad.runtime.cpu")] for m, deps in outside.items()}
    assert not {m: deps for m, deps in reaching.items() if deps}


def test_one_module_reads_the_environment():
    """tgrad/config.py is the table of every environment variable tgrad reads; nothing else touches
    os.environ, and every name asked of it is in the table."""
    asked = set()
    for m, path in _modules().items():
        text = path.read_text()
        if m != "tgrad.config":
            assert not re.search(r"\bos\.(environ|getenv|putenv)\b|\bgetenv\(", text), m
        asked |= set(re.findall(r"config\.(?:get|on|is_set|put)\(\"(\w+)\"", text))
    assert asked and asked <= set(config.KNOBS), asked - set(config.KNOBS)


def test_module_docstrings_stay_short():
    """A module docstring says what the module does and its main rule, in 25 lines at most: the longer
    rationale goes next to the code it explains or to docs/architecture.md, measurements and history to
    bench/HISTORY.md."""
    lengths = {m: len((ast.get_docstring(ast.parse(p.read_text())) or "").splitlines())
               for m, p in _modules().items()}
    assert not {m: n for m, n in lengths.items() if n > 25}


def test_one_structure_key_and_one_replay_module():
    """graph.structure is the one key of a graph's structure (the schedule cache and the eager replays
    use it; nothing else numbers a graph's buffers), replay.py the one place eager work is replayed by
    TinyJit, and the suite resets no global history between tests (nothing observable depends on it)."""
    numbering, jits = set(), set()
    for m, path in _modules().items():
        text = path.read_text()
        if re.search(r"\[id\(\w+\)\] = len\(\w+\)|setdefault\(id\(\w+\), len\(", text):
            numbering.add(m)
        if m != "tgrad.jit" and "TinyJit(" in text:
            jits.add(m)
    assert numbering == {"tgrad.graph"} and jits == {"tgrad.replay"}, (numbering, jits)
    for m in ("tgrad.schedule_cache", "tgrad.replay"):
        assert "structure(" in _modules()[m].read_text(), m
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert "autouse=True" not in conftest and ".reset()" not in conftest


# module-level numbers that are facts, not tuning: formats, ABIs and limits set by hardware or drivers
FACTS = {
    "INT32_MAX", "GRID_X_MAX", "GRID_YZ_MAX", "MESA_MAX_LOOP", "PAGE", "DIMS", "KERNEL_ARGS", "W_SIDE",
    "WORDS", "RECORD_HEAD", "MAX_ARGS", "MAX_CHUNKS", "_LEGACY_MAGIC", "KERNEL_OPT",
}
# the goal is at most 15 tuning constants outside opt/opts.py's DeviceProps and HostTuning
MAX_TUNING_CONSTANTS = 15


def _numeric(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
    if isinstance(value, ast.BinOp):
        return _numeric(value.left) and _numeric(value.right)
    return isinstance(value, ast.UnaryOp) and _numeric(value.operand)


def tuning_constants() -> list[str]:
    """Module-level names bound to a number in tgrad/ (thresholds, sizes, counts), facts excepted."""
    found = []
    for name, path in _modules().items():
        for stmt in ast.parse(path.read_text()).body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
            value = getattr(stmt, "value", None)
            numeric = value is not None and _numeric(value)
            if isinstance(target, ast.Name) and numeric and target.id not in FACTS:
                found.append(f"{name}.{target.id}")
    return found


def test_the_cpu_thresholds_are_device_properties():
    """The CPU's choices between implementations (BLAS or the generated loop, direct convolutions, piece
    pairs, threads) read their sizes from the device's HostTuning (opt/opts.py), not from module constants
    of blas.py, emit_numba*.py or the CPU runtime; tuning constants elsewhere only go down."""
    found = tuning_constants()
    choices = ("BLAS_M", "DIRECT_", "SCATTER_", "PAIR_", "CHUNK_", "PARALLEL_", "BATCHED_MAX", "SMALL_K")
    cpu = [c for c in found if c.startswith("tgrad.blas.") or any(w in c for w in choices)]
    assert not cpu, cpu
    assert len(found) <= MAX_TUNING_CONSTANTS, (len(found), found)


def test_the_driver_is_device_neutral():
    """realize.py asks a device one question about a schedule (Runtime.plan) and knows no device's way of
    running it (the CPU's row groups and pairs live in runtime/cpu/groups.py); nothing above the runtimes
    compares a device's name with "CPU" to choose how to compute."""
    source = (PACKAGE / "realize.py").read_text()
    assert not [w for w in ("row_count", "rows_runner", ".pairs(", '"CPU"') if w in source]
    assert hasattr(device.Runtime, "plan") and not hasattr(device.Runtime, "row_count")
    above = [p for p in PACKAGE.rglob("*.py")
             if "runtime" not in p.parts and p.name not in ("device.py", "config.py")]
    compares = [str(p.relative_to(ROOT)) for p in above
                if re.search(r'(==|!=|\bin)\s*\(?"CPU"', p.read_text())]
    assert not compares, compares


def test_a_new_primitive_op_touches_six_files():
    """TRUNC, the last unary primitive added, is named in six modules: graph.py (the Op, its numpy
    reference), autodiff.py (its gradient), the three emitters' op tables (emit_cstyle's serves OpenCL,
    Metal and WGSL) and its Tensor method (docs/architecture.md, "Adding a primitive op"). Every unary
    and binary op has its numpy reference (the NUMPY device) and a rendering in every emitter."""
    from tgrad import emit_cstyle, emit_numba, emit_triton
    from tgrad.graph import BINARY, REFERENCE, UNARY, Op

    named = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if re.search(r"\bTRUNC\b", p.read_text()))
    assert named == ["autodiff.py", "emit_cstyle.py", "emit_numba.py", "emit_triton.py", "graph.py",
                     "ops/math.py"], named
    for op in (UNARY | BINARY) - {Op.CAST}:
        assert op in REFERENCE, op
        for table in (emit_numba.code_for_op, emit_cstyle.code_for_op, emit_triton.code_for_op):
            assert op.value in table, op


# The import-time hook slots left, each one a real cycle: backward() (tensor.py) computes through
# replay.py's TinyJit programs (jit.py needs tensor.py); every node built over a symbolic one (graph.py)
# gets symbolic.py's rule, which masks with nodes over buffers the driver uploads (realize.py needs
# graph.py). A new one needs a reason this strong and an entry here.
HOOK_SLOTS = {("tgrad/__init__.py", "tensor.BACKWARD_REPLAY"), ("tgrad/symbolic.py", "g.SYM_RULE")}


def test_no_new_import_time_hook_slots():
    """No module sets another module's attribute when it is imported (a hook slot: the path through the
    code cannot be followed by reading), but those in HOOK_SLOTS."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported:
                    found.add((str(path.relative_to(ROOT)), f"{t.value.id}.{t.attr}"))
    assert found == HOOK_SLOTS, f"import-time hook slots: {sorted(found - HOOK_SLOTS)} new, " \
        f"{sorted(HOOK_SLOTS - found)} gone (update HOOK_SLOTS)"
