"""Metal Shading Language from the C-style emitter. Nothing here runs Metal, so every kernel of a small op
suite (forward and backward) is rendered, checked for structure, and syntax-checked with clang against
tests/metal_shim.h (a stand-in for <metal_stdlib>)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cstyle_cases import find_clang, suite_kernels
from tgrad import Tensor, fuse
from tgrad.emit_opencl import METAL, render
from tgrad.errors import DeviceError, DTypeError
from tgrad.opt import DeviceProps, optimize

SHIM = Path(__file__).with_name("metal_shim.h")


def source(kernel, *args, **kwargs) -> str:
    """The rendered source of the kernel with the opts the optimizer picks for a Metal device."""
    return render(optimize(kernel, DeviceProps("METAL")), *args, **kwargs).source


KERNELS = suite_kernels()


def syntax_check(sources: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    clang = find_clang()
    if clang is None:
        if os.environ.get("CI"):
            pytest.fail("clang++ is needed for the Metal syntax check in CI (apt-get install clang)")
        pytest.skip("clang++ not found (apt-get install clang-15 or clang); Metal syntax is not checked")
    inc = tmp_path / "inc"
    inc.mkdir(exist_ok=True)
    (inc / "metal_stdlib").write_text(f'#include "{SHIM}"\n')
    src = tmp_path / "kernels.metal"
    src.write_text("\n".join(sources))
    cmd = [clang, "-x", "c++", "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", "-I", str(inc),
           str(src)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_suite_is_not_trivial():
    assert len(KERNELS) >= 30
    assert any(k.reduce_expr is not None for k in KERNELS)


def test_every_kernel_renders_and_passes_clang(tmp_path):
    sources = [source(k, METAL, name=f"k{i}") for i, k in enumerate(KERNELS)]
    proc = syntax_check(sources, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_broken_source_fails_clang(tmp_path):
    good = source(KERNELS[0], METAL, name="k0")
    proc = syntax_check([good.replace(";", "", 1)], tmp_path)
    assert proc.returncode != 0
    proc = syntax_check([good.replace("kernel void", "kernel void k0_bad(); kernel void", 1)
                         .replace("exp2(", "exp(")], tmp_path)
    if "exp2(" in good:
        assert proc.returncode != 0  # a function the shim (Metal) does not declare


@pytest.mark.parametrize("i", range(len(KERNELS)))
def test_structure(i):
    k = KERNELS[i]
    src = source(k, METAL)
    assert src.startswith("#include <metal_stdlib>\nusing namespace metal;\n")
    assert f"kernel void {k.name}(" in src
    n_buf = 1 + len(k.in_dtypes)
    for b in range(n_buf):  # every buffer bound exactly once, in order
        assert src.count(f"[[buffer({b})]]") == 1
    assert f"[[buffer({n_buf})]]" not in src
    assert re.search(r"device \w+\* out \[\[buffer\(0\)\]\]", src)
    for opencl_only in ("__global", "__kernel", "get_global_id", "vload_half", "vstore_half", "#pragma",
                        "double", "barrier(CLK"):
        assert opencl_only not in src
    if "threadgroup float part" in src or "part[" in src:
        assert "[[threadgroup_position_in_grid]]" in src and "threadgroup_barrier(" in src
    else:
        assert "[[thread_position_in_grid]]" in src
    for j, dt in enumerate(k.in_dtypes):
        storage = {"bool": "uchar", "float16": "half"}.get(dt.name)
        if storage:
            assert f"const device {storage}* in{j} " in src


def test_float64_is_a_clear_error():
    k = fuse.schedule([(Tensor(np.ones(3), device="NUMPY") * 2).node])[0].kernel
    with pytest.raises(DTypeError, match="float64"):
        source(k, METAL)


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the Metal runtime may open")
def test_metal_device_needs_macos():
    from tgrad.runtime.metal import MetalRuntime

    with pytest.raises(DeviceError, match="needs macOS"):
        MetalRuntime()
