"""The tinygrad import shim (tests/tinygrad_shim): it re-exports tgrad and adds no Tensor op. With
TGRAD_TINYGRAD_TESTS pointing at tinygrad's test/backend/test_ops.py, a few of its cases run here too
(the full run is `python tests/tinygrad_shim/run.py <that file>`, minutes long, not part of CI)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SHIM = Path(__file__).parent / "tinygrad_shim"
REPO = SHIM.parent.parent


def test_shim_reexports_tgrad_and_adds_no_ops():
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]; import tgrad; before = set(dir(tgrad.Tensor)); "
        "import tinygrad, tinygrad.tensor, tinygrad.helpers, tinygrad.nn.optim, tinygrad.nn.state; "
        "assert tinygrad.__file__.startswith(sys.argv[1]), tinygrad.__file__; "
        "assert tinygrad.Tensor is tgrad.Tensor and tinygrad.tensor.Tensor is tgrad.Tensor; "
        "assert tinygrad.dtypes is tgrad.dtypes and tinygrad.TinyJit is tgrad.TinyJit; "
        "assert set(dir(tgrad.Tensor)) == before, 'the shim changed Tensor'"
    )
    subprocess.run([sys.executable, "-c", code, str(SHIM), str(REPO)], check=True, cwd=REPO)


@pytest.mark.skipif(
    not os.environ.get("TGRAD_TINYGRAD_TESTS"), reason="set TGRAD_TINYGRAD_TESTS to tinygrad's test_ops.py"
)
def test_a_few_tinygrad_cases_pass():
    run = [sys.executable, str(SHIM / "run.py"), os.environ["TGRAD_TINYGRAD_TESTS"], "-k", "test_einsum"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert " 0 fail, 0 error" in out, out
