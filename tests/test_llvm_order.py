"""Importing triton (or PyTorch's first optimizer step, which imports it) after tgrad ran on WEBGPU or CL:
a fresh process in that order must finish normally (it died with a segmentation fault: Mesa's LLVM was
loaded first; tgrad/runtime/llvm_order.py). The suite's own conftest imports triton first, so each case
runs in a new interpreter that does not."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import open_or_skip

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

AFTER = {
    "import triton": "import triton\nimport triton.language as tl\nprint('after', tl.float32)",
    "torch.optim step": (
        "import torch\n"
        "p = torch.nn.Parameter(torch.ones(3))\n"
        "opt = torch.optim.Adam([p], lr=0.1)\n"
        "p.sum().backward()\n"
        "opt.step()\n"
        "print('after', p.detach().numpy().tolist())"
    ),
}


@pytest.mark.parametrize("name, backend", [("WEBGPU", None), ("WEBGPU", "OpenGL"), ("CL", None)])
@pytest.mark.parametrize("then", list(AFTER))
def test_triton_after_a_device_with_its_own_llvm(name, backend, then):
    open_or_skip(name)
    script = (
        "from tgrad import Tensor\n"
        f"x = Tensor([1.0, 2.0, 3.0], device={name!r})\n"
        "print('before', (x * 2 + 1).sum().item(), flush=True)\n" + AFTER[then]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    if backend is not None:  # wgpu over Mesa's OpenGL (llvmpipe) instead of Vulkan (lavapipe)
        env["WGPU_BACKEND_TYPE"] = backend
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "before 15.0" in done.stdout and "after" in done.stdout, done.stdout
